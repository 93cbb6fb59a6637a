"""Redis key names of one elastic job: every key lives under ``edl:{job_id}:``.

One module owns the layout so that the runtime, the control API and the node
agent agree on it, and ``cleanup()`` can delete everything a job wrote.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JobKeys:
    """The key names of one job."""

    job_id: str

    @property
    def prefix(self) -> str:
        return f"edl:{self.job_id}:"

    def k(self, *parts: object) -> str:
        """A key under the job's prefix, parts joined by ':'."""
        return self.prefix + ":".join(str(p) for p in parts)

    # leader lease: value = worker id of the leader, set NX with an expiry, refreshed
    @property
    def leader(self) -> str:
        return self.k("leader")

    # hash of job metadata kept by the leader (status, generation, members, ...)
    @property
    def meta(self) -> str:
        return self.k("meta")

    # stream of runtime events for the agent / portal
    @property
    def events(self) -> str:
        return self.k("events")

    # stream of control requests (scale-in, stop, migration, profile) for the leader
    @property
    def control(self) -> str:
        return self.k("control")

    # list: RPC requests to the leader (newcomer registration, ready notices)
    @property
    def rpc(self) -> str:
        return self.k("rpc")

    def reply(self, worker_id: str) -> str:
        """List: the leader's RPC replies to one worker."""
        return self.k("reply", worker_id)

    def ranks(self) -> str:
        """Hash: worker -> its rank in the allocation's order (``ranks.py``)."""
        return self.k("ranks")

    def alive(self, worker_id: str) -> str:
        """Per-worker liveness key with a short expiry, refreshed in the background."""
        return self.k("alive", worker_id)

    def plan(self, seq: int) -> str:
        """One published plan (JSON), addressed by its sequence number."""
        return self.k("plan", seq)

    @property
    def plan_seq(self) -> str:
        return self.k("planseq")

    @property
    def gen_counter(self) -> str:
        return self.k("gencounter")

    def ready(self, generation: int) -> str:
        """Set of workers whose process group of ``generation`` is built."""
        return self.k("ready", generation)

    def survivors(self, generation: int) -> str:
        """Hash worker -> last committed step, written by workers that saw ``generation`` fail."""
        return self.k("survivors", generation)

    def recovery(self, generation: int) -> str:
        """The recovery plan (JSON) after ``generation`` failed."""
        return self.k("recovery", generation)

    def handoff(self, generation: int) -> str:
        """The training state left by the last leader when every worker of a job moves."""
        return self.k("handoff", generation)

    def pauses(self, generation: int) -> str:
        """Hash worker -> seconds it stood still while switching to ``generation``."""
        return self.k("pauses", generation)

    def nudge(self, worker_id: str) -> str:
        """List of plan numbers a member should read now (a prepare plan: build ahead)."""
        return self.k("nudge", worker_id)

    def switch_profile(self, generation: int) -> str:
        """Hash worker -> JSON seconds of each part of its switch to ``generation``."""
        return self.k("switchprof", generation)

    @property
    def saved_at_end(self) -> str:
        """The step of rank 0's last checkpoint at the job's end (the leader waits for it)."""
        return self.k("savedatend")

    def store(self) -> str:
        """Prefix of the Redis-backed torch.distributed store."""
        return self.k("store") + ":"
