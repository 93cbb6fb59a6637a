"""Tenancy's REST API (``/api/v1/``): who am I, members, API tokens, the audit log.

The tenants themselves (``/api/v1/tenants/``) are served by ``jobs.api.tenants``:
each shows its GPUs in use, which only ``jobs`` (above ``tenancy``) knows.
"""
