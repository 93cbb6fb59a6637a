"""Tenancy: tenants, members and roles, API tokens, and ``restrict(user)`` scoping."""
