"""The control plane's app: the tick, the agents' reports and commands, the forecast."""

from django.apps import AppConfig


class ControlConfig(AppConfig):
    """App config for ``control`` (no models: it reads and writes ``jobs``' rows)."""

    name = "control"
