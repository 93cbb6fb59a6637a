"""Each runtime event is declared once, in ``workers.runtime_events``, and nowhere else.

The runtime writes an event, the agent reads it and the portal gets its report
from the one declaration; these tests fail when a second one creeps back in:

* a module of ``workers/`` (tests aside: they play the tenant's program, which
  may write anything) that builds a stream entry from a dict literal, writes to
  a job's event stream other than through ``workers.elastic.control.publish``,
  lists event kinds of its own (three or more), or branches on an event's kind
  by name (``kind == "progress"``, ``kind in (...)``), or declares a class of
  an event's kind (``TYPE = "progress"``; the reports of ``workers.protocol`` aside);
* an event class that is not declared, a kind declared twice, an event whose
  report does not take exactly what the declaration makes of it.

Each rule of the source scan is shown to fire on a planted violation.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

import workers
from workers.protocol import EVENT_REPORTS, JobEventReport, JobReport
from workers.runtime_events import (
    EVENT_KINDS,
    RuntimeEvent,
    declare,
    event_types,
    wire,
)
from workers.tests.test_runtime_event_wire import GOLDEN

WORKERS = Path(workers.__file__).resolve().parent
DECLARATIONS = "runtime_events.py"
REPORTS = "protocol.py"
"""Where the reports live: each event kind's report type may share the kind's name."""
WRITER = ("elastic/control.py", "publish")
"""The one function that appends to a job's event stream."""

BASE_FIELDS = {f.name for f in dataclasses.fields(JobEventReport)} | {"event_id"}


def product_modules() -> list[Path]:
    """Every module of ``workers/`` but its tests."""
    return sorted(p for p in WORKERS.rglob("*.py") if "tests" not in p.relative_to(WORKERS).parts)


def _string(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _named(node: ast.AST, name: str) -> bool:
    return (isinstance(node, ast.Name) and node.id == name) or (
        isinstance(node, ast.Attribute) and node.attr == name
    )


def _function_of(tree: ast.Module) -> dict[ast.AST, str]:
    """The name of the top-level function (or method) each node lies in."""
    owner: dict[ast.AST, str] = {}
    for top in ast.walk(tree):
        if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(top):
                owner.setdefault(node, top.name)
    return owner


def violations(source: str, where: str) -> list[str]:
    """What in one module's source declares or handles an event kind a second time."""
    tree = ast.parse(source)
    owner = _function_of(tree)
    kinds = set(EVENT_KINDS)
    found: list[str] = []
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Dict):
            keys = {_string(key) for key in node.keys}
            if "kind" in keys and "data" in keys:
                found.append(f"{line} builds an event-stream entry from a dict literal")
        elif isinstance(node, ast.Call) and _named(node.func, "xadd") and node.args:
            writer = (where, owner.get(node))
            if _named(node.args[0], "events") and writer != WRITER:
                found.append(f"{line} writes to a job's event stream outside publish")
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            listed = {text for item in node.elts if (text := _string(item)) in kinds}
            if len(listed) >= 3:  # two may be job states too (``finished``, ``failed``)
                found.append(f"{line} lists event kinds: {', '.join(sorted(listed))}")
        elif isinstance(node, ast.ClassDef) and where != REPORTS:
            for item in node.body:
                targets: list[ast.expr] = []
                if isinstance(item, ast.AnnAssign):
                    targets = [item.target]
                elif isinstance(item, ast.Assign):
                    targets = item.targets
                value = item.value if isinstance(item, ast.Assign | ast.AnnAssign) else None
                declared = _string(value)
                if declared in kinds and any(_named(t, "TYPE") for t in targets):
                    found.append(f"{line} declares event kind {declared} again")
        elif isinstance(node, ast.Compare) and _named(node.left, "kind"):
            compared = [_string(c) for c in node.comparators]
            compared += [
                _string(item)
                for c in node.comparators
                if isinstance(c, ast.Tuple | ast.List | ast.Set)
                for item in c.elts
            ]
            if set(compared) & kinds:
                found.append(f"{line} branches on an event kind by name")
    return found


def test_no_module_but_the_declarations_writes_reads_or_lists_an_event_kind() -> None:
    found: list[str] = []
    for path in product_modules():
        where = str(path.relative_to(WORKERS))
        if where != DECLARATIONS:
            found += violations(path.read_text(), where)
    assert found == []


PLANTED = {
    "entry": 'client.xadd(stream, {"kind": "progress", "data": "{}"})\n',
    "stream": "def emit(client, keys, fields):\n    client.xadd(keys.events, fields)\n",
    "listing": 'KINDS = ("progress", "finished", "failed")\n',
    "branch": 'def report(kind):\n    if kind == "scale_done":\n        return 1\n',
    "membership": 'def known(kind):\n    return kind in ("straggler", "x")\n',
    "class": 'class Finished(Message):\n    TYPE: ClassVar[str] = "finished"\n',
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_each_rule_fires_on_a_planted_second_declaration(name: str) -> None:
    assert len(violations(PLANTED[name], "planted.py")) == 1


def test_the_one_writer_may_write_the_stream() -> None:
    source = "def publish(client, keys, event):\n    client.xadd(keys.events, event.entry())\n"
    assert violations(source, WRITER[0]) == []
    assert violations(source.replace("publish", "emit"), WRITER[0]) != []


def _every_subclass(cls: type[RuntimeEvent]) -> set[type[RuntimeEvent]]:
    out: set[type[RuntimeEvent]] = set()
    for sub in cls.__subclasses__():
        if sub.__module__ != __name__:  # this module's own planted classes
            out |= {sub} | _every_subclass(sub)
    return out


def test_every_event_class_is_declared_under_its_own_kind() -> None:
    declared = event_types()
    assert set(declared) == set(EVENT_KINDS)
    assert _every_subclass(RuntimeEvent) == set(declared.values())
    assert all(kind == cls.TYPE for kind, cls in declared.items())


def test_every_kind_the_runtime_publishes_is_declared_and_every_declared_kind_is_published() -> (
    None
):
    """``publish(client, keys, XxxEvent(...))`` (or of a variable bound to one) in the runtime."""
    names = {cls.__name__ for cls in event_types().values()}
    made: set[str] = set()
    for path in sorted((WORKERS / "elastic").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            called = (
                node.func.id
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                else ""
            )
            if called.endswith("Event") and called != "RuntimeEvent":
                made.add(called)
    assert made == names


@pytest.mark.parametrize("kind", EVENT_KINDS)
def test_each_event_makes_exactly_the_fields_of_its_report(kind: str) -> None:
    event = event_types()[kind]
    report = EVENT_REPORTS[kind]
    assert issubclass(report, JobReport) and report.TYPE == event.REPORT
    report_fields = {f.name: f for f in dataclasses.fields(report)}
    made = event.report_names()
    assert not made & BASE_FIELDS, "the agent, not the event, says node, job and event_id"
    assert made <= set(report_fields), f"{kind} names fields its report lacks"
    required = {
        name
        for name, f in report_fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    assert required - BASE_FIELDS <= made, f"{kind} leaves a field its report needs"


def test_a_kind_declared_twice_refuses_to_import() -> None:
    @dataclass(frozen=True, kw_only=True)
    class AnotherProgress(RuntimeEvent):
        TYPE: ClassVar[str] = "progress"
        REPORT: ClassVar[str] = "progress"
        step: int = wire()

    with pytest.raises(TypeError, match="declared twice"):
        declare(AnotherProgress)
    assert event_types()["progress"] is not AnotherProgress


def test_an_undeclared_field_refuses_to_import() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Loose(RuntimeEvent):
        TYPE: ClassVar[str] = "loose"
        REPORT: ClassVar[str] = "progress"
        step: int

    with pytest.raises(TypeError, match="not declared with wire"):
        declare(Loose)
    assert "loose" not in event_types()


@pytest.mark.parametrize(
    ("event", "entry"),
    [(event, entry) for event, entry, _report in GOLDEN],
    ids=[f"{entry['kind']}-{i}" for i, (_e, entry, _r) in enumerate(GOLDEN)],
)
def test_what_an_event_makes_is_what_its_declaration_names(
    event: RuntimeEvent, entry: dict[str, str]
) -> None:
    """``report_names`` (what the report check above trusts) is what ``report_fields`` makes."""
    body = json.loads(entry["data"])
    assert set(type(event).report_fields(body)) == type(event).report_names()
