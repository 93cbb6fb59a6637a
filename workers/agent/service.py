"""The agent as a Celery worker: the command task, the signals, the command line.

The agent owns long-lived child processes, so the Celery worker runs with the
``threads`` pool: tasks execute in the agent's own process, next to the
supervisor thread that watches the children (started on ``worker_ready``,
stopped on ``worker_shutdown``).

No Django here: settings come from the environment (``AgentEnvironment``)
and the Celery app is the agent's own (``workers.agent.celery_app``), so a
GPU server runs ``python -m workers.agent`` with only ``REDIS_URL`` set.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from celery import Celery

from workers.agent.agent import Agent
from workers.agent.celery_app import BrokerNotConfigured, agent_app
from workers.agent.code_cache import CodeCache
from workers.agent.config import AgentConfig, AgentConfigError, AgentEnvironment, detect_slots
from workers.agent.gpus import GpuDevice, host_gpus, slot_devices
from workers.agent.processes import ResolveCode, no_code_cache
from workers.agent.reports import send_heartbeat, send_report
from workers.agent.store import AgentStore
from workers.artifacts import ArtifactStore
from workers.protocol import (
    AGENT_COMMAND_TASK,
    HEARTBEATS_QUEUE,
    REPORTS_QUEUE,
    ProtocolError,
    agent_queue,
    check_name,
)

log = logging.getLogger(__name__)

_AGENT: Agent | None = None


def current_agent() -> Agent:
    """The agent of this process (set by ``run``)."""
    if _AGENT is None:
        raise RuntimeError("no agent runs in this process")
    return _AGENT


def _register_task(app: Celery) -> None:
    if AGENT_COMMAND_TASK in app.tasks:
        return

    @app.task(name=AGENT_COMMAND_TASK, ignore_result=True, acks_late=True)
    def agent_command(payload: Any) -> str:  # pragma: no cover - runs in the agent process
        """Check the signature of one command of workers.protocol, and apply it on this node."""
        return current_agent().receive_signed(payload)


def _on_worker_ready(**_: Any) -> None:
    agent = current_agent()
    agent.start()
    log.info(
        "agent %s ready: %d %s slot(s), queue agent.%s",
        agent.config.node,
        agent.config.slots,
        agent.config.device,
        agent.config.node,
    )


def _on_worker_shutdown(**_: Any) -> None:
    if _AGENT is not None:
        _AGENT.close()


def build_parser(prog: str = "python -m workers.agent") -> argparse.ArgumentParser:
    """The command line shared by ``python -m workers.agent`` and ``manage.py agent``."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Run the node agent: a Celery worker on queue agent.<node>."
    )
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the agent's options to ``parser``."""
    parser.add_argument("--node", required=True, help="this server's node name")
    parser.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="CUDA devices to use (default: all); on a server without GPUs, CPU slots "
        "(default: one per core)",
    )
    parser.add_argument("--cpu", action="store_true", help="offer CPU slots even if CUDA exists")
    parser.add_argument(
        "--reports-queue",
        default=REPORTS_QUEUE,
        help="queue the reports go to (default: %(default)s)",
    )
    parser.add_argument(
        "--heartbeats-queue",
        default=HEARTBEATS_QUEUE,
        help="queue the heartbeats go to (default: %(default)s; the report worker consumes "
        "it beside the reports' queue, so a backlog of reports never delays a heartbeat)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=4, help="commands applied at once (threads)"
    )
    parser.add_argument(
        "--stop-children-on-exit",
        action="store_true",
        help="end the training processes when the agent stops (default: leave them running; "
        "a restarted agent adopts them)",
    )
    parser.add_argument(
        "--key-file",
        default=None,
        help="file holding this node's signing key in hex (else AGENT_KEY or AGENT_KEY_FILE)",
    )
    parser.add_argument("--loglevel", default="INFO")


def config_from_options(
    options: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> AgentConfig:
    """Build the agent's settings from parsed options and the environment (``AgentEnvironment``)."""
    try:
        check_name(options.node, "--node")
    except ProtocolError as exc:
        raise AgentConfigError(str(exc)) from None
    if options.concurrency < 1:
        raise AgentConfigError("--concurrency must be at least 1")
    device, slots = detect_slots(options.gpus, force_cpu=options.cpu)
    env = AgentEnvironment.read(environ, key_file=getattr(options, "key_file", None))
    if not env.key:
        raise AgentConfigError(
            "no agent key: set AGENT_KEY or AGENT_KEY_FILE, or pass --key-file "
            "(manage.py agentkey NODE prints a node's key)"
        )
    gpus: tuple[GpuDevice, ...] = ()
    if device == "cuda":
        gpus = slot_devices(host_gpus(), os.environ.get("CUDA_VISIBLE_DEVICES"), slots)
        if not gpus:
            log.warning(
                "cannot tell which GPU each slot is (/proc/driver/nvidia/gpus): slot k is CUDA "
                "device k and every sandbox gets every /dev/nvidia*"
            )
    return AgentConfig(
        node=options.node,
        device=device,
        slots=slots,
        gpus=gpus,
        redis_url=env.redis_url,
        data_dir=env.data_dir,
        reports_queue=options.reports_queue,
        heartbeats_queue=options.heartbeats_queue,
        heartbeat_seconds=env.heartbeat_seconds,
        heartbeat_expires_seconds=max(env.heartbeat_seconds, env.down_after_seconds),
        stop_children_on_exit=options.stop_children_on_exit,
        concurrency=options.concurrency,
        sandbox=env.sandbox,
        artifact_url=env.artifact_url,
        address=env.address,
        step_log_dir=env.step_log_dir,
        collect_limits=env.collect_limits,
        mirror_limits=env.mirror_limits,
        key=env.key,
        message_max_age_s=env.message_max_age_s,
        message_max_skew_s=env.message_max_skew_s,
        cleanup=env.cleanup,
        environments=env.environments,
        session_home_sync_s=env.session_home_sync_s,
        home_limits=env.home_limits,
    )


def make_agent(config: AgentConfig, app: Celery) -> Agent:
    """An agent that reports through ``app`` and takes programs' code through its code cache."""
    return Agent(
        config,
        AgentStore.from_url(config.redis_url, config.node),
        resolve_code=code_resolver(config),
        send=lambda report: send_report(
            report, key=config.key, queue=config.reports_queue, app=app
        ),
        send_heartbeat=lambda beat: send_heartbeat(
            beat,
            key=config.key,
            queue=config.heartbeats_queue,
            expires_seconds=config.heartbeat_expires_seconds,
            app=app,
        ),
    )


def code_resolver(config: AgentConfig) -> ResolveCode:
    """A program's unpacked bundle: fetched from the artifact store once per node."""
    if not config.artifact_url:
        return no_code_cache
    cache = CodeCache(config.code_cache_dir(), ArtifactStore(config.artifact_url))
    return lambda program: cache.ensure(program.code, program.code_path)


def run(config: AgentConfig, loglevel: str = "INFO", app: Celery | None = None) -> None:
    """Run the agent until the Celery worker stops (SIGTERM/SIGINT: warm shutdown).

    ``app`` defaults to the agent's own Celery app (broker from the environment).
    """
    global _AGENT
    from celery.signals import (
        worker_ready,
        worker_shutdown,
    )

    app = app if app is not None else agent_app()
    _AGENT = make_agent(config, app)
    _AGENT.restore()
    _register_task(app)
    worker_ready.connect(_on_worker_ready, weak=False, dispatch_uid="agent-ready")
    worker_shutdown.connect(_on_worker_shutdown, weak=False, dispatch_uid="agent-shutdown")
    argv = [
        "worker",
        "--queues", agent_queue(config.node),
        "--pool", "threads",
        "--concurrency", str(config.concurrency),
        "--hostname", f"agent@{config.node}",
        "--without-gossip",
        "--without-mingle",
        "--loglevel", loglevel,
    ]  # fmt: skip
    app.worker_main(argv)


def main(argv: list[str] | None = None, prog: str = "python -m workers.agent") -> int:
    """Entry point of ``python -m workers.agent``; exit status 2 on bad input."""
    options = build_parser(prog).parse_args(argv)
    return run_options(options)


def run_options(options: argparse.Namespace) -> int:
    """Run from parsed options (shared with the management command)."""
    try:
        config = config_from_options(options)
        app = agent_app()
    except (AgentConfigError, BrokerNotConfigured) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    run(config, loglevel=options.loglevel, app=app)
    return 0
