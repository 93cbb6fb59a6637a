"""The node agent: a Celery worker on one server that runs its training processes.

It consumes the queue ``agent.<node>``, applies the commands of
``workers.protocol`` (start, scale in, migrate, stop, profile), supervises the
training processes it started, forwards their jobs' runtime events and its
own observations as reports, and heartbeats.  See ``docs/agent.md``.
"""
