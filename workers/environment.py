"""A job's own Python dependencies: what it may ask for, checked, and the key of what it gets.

Shared by the portal (a bad ``environment`` is a 400 naming the field) and
the agent (which builds it: ``workers.agent.environments``), so one rule
decides.  A job asks in its ``environment`` field::

    {"requirements": ["einops==0.8.1", "tqdm>=4"], "python": "3.11", "replace": []}

or ships them in its bundle: a ``uv.lock`` (its index packages, pinned
exactly: ``uv_lock_pins``), else ``requirements.txt``, else the ``[project]``
``dependencies`` of a ``pyproject.toml`` (``bundle_requirements``); the
field's requirements come after the bundle's.

**What a requirement may be**: a PEP 508 requirement naming a package of the
operator's index (``name``, extras, version specifiers, markers).  Never an
option (``-e``, ``-r``, ``--index-url``, ``--extra-index-url``, ``-f``...:
the index and its credentials are the operator's), a path, or a direct
reference (``name @ https://...``): nothing reaches a node that the
operator's index did not serve.

**Extra indexes** (``indexes``, where the operator allows a job its own: the
portal's ``ENVIRONMENT_ALLOW_JOB_INDEX``): at most ``MAX_INDEXES`` plain
``https://`` URLs of a named host, with no credentials (``user:pw@``), query
or fragment: credentials never come from a job.  They are part of the
request, so of its key; a request without them stores no ``indexes`` key,
so its field and its key are what they were before indexes existed.

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
from urllib.parse import urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from workers.program import ProgramError

MAX_REQUIREMENTS = 200
MAX_REQUIREMENT_CHARS = 400
MAX_FILE_BYTES = 256 * 1024
PYTHON_VERSION = re.compile(r"3\.\d{1,2}")
MAX_INDEXES = 3
MAX_INDEX_CHARS = 400
BUNDLE_FILES = ("uv.lock", "requirements.txt", "pyproject.toml")
"""Where a bundle declares its dependencies, read in this order (the first found wins:
a lock's exact pins over a requirements.txt over a pyproject.toml's ranges)."""
HOSTNAME = re.compile(
    r"(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]([a-z0-9-]{0,61}[a-z0-9])?"
)
"""A DNS name of at least two labels whose last (the top-level domain) starts with a
letter: no IP literal, no single-label name such as ``localhost``."""
URL_CHARACTERS = re.compile(r"[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]+")


@dataclass(frozen=True)
class EnvironmentSpec:
    """A job's checked request: requirements in order, the Python it expects, what it may replace."""

    requirements: tuple[str, ...] = ()
    python: str | None = None
    replace: tuple[str, ...] = field(default=())
    indexes: tuple[str, ...] = ()
    """Extra index URLs the job asks for besides the operator's (``check_index_url``)."""

    @property
    def empty(self) -> bool:
        """Whether the job asks for nothing beyond the node's base layer."""
        return not self.requirements

    def to_dict(self) -> dict[str, Any]:
        """The field as stored and sent to agents (``check_environment`` reads it back).

        ``indexes`` only when some are asked: a request without them keeps the
        field, and so the ``environment_key``, it had before indexes existed.
        """
        stored: dict[str, Any] = {
            "requirements": list(self.requirements),
            "python": self.python,
            "replace": list(self.replace),
        }
        if self.indexes:
            stored["indexes"] = list(self.indexes)
        return stored

    def as_field(self) -> dict[str, Any]:
        """The ``environment`` field a job stores and a start command carries: ``to_dict()``,
        or ``{}`` when nothing is asked beyond the base layer (an index alone is kept: it
        serves the bundle's requirements)."""
        return {} if self.empty and not self.indexes else self.to_dict()

    def with_bundle(self, bundled: Iterable[str]) -> EnvironmentSpec:
        """The bundle's requirements first, then the job's own."""
        merged = (*bundled, *self.requirements)
        _check_count(merged)
        return EnvironmentSpec(merged, self.python, self.replace, self.indexes)


def check_environment(raw: object) -> EnvironmentSpec:
    """The ``environment`` field of a job (``None`` or ``{}``: nothing asked), checked."""
    if raw is None:
        return EnvironmentSpec()
    if not isinstance(raw, Mapping):
        raise ProgramError(
            "environment", "must be an object with requirements, python, replace, indexes"
        )
    unknown = set(raw) - {"requirements", "python", "replace", "indexes"}
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
    indexes = raw.get("indexes") or []
    if not isinstance(indexes, list):
        raise ProgramError("environment.indexes", "must be a list of https:// URLs")
    if len(indexes) > MAX_INDEXES:
        raise ProgramError("environment.indexes", f"at most {MAX_INDEXES} extra indexes")
    checked = tuple(check_requirement(line) for line in requirements)
    _check_count(checked)
    names = tuple(sorted({_package_name(name, "environment.replace") for name in replace}))
    urls = tuple(dict.fromkeys(check_index_url(url) for url in indexes))
    return EnvironmentSpec(checked, python, names, urls)


def check_index_url(url: object, where: str = "environment.indexes") -> str:
    """One extra index a job asks for: a plain ``https://`` URL of a named host; else a
    ProgramError (which never repeats the URL: it may hold a password)."""
    if not isinstance(url, str):
        raise ProgramError(where, "must be a list of https:// URLs")
    if len(url) > MAX_INDEX_CHARS:
        raise ProgramError(where, f"an index URL longer than {MAX_INDEX_CHARS} characters")
    if not URL_CHARACTERS.fullmatch(url):
        raise ProgramError(where, "each must be one https:// URL, without spaces or controls")
    parts = urlsplit(url)
    if parts.scheme.lower() != "https":
        raise ProgramError(where, "each must be an https:// URL")
    if "@" in parts.netloc:
        raise ProgramError(
            where,
            "an index URL must not carry credentials (user:password@): credentials never "
            "come from a job; an index that needs them is the operator's to configure",
        )
    if parts.query or "?" in url:
        raise ProgramError(where, "an index URL must not have a query (?...)")
    if parts.fragment or "#" in url:
        raise ProgramError(where, "an index URL must not have a fragment (#...)")
    try:
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError:
        raise ProgramError(where, "an index URL's port must be a number") from None
    if not HOSTNAME.fullmatch(parts.hostname or ""):
        raise ProgramError(
            where, "an index URL must name its host by a DNS name (no IP, no bare name)"
        )
    return url


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


def uv_lock_pins(text: str, where: str = "uv.lock") -> tuple[str, ...]:
    """The exact pins of a ``uv.lock``: ``name==version`` for each package of an index.

    The project itself (``source = { editable = "." }`` or ``{ virtual = "." }``)
    is the bundle's own code: skipped.  A package from anywhere else (git, a
    path, a URL, a directory, another project) is refused: nothing reaches a
    node that the operator's index did not serve.  A lock that resolves one
    package to two versions (forks by marker) cannot become one pin each: refused.
    The lock's hashes are not carried: the operator's index is the trusted source.

    A package the lock reaches only through markers keeps them (``colorama==0.4.6;
    sys_platform == "win32"``: ``lock_markers``), so a Windows-only package is not
    installed on a Linux node.
    """
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProgramError(where, f"is not valid TOML: {exc}") from None
    if document.get("version") != 1:
        raise ProgramError(where, "is not a uv.lock of format version 1")
    packages = document.get("package", [])
    if not isinstance(packages, list) or not all(isinstance(p, dict) for p in packages):
        raise ProgramError(where, "its packages must be [[package]] tables")
    versions: dict[str, str] = {}
    projects: list[str] = []
    edges: dict[str, list[tuple[str, str | None]]] = {}
    for entry in packages:
        name, version, source = _locked_package(entry, where)
        edges.setdefault(name, []).extend(_locked_edges(entry, name, where))
        if source is None:
            projects.append(name)
            continue
        seen = versions.setdefault(name, version)
        if seen != version:
            raise ProgramError(
                where,
                f"holds two versions of {name} ({seen} and {version}, for different "
                "platforms or Pythons), which cannot both be pinned: list the requirements "
                "in requirements.txt instead",
            )
    _check_count(versions)
    markers = lock_markers(projects, edges)
    return tuple(
        check_requirement(_pin(name, version, markers.get(name)), where)
        for name, version in versions.items()
    )


LOCK_SOURCES = frozenset({"registry", "git", "path", "url", "directory", "editable", "virtual"})
"""The source kinds a ``uv.lock`` names (any other is named "unknown" when refused)."""
MAX_MARKER_TERMS = 4
"""A package reached by more alternative marker paths than this is installed everywhere."""


def _locked_package(entry: Mapping[str, Any], where: str) -> tuple[str, str, str | None]:
    """A ``[[package]]`` of a lock: its name, version and index (``None``: the project)."""
    name = entry.get("name")
    if not isinstance(name, str):
        raise ProgramError(where, "a [[package]] without a name")
    name = _package_name(name, where)
    source = entry.get("source")
    if not isinstance(source, dict) or len(source) != 1:
        raise ProgramError(where, f"package {name}: its source must be one {{ kind = ... }}")
    [(kind, value)] = source.items()
    if kind in ("editable", "virtual") and value == ".":
        return name, "", None
    if kind != "registry":
        named = kind if kind in LOCK_SOURCES else "unknown"
        raise ProgramError(
            where,
            f"package {name} comes from a {named} source: only packages from the operator's "
            "index are installed (lock it from the index, or leave it out)",
        )
    version = entry.get("version")
    if not isinstance(version, str):
        raise ProgramError(where, f"package {name}: a version is required")
    try:
        Version(version)
    except InvalidVersion:
        raise ProgramError(where, f"package {name}: {version[:40]!r} is not a version") from None
    return name, version, str(value)


def _locked_edges(entry: Mapping[str, Any], name: str, where: str) -> list[tuple[str, str | None]]:
    """What a locked package depends on, each with its edge's marker (``None``: always):
    its ``dependencies`` and, to install no less than the lock may need, every group of
    its ``optional-dependencies`` and ``dev-dependencies``."""
    lists = [entry.get("dependencies", [])]
    for table in ("optional-dependencies", "dev-dependencies"):
        groups = entry.get(table, {})
        if not isinstance(groups, dict):
            raise ProgramError(where, f"package {name}: {table} must be a table of lists")
        lists.extend(groups.values())
    edges: list[tuple[str, str | None]] = []
    for listed in lists:
        if not isinstance(listed, list):
            raise ProgramError(where, f"package {name}: its dependencies must be lists")
        for dependency in listed:
            target = dependency.get("name") if isinstance(dependency, dict) else None
            marker = dependency.get("marker") if isinstance(dependency, dict) else None
            if not isinstance(target, str) or not isinstance(marker, str | None):
                raise ProgramError(where, f"package {name}: a dependency without a name")
            edges.append((canonicalize_name(target), marker))
    return edges


def lock_markers(
    roots: Iterable[str], edges: Mapping[str, Iterable[tuple[str, str | None]]]
) -> dict[str, str | None]:
    """When each package of a lock is needed: the disjunction, over the paths from the
    project (``roots``) to it, of the markers of their edges; ``None`` (always) for a
    package reached without one, reached by more than ``MAX_MARKER_TERMS`` alternatives,
    or not reached at all.  An edge's marker on extras or groups counts as always (it
    has no meaning in a plain install), so no package is left out that the lock needs.
    """
    always: frozenset[str] = frozenset()
    need: dict[str, set[frozenset[str]]] = {root: {always} for root in roots}
    pending = list(need)
    while pending:
        parent = pending.pop()
        for child, marker in edges.get(parent, ()):
            term = frozenset() if marker is None or _names_extra(marker) else {marker}
            known = need.setdefault(child, set())
            before = set(known)
            for path in need[parent]:
                _add_term(known, path | term)
            if known != before:
                pending.append(child)
    return {
        name: None
        if always in terms
        else " or ".join(_conjunction(t) for t in sorted(terms, key=sorted))
        for name, terms in need.items()
    }


def _add_term(terms: set[frozenset[str]], term: frozenset[str]) -> None:
    """Add a conjunction to a disjunction, keeping it minimal; too many: always."""
    if any(known <= term for known in terms):
        return
    terms.difference_update({known for known in terms if term <= known})
    terms.add(term)
    if len(terms) > MAX_MARKER_TERMS:
        terms.clear()
        terms.add(frozenset())


def _names_extra(marker: str) -> bool:
    """Whether a lock's edge marker speaks of extras or groups (uv's conflict markers)."""
    return re.search(r"\b(extra|group)\b", marker) is not None


def _conjunction(term: frozenset[str]) -> str:
    """One path's markers, all needed, as PEP 508 text that may stand in an ``or``."""
    parts = sorted(term)
    if len(parts) == 1:
        return parts[0] if " or " not in parts[0] else f"({parts[0]})"
    return "(" + " and ".join(f"({part})" for part in parts) + ")"


def _pin(name: str, version: str, marker: str | None) -> str:
    """``name==version``, with the marker under which the lock needs it when that fits."""
    pin = f"{name}=={version}"
    if marker is None or len(pin) + len(marker) + 2 > MAX_REQUIREMENT_CHARS:
        return pin
    return f"{pin}; {marker}"


_BUNDLE_READERS = {
    "uv.lock": uv_lock_pins,
    "requirements.txt": requirements_txt,
    "pyproject.toml": pyproject_dependencies,
}


def bundle_requirements(files: Mapping[str, bytes]) -> tuple[str, ...]:
    """What a bundle declares, from its top-level files (name → contents; the first of
    ``BUNDLE_FILES`` it has)."""
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
        return _BUNDLE_READERS[name](text, name)
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
