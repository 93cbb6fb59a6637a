"""``manage.py loadtopology SPEC.json``: make the inventory match a fabric spec (idempotent)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from django.core.management.base import BaseCommand, CommandError, CommandParser

from inventory.services import InventoryError, do_load_topology


class Command(BaseCommand):
    """Load or update the cluster's leaf-spine topology from a JSON or YAML file."""

    help = (
        "Create or update the fabric, servers and GPUs from SPEC (JSON or YAML: leaves, spines, "
        "servers_per_leaf, gpus_per_server, optional link_gbps and servers). Refuses changes "
        "that would orphan running jobs."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("spec", type=Path)

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["spec"]
        try:
            text = path.read_text()
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
        try:
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise CommandError(f"{path} is not valid JSON/YAML: {exc}") from None
        try:
            result = do_load_topology(data)
        except InventoryError as exc:
            raise CommandError(str(exc)) from None
        if result.unchanged:
            self.stdout.write("topology unchanged")
        else:
            verb = "created" if result.created else "updated"
            self.stdout.write(
                f"topology {verb}: {result.servers_added} servers added, "
                f"{result.servers_removed} removed"
            )
