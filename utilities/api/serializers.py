"""Serializer bases for every app's request bodies."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class StrictSerializer(serializers.Serializer[Any]):
    """A request body whose unknown keys are refused (a typo must not pass as "no change")."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Refuse keys that are not fields of this body."""
        unknown = sorted(set(self.initial_data) - set(self.fields)) if self.initial_data else []
        if unknown:
            names = ", ".join(str(k)[:50] for k in unknown[:5])
            raise serializers.ValidationError({"non_field_errors": [f"unknown field(s): {names}"]})
        return attrs
