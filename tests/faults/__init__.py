"""Fault tests: real stacks whose processes are SIGKILLed and whose services restart (issue 16).

``python -m pytest tests/faults -m stack`` boots two stacks (``runstack``): one on a
Redis server of the test's own, which takes the process kills and a Redis restart,
and one on a throwaway PostgreSQL cluster, which takes a PostgreSQL restart.
Every scenario ends with the same promises checked: every job completed, every
sample used once per epoch (the runtime's step log) and the final model equal to
one process trained over the same batches, no GPU held by a dead job, none held twice.
"""
