"""Sweeps from the command line: the sweep file, the ``/api/v1/sweeps/`` calls and what
``portalctl sweep ...`` prints (the click commands are in ``portalctl.cli``).

A sweep file is a job file (``portalctl.jobfile``: the trials' program, GPUs,
env...) with the search beside it::

    name: lr-search
    code: .
    entrypoint: train.py
    launcher: edl
    gpus: 1
    search_space:
      lr: {type: loguniform, low: 1.0e-4, high: 0.1}
      width: {type: grid, values: [64, 128]}
    metric: val_loss
    mode: min                 # or max
    strategy: asha            # grid | random | asha
    eta: 3
    min_steps: 100
    max_steps: 2700
    max_trials: 27
    max_gpu_hours: 10         # optional
    max_running: 8            # optional
    seed: 0
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from portalctl.client import Client
from portalctl.jobfile import JobFileError, job_fields, load_fields_file, read_yaml
from portalctl.sweep_fields import SWEEP_FIELDS

TRIAL_COLUMNS = ("trial", "params", "status", "rung", "metric", "job", "GPUs", "why")


def parse_sweep_file(text: str, *, source: str = "sweep file") -> dict[str, Any]:
    """The submission fields of a sweep file's text: a job file's plus the search."""
    data = read_yaml(text, source=source)
    if not isinstance(data, dict):
        raise JobFileError(f"{source}: expected a mapping of sweep fields")
    search = {key: data.pop(key) for key in SWEEP_FIELDS if key in data}
    if not isinstance(search.get("search_space"), dict):
        raise JobFileError(f"{source}: search_space must be a mapping of hyperparameters")
    return {**job_fields(data, source=source), **search}


def load_sweep_file(path: str | Path) -> dict[str, Any]:
    """Read and parse a sweep file; a relative ``code`` path becomes relative to the file."""
    return load_fields_file(path, lambda text, source: parse_sweep_file(text, source=source))


class SweepsAPI:
    """``/api/v1/sweeps/`` over a :class:`~portalctl.client.Client`; answers as the API's JSON."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def create(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """Start a sweep; the sweep with its first trials."""
        return dict(self._client.json("POST", "/api/v1/sweeps/", json=dict(fields)))

    def get(self, sweep_id: int) -> dict[str, Any]:
        """One sweep, its trials and its best trial."""
        return dict(self._client.json("GET", f"/api/v1/sweeps/{int(sweep_id)}/"))

    def list(self) -> list[dict[str, Any]]:
        """The caller's sweeps, newest first."""
        return [dict(item) for item in self._client.pages("/api/v1/sweeps/")]

    def cancel(self, sweep_id: int, reason: str = "") -> dict[str, Any]:
        """Cancel the sweep and its running trials."""
        body = {"reason": reason} if reason else {}
        path = f"/api/v1/sweeps/{int(sweep_id)}/cancel/"
        return dict(self._client.json("POST", path, json=body))


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def summary(sweep: Mapping[str, Any]) -> str:
    """One line: id, name, strategy, metric and state (and the best trial once known)."""
    line = (
        f"sweep {sweep['id']} ({sweep['name']}): {sweep['strategy']}, "
        f"{sweep['mode']} {sweep['metric']}, {sweep['max_trials']} trials: {sweep['state']}"
    )
    best = sweep.get("best")
    if best:
        params = ", ".join(f"{k}={_value(v)}" for k, v in best["params"].items())
        line += (
            f"; best trial {best['index']} ({params}) {sweep['metric']}={_value(best['metric'])}"
        )
    return line


def trial_rows(sweep: Mapping[str, Any]) -> list[list[Any]]:
    """The trials as rows of :data:`TRIAL_COLUMNS`."""
    return [
        [
            t["index"],
            " ".join(f"{k}={_value(v)}" for k, v in t["params"].items()),
            t["status"],
            t["rung"],
            "" if t["metric"] is None else _value(t["metric"]),
            t["job"] or "",
            t["gpus"],
            t["reason"],
        ]
        for t in sweep.get("trials", [])
    ]


def list_rows(sweeps: list[dict[str, Any]]) -> list[list[Any]]:
    """Sweeps as rows of id, name, strategy, metric, state."""
    return [
        [s["id"], s["name"], s["strategy"], f"{s['mode']} {s['metric']}", s["state"]]
        for s in sweeps
    ]
