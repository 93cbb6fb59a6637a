"""``manage.py loadtopology SPEC.json``: make the inventory match a fabric spec (idempotent)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.context import acting_as, system_actor
from inventory.limits import TopologyLimits, TopologyTooLarge, check_document_size
from inventory.services import InventoryError, do_load_topology
from utilities.bounded_json import JsonRefused, loads


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
        limits = TopologyLimits.from_settings()
        try:
            with path.open("rb") as spec_file:
                raw = spec_file.read(limits.document_bytes + 1)
            check_document_size(len(raw), limits)
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
        except TopologyTooLarge as exc:
            raise CommandError(f"{path}: {exc}") from None
        try:
            data = loads(raw) if path.suffix == ".json" else yaml.safe_load(raw)
        except (JsonRefused, yaml.YAMLError) as exc:
            raise CommandError(f"{path} is not valid JSON/YAML: {exc}") from None
        except RecursionError:  # PyYAML composes nested nodes recursively
            raise CommandError(f"{path} is nested too deeply") from None
        try:
            with acting_as(system_actor("manage.py loadtopology")):
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
