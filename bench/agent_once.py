"""One program started once by a real node agent, for benchmarks of the launch path.

``run_program`` builds the real ``workers.agent.agent.Agent`` from a config,
hands it one start command, ticks it until the worker exits, and returns the
JSON line the program printed last with the agent's reports (used by
``bench/sandbox_cost.py`` and ``bench/environments.py``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from workers.agent.agent import Agent
from workers.agent.config import AgentConfig
from workers.agent.store import AgentStore
from workers.protocol import Report, WorkerExited


def run_program(
    config: AgentConfig, code_root: Path, payload: dict[str, Any]
) -> tuple[float, dict[str, Any], list[Report]]:
    """Start ``payload`` (one worker ``w0``) on a fresh agent; when the command was handed
    over, what the program printed last (a JSON line), and the agent's reports."""
    sent: list[Report] = []
    agent = Agent(
        config,
        AgentStore.from_url(config.redis_url, config.node),
        send=sent.append,
        resolve_code=lambda program: code_root / program.code,
    )
    try:
        began = time.time()
        if agent.receive(payload) != "applied":
            raise RuntimeError(f"the start was not applied: {sent}")
        while not any(isinstance(r, WorkerExited) for r in sent):
            agent.tick()
            time.sleep(0.02)
        text = config.log_path(payload["job"], "w0").read_text()
        lines = [line for line in text.splitlines() if line.startswith("{")]
        if not lines:
            raise RuntimeError(f"the program reported nothing:\n{text[-3000:]}")
        return began, json.loads(lines[-1]), sent
    finally:
        agent.close(stop_children=True)
