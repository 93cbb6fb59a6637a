"""The elastic SDK: the public face of ``workers.elastic`` for user programs."""
