"""Inventory: the fabric, its servers and GPUs, and their states (up, draining, down)."""
