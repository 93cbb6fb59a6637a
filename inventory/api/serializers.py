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
