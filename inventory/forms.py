"""Forms of the admin topology editor; the rules themselves live in ``inventory.services``."""

from __future__ import annotations

from typing import Any

from django import forms

from inventory.limits import TopologyLimits, TopologyTooLarge, check_document_size
from utilities.bounded_json import JsonRefused, loads

GENERATOR_FIELDS = ("leaves", "spines", "servers_per_leaf", "gpus_per_server", "link_gbps")
# Words in the inventory's messages that point at one generator field.
_FIELD_HINTS = (
    ("servers_per_leaf", "servers_per_leaf"),
    ("gpus_per_server", "gpus_per_server"),
    ("uplinks", "spines"),
    ("spines", "spines"),
    ("leaves", "leaves"),
    ("link_gbps", "link_gbps"),
    ("bandwidth", "link_gbps"),
)


def field_for_message(message: str) -> str | None:
    """The generator field an inventory error is about, or None for a form-wide error."""
    lowered = message.lower()
    for hint, field in _FIELD_HINTS:
        if hint in lowered:
            return field
    return None


class GeneratorForm(forms.Form):
    """A uniform leaf-spine fabric from its four sizes."""

    leaves = forms.IntegerField(min_value=1, max_value=512, initial=4)
    spines = forms.IntegerField(min_value=1, max_value=512, initial=4)
    servers_per_leaf = forms.IntegerField(
        min_value=1, max_value=64, initial=2, label="Servers/leaf"
    )
    gpus_per_server = forms.IntegerField(min_value=1, max_value=16, initial=2, label="GPUs/server")
    link_gbps = forms.FloatField(min_value=0.001, initial=100.0, label="Link Gb/s")

    def spec(self) -> dict[str, Any]:
        """The topology document to load."""
        return {name: self.cleaned_data[name] for name in GENERATOR_FIELDS}


class ImportForm(forms.Form):
    """A topology document (the format ``loadtopology`` and Export use), pasted or uploaded."""

    document = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}),
        label="JSON spec",
        help_text='e.g. {"leaves": 2, "spines": 2, "servers_per_leaf": 2, "gpus_per_server": 2}',
    )
    upload = forms.FileField(required=False, label="or a file")

    def clean(self) -> dict[str, Any]:
        """Parse the document within bounds (size, nesting, numbers) into ``data``."""
        cleaned = super().clean() or {}
        limits = TopologyLimits.from_settings()
        upload = cleaned.get("upload")
        target = "upload" if upload is not None else "document"
        raw: bytes = (
            upload.read(limits.document_bytes + 1)
            if upload is not None
            else (cleaned.get("document") or "").encode()
        )
        try:
            check_document_size(len(raw), limits)
        except TopologyTooLarge as exc:
            self.add_error(target, f"{str(exc).capitalize()}.")
            return cleaned
        if not raw.strip():
            self.add_error("document", "Paste a JSON spec or choose a file.")
            return cleaned
        try:
            cleaned["data"] = loads(raw)
        except JsonRefused as exc:
            message = exc.message if exc.field is None else f"{exc.field}: {exc.message}"
            self.add_error(target, message)
        return cleaned


class ServerForm(forms.Form):
    """A new server at a free position of the fabric, of a GPU type, in a pool."""

    leaf = forms.IntegerField(min_value=0)
    slot = forms.IntegerField(min_value=0)
    node = forms.CharField(max_length=64, label="Node name")
    gpu_type = forms.CharField(
        max_length=32, required=False, label="GPU type", help_text="Empty: default."
    )
    pool = forms.CharField(max_length=63, required=False, help_text="The server's pool label.")

    def add_fields(self) -> dict[str, Any]:
        """The keyword arguments of ``inventory.services.do_add_server``."""
        data = self.cleaned_data
        pool = data.get("pool") or ""
        return {
            "leaf": data["leaf"],
            "slot": data["slot"],
            "node": data["node"],
            "gpu_type": data.get("gpu_type") or None,
            "labels": {"pool": pool} if pool else {},
        }


SERVER_ACTIONS = {"drain": "draining", "undrain": "up", "down": "down"}
"""The topology page's server buttons: action → state (the reason names who: the service)."""


class AcceptForm(forms.Form):
    """Accept a pending server onto a leaf (its first free slot unless one is named)."""

    pending = forms.IntegerField(widget=forms.HiddenInput)
    leaf = forms.IntegerField(min_value=0)
    slot = forms.IntegerField(min_value=0, required=False, help_text="Empty: the first free.")
    gpu_type = forms.CharField(max_length=32, required=False, label="GPU type", initial="default")
    pool = forms.CharField(max_length=63, required=False, help_text="The server's pool label.")

    def accept_fields(self) -> dict[str, Any]:
        """The keyword arguments of ``inventory.registration.do_accept_server``."""
        data = self.cleaned_data
        pool = data.get("pool") or ""
        return {
            "pending": data["pending"],
            "leaf": data["leaf"],
            "slot": data.get("slot"),
            "gpu_type": data.get("gpu_type") or None,
            "labels": {"pool": pool} if pool else {},
        }


class RetypeForm(forms.Form):
    """A server's GPU type and pool, set in the topology editor (its other labels kept)."""

    node = forms.CharField(max_length=64, widget=forms.HiddenInput)
    gpu_type = forms.CharField(max_length=32, required=False, label="GPU type")
    pool = forms.CharField(max_length=63, required=False, help_text="Empty: no pool.")

    def retype_fields(self, labels: Any) -> dict[str, Any]:
        """The keyword arguments of ``inventory.services.do_set_server_type``, given the
        server's current ``labels``: its pool label set (or removed when empty)."""
        data = self.cleaned_data
        kept = {k: v for k, v in (labels or {}).items() if k != "pool"}
        pool = data.get("pool") or ""
        return {
            "node": data["node"],
            "gpu_type": data.get("gpu_type") or None,
            "labels": kept | ({"pool": pool} if pool else {}),
        }
