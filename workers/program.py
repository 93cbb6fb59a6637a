"""A tenant's own training program: its entrypoint, launcher and environment (pure checks).

Shared by the portal, which refuses a bad job spec with a 400 naming the
field, and by the agent protocol, which refuses a bad command the same way,
so one rule decides what a program may ask for.

The entrypoint is a Python file inside the code bundle and its arguments,
split with shell rules (``shlex``) and never run through a shell. ``env`` holds
the user's own variables: names like ``[A-Z_][A-Z0-9_]*``, none that the
launcher sets (``RESERVED_ENV``), at most ``MAX_ENV_VARS`` of them and
``MAX_ENV_BYTES`` in all.
"""

from __future__ import annotations

import re
import shlex
import typing
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Literal

Launcher = Literal["edl", "torchrun"]
LAUNCHERS: tuple[str, ...] = typing.get_args(Launcher)

MAX_ENV_VARS = 64
MAX_ENV_BYTES = 4096
MAX_ENTRYPOINT_CHARS = 2000
MAX_ARGS = 256

ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")

TORCHRUN_ENV: tuple[str, ...] = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID",
)
"""What the torchrun launcher sets (the torchrun contract)."""

RESERVED_ENV: frozenset[str] = frozenset(
    (
        *TORCHRUN_ENV,
        "CHECKPOINT_DIR",
        "ARTIFACT_DIR",
        "SCRATCH_DIR",
        "HOME",
        "TMPDIR",
        "PATH",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUNBUFFERED",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "CUDA_VISIBLE_DEVICES",
        "REDIS_URL",
    )
)
"""Names a user may not set: the launchers set them, or they would change the interpreter."""

RESERVED_PREFIXES: tuple[str, ...] = ("EDL_", "PORTAL_")
"""Prefixes of the elastic SDK's and the portal's own variables."""


class ProgramError(ValueError):
    """A program field that cannot run; ``field`` names it for the 400 answer."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def split_entrypoint(text: str) -> tuple[str, ...]:
    """Split ``"train.py --lr 0.1"`` into argv with shell rules, and check it."""
    if not isinstance(text, str) or not text.strip():
        raise ProgramError("entrypoint", "give a Python file of the bundle, e.g. 'train.py'")
    if len(text) > MAX_ENTRYPOINT_CHARS:
        raise ProgramError("entrypoint", f"longer than {MAX_ENTRYPOINT_CHARS} characters")
    try:
        argv = tuple(shlex.split(text))
    except ValueError as exc:
        raise ProgramError("entrypoint", f"cannot be split with shell rules: {exc}") from None
    check_entrypoint(argv)
    return argv


def check_entrypoint(argv: Sequence[str]) -> None:
    """A relative ``.py`` path inside the bundle, then at most ``MAX_ARGS`` arguments."""
    if not argv:
        raise ProgramError("entrypoint", "must not be empty")
    if len(argv) > MAX_ARGS + 1:
        raise ProgramError("entrypoint", f"more than {MAX_ARGS} arguments")
    script = argv[0]
    path = PurePosixPath(script)
    if path.is_absolute() or ".." in path.parts or "\\" in script:
        raise ProgramError("entrypoint", f"{script!r} must be a relative path inside the bundle")
    if path.suffix != ".py":
        raise ProgramError("entrypoint", f"{script!r} is not a Python file (.py)")
    for arg in argv:
        if "\0" in arg:
            raise ProgramError("entrypoint", "contains a NUL character")


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    """The user's variables, checked; a copy."""
    if not isinstance(env, Mapping):
        raise ProgramError("env", "must be an object of NAME: value strings")
    if len(env) > MAX_ENV_VARS:
        raise ProgramError("env", f"at most {MAX_ENV_VARS} variables")
    total = 0
    out: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            raise ProgramError("env", f"{name!r} is not a variable name ([A-Z_][A-Z0-9_]*)")
        if name in RESERVED_ENV or name.startswith(RESERVED_PREFIXES):
            raise ProgramError("env", f"{name} is set by the launcher and cannot be overridden")
        if not isinstance(value, str):
            raise ProgramError("env", f"the value of {name} must be a string")
        if "\0" in value:
            raise ProgramError("env", f"the value of {name} contains a NUL character")
        total += len(name.encode()) + len(value.encode()) + 2
        out[name] = value
    if total > MAX_ENV_BYTES:
        raise ProgramError("env", f"more than {MAX_ENV_BYTES} bytes in all")
    return out


def check_launcher(launcher: str) -> Launcher:
    """``edl`` or ``torchrun``."""
    if launcher == "edl":
        return "edl"
    if launcher == "torchrun":
        return "torchrun"
    raise ProgramError("launcher", f"must be one of {', '.join(LAUNCHERS)}, not {launcher!r}")


CODE_ID = re.compile(r"[0-9a-f]{64}")


def check_code_id(code: str) -> str:
    """A bundle id: the sha256 of its archive, 64 lowercase hex digits."""
    if not isinstance(code, str) or not CODE_ID.fullmatch(code):
        raise ProgramError("code", "must be a bundle id (64 hex digits, from POST /api/v1/code/)")
    return code
