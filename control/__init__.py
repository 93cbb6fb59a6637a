"""The control plane: the scheduler tick, the agents' reports, reconcile, the forecast.

Thin over the cores: ``scheduler`` decides sizes, ``fabric`` places them,
this app reads and writes ``jobs``' rows and talks to the agents.  It sits
above ``jobs`` (the job domain) and below ``notifications`` and ``portal``.

The agents' command wire (``jobs.agent_commands``, ``jobs.agent_trust``,
``jobs.outbox``) stays in ``jobs``: the domain's services queue a command in
the same transaction as the change it follows (cancel: stop its workers), so
the outbox sits below them; the control plane sends what it queues.
"""
