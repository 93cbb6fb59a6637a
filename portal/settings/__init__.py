"""Settings split by purpose: ``base`` (everything, read from the environment),
``dev`` (the embedded default), ``test`` and ``prod``."""
