"""A job's own Python dependencies: what it may ask for, checked, and the key of what it gets.

Shared by the portal (a bad ``environment`` is a 400 naming the field) and
the agent (which builds it: ``workers.agent.environments``), so one rule
decides.  A job asks in its ``environment`` field::

    {"requirements": ["einops==0.8.1", "tqdm>=4"], "python": "3.11", "replace": []}

or ships them in its bundle: ``requirements.txt``, or the ``[project]``
``dependencies`` of a ``pyproject.toml`` (``bundle_requirements``); the
field's requirements come after the bundle's.

**What a requirement may be**: a PEP 508 requirement naming a package of the
operator's index (``name``, extras, version specifiers, markers).  Never an
option (``-e``, ``-r``, ``--index-url``, ``--extra-index-url``, ``-f``...:
the index and its credentials are the operator's), a path, or a direct
reference (``name @ https://...``): nothing reaches a node that the
operator's index did not serve.

**The base layer is the node's**: its interpreter, torch (the CUDA build on
GPU nodes) and the ``edl`` SDK.  A requirement that names a base package
with a specifier its installed version does not meet would replace it: it
is refused (``base_conflicts``), naming the package and both versions,
unless the job lists that package in ``replace``; one the base already
meets installs nothing.  ``python`` must be the node's ``major.minor``
when given (the agent says so otherwise).

``environment_key`` names the built environment: the hash of the normalised
request and of the base layer's fingerprint, so two jobs asking the same on
the same base share one build.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from workers.program import ProgramError

MAX_REQUIREMENTS = 200
MAX_REQUIREMENT_CHARS = 400
MAX_FILE_BYTES = 256 * 1024
PYTHON_VERSION = re.compile(r"3\.\d{1,2}")
BUNDLE_FILES = ("requirements.txt", "pyproject.toml")
"""Where a bundle declares its dependencies, read in this order (the first found wins)."""


@dataclass(frozen=True)
class EnvironmentSpec:
    """A job's checked request: requirements in order, the Python it expects, what it may replace."""

    requirements: tuple[str, ...] = ()
    python: str | None = None
    replace: tuple[str, ...] = field(default=())

    @property
    def empty(self) -> bool:
        """Whether the job asks for nothing beyond the node's base layer."""
        return not self.requirements

    def to_dict(self) -> dict[str, Any]:
        """The field as stored and sent to agents (``check_environment`` reads it back)."""
        return {
            "requirements": list(self.requirements),
            "python": self.python,
            "replace": list(self.replace),
        }

    def as_field(self) -> dict[str, Any]:
        """The ``environment`` field a job stores and a start command carries: ``to_dict()``,
        or ``{}`` when nothing is asked beyond the base layer."""
        return {} if self.empty else self.to_dict()

    def with_bundle(self, bundled: Iterable[str]) -> EnvironmentSpec:
        """The bundle's requirements first, then the job's own."""
        merged = (*bundled, *self.requirements)
        _check_count(merged)
        return EnvironmentSpec(merged, self.python, self.replace)


def check_environment(raw: object) -> EnvironmentSpec:
    """The ``environment`` field of a job (``None`` or ``{}``: nothing asked), checked."""
    if raw is None:
        return EnvironmentSpec()
    if not isinstance(raw, Mapping):
        raise ProgramError("environment", "must be an object with requirements, python, replace")
    unknown = set(raw) - {"requirements", "python", "replace"}
    if unknown:
        raise ProgramError("environment", f"unknown keys: {', '.join(sorted(map(str, unknown)))}")
    requirements = raw.get("requirements") or []
    if not isinstance(requirements, list) or not all(isinstance(r, str) for r in requirements):
        raise ProgramError("environment.requirements", "must be a list of strings")
    python = raw.get("python")
    if python is not None and (not isinstance(python, str) or not PYTHON_VERSION.fullmatch(python)):
        raise ProgramError("environment.python", "must be a Python version like '3.11'")
    replace = raw.get("replace") or []
    if not isinstance(replace, list) or not all(isinstance(r, str) for r in replace):
        raise ProgramError("environment.replace", "must be a list of package names")
    checked = tuple(check_requirement(line) for line in requirements)
    _check_count(checked)
    names = tuple(sorted({_package_name(name, "environment.replace") for name in replace}))
    return EnvironmentSpec(checked, python, names)


def check_requirement(line: str, where: str = "environment.requirements") -> str:
    """One PEP 508 requirement of the operator's index, normalised; else a ProgramError."""
    text = line.strip()
    if not text:
        raise ProgramError(where, "an empty requirement")
    if len(text) > MAX_REQUIREMENT_CHARS:
        raise ProgramError(where, f"a requirement longer than {MAX_REQUIREMENT_CHARS} characters")
    if text.startswith("-"):
        option = text.split()[0].split("=")[0]
        raise ProgramError(
            where,
            f"{option!r} is not allowed: packages come from the operator's index, "
            "name them only (e.g. 'einops==0.8.1')",
        )
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        raise ProgramError(where, f"{text!r} is not a requirement: {exc}") from None
    if requirement.url is not None:
        raise ProgramError(
            where,
            f"{requirement.name} @ ... is not allowed: packages come from the operator's index",
        )
    return str(requirement)


def requirements_txt(text: str, where: str = "requirements.txt") -> tuple[str, ...]:
    """The requirements of a ``requirements.txt``: comments, blank lines and line
    continuations handled; any option line (``-r``, ``-e``, ``--index-url``...) refused."""
    joined = re.sub(r"\\\r?\n", " ", text)
    out = []
    for raw in joined.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if line:
            out.append(check_requirement(line, where))
    _check_count(out)
    return tuple(out)


def pyproject_dependencies(text: str, where: str = "pyproject.toml") -> tuple[str, ...]:
    """The ``[project] dependencies`` of a ``pyproject.toml`` (nothing when it has none)."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProgramError(where, f"is not valid TOML: {exc}") from None
    project = document.get("project", {})
    dependencies = project.get("dependencies", []) if isinstance(project, dict) else []
    if not isinstance(dependencies, list) or not all(isinstance(d, str) for d in dependencies):
        raise ProgramError(where, "[project] dependencies must be a list of strings")
    checked = tuple(check_requirement(line, where) for line in dependencies)
    _check_count(checked)
    return checked


def bundle_requirements(files: Mapping[str, bytes]) -> tuple[str, ...]:
    """What a bundle declares, from its top-level files (name → contents; ``BUNDLE_FILES``)."""
    for name in BUNDLE_FILES:
        data = files.get(name)
        if data is None:
            continue
        if len(data) > MAX_FILE_BYTES:
            raise ProgramError(name, f"is larger than {MAX_FILE_BYTES // 1024} KiB")
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise ProgramError(name, "is not UTF-8 text") from None
        read = requirements_txt if name == "requirements.txt" else pyproject_dependencies
        return read(text, name)
    return ()


def base_conflicts(spec: EnvironmentSpec, base: Mapping[str, str]) -> list[str]:
    """Why each requirement that would replace a base package (name → installed version)
    is refused; empty when none would (or the job lists it in ``replace``)."""
    installed = {canonicalize_name(name): version for name, version in base.items()}
    problems = []
    for line in spec.requirements:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        if name not in installed or name in spec.replace or not requirement.specifier:
            continue
        try:
            version = Version(installed[name])
        except InvalidVersion:
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            problems.append(
                f"{line!r} would replace the node's {name} {installed[name]}: "
                f"jobs build on the node's {name}; drop the pin, or list "
                f"{name!r} in environment.replace to install another"
            )
    return problems


def environment_key(spec: EnvironmentSpec, base_fingerprint: str) -> str:
    """The cache key of the environment ``spec`` builds on a base layer (hex, 32 chars)."""
    document = json.dumps(
        {"spec": spec.to_dict(), "base": base_fingerprint}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(document.encode()).hexdigest()[:32]


def _package_name(name: str, where: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name):
        raise ProgramError(where, f"{name!r} is not a package name")
    return canonicalize_name(name)


def _check_count(requirements: Iterable[str]) -> None:
    if len(tuple(requirements)) > MAX_REQUIREMENTS:
        raise ProgramError(
            "environment.requirements", f"more than {MAX_REQUIREMENTS} requirements in all"
        )
