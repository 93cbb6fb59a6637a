"""The audit log's REST shapes: a row as ``/api/v1/audit/`` answers it.

The endpoint itself is ``tenancy.api.audit``'s: who may read which rows
depends on tenant ownership, which ``audit`` (below ``tenancy``) cannot know.
"""
