"""Checking the program half of a job submission: code bundle, entrypoint, launcher, env,
environment.

A job runs either a built-in ``workload`` or a tenant's ``code`` bundle. For a
bundle, the entrypoint must name a Python file that is in it, the launcher is
``edl`` or ``torchrun``, ``env`` holds only the user's own variables (the
rules of ``workers.program``), and ``environment`` the Python dependencies it
asks for beyond the node's base layer (the rule of ``workers.environment``,
which the agent applies again when it builds them).  Every refusal names its
field, down to the key: ``environment.requirements``.  A job's own package
indexes (``environment.indexes``) are refused unless the operator sets
``ENVIRONMENT_ALLOW_JOB_INDEX``.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.conf import settings

from bundles.models import CodeBundle
from tenancy.models import Tenant
from utilities.bounded_json import JsonRefused, loads
from workers.environment import EnvironmentSpec, check_environment
from workers.program import (
    ProgramError,
    check_code_id,
    check_env,
    check_launcher,
    entrypoint_kind,
    split_entrypoint,
)

PROGRAM_FIELDS = ("code", "entrypoint", "launcher", "env", "environment")

T = TypeVar("T")


@dataclass(frozen=True)
class ProgramSpec:
    """A checked program: the tenant's bundle, argv, launcher, variables and dependencies."""

    bundle: CodeBundle
    entrypoint: tuple[str, ...]
    launcher: str
    env: dict[str, str]
    environment: EnvironmentSpec = field(default_factory=EnvironmentSpec)

    @property
    def environment_field(self) -> dict[str, Any]:
        """The ``environment`` as the job stores it and agents receive it (``{}``: none asked)."""
        return self.environment.as_field()

    @property
    def entrypoint_text(self) -> str:
        """The entrypoint as one shell-quoted line (what the job shows)."""
        return shlex.join(self.entrypoint)


def wants_program(data: Mapping[str, Any]) -> bool:
    """Whether a submission asks for a code bundle rather than a built-in workload."""
    return any(data.get(name) not in (None, "") for name in ("code", "entrypoint"))


def check_program(
    tenant: Tenant, data: Mapping[str, Any], add_error: Callable[[str, str], None]
) -> ProgramSpec | None:
    """Check the program fields of ``data`` for ``tenant``; report each problem by field."""
    bundle = _bundle(tenant, data.get("code"), add_error)
    entrypoint = _checked(add_error, lambda: split_entrypoint(data.get("entrypoint") or ""))
    environment = _checked(add_error, lambda: _environment(bundle, data.get("environment")))
    if bundle is not None and entrypoint:
        problem = _entrypoint_problem(bundle, entrypoint, environment)
        if problem is not None:
            add_error("entrypoint", problem)
            entrypoint = None
    raw_launcher = data.get("launcher")
    launcher = None
    if not raw_launcher:
        add_error("launcher", "Required with code: 'edl' or 'torchrun'.")
    else:
        launcher = _checked(add_error, lambda: check_launcher(str(raw_launcher)))
    env = _checked(add_error, lambda: check_env(parse_env(data.get("env"))))
    if data.get("workload"):
        add_error("workload", "Give either a built-in workload or code, not both.")
    if data.get("args"):
        add_error("args", "A program takes its arguments in entrypoint.")
    if bundle is None or not entrypoint or launcher is None or env is None or environment is None:
        return None
    return ProgramSpec(
        bundle=bundle,
        entrypoint=entrypoint,
        launcher=launcher,
        env=env,
        environment=environment,
    )


def _entrypoint_problem(
    bundle: CodeBundle, entrypoint: tuple[str, ...], environment: EnvironmentSpec | None
) -> str | None:
    """Why the entrypoint cannot run from this bundle (None when it can): a script must be
    one of its files; a module its own, or of requirements; a console script needs
    requirements that may install it (the agent finds it in the built environment)."""
    files = {str(item.get("path")) for item in bundle.files}
    kind = entrypoint_kind(entrypoint)
    declared = bool(bundle.requirements) or (environment is not None and not environment.empty)
    if kind == "script" and entrypoint[0] not in files:
        return f"{entrypoint[0]!r} is not a file of bundle {bundle.sha256[:12]}."
    if kind == "module" and not declared:
        path = entrypoint[1].replace(".", "/")
        if not {f"{path}.py", f"{path}/__main__.py", f"{path}/__init__.py"} & files:
            return (
                f"Module {entrypoint[1]!r} is not in bundle {bundle.sha256[:12]}, and the job "
                "declares no requirements that could install it."
            )
    if kind == "command" and not declared:
        return (
            f"{entrypoint[0]!r} is not a Python file of the bundle; as a console script it "
            "needs requirements that install it (requirements.txt or environment)."
        )
    return None


def _environment(bundle: CodeBundle | None, raw: Any) -> EnvironmentSpec:
    """The job's own ``environment``, checked; with its bundle's requirements (which the
    agent installs first) it must stay within the rule's count.  Its own indexes only
    where the operator allows them."""
    spec = check_environment(raw)
    if spec.indexes and not settings.ENVIRONMENT_ALLOW_JOB_INDEX:
        raise ProgramError(
            "environment.indexes",
            "this portal does not let a job name its own package index: packages come from "
            "the operator's index (an admin must set ENVIRONMENT_ALLOW_JOB_INDEX to allow it)",
        )
    if bundle is not None:
        spec.with_bundle(bundle.requirements)
    return spec


def parse_env(raw: Any) -> Any:
    """``env`` as sent: an object, or (from a form) JSON text or ``NAME=value`` lines."""
    if raw is None or raw == "":
        return {}
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if text.startswith("{"):
        try:  # bounded: json.loads recursed into a RecursionError on deep nesting
            return loads(text)
        except JsonRefused:
            raise ProgramError("env", "is not a JSON object") from None
    env: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep:
            raise ProgramError("env", f"line {number} is not NAME=value")
        env[name.strip()] = value
    return env


def _bundle(tenant: Tenant, code: Any, add_error: Callable[[str, str], None]) -> CodeBundle | None:
    if _checked(add_error, lambda: check_code_id(code)) is None:
        return None
    bundle = CodeBundle.objects.filter(tenant=tenant, sha256=code).first()
    if bundle is None:
        add_error(
            "code",
            f"No code bundle {code[:12]}… in tenant {tenant.slug}: upload it with "
            "POST /api/v1/code/ first.",
        )
    return bundle


def _checked(add_error: Callable[[str, str], None], check: Callable[[], T]) -> T | None:
    try:
        return check()
    except ProgramError as exc:
        add_error(exc.field, exc.message[:1].upper() + exc.message[1:] + ".")
        return None
