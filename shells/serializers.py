"""The API's view of a shell."""

from __future__ import annotations

from rest_framework import serializers

from shells.models import Shell


class ShellSerializer(serializers.ModelSerializer[Shell]):
    """A shell: whose, where, when, and how it ended (``closed_at`` null: open)."""

    user = serializers.CharField(source="user.username", read_only=True)
    tenant = serializers.CharField(source="tenant.slug", read_only=True)
    closed_by = serializers.CharField(source="closed_by.username", read_only=True, default=None)

    class Meta:
        model = Shell
        fields = [
            "id", "tenant", "job", "user", "node", "worker_id", "argv", "opened_at",
            "closed_at", "exit_code", "bytes_in", "bytes_out", "close_reason", "closed_by",
        ]  # fmt: skip
        read_only_fields = fields
