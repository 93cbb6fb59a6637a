"""Serializers of inventory's API."""

from __future__ import annotations

from rest_framework import serializers


class SuspectGpuSerializer(serializers.Serializer[object]):
    """One GPU in its cool-down: where, since and until when, why, who marked it, whose job."""

    gpu = serializers.IntegerField(help_text="Global GPU id in the fabric.")
    node = serializers.CharField(help_text="The agent node of its server.")
    local = serializers.IntegerField(help_text="Device index on its server.")
    since = serializers.DateTimeField(allow_null=True)
    until = serializers.DateTimeField(help_text="No new placement lands on it before then.")
    reason = serializers.CharField()
    by = serializers.CharField(help_text="Who marked it.")
    job = serializers.IntegerField(allow_null=True, help_text="The job whose worker was slow.")


class GpuRowSerializer(serializers.Serializer[object]):
    """One GPU of a server: its ids, whether it is suspect, its health (null: not reported)."""

    index = serializers.IntegerField()
    local = serializers.IntegerField()
    uuid = serializers.CharField(allow_blank=True)
    suspect = serializers.BooleanField()
    health = serializers.DictField(allow_null=True)


class ServerRowSerializer(serializers.Serializer[object]):
    """A server: position, type, pool, state and why, health, GPUs."""

    id = serializers.IntegerField()
    node = serializers.CharField()
    leaf = serializers.IntegerField()
    slot = serializers.IntegerField()
    state = serializers.CharField()
    state_reason = serializers.CharField(allow_blank=True)
    gpu_type = serializers.CharField()
    gpu_model = serializers.CharField(allow_blank=True)
    gpu_memory_mib = serializers.IntegerField()
    gpu_count = serializers.IntegerField()
    cpu_cores = serializers.IntegerField()
    memory_mib = serializers.IntegerField()
    labels = serializers.DictField(child=serializers.CharField())
    pool = serializers.CharField(allow_blank=True)
    health = serializers.CharField(help_text="ok, unhealthy or not reported")
    last_heartbeat = serializers.DateTimeField(allow_null=True)
    gpus = GpuRowSerializer(many=True)


class PendingServerSerializer(serializers.Serializer[object]):
    """A server that reported itself and waits for an admin."""

    id = serializers.IntegerField()
    node = serializers.CharField()
    gpus = serializers.IntegerField()
    gpu_model = serializers.CharField()
    gpu_source = serializers.CharField(help_text="nvml, torch or none")
    cpu_cores = serializers.IntegerField()
    memory_mib = serializers.IntegerField()
    first_seen = serializers.DateTimeField()
    last_seen = serializers.DateTimeField()
    forgotten_at = serializers.DateTimeField(
        allow_null=True, help_text="When an admin forgot it before it reported again (or null)."
    )
    forgotten_by = serializers.CharField(allow_blank=True)
    note = serializers.CharField(allow_blank=True, help_text="Says so when it was forgotten.")


class AcceptServerSerializer(serializers.Serializer[object]):
    """Where and as what to accept a pending server."""

    leaf = serializers.IntegerField()
    slot = serializers.IntegerField(required=False, help_text="Default: the leaf's first free.")
    gpu_type = serializers.CharField(required=False, help_text="Type slug; default 'default'.")
    labels = serializers.DictField(child=serializers.CharField(), required=False)


class ServerTypeSerializer(serializers.Serializer[object]):
    """A server's GPU type and labels (its pool among them), set by an admin."""

    gpu_type = serializers.CharField(
        required=False, help_text="Type slug, e.g. h100-80g (default: kept)."
    )
    labels = serializers.DictField(
        child=serializers.CharField(),
        required=False,
        help_text="Replace its labels (default: kept).",
    )
