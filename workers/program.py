"""A tenant's own training program: its entrypoint, launcher and environment (pure checks).

Shared by the portal, which refuses a bad job spec with a 400 naming the
field, and by the agent protocol, which refuses a bad command the same way,
so one rule decides what a program may ask for.

The entrypoint is a Python file inside the code bundle and its arguments,
split with shell rules (``shlex``) and never run through a shell. ``env`` holds
the user's own variables: names like ``[A-Z_][A-Z0-9_]*``, none that the
launcher sets (``RESERVED_ENV``), none that the system reads
(``SYSTEM_ENV_PREFIXES``, ``SYSTEM_ENV_NAMES``), at most ``MAX_ENV_VARS`` of
them and ``MAX_ENV_BYTES`` in all.

Which names a job may set (``env_name_problem``): the known training families
(``TRAINING_ENV_PREFIXES``: ``NCCL_*``, ``TORCH_*``, ``HF_*``, ``WANDB_*``...)
and plain application names (``LR``, ``MY_DATASET``), but never a name that
the dynamic loader, the C library or an interpreter reads (``LD_AUDIT``,
``GCONV_PATH``, ``MALLOC_*``, ``PYTHON*``, ``BASH_ENV``...): with one of those
a tenant's file would run inside the process before its code does.  The agent
also starts the sandbox builder with a fixed environment of its own
(``workers.agent.sandbox``), so no job variable reaches a root process.
"""

from __future__ import annotations

import re
import shlex
import typing
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Literal

Launcher = Literal["edl", "torchrun", "session"]
"""``session``: the agent runs JupyterLab as the worker's program and relays it to the portal
(``workers.agent.lab_launch``); the entrypoint is not run (the portal sends ``lab``)."""
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

TRAINING_ENV_PREFIXES: tuple[str, ...] = (
    "NCCL_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "PYTORCH_",
    "CUDA_",
    "CUBLAS_",
    "CUDNN_",
    "OMP_",
    "MKL_",
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "DATASETS_",
    "WANDB_",
    "MLFLOW_",
    "GLOO_",
)
"""Families of variables that training programs set, documented by their libraries."""

SYSTEM_ENV_PREFIXES: tuple[str, ...] = (
    "LD_",  # the dynamic loader: LD_AUDIT, LD_PRELOAD, LD_LIBRARY_PATH, LD_BIND_NOW...
    "GCONV_",  # glibc's iconv modules
    "MALLOC_",  # glibc's allocator (MALLOC_TRACE writes a file)
    "GLIBC_",  # GLIBC_TUNABLES
    "PYTHON",  # the interpreter: PYTHONPATH, PYTHONSTARTUP, PYTHONHOME, PYTHONINSPECT...
    "BASH_",  # BASH_ENV, BASH_FUNC_*
    "PERL",  # PERL5LIB, PERL5OPT
    "RUBY",  # RUBYOPT, RUBYLIB
    "NODE_",  # NODE_OPTIONS
    "JAVA_",  # JAVA_TOOL_OPTIONS
    "_JAVA_",  # _JAVA_OPTIONS
    "DYLD_",  # the macOS loader, refused for clarity
    "SSL_",  # SSL_CERT_FILE, SSL_CERT_DIR: whom TLS trusts
    "OPENSSL_",  # OPENSSL_CONF loads engines
)
"""Prefixes of what the loader, the C library or an interpreter reads: never a job's."""

SYSTEM_ENV_NAMES: frozenset[str] = frozenset(
    (
        # glibc's "unsecure" variables (it drops them for setuid programs for a reason)
        "GETCONF_DIR",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
        "TZDIR",
        # shells and the tools a program may start
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "IFS",
        "PS4",
        "CDPATH",
        "GLOBIGNORE",
        "SHELL",
        "TERMINFO",
        "TERMINFO_DIRS",
        "GIT_CONFIG_GLOBAL",
        "GIT_EXEC_PATH",
        "GIT_SSH_COMMAND",
        "GIT_ASKPASS",
        "SSH_ASKPASS",
        "CURL_CA_BUNDLE",
        "REQUESTS_CA_BUNDLE",
        "PIP_INDEX_URL",
        "PIP_EXTRA_INDEX_URL",
        "UV_INDEX_URL",
        "UV_EXTRA_INDEX_URL",
    )
)
"""Single names that the C library, shells or tools read: never a job's."""


class ProgramError(ValueError):
    """A program field that cannot run; ``field`` names it for the 400 answer."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def split_entrypoint(text: str) -> tuple[str, ...]:
    """Split ``"train.py --lr 0.1"`` into argv with shell rules, and check it.

    A leading ``python``/``python3`` is dropped (``python -m pkg.train`` is
    ``-m pkg.train``): the program always runs on the node's interpreter.
    """
    if not isinstance(text, str) or not text.strip():
        raise ProgramError("entrypoint", "give a Python file of the bundle, e.g. 'train.py'")
    if len(text) > MAX_ENTRYPOINT_CHARS:
        raise ProgramError("entrypoint", f"longer than {MAX_ENTRYPOINT_CHARS} characters")
    try:
        argv = tuple(shlex.split(text))
    except ValueError as exc:
        raise ProgramError("entrypoint", f"cannot be split with shell rules: {exc}") from None
    if argv and argv[0] in INTERPRETER_NAMES:
        argv = argv[1:]
    check_entrypoint(argv)
    return argv


INTERPRETER_NAMES = frozenset({"python", "python3"})
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
COMMAND_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")

EntrypointKind = Literal["script", "module", "command"]


def entrypoint_kind(argv: Sequence[str]) -> EntrypointKind:
    """What ``argv[0]`` names (``check_entrypoint`` has passed): a Python file of the bundle
    (``script``), ``-m`` and a module of the bundle or the environment (``module``), or a
    console script that the job's environment installs (``command``)."""
    if argv[0] == "-m":
        return "module"
    return "script" if argv[0].endswith(".py") else "command"


def check_entrypoint(argv: Sequence[str]) -> None:
    """A relative ``.py`` path inside the bundle, ``-m module``, or a console script's name;
    then at most ``MAX_ARGS`` arguments."""
    if not argv:
        raise ProgramError("entrypoint", "must not be empty")
    if len(argv) > MAX_ARGS + 1:
        raise ProgramError("entrypoint", f"more than {MAX_ARGS} arguments")
    for arg in argv:
        if "\0" in arg:
            raise ProgramError("entrypoint", "contains a NUL character")
    first = argv[0]
    if first == "-m":
        if len(argv) < 2 or not MODULE_NAME.fullmatch(argv[1]):
            raise ProgramError("entrypoint", "-m needs a module name, e.g. '-m mypackage.train'")
        return
    if not first.endswith(".py"):
        if not COMMAND_NAME.fullmatch(first):
            raise ProgramError(
                "entrypoint",
                f"{first!r} is neither a Python file (.py) of the bundle, '-m module', "
                "nor the name of a console script the job's requirements install",
            )
        return
    path = PurePosixPath(first)
    if path.is_absolute() or ".." in path.parts or "\\" in first:
        raise ProgramError("entrypoint", f"{first!r} must be a relative path inside the bundle")


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
        problem = env_name_problem(name)
        if problem is not None:
            raise ProgramError("env", problem)
        if not isinstance(value, str):
            raise ProgramError("env", f"the value of {name} must be a string")
        if "\0" in value:
            raise ProgramError("env", f"the value of {name} contains a NUL character")
        total += len(name.encode()) + len(value.encode()) + 2
        out[name] = value
    if total > MAX_ENV_BYTES:
        raise ProgramError("env", f"more than {MAX_ENV_BYTES} bytes in all")
    return out


def env_name_problem(name: str) -> str | None:
    """Why a job may not set the variable ``name`` (None: it may); see the module docstring."""
    if name in RESERVED_ENV or name.startswith(RESERVED_PREFIXES):
        return f"{name} is set by the launcher and cannot be overridden"
    if name.startswith(TRAINING_ENV_PREFIXES):
        return None
    if name in SYSTEM_ENV_NAMES or name.startswith(SYSTEM_ENV_PREFIXES):
        return (
            f"{name} is read by the system (the dynamic loader, the C library or an "
            "interpreter) and a job may not set it"
        )
    return None


def check_launcher(launcher: str) -> Launcher:
    """``edl``, ``torchrun`` or ``session``."""
    if launcher == "edl":
        return "edl"
    if launcher == "torchrun":
        return "torchrun"
    if launcher == "session":
        return "session"
    raise ProgramError("launcher", f"must be one of {', '.join(LAUNCHERS)}, not {launcher!r}")


CODE_ID = re.compile(r"[0-9a-f]{64}")


def check_code_id(code: str) -> str:
    """A bundle id: the sha256 of its archive, 64 lowercase hex digits."""
    if not isinstance(code, str) or not CODE_ID.fullmatch(code):
        raise ProgramError("code", "must be a bundle id (64 hex digits, from POST /api/v1/code/)")
    return code
