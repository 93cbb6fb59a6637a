"""Job files: a YAML mapping with the API's job fields (``POST /api/v1/jobs/``).

::

    name: ddp
    code: .                       # a directory, an archive or a bundle id
    entrypoint: train.py --epochs 4
    launcher: torchrun
    gpus: 2
    min_gpus: 1
    max_gpus: 4
    env: {WANDB_MODE: offline}
    after: ok:12,any:array:5      # or the API's list: [{kind: after_ok, job: 12}]
    environment:                  # Python packages beyond the node's torch and edl
      requirements: [einops==0.8.1, "tqdm>=4"]
      indexes: [https://pypi.example.org/simple]   # where the operator allows it

A key the API does not know is an error that names it; ``code`` given as a
relative path is relative to the file.  ``environment`` goes to the API as
written (the server checks it: ``requirements``, ``python``, ``replace``,
``indexes``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

JOB_FILE_FIELDS = (
    "name",
    "workload",
    "args",
    "gpus",
    "min_gpus",
    "max_gpus",
    "batch_size",
    "priority",
    "recovery",
    "checkpoint_interval",
    "max_restarts",
    "max_runtime_s",
    "gpu_types",
    "node_selector",
    "cpus_per_gpu",
    "mem_per_gpu_mib",
    "code",
    "entrypoint",
    "launcher",
    "env",
    "environment",
    "after",
    "resume_from",
    "tenant",
)
"""The fields of a submission (the schema's ``JobCreate``; a test compares them)."""

_MAPPINGS = ("args", "env", "environment", "node_selector")
_MEMORY_UNITS = {"": 1, "M": 1, "MI": 1, "MIB": 1, "G": 1024, "GI": 1024, "GIB": 1024}
_MEMORY_UNITS |= {"T": 1024 * 1024, "TI": 1024 * 1024, "TIB": 1024 * 1024}


class JobFileError(ValueError):
    """A job file that cannot be used, with the reason."""


def read_yaml(text: str, *, source: str) -> Any:
    """A job or sweep file's text as YAML data; invalid YAML is a :class:`JobFileError`."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise JobFileError(f"{source}: not valid YAML ({exc})") from None


def parse_job_file(text: str, *, source: str = "job file") -> dict[str, Any]:
    """The submission fields of a job file's text."""
    data = read_yaml(text, source=source)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise JobFileError(f"{source}: expected a mapping of job fields")
    return job_fields(data, source=source)


def job_fields(data: dict[Any, Any], *, source: str) -> dict[str, Any]:
    """A job file's mapping checked (known keys; ``args``, ``env``, ``environment`` are
    mappings) with ``env``'s values as strings: the submission's job fields."""
    unknown = sorted(str(key) for key in data if key not in JOB_FILE_FIELDS)
    if unknown:
        raise JobFileError(
            f"{source}: unknown key(s) {', '.join(unknown)} (known: {', '.join(JOB_FILE_FIELDS)})"
        )
    for key in _MAPPINGS:
        if key in data and not isinstance(data[key], dict):
            raise JobFileError(f"{source}: {key} must be a mapping")
    fields = {str(key): value for key, value in data.items()}
    if "env" in fields:
        fields["env"] = {str(k): "" if v is None else str(v) for k, v in fields["env"].items()}
    return fields


def load_fields_file(
    path: str | Path, parse: Callable[[str, str], dict[str, Any]]
) -> dict[str, Any]:
    """Read a job or sweep file and ``parse(text, source)`` it; a relative ``code`` path
    becomes relative to the file."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise JobFileError(f"{file}: {exc.strerror or exc}") from None
    fields = parse(text, str(file))
    code = fields.get("code")
    if isinstance(code, str) and (file.parent / code).exists():
        fields["code"] = str(file.parent / code)
    return fields


def load_job_file(path: str | Path) -> dict[str, Any]:
    """Read and parse a job file; a relative ``code`` path becomes relative to the file."""
    return load_fields_file(path, lambda text, source: parse_job_file(text, source=source))


def parse_memory_mib(text: str) -> int:
    """``"16G"``, ``"512M"``, ``"1T"`` (binary units; a bare number is MiB) -> MiB;
    ValueError naming the text otherwise."""
    stripped = text.strip().upper()
    digits = stripped.rstrip("MGTIB")
    unit = stripped[len(digits) :]
    if not digits.isdigit() or unit not in _MEMORY_UNITS:
        raise ValueError(f"bad memory size {text!r} (use e.g. 16G, 512M or a number of MiB)")
    return int(digits) * _MEMORY_UNITS[unit]


def parse_selector_flags(pairs: tuple[str, ...]) -> dict[str, str]:
    """``("pool=train", "rack=r12,nvlink=true")`` -> labels; ValueError on a pair
    without ``=`` (the server checks the labels themselves)."""
    labels: dict[str, str] = {}
    for part in (p.strip() for pair in pairs for p in pair.split(",")):
        if not part:
            continue
        label, sep, value = part.partition("=")
        if not sep or not label.strip():
            raise ValueError(f"bad selector {part!r} (use label=value, e.g. pool=train)")
        labels[label.strip()] = value.strip()
    return labels


def resource_fields(
    gpu_type: str | None, selector: tuple[str, ...], cpus: int | None, mem: str | None
) -> dict[str, Any]:
    """The submission fields of ``--gpu-type T[,T2] --selector k=v --cpus N --mem 16G``
    (only those given); ValueError on a bad selector or memory size."""
    fields: dict[str, Any] = {}
    if gpu_type:
        fields["gpu_types"] = [t.strip() for t in gpu_type.split(",") if t.strip()]
    if selector:
        fields["node_selector"] = parse_selector_flags(selector)
    if cpus is not None:
        fields["cpus_per_gpu"] = cpus
    if mem is not None:
        fields["mem_per_gpu_mib"] = parse_memory_mib(mem)
    return fields
