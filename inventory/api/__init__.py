"""Inventory's REST API (``/api/v1/gpus/``): the GPUs in a straggler's cool-down."""
