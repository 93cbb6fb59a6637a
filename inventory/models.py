"""The cluster inventory: the leaf-spine fabric, its servers (one agent each) and their GPUs.

The fabric is uniform (see ``fabric.topology``)::

    spine 0 ... spine S-1
       \\  all leaf-spine cables  /
    leaf 0 ... leaf L-1              every GPU has its own NIC on its leaf
     server (leaf, slot) x servers_per_leaf, each with gpus_per_server GPUs

so leaves, spines and cables follow from one ``Fabric`` row; servers and GPUs
are rows because they come and go (added, removed, drained, down).  A GPU's
global id is ``leaf * gpus_per_leaf + slot * gpus_per_server + local`` — the
numbering the vClos allocator uses.
"""

from __future__ import annotations

from django.db import models

from fabric.topology import FabricSpec
from inventory.server_types import DEFAULT_GPU_TYPE


class Fabric(models.Model):
    """The one leaf-spine fabric of this cluster (a single row, pk=1)."""

    leaves = models.PositiveIntegerField()
    spines = models.PositiveIntegerField()
    servers_per_leaf = models.PositiveIntegerField()
    gpus_per_server = models.PositiveIntegerField()
    link_gbps = models.FloatField(default=100.0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "portal_fabric"  # moved from the portal app: same table, no data moved
        constraints = [models.CheckConstraint(condition=models.Q(pk=1), name="single_fabric")]

    def __str__(self) -> str:
        return (
            f"{self.leaves} leaves x {self.spines} spines, {self.servers_per_leaf} servers/leaf "
            f"x {self.gpus_per_server} GPUs"
        )

    def spec(self) -> FabricSpec:
        """The pure description that ``fabric`` and ``scheduler`` work on."""
        return FabricSpec(
            leaves=self.leaves,
            spines=self.spines,
            servers_per_leaf=self.servers_per_leaf,
            gpus_per_server=self.gpus_per_server,
            link_gbps=self.link_gbps,
        )


class ServerState(models.TextChoices):
    """Whether a server's GPUs may be given to jobs."""

    UP = "up", "Up"
    DRAINING = "draining", "Draining"  # running jobs migrate off; nothing new lands
    DOWN = "down", "Down"  # agent missed its heartbeats, or marked by an admin


class Server(models.Model):
    """A GPU server at position ``slot`` under ``leaf``, run by the agent named ``node``."""

    node = models.CharField(max_length=64, unique=True)
    leaf = models.PositiveIntegerField()
    slot = models.PositiveIntegerField()
    state = models.CharField(max_length=10, choices=ServerState.choices, default=ServerState.UP)
    state_reason = models.CharField(max_length=200, blank=True, default="")
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    agent_info = models.JSONField(default=dict, blank=True)
    # What the server is (typed resources): set by the topology, checked against what its
    # agent reports (``inventory.registration``).  0 / "" read as "not known".
    gpu_type = models.CharField(max_length=32, default=DEFAULT_GPU_TYPE, help_text="Type slug.")
    gpu_model = models.CharField(max_length=96, blank=True, default="")
    gpu_memory_mib = models.PositiveIntegerField(default=0)
    gpu_count = models.PositiveIntegerField(default=0)
    cpu_cores = models.PositiveIntegerField(default=0)
    memory_mib = models.PositiveBigIntegerField(default=0, help_text="Host memory.")
    labels = models.JSONField(default=dict, blank=True, help_text="Free-form text → text.")

    class Meta:
        db_table = "portal_server"  # moved from the portal app: same table, no data moved
        ordering = ["leaf", "slot"]
        constraints = [
            models.UniqueConstraint(fields=["leaf", "slot"], name="one_server_per_position")
        ]

    def __str__(self) -> str:
        return f"{self.node} (leaf {self.leaf}, slot {self.slot}, {self.state})"


class Gpu(models.Model):
    """One GPU (or, on a machine without GPUs, one CPU slot that stands in for it)."""

    index = models.PositiveIntegerField(unique=True, help_text="Global id in the fabric.")
    server = models.ForeignKey(Server, on_delete=models.CASCADE, related_name="gpu_set")
    local = models.PositiveIntegerField(help_text="Device index on its server.")
    # A suspect mark: a worker on this GPU was reported as a straggler. Until
    # ``suspect_until`` the tick gives the GPU to no new placement or scale-out (a job
    # already on it keeps it); the mark lapses by itself, no write needed. Kept after it
    # lapses (history; a new mark overwrites it), cleared by an admin.
    suspect_until = models.DateTimeField(
        null=True, blank=True, db_index=True, help_text="Not given to new placements until then."
    )
    suspect_since = models.DateTimeField(null=True, blank=True)
    suspect_reason = models.CharField(max_length=200, blank=True, default="")
    suspect_by = models.CharField(
        max_length=150, blank=True, default="", help_text="Who marked it (the system or a user)."
    )
    # The job whose worker was slow, by id: inventory sits below jobs and holds no key to it.
    suspect_job = models.PositiveIntegerField(null=True, blank=True)
    uuid = models.CharField(max_length=96, blank=True, default="", help_text="As NVML names it.")

    class Meta:
        db_table = "portal_gpu"  # moved from the portal app: same table, no data moved
        ordering = ["index"]
        constraints = [
            models.UniqueConstraint(fields=["server", "local"], name="one_gpu_per_device")
        ]

    def __str__(self) -> str:
        return f"gpu {self.index} ({self.server.node}:{self.local})"


class PendingServer(models.Model):
    """A server whose agent reported itself but that the inventory does not hold yet.

    It has no position and no GPU rows, so nothing is ever scheduled on it: an
    admin accepts it onto a leaf (``inventory.registration.do_accept_server``),
    which makes it a ``Server``, or forgets it (``do_forget_pending_server``).
    ``hardware`` is its latest hardware report.

    A forgotten row is kept, hidden, with when and by whom: an agent that is
    still running reports again, and its row comes back saying it was forgotten
    (``listed`` is the rule); one that stays silent stays hidden.
    """

    node = models.CharField(max_length=64, unique=True)
    hardware = models.JSONField(default=dict, blank=True)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()
    forgotten_at = models.DateTimeField(
        null=True, blank=True, help_text="When an admin last forgot it (hidden until it reports)."
    )
    forgotten_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        ordering = ["node"]

    def __str__(self) -> str:
        return f"{self.node} (pending)"

    @property
    def hidden(self) -> bool:
        """Forgotten and silent since: not listed, not to be accepted or forgotten again."""
        return self.forgotten_at is not None and self.last_seen <= self.forgotten_at

    @classmethod
    def listed(cls) -> models.QuerySet[PendingServer]:
        """The rows an admin sees: never forgotten, or reported again since forgotten."""
        return cls.objects.filter(
            models.Q(forgotten_at__isnull=True) | models.Q(last_seen__gt=models.F("forgotten_at"))
        )
