"""What a node's environment cache holds, as one bounded report for the control plane.

::

    EnvironmentCache.entries()        (key, bytes, last use), least recently used first
      + <root>/<key>/manifest.json    requirements, packages, build_s, built_at
      + keys the node's workers use   (WorkerRecord.environment)
      ──▶ EnvironmentCacheReport      most recently used first, cut to the protocol's bounds

The agent reports at start and then every ``REPORT_EVERY_S``, in a thread of
its own, never on a heartbeat.  A complete environment is read-only, so its
tree is walked once: later reports take its size from the cache's memory
(``EnvironmentCache.entries``) and read only its manifest.  The manifest is
the agent's own file, yet it is read at most ``MANIFEST_MAX_BYTES`` and every
field is checked: a damaged one costs its entry's details, never the report.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Collection
from pathlib import Path
from typing import Any

from workers.agent.environments import EnvironmentCache
from workers.environment import MAX_REQUIREMENT_CHARS, MAX_REQUIREMENTS
from workers.protocol import (
    MAX_BUILD_S,
    MAX_CACHE_BYTES,
    MAX_CACHE_ENTRIES,
    MAX_CACHE_REPORT_CHARS,
    MAX_ENVIRONMENT_PACKAGES,
    MAX_PACKAGE_CHARS,
    CachedEnvironment,
    EnvironmentCacheReport,
)

log = logging.getLogger(__name__)

MANIFEST_MAX_BYTES = 1024 * 1024
"""The most of one manifest read (a manifest lists at most a thousand pins)."""

REPORT_EVERY_S = 60.0
"""How often an agent reports its cache (``Agent.report_environments``), the first at start."""


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of an environment's ``directory``; {} when it cannot be read as one."""
    try:
        with open(directory / "manifest.json", "rb") as handle:
            raw = handle.read(MANIFEST_MAX_BYTES + 1)
    except OSError:
        return {}
    if len(raw) > MANIFEST_MAX_BYTES:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _texts(raw: Any, most: int, chars: int) -> list[str]:
    """The strings of a manifest list that the protocol can carry, in order, at most ``most``."""
    if not isinstance(raw, list):
        return []
    return [item for item in raw if isinstance(item, str) and len(item) <= chars][:most]


def _number(raw: Any, low: float, high: float) -> float | None:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None
    return float(raw) if math.isfinite(raw) and low <= raw <= high else None


def cached_environment(
    key: str, size: int, last_used: float, manifest: dict[str, Any], *, in_use: bool, budget: int
) -> CachedEnvironment:
    """One entry of the report; its package and requirement text kept within ``budget`` chars."""
    packages = _texts(manifest.get("packages"), MAX_ENVIRONMENT_PACKAGES, MAX_PACKAGE_CHARS)
    requirements = _texts(manifest.get("requirements"), MAX_REQUIREMENTS, MAX_REQUIREMENT_CHARS)
    kept_requirements: list[str] = []
    for requirement in requirements:  # what was asked first: it is what an admin recognises
        if len(requirement) > budget:
            break
        kept_requirements.append(requirement)
        budget -= len(requirement)
    kept_packages: list[str] = []
    for package in packages:
        if len(package) > budget:
            break
        kept_packages.append(package)
        budget -= len(package)
    return CachedEnvironment(
        key=key,
        size_bytes=min(max(0, size), MAX_CACHE_BYTES),
        last_used=max(0.0, last_used),
        in_use=in_use,
        packages=tuple(kept_packages),
        requirements=tuple(kept_requirements),
        packages_omitted=len(packages) - len(kept_packages),
        built_at=_number(manifest.get("built_at"), 0.0, 2.0**40),
        build_s=_number(manifest.get("build_s"), 0.0, MAX_BUILD_S),
    )


def cache_report(
    node: str, cache: EnvironmentCache, in_use: Collection[str]
) -> EnvironmentCacheReport:
    """The report of ``cache`` on ``node``; ``in_use``: the keys its workers run in.

    Walks every entry (``EnvironmentCache.entries``): call it outside the agent's lock.
    """
    entries = cache.entries()
    total = sum(size for _, size, _ in entries)
    listed: list[CachedEnvironment] = []
    budget = MAX_CACHE_REPORT_CHARS
    for key, size, last_used in reversed(entries[-MAX_CACHE_ENTRIES:]):  # most recent first
        directory = cache.ready(key)
        manifest = read_manifest(directory) if directory is not None else {}
        entry = cached_environment(
            key, size, last_used, manifest, in_use=key in in_use, budget=budget
        )
        budget -= entry.text_chars
        listed.append(entry)
    return EnvironmentCacheReport(
        node=node,
        max_bytes=min(max(0, cache.settings.max_bytes), MAX_CACHE_BYTES),
        total_bytes=min(total, MAX_CACHE_BYTES),
        entries=tuple(listed),
        omitted=len(entries) - len(listed),
    )
