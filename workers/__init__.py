"""Adapters that run on GPU servers: the node agent and the elastic training runtime."""
