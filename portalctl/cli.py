"""``portalctl``: the command line, a thin layer of click + rich over :mod:`portalctl.client`.

::

    portalctl login --url URL            token asked for, kept in the config dir (0600)
    portalctl submit --code . --entrypoint train.py --gpus 2 --follow
    portalctl submit ... --after ok:12,any:array:5
    portalctl ls | get | events | logs | cancel | scale | artifacts | download | top
    portalctl array submit --code . --entrypoint train.py --size 6 --max-running 2
    portalctl array ls | get | cancel | retry
    portalctl sweep create -f sweep.yaml
    portalctl sweep ls | get | cancel
    portalctl sessions start --gpus 1 [--idle 30m] | ls | open 12 | stop 12
    portalctl shell 12 [--worker w3] [-- nvidia-smi]    exits with the command's status
    portalctl nodes [--pending] [-o json]     servers: GPU type, pool, state, health (admins)

Every command takes ``-o json`` (one JSON document on stdout) and otherwise
prints tables for people.  Errors are one line on stderr.  Exit codes:

    0  done (with --wait/--follow: the job completed)
    1  the job failed
    2  usage error (a bad option, a bad job file)
    3  the job was cancelled
    4  the server refused the request (its message is printed)
    5  the server could not be reached, or a wait timed out
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import click
import platformdirs
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table

from portalctl.after import parse_after
from portalctl.client import BUNDLE_ID, Array, Client, Job, PortalError
from portalctl.duration import format_duration, parse_duration
from portalctl.jobfile import JobFileError, load_job_file, resource_fields
from portalctl.nodes import NODE_COLUMNS, PENDING_COLUMNS, forget_path, node_row, pending_row
from portalctl.sessions import SESSION_COLUMNS, SessionsAPI, session_row, start_fields
from portalctl.sessions import lab_url as session_lab_url
from portalctl.shell import ShellRequest
from portalctl.shell import shell as run_shell
from portalctl.sweep import (
    TRIAL_COLUMNS,
    SweepsAPI,
    list_rows,
    load_sweep_file,
    summary,
    trial_rows,
)

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CANCELLED = 3
EXIT_REFUSED = 4
EXIT_UNREACHABLE = 5
STATE_EXIT = {"completed": 0, "failed": EXIT_FAILED, "cancelled": EXIT_CANCELLED}

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class DurationType(click.ParamType[int, Any]):
    """A click option of whole seconds written as ``7200``, ``2h`` or ``1h30m``."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """Seconds, or a usage error that says which forms work."""
        if isinstance(value, int):
            return value
        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = DurationType()


# ---------------------------------------------------------------------- configuration


def config_path() -> Path:
    """Where ``login`` keeps the URL and token."""
    return Path(platformdirs.user_config_dir("portalctl")) / "config.json"


def read_config() -> dict[str, str]:
    """The stored URL and token, overridden by ``PORTAL_URL`` / ``PORTAL_TOKEN``."""
    stored: dict[str, str] = {}
    path = config_path()
    if path.is_file():
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            loaded = {}
        if isinstance(loaded, dict):
            stored = {k: str(v) for k, v in loaded.items() if k in ("url", "token")}
    for key, env in (("url", "PORTAL_URL"), ("token", "PORTAL_TOKEN")):
        if os.environ.get(env):
            stored[key] = os.environ[env]
    return stored


def write_config(url: str, token: str) -> Path:
    """Store the URL and token, readable by the user alone."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump({"url": url, "token": token}, handle)
    os.chmod(path, 0o600)  # also when the file was there before, with other bits
    return path


def fail(message: str, code: int) -> NoReturn:
    """One line on stderr, then exit with ``code``."""
    err.print(f"portalctl: {message}", markup=False)
    sys.exit(code)


def exit_code_of(exc: PortalError) -> int:
    """Unreachable (status 0) or refused."""
    return EXIT_UNREACHABLE if exc.status == 0 else EXIT_REFUSED


class Context:
    """What every command shares: the output format and a lazily made client."""

    def __init__(self, output: str) -> None:
        self.output = output
        self._client: Client | None = None

    @property
    def json(self) -> bool:
        """Machines asked for one JSON document."""
        return self.output == "json"

    def client(self) -> Client:
        """The client of the configured portal (a usage error when none is)."""
        if self._client is None:
            config = read_config()
            if not config.get("url") or not config.get("token"):
                fail(
                    "no portal configured: run `portalctl login --url URL` "
                    "or set PORTAL_URL and PORTAL_TOKEN",
                    EXIT_USAGE,
                )
            self._client = Client(config["url"], config["token"])
        return self._client


def emit_json(document: Any) -> None:
    """The one JSON document of ``-o json``."""
    click.echo(json.dumps(document, indent=2, default=str))


def output_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """``-o json|table`` on a command (also accepted before the command name)."""
    return click.option(
        "-o",
        "--output",
        "output",
        type=click.Choice(["table", "json"]),
        default=None,
        help="json: one JSON document on stdout.",
    )(func)


def ctx_of(output: str | None) -> Context:
    """The shared context, with a command's own ``-o`` taking precedence."""
    ctx = click.get_current_context().find_object(Context)
    assert ctx is not None
    if output:
        ctx.output = output
    return ctx


class PortalGroup(click.Group):
    """Turns a :class:`PortalError` anywhere into one line on stderr and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PortalError as exc:
            fail(str(exc), exit_code_of(exc))
        except TimeoutError as exc:
            fail(str(exc), EXIT_UNREACHABLE)
        except KeyboardInterrupt:
            fail("interrupted", 130)


@click.group(cls=PortalGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json"]),
    default="table",
    help="json: one JSON document on stdout.",
)
@click.version_option("0.1.0", prog_name="portalctl")
@click.pass_context
def main(ctx: click.Context, output: str) -> None:
    """The GPU portal from the command line (PORTAL_URL / PORTAL_TOKEN, or `portalctl login`)."""
    ctx.obj = Context(output)


# ---------------------------------------------------------------------- rendering


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    """A rich table of plain cells."""
    shown = Table(title=title, title_justify="left", box=None, header_style="bold")
    for column in columns:
        shown.add_column(column)
    for row in rows:
        shown.add_row(*(_cell(value) for value in row))
    return shown


JOB_COLUMNS = (
    "ID", "NAME", "TENANT", "STATE", "GPUS", "RANGE", "PRIO", "RESTARTS", "LIMIT", "STEP",
    "SUBMITTED",
)  # fmt: skip


def restarts_cell(job: Job) -> str:
    """Restarts used of those allowed, ``"1/3"``; ``"0/0"`` when a failure is final."""
    return f"{job.restarts}/{job.max_restarts}"


def job_row(job: Job) -> list[Any]:
    """A job as one row of ``ls``."""
    return [
        job.id,
        job.name,
        job.tenant,
        job.state,
        job.parallelism,
        f"{job.min_gpus}-{job.max_gpus}",
        job.priority,
        restarts_cell(job),
        format_duration(job.max_runtime_s),
        job.step,
        (job.submitted_at or "")[:19].replace("T", " "),
    ]


def show_job(job: Job) -> None:
    """One job as a two-column table (a run-time limit also in short form: ``7200 (2h)``)."""
    keys = [
        "id", "name", "tenant", "state", "workload", "code", "entrypoint", "launcher",
        "environment", "environment_used", "gpus",
        "min_gpus", "max_gpus", "parallelism", "priority", "restarts", "max_restarts",
        "max_runtime_s", "runtime_deadline", "generation", "step", "loss",
        "submitted_at", "started_at", "finished_at", "jct_seconds", "wait_reason",
        "failure_reason",
    ]  # fmt: skip
    rows = [(key, job.raw.get(key)) for key in keys if key in job.raw]
    rows = [
        (key, f"{value} ({format_duration(value)})")
        if key == "max_runtime_s" and isinstance(value, int) and value > 0
        else (key, environment_text(value))
        if key == "environment"
        else (key, environment_used_text(value))
        if key == "environment_used"
        else (key, value)
        for key, value in rows
    ]
    out.print(table(None, ("FIELD", "VALUE"), rows))


def environment_used_text(used: Any) -> str:
    """What a job's processes last started in, on one line: ``3f2a9c1e07b4 on node-0: built
    in 2.1 s; einops==0.8.1 tabulate==0.9.0`` (empty: no environment, or not started)."""
    if not isinstance(used, dict) or not used.get("environment"):
        return ""
    how = "cache hit" if used.get("hit") else f"built in {float(used.get('build_s') or 0):.1f} s"
    packages = " ".join(str(p) for p in used.get("packages") or []) or "nothing beyond the base"
    return f"{str(used['environment'])[:12]} on {used.get('node', '?')}: {how}; {packages}"


def environment_text(environment: Any) -> str:
    """A job's own requirements on one line: ``einops==0.8.1 tqdm>=4 (python 3.11)``, with
    its own package indexes when it names some: ``(index https://pypi.example.org/simple)``.

    Empty: the job asks for nothing beyond the node's base layer (its bundle's
    own requirements.txt still applies; ``portalctl`` shows that with the upload).
    """
    if not isinstance(environment, dict):
        return ""
    requirements = environment.get("requirements") or []
    indexes = environment.get("indexes") or []
    if not requirements and not indexes:
        return ""
    text = " ".join(str(line) for line in requirements)
    notes = [f"python {environment['python']}"] if environment.get("python") else []
    if environment.get("replace"):
        notes.append("may replace " + ", ".join(map(str, environment["replace"])))
    if indexes:
        notes.append(("index " if len(indexes) == 1 else "indexes ") + ", ".join(map(str, indexes)))
    return " ".join(part for part in (text, f"({'; '.join(notes)})" if notes else "") if part)


def add_requirements(fields: dict[str, Any], requirements: Sequence[str]) -> None:
    """Append ``--requirement`` lines to the ``environment.requirements`` of ``fields``."""
    _extend_environment(fields, "requirements", requirements)


def add_indexes(fields: dict[str, Any], indexes: Sequence[str]) -> None:
    """Append ``--index`` URLs to the ``environment.indexes`` of ``fields`` (the portal
    checks them, and refuses them unless its operator allows a job its own index)."""
    _extend_environment(fields, "indexes", indexes)


def _extend_environment(fields: dict[str, Any], key: str, values: Sequence[str]) -> None:
    """Append ``values`` to the list ``environment.<key>`` of ``fields`` (a job file's first)."""
    if not values:
        return
    environment = dict(fields.get("environment") or {})
    listed = environment.get(key) or []
    if not isinstance(listed, list):
        raise click.UsageError(f"environment.{key} must be a list in the job file")
    environment[key] = [*listed, *values]
    fields["environment"] = environment


def log_text(line: Any, with_worker: bool) -> str:
    """A log line for people: ``[rank N]`` first when asked."""
    if not with_worker:
        return str(line.text)
    who = f"rank {line.rank}" if line.rank is not None else (line.worker or "-")
    return f"[{who}] {line.text}"


# ---------------------------------------------------------------------- commands


@main.command()
@click.option("--url", required=True, help="The portal's address, e.g. http://127.0.0.1:8000")
@click.option("--token", prompt="API token", hide_input=True, help="Asked for when not given.")
@output_option
def login(url: str, token: str, output: str | None) -> None:
    """Check a token against the portal and store it (mode 0600) for the next commands."""
    ctx = ctx_of(output)
    with Client(url, token) as client:
        me = client.me()
    path = write_config(url, token)
    if ctx.json:
        emit_json({"url": url, "user": me.get("username"), "config": str(path)})
    else:
        out.print(f"Logged in to {url} as {me.get('username', '?')} (saved in {path})")


def _parse_env(pairs: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{pair!r} is not K=V", param_hint="--env")
        env[name] = value
    return env


def _resolve_code(ctx: Context, code: str, tenant: str | None) -> str:
    """A bundle id from ``--code``: an id as is, a directory or an archive uploaded."""
    if BUNDLE_ID.match(code) and not Path(code).exists():
        return code
    if not Path(code).exists():
        raise click.BadParameter(
            f"{code!r} is neither a directory, an archive nor a bundle id", param_hint="--code"
        )
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err,
        transient=True,
        disable=ctx.json or not err.is_terminal,
    ) as bar:
        task = bar.add_task("uploading", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        try:
            upload = ctx.client().code.upload(code, tenant=tenant, progress=progress)
        except (OSError, ValueError) as exc:
            raise click.BadParameter(str(exc), param_hint="--code") from None
    bundle = upload.bundle
    verb = "uploaded" if upload.uploaded else "already on the server"
    declared = f", {len(bundle.requirements)} requirements" if bundle.requirements else ""
    err.print(
        f"code {bundle.id[:12]} {verb} ({bundle.files} files, {bundle.size} bytes{declared})",
        markup=False,
    )
    return bundle.id


def _follow_and_exit(ctx: Context, job_id: int, follow: bool) -> NoReturn:
    """Stream the logs (``follow``) or wait, then exit with the code of how the job ended."""
    client = ctx.client()
    if follow:
        for line in client.jobs.logs(job_id, follow=True):
            if ctx.json:
                err.print(line.text, markup=False)
            else:
                click.echo(line.text)
    job = client.jobs.wait(job_id)
    if ctx.json:
        emit_json(job.raw)
    else:
        reason = f": {job.failure_reason}" if job.failure_reason else ""
        err.print(f"job {job.id} {job.state}{reason}", markup=False)
    sys.exit(STATE_EXIT.get(job.state, EXIT_FAILED))


@main.command()
@click.option("-f", "--file", "job_file", type=click.Path(dir_okay=False), help="A job.yaml.")
@click.option("--code", help="A directory or archive to upload, or a bundle id.")
@click.option("--entrypoint", help='The program and its arguments: "train.py --lr 0.1".')
@click.option("--launcher", type=click.Choice(["edl", "torchrun"]))
@click.option("--workload", help="A built-in workload instead of code (e.g. mlp-digits).")
@click.option("--gpus", type=click.IntRange(min=1))
@click.option("--min", "min_gpus", type=click.IntRange(min=1))
@click.option("--max", "max_gpus", type=click.IntRange(min=1))
@click.option("--name")
@click.option("--tenant", help="Tenant slug (needed only if you belong to several).")
@click.option("--priority", type=click.IntRange(0, 100), help="0-100 (70+ high, below 30 low).")
@click.option(
    "--max-restarts",
    type=click.IntRange(min=0),
    help="Times a failed program is requeued from its checkpoint (default: the tenant's).",
)
@click.option(
    "--max-runtime",
    type=DURATION,
    help="Wall-clock limit since the first start: seconds, 30m, 2h, 1h30m, 1d "
    "(default: the tenant's).",
)
@click.option("--arg", "args", multiple=True, help="A workload argument K=V (repeatable).")
@click.option("--env", "env", multiple=True, help="An environment variable K=V (repeatable).")
@click.option(
    "-r",
    "--requirement",
    "requirements",
    multiple=True,
    help="A Python package the program needs, as in requirements.txt: -r einops==0.8.1 "
    "(repeatable; after the bundle's own requirements.txt).",
)
@click.option(
    "--index",
    "indexes",
    multiple=True,
    metavar="URL",
    help="An extra package index of the job's own, https:// without credentials "
    "(repeatable, at most 3; only where the portal's operator allows it).",
)
@click.option(
    "--after",
    metavar="DEPS",
    help="Wait for other jobs or arrays first: ok:12 (job 12 completed), any:13 (ended), "
    "failed:14 (failed), ok:array:5 (every task of array 5); comma-separated.",
)
@click.option(
    "--resume-from",
    type=click.IntRange(min=1),
    metavar="JOB",
    help="Start from job JOB's newest checkpoint (a job of the same tenant).",
)
@click.option(
    "--gpu-type",
    metavar="T[,T2]",
    help="GPU types the job accepts, preferred first (e.g. h100-80g,a100-40g); default: any.",
)
@click.option(
    "--selector",
    "selector",
    multiple=True,
    metavar="K=V",
    help="A label the job's servers must carry, e.g. pool=train (repeatable).",
)
@click.option("--cpus", type=click.IntRange(min=0), help="CPU cores per GPU (default: tenant's).")
@click.option("--mem", metavar="SIZE", help="Host memory per GPU: 16G, 512M (default: tenant's).")
@click.option("--wait", is_flag=True, help="Wait for the end; the exit code says how it ended.")
@click.option("--follow", is_flag=True, help="Stream the logs until the job ends (implies --wait).")
@output_option
def submit(
    job_file: str | None,
    code: str | None,
    entrypoint: str | None,
    launcher: str | None,
    workload: str | None,
    gpus: int | None,
    min_gpus: int | None,
    max_gpus: int | None,
    name: str | None,
    tenant: str | None,
    priority: int | None,
    max_restarts: int | None,
    max_runtime: int | None,
    args: tuple[str, ...],
    env: tuple[str, ...],
    requirements: tuple[str, ...],
    indexes: tuple[str, ...],
    after: str | None,
    resume_from: int | None,
    gpu_type: str | None,
    selector: tuple[str, ...],
    cpus: int | None,
    mem: str | None,
    wait: bool,
    follow: bool,
    output: str | None,
) -> None:
    """Submit a job (uploading its code first when needed) and print its id."""
    ctx = ctx_of(output)
    try:
        fields = load_job_file(job_file) if job_file else {}
        fields.update(resource_fields(gpu_type, selector, cpus, mem))
    except (JobFileError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    flags: dict[str, Any] = {
        "code": code,
        "entrypoint": entrypoint,
        "launcher": launcher,
        "workload": workload,
        "gpus": gpus,
        "min_gpus": min_gpus,
        "max_gpus": max_gpus,
        "name": name,
        "tenant": tenant,
        "priority": priority,
        "max_restarts": max_restarts,
        "max_runtime_s": max_runtime,
        "resume_from": resume_from,
    }
    fields.update({k: v for k, v in flags.items() if v is not None})
    if env:
        fields["env"] = {**fields.get("env", {}), **_parse_env(env)}
    add_requirements(fields, requirements)
    add_indexes(fields, indexes)
    if args:
        parsed = {k: _number(v) for k, v in _parse_env(args).items()}
        fields["args"] = {**fields.get("args", {}), **parsed}
    _finish_fields(ctx, fields, code, after)
    if not fields.get("code") and not fields.get("workload"):
        raise click.UsageError("give --code (with --entrypoint) or --workload, or a job file")
    job = ctx.client().jobs.submit(**fields)
    if not (wait or follow):
        if ctx.json:
            emit_json(job.raw)
        else:
            click.echo(job.id)
        return
    err.print(f"job {job.id} submitted ({job.state})")
    _follow_and_exit(ctx, job.id, follow)


def _finish_fields(
    ctx: Context, fields: dict[str, Any], code: str | None, after: str | None
) -> None:
    """What every submission adds to its fields: GPUs, ``after`` (flag or job file text),
    the uploaded code's id and a default name."""
    if "gpus" not in fields:
        fields["gpus"] = fields.get("min_gpus") or 1
    wanted = after if after is not None else fields.get("after")
    if isinstance(wanted, str):
        try:
            fields["after"] = parse_after(wanted)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    if fields.get("code"):
        fields["code"] = _resolve_code(ctx, str(fields["code"]), fields.get("tenant"))
    if not fields.get("name"):
        fields["name"] = _default_name(code, fields)


def _number(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def _default_name(code: str | None, fields: dict[str, Any]) -> str:
    if code and Path(code).exists():
        return Path(code).resolve().name or "job"
    if fields.get("entrypoint"):
        return Path(str(fields["entrypoint"]).split()[0]).stem
    return str(fields.get("workload") or "job")


@main.command("ls")
@click.option("--state", help="Only these states (comma-separated: queued,running).")
@click.option("--tenant", help="Only this tenant's jobs.")
@click.option(
    "--all-tenants",
    is_flag=True,
    help="Every tenant's jobs you may see (cluster admins); default: your tenants'.",
)
@output_option
def list_jobs(state: str | None, tenant: str | None, all_tenants: bool, output: str | None) -> None:
    """List your tenants' jobs, newest first."""
    ctx = ctx_of(output)
    client = ctx.client()
    jobs = client.jobs.list(state=state, tenant=tenant)
    if not (tenant or all_tenants):
        mine = {m["tenant"] for m in client.me().get("memberships", [])}
        jobs = [job for job in jobs if job.tenant in mine]
    if ctx.json:
        emit_json([job.raw for job in jobs])
    else:
        out.print(table(None, JOB_COLUMNS, (job_row(job) for job in jobs)))


@main.command()
@click.argument("job_id", type=int)
@output_option
def get(job_id: int, output: str | None) -> None:
    """Show one job."""
    ctx = ctx_of(output)
    job = ctx.client().jobs.get(job_id)
    if ctx.json:
        emit_json(job.raw)
    else:
        show_job(job)


@main.command()
@click.argument("job_id", type=int)
@output_option
def events(job_id: int, output: str | None) -> None:
    """A job's history: every change of state or parallelism, with its reason."""
    ctx = ctx_of(output)
    history = ctx.client().jobs.events(job_id)
    if ctx.json:
        emit_json([event.raw for event in history])
        return
    rows = (
        (e.at[:19].replace("T", " "), e.kind, _transition(e.from_state, e.to_state), e.reason)
        for e in history
    )
    out.print(table(None, ("AT", "KIND", "STATE", "REASON"), rows))


def _transition(before: str | None, after: str | None) -> str:
    return f"{before or '-'} → {after}" if after else ""


@main.command()
@click.argument("job_id", type=int)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the job ends.")
@click.option("--tail", type=click.IntRange(0, 10000), help="The last N lines (default 1000).")
@click.option("--worker", help="Only this worker's lines.")
@click.option("--ranks", is_flag=True, help="Prefix each line with its rank.")
@output_option
def logs(
    job_id: int,
    follow: bool,
    tail: int | None,
    worker: str | None,
    ranks: bool,
    output: str | None,
) -> None:
    """A job's output (-f: followed live until the job ends)."""
    ctx = ctx_of(output)
    lines = ctx.client().jobs.logs(job_id, follow=follow, tail=tail, worker=worker)
    if ctx.json:
        emit_json([line.raw for line in lines])
        return
    for line in lines:
        click.echo(log_text(line, ranks))


@main.command()
@click.argument("job_id", type=int)
@click.option("--reason", default="", help="Why (recorded in the job's history).")
@output_option
def cancel(job_id: int, reason: str, output: str | None) -> None:
    """Cancel a job (a graceful stop that releases its GPUs)."""
    ctx = ctx_of(output)
    job = ctx.client().jobs.cancel(job_id, reason)
    if ctx.json:
        emit_json(job.raw)
    else:
        out.print(f"job {job.id}: {job.state}")


@main.command()
@click.argument("job_id", type=int)
@click.option("--min", "min_gpus", type=click.IntRange(min=1))
@click.option("--max", "max_gpus", type=click.IntRange(min=1))
@click.option("--priority", type=click.IntRange(0, 100))
@output_option
def scale(
    job_id: int,
    min_gpus: int | None,
    max_gpus: int | None,
    priority: int | None,
    output: str | None,
) -> None:
    """Change a job's elastic range (also while it runs)."""
    ctx = ctx_of(output)
    if min_gpus is None and max_gpus is None and priority is None:
        raise click.UsageError("give --min, --max or --priority")
    job = ctx.client().jobs.scale(job_id, min_gpus=min_gpus, max_gpus=max_gpus, priority=priority)
    if ctx.json:
        emit_json(job.raw)
    else:
        out.print(f"job {job.id}: {job.min_gpus}-{job.max_gpus} GPUs, now {job.parallelism}")


@main.command()
@click.argument("job_id", type=int)
@output_option
def artifacts(job_id: int, output: str | None) -> None:
    """What a job stored: checkpoints, the final one, its files and its log."""
    ctx = ctx_of(output)
    listed = ctx.client().artifacts.list(job_id)
    if ctx.json:
        emit_json([a.raw for a in listed])
        return
    rows = ((a.id, a.kind, a.name, a.step, a.size, a.sha256[:12]) for a in listed)
    out.print(table(None, ("ID", "KIND", "NAME", "STEP", "BYTES", "SHA256"), rows))


@main.command()
@click.argument("job_id", type=int)
@click.argument("artifact", required=False, type=int)
@click.option("-o", "--out", "target", type=click.Path(), help="Where to write it.")
@click.option("--format", "output", type=click.Choice(["table", "json"]), default=None)
def download(job_id: int, artifact: int | None, target: str | None, output: str | None) -> None:
    """Download an artifact (default: the final checkpoint); resumable, sha256 checked.

    Here -o is the file to write; use --format json (or `portalctl -o json download`).
    """
    ctx = ctx_of(output)
    client = ctx.client()
    listed = client.artifacts.list(job_id)
    if artifact is None:
        chosen = next((a for a in listed if a.kind == "final"), None)
        if chosen is None:
            fail(
                f"job {job_id} has no final checkpoint (see `portalctl artifacts {job_id}`)",
                EXIT_REFUSED,
            )
    else:
        chosen = next((a for a in listed if a.id == artifact), None)
        if chosen is None:
            fail(f"job {job_id} has no artifact {artifact}", EXIT_REFUSED)
    path = Path(target) if target else Path(chosen.name)
    if path.is_dir():
        path = path / chosen.name
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err,
        transient=True,
        disable=ctx.json or not err.is_terminal,
    ) as bar:
        task = bar.add_task(chosen.name, total=chosen.size)
        saved = client.artifacts.download(
            job_id,
            chosen,
            path,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    if ctx.json:
        emit_json({"path": str(saved), "sha256": chosen.sha256, "size": chosen.size})
    else:
        out.print(f"{saved} ({chosen.size} bytes, sha256 {chosen.sha256} verified)")


@main.command()
@click.option("--interval", type=click.FloatRange(min=0.5), default=2.0, show_default=True)
@click.option("--once", is_flag=True, help="Print one snapshot and exit.")
@output_option
def top(interval: float, once: bool, output: str | None) -> None:
    """A live view of your tenants' GPUs and active jobs (Ctrl-C to quit)."""
    ctx = ctx_of(output)
    client = ctx.client()

    def snapshot() -> tuple[list[Any], list[Job]]:
        return client.tenants(), client.jobs.list(state="queued,running,scaling")

    if ctx.json:
        tenants, jobs = snapshot()
        emit_json({"tenants": [t.raw for t in tenants], "jobs": [j.raw for j in jobs]})
        return

    def view() -> Group:
        tenants, jobs = snapshot()
        quota = table(
            "Tenants",
            ("TENANT", "ROLE", "GPUS IN USE", "QUOTA"),
            ((t.slug, t.role, t.gpus_in_use, t.gpu_quota) for t in tenants),
        )
        active = table("Active jobs", JOB_COLUMNS, (job_row(j) for j in jobs))
        stamp = time.strftime("%H:%M:%S")
        return Group(f"[bold]{client.url}[/bold]  {stamp}", quota, active)

    if once:
        out.print(view())
        return
    try:
        with Live(view(), console=out, refresh_per_second=4, screen=False) as live:
            while True:
                time.sleep(interval)
                live.update(view())
    except KeyboardInterrupt:
        return


@main.group()
def array() -> None:
    """Job arrays: N tasks of one program, each with TASK_ID and TASK_COUNT in its env."""


def emit_array(ctx: Context, found: Array) -> None:
    """An array as ``-o json`` asks (the API's object) or as :func:`show_array` shows it."""
    if ctx.json:
        emit_json(found.raw)
    else:
        show_array(found)


def show_array(found: Array) -> None:
    """An array's summary and, when the answer has them, its tasks."""
    counts = ", ".join(f"{n} {state}" for state, n in sorted(found.counts.items()))
    cap = f", at most {found.max_running} at once" if found.max_running else ""
    out.print(f"array {found.id} ({found.name}): {found.size} tasks{cap}: {counts}", markup=False)
    if found.tasks:
        rows = [[t["task_id"], t["job"], t["state"], t.get("wait_reason", "")] for t in found.tasks]
        out.print(table(None, ["TASK_ID", "job", "state", "waits for"], rows))


@array.command("submit")
@click.option("-f", "--file", "job_file", type=click.Path(dir_okay=False), help="A job.yaml.")
@click.option("--code", help="A directory or archive to upload, or a bundle id.")
@click.option("--entrypoint", help='The program and its arguments: "train.py --lr 0.1".')
@click.option("--launcher", type=click.Choice(["edl", "torchrun"]))
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs per task.")
@click.option("--name")
@click.option("--tenant", help="Tenant slug (needed only if you belong to several).")
@click.option("--env", "env", multiple=True, help="An environment variable K=V (repeatable).")
@click.option("--size", type=click.IntRange(min=1), required=True, help="How many tasks.")
@click.option("--max-running", type=click.IntRange(min=1), help="Tasks queued or running at once.")
@click.option("--after", metavar="DEPS", help="As submit's: ok:12,any:array:5.")
@output_option
def array_submit(
    job_file: str | None,
    code: str | None,
    entrypoint: str | None,
    launcher: str | None,
    gpus: int | None,
    name: str | None,
    tenant: str | None,
    env: tuple[str, ...],
    size: int,
    max_running: int | None,
    after: str | None,
    output: str | None,
) -> None:
    """Submit an array of SIZE tasks of one program and print its id."""
    ctx = ctx_of(output)
    try:
        fields = load_job_file(job_file) if job_file else {}
    except JobFileError as exc:
        raise click.UsageError(str(exc)) from None
    flags = {"code": code, "entrypoint": entrypoint, "launcher": launcher, "gpus": gpus,
             "name": name, "tenant": tenant}  # fmt: skip
    fields.update({k: v for k, v in flags.items() if v is not None})
    if env:
        fields["env"] = {**fields.get("env", {}), **_parse_env(env)}
    if not fields.get("code"):
        raise click.UsageError(
            "an array runs a program: give --code and --entrypoint, or a job file"
        )
    _finish_fields(ctx, fields, code, after)
    found = ctx.client().arrays.submit(**fields, size=size, max_running=max_running)
    if ctx.json:
        emit_json(found.raw)
    else:
        click.echo(found.id)


@array.command("ls")
@output_option
def array_list(output: str | None) -> None:
    """List your tenants' arrays, newest first, with their tasks' states."""
    ctx = ctx_of(output)
    found = ctx.client().arrays.list()
    if ctx.json:
        emit_json([a.raw for a in found])
        return
    rows = [[a.id, a.name, a.size, a.max_running or "", ", ".join(
        f"{n} {s}" for s, n in sorted(a.counts.items()))] for a in found]  # fmt: skip
    out.print(table(None, ["id", "name", "tasks", "at once", "states"], rows))


@array.command("get")
@click.argument("array_id", type=int)
@output_option
def array_get(array_id: int, output: str | None) -> None:
    """Show an array: its counts per state and each task."""
    ctx = ctx_of(output)
    emit_array(ctx, ctx.client().arrays.get(array_id))


@array.command("cancel")
@click.argument("array_id", type=int)
@click.option("--reason", default="", help="Why (recorded in each task's history).")
@output_option
def array_cancel(array_id: int, reason: str, output: str | None) -> None:
    """Cancel every task of an array that has not ended."""
    ctx = ctx_of(output)
    emit_array(ctx, ctx.client().arrays.cancel(array_id, reason))


@array.command("retry")
@click.argument("array_id", type=int)
@output_option
def array_retry(array_id: int, output: str | None) -> None:
    """Submit again every task of an array whose latest attempt failed."""
    ctx = ctx_of(output)
    emit_array(ctx, ctx.client().arrays.retry(array_id))


@main.group()
def sweep() -> None:
    """Hyperparameter sweeps: trials of one program, promoted and stopped by grid, random
    or ASHA (see portalctl.sweep for the sweep file)."""


def emit_sweep(ctx: Context, found: dict[str, Any]) -> None:
    """A sweep as ``-o json`` asks (the API's object), or its summary and trials table."""
    if ctx.json:
        emit_json(found)
        return
    out.print(summary(found), markup=False)
    if found.get("trials"):
        out.print(table(None, TRIAL_COLUMNS, trial_rows(found)))


@sweep.command("create")
@click.option("-f", "--file", "sweep_file", type=click.Path(dir_okay=False), required=True,
              help="A sweep.yaml: a job file plus search_space, metric, strategy...")  # fmt: skip
@click.option("--tenant", help="Tenant slug (needed only if you belong to several).")
@output_option
def sweep_create(sweep_file: str, tenant: str | None, output: str | None) -> None:
    """Start a sweep from a sweep file and print its id."""
    ctx = ctx_of(output)
    try:
        fields = load_sweep_file(sweep_file)
    except JobFileError as exc:
        raise click.UsageError(str(exc)) from None
    if tenant:
        fields["tenant"] = tenant
    if not fields.get("code"):
        raise click.UsageError("a sweep runs a program: give code and entrypoint in the file")
    _finish_fields(ctx, fields, str(fields["code"]), None)
    found = SweepsAPI(ctx.client()).create(fields)
    if ctx.json:
        emit_json(found)
    else:
        click.echo(found["id"])


@sweep.command("ls")
@output_option
def sweep_list(output: str | None) -> None:
    """List your tenants' sweeps, newest first."""
    ctx = ctx_of(output)
    found = SweepsAPI(ctx.client()).list()
    if ctx.json:
        emit_json(found)
        return
    out.print(table(None, ["id", "name", "strategy", "metric", "state"], list_rows(found)))


@sweep.command("get")
@click.argument("sweep_id", type=int)
@output_option
def sweep_get(sweep_id: int, output: str | None) -> None:
    """Show a sweep: its state, best trial and every trial."""
    ctx = ctx_of(output)
    emit_sweep(ctx, SweepsAPI(ctx.client()).get(sweep_id))


@sweep.command("cancel")
@click.argument("sweep_id", type=int)
@click.option("--reason", default="", help="Why (recorded in each running trial's history).")
@output_option
def sweep_cancel(sweep_id: int, reason: str, output: str | None) -> None:
    """Cancel a sweep: its running trials' jobs are cancelled, the rest stopped."""
    ctx = ctx_of(output)
    emit_sweep(ctx, SweepsAPI(ctx.client()).cancel(sweep_id, reason))


@main.group()
def sessions() -> None:
    """Interactive sessions: JupyterLab on the cluster's GPUs, through the portal."""


def emit_session(ctx: Context, found: dict[str, Any]) -> None:
    """A session as ``-o json`` asks (the API's object), or its one-row table."""
    if ctx.json:
        emit_json(found)
        return
    url = ctx.client().url
    out.print(table(None, SESSION_COLUMNS, [session_row(found, url)]))


@sessions.command("ls")
@click.option("--state", help="Comma-separated states, e.g. running,queued.")
@output_option
def sessions_list(state: str | None, output: str | None) -> None:
    """List your tenants' sessions, newest first."""
    ctx = ctx_of(output)
    found = SessionsAPI(ctx.client()).list(state)
    if ctx.json:
        emit_json(found)
        return
    url = ctx.client().url
    out.print(table(None, SESSION_COLUMNS, (session_row(s, url) for s in found)))


@sessions.command("start")
@click.option("--gpus", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--idle", "idle_s", type=DURATION, help="Idle timeout: 30m, 2h (tenant's default).")
@click.option(
    "--lifetime", "lifetime_s", type=DURATION, help="Longest life: 8h (tenant's default)."
)
@click.option("--priority", help="high, normal, low, or 0-100 (default: normal).")
@click.option("--access", type=click.Choice(["creator", "tenant"]),
              help="Who may open its lab: only you (default), or your tenant's members.")  # fmt: skip
@click.option("--code", help="A directory, an archive or a bundle id to start from.")
@click.option("--requirement", "requirements", multiple=True, metavar="PKG",
              help="A Python package the session needs, e.g. einops==0.8.1 (repeatable).")  # fmt: skip
@click.option("--name", help="A name for it (default: session).")
@click.option("--tenant", help="Tenant slug (needed only if you belong to several).")
@click.option("--gpu-type", metavar="T[,T2]", help="GPU types it accepts, preferred first.")
@click.option("--selector", "selector", multiple=True, metavar="K=V",
              help="A label its server must carry, e.g. pool=interactive (repeatable).")  # fmt: skip
@click.option("--cpus", type=click.IntRange(min=0), help="CPU cores per GPU (default: tenant's).")
@click.option("--mem", metavar="SIZE", help="Host memory per GPU: 16G, 512M (default: tenant's).")
@output_option
def sessions_start(
    gpus: int,
    idle_s: int | None,
    lifetime_s: int | None,
    priority: str | None,
    access: str | None,
    code: str | None,
    requirements: tuple[str, ...],
    name: str | None,
    tenant: str | None,
    gpu_type: str | None,
    selector: tuple[str, ...],
    cpus: int | None,
    mem: str | None,
    output: str | None,
) -> None:
    """Start a session and print its id (`portalctl sessions open ID` gives its lab URL)."""
    ctx = ctx_of(output)
    try:
        resources = resource_fields(gpu_type, selector, cpus, mem)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    bundle = _resolve_code(ctx, code, tenant) if code else None
    fields = start_fields(gpus=gpus, tenant=tenant, name=name, idle_s=idle_s,
                          lifetime_s=lifetime_s, priority=priority, access=access, code=bundle,
                          requirements=requirements, resources=resources)  # fmt: skip
    found = SessionsAPI(ctx.client()).start(fields)
    if ctx.json:
        emit_json(found)
    else:
        click.echo(found["id"])


@sessions.command("stop")
@click.argument("session_id", type=int)
@click.option("--reason", default="", help="Why (recorded in its history).")
@output_option
def sessions_stop(session_id: int, reason: str, output: str | None) -> None:
    """Stop a session: its home is saved, its GPUs released."""
    ctx = ctx_of(output)
    emit_session(ctx, SessionsAPI(ctx.client()).stop(session_id, reason))


@sessions.command("open")
@click.argument("session_id", type=int)
@output_option
def sessions_open(session_id: int, output: str | None) -> None:
    """Print the URL of a session's JupyterLab (sign in to the portal in that browser)."""
    ctx = ctx_of(output)
    found = SessionsAPI(ctx.client()).get(session_id)
    url = session_lab_url(ctx.client().url, found)
    if ctx.json:
        emit_json({"id": found["id"], "state": found["state"], "lab_url": url})
        return
    if found.get("state") not in ("running", "scaling"):
        err.print(f"session {session_id} is {found.get('state')}: its lab opens once it runs",
                  markup=False)  # fmt: skip
    click.echo(url)


@main.command()
@click.option("--pending", is_flag=True, help="Servers that reported themselves, not accepted.")
@click.option(
    "--forget",
    type=click.IntRange(min=1),
    metavar="ID",
    help="Forget pending server ID (it comes back if its agent reports again).",
)
@output_option
def nodes(pending: bool, forget: int | None, output: str | None) -> None:
    """The cluster's servers: GPU type, pool, state (and why), health (cluster admins)."""
    ctx = ctx_of(output)
    if forget is not None:
        ctx.client().request("POST", forget_path(forget))
        if ctx.json:
            emit_json({"forgotten": forget})
        else:
            out.print(
                f"pending server {forget} forgotten (it comes back if its agent reports again)"
            )
        return
    path = "/api/v1/servers/pending/" if pending else "/api/v1/servers/"
    rows = ctx.client().json("GET", path)
    if ctx.json:
        emit_json(rows)
    elif pending:
        out.print(table(None, PENDING_COLUMNS, (pending_row(row) for row in rows)))
    else:
        out.print(table(None, NODE_COLUMNS, (node_row(row) for row in rows)))


@main.command()
@click.argument("job_id", type=int)
@click.option("--worker", help="The worker to open it on, e.g. w3 (default: the job's first).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def shell(job_id: int, worker: str | None, command: tuple[str, ...]) -> None:
    """A shell in a running job's worker, in its sandbox; or run COMMAND there (after --).

    The exit status is the command's (128 + N for signal N); 255 when portalctl could
    not run it.
    """
    ctx_of(None).client()  # a usage error when no portal is configured
    config = read_config()
    if command[:1] == ("--",):  # after the job id, click leaves the separator in
        command = command[1:]
    request = ShellRequest(job_id=job_id, worker=worker, argv=command)
    sys.exit(run_shell(config["url"], config["token"], request))


if __name__ == "__main__":  # pragma: no cover - python -m portalctl.cli
    main()
