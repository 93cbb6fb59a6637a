"""kombu's Redis transport for a broker user that may not run scripts (an agent's own user).

An agent that logs into Redis as its own user (``redis_acl.agent_rules``)
has no ``@scripting``: a script runs inside the server, and one endless loop
answers BUSY to everyone.  kombu's Redis transport runs one script on the
consumer's path: the mutex around restoring unacknowledged messages is
redis-py's ``Lock``, whose release is EVALSHA.  Here the release is a
WATCH/MULTI/EXEC transaction (``workers.elastic.redis_io.write_if``) and
everything else is kombu's own::

    Celery / kombu ── Transport ── Channel ── ScriptlessRedis.lock() ── ScriptlessLock
                                                                   acquire: SET NX PX (redis-py)
                                                                   release: WATCH, GET, MULTI, DEL, EXEC

Use: ``Connection(url, transport=Transport)``, or the app setting
``broker_transport = "workers.agent.broker_redis:Transport"``.
"""

from __future__ import annotations

import redis
from kombu.transport import redis as kombu_redis
from redis.exceptions import LockNotOwnedError
from redis.lock import Lock

from workers.elastic.redis_io import write_if


class ScriptlessLock(Lock):
    """redis-py's lock, released by a transaction instead of a script."""

    def do_release(self, expected_token: str) -> None:
        """Delete the lock if it still holds our token (else it expired: not ours)."""
        name = str(self.name)
        if not write_if(self.redis, name, expected_token, lambda tx: tx.delete(name)):
            raise LockNotOwnedError("Cannot release a lock that's no longer owned", lock_name=name)


class ScriptlessRedis(redis.Redis):
    """A redis-py client whose locks are ``ScriptlessLock`` unless told otherwise."""

    def lock(
        self,
        name: str,
        timeout: float | None = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        lock_class: type[Lock] | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
    ) -> Lock:
        """``redis.Redis.lock`` with ``ScriptlessLock`` as the default class."""
        made: Lock = (lock_class or ScriptlessLock)(
            self, name, timeout=timeout, sleep=sleep, blocking=blocking,
            blocking_timeout=blocking_timeout, thread_local=thread_local,
            raise_on_release_error=raise_on_release_error,
        )  # fmt: skip
        return made


class Channel(kombu_redis.Channel):
    """kombu's Redis channel on a ``ScriptlessRedis`` client."""

    def _get_client(self) -> type[redis.Redis]:
        if self.global_keyprefix:
            raise ValueError("the scriptless transport does not support global_keyprefix")
        super()._get_client()  # type: ignore[no-untyped-call]  # kombu's redis-py version check
        return ScriptlessRedis


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with ``Channel`` above."""

    Channel = Channel
