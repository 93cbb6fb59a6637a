"""``python -m fabric``: allocate jobs, check allocations for shared links, measure ECMP collisions.

Bad input (missing or malformed files, bad options) prints one line to stderr
and exits with status 2; nothing else is printed then.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from fabric.allocator import Allocation, VClosAllocator
from fabric.collisions import measure
from fabric.contention import analyze
from fabric.errors import FabricError, PlacementError, UnknownJobError
from fabric.routing import EcmpRouting, LinkIds, Router, SourceRouting
from fabric.topology import FabricSpec, load_spec
from fabric.traffic import PATTERNS, Step, pattern_steps


class InputError(Exception):
    """Bad command-line input; becomes a one-line message and exit status 2."""


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")


def _err(line: str) -> None:
    sys.stderr.write(line + "\n")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise InputError(message)


def _read_json(path: str, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{what} {path} is not valid JSON: {exc.msg} at line {exc.lineno}"
        ) from exc


def _parse_jobs(data: Any) -> list[tuple[str, Any]]:
    """Validate the jobs file into ("job", (id, gpus)) and ("release", [ids]) entries."""
    if not isinstance(data, list):
        raise InputError("jobs file must be a JSON list")
    out: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise InputError(f"jobs[{i}] must be an object")
        if set(item) == {"release"}:
            ids = item["release"]
            if not isinstance(ids, list) or not all(
                isinstance(x, str | int) and not isinstance(x, bool) for x in ids
            ):
                raise InputError(f"jobs[{i}].release must be a list of job ids")
            unknown = [str(x) for x in ids if str(x) not in seen]
            if unknown:
                raise InputError(
                    f"jobs[{i}] releases unknown or later job(s): {', '.join(unknown)}"
                )
            out.append(("release", [str(x) for x in ids]))
            continue
        if set(item) != {"job", "gpus"}:
            raise InputError(f'jobs[{i}] must be {{"job": ID, "gpus": N}} or {{"release": [IDs]}}')
        job, gpus = item["job"], item["gpus"]
        if isinstance(job, bool) or not isinstance(job, str | int) or str(job) == "":
            raise InputError(f"jobs[{i}].job must be a string or integer id")
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise InputError(f"jobs[{i}].gpus must be a positive integer")
        if str(job) in seen:
            raise InputError(f"jobs[{i}]: job {job} appears twice")
        seen.add(str(job))
        out.append(("job", (str(job), gpus)))
    return out


def _result(alloc: Allocation) -> dict[str, Any]:
    return {
        "job": alloc.job_id,
        "gpus": list(alloc.gpus),
        "leaves": list(alloc.leaves),
        "spines": list(alloc.spines),
        "uplinks": list(alloc.uplinks),
        "routes": {
            str(leaf): {str(p): s for p, s in m.items()} for leaf, m in alloc.routes.items()
        },
    }


def cmd_allocate(args: argparse.Namespace) -> int:
    """Allocate jobs in order; print one result per job."""
    spec = load_spec(args.topology)
    entries = _parse_jobs(_read_json(args.jobs, "jobs file"))
    alloc = VClosAllocator(spec)
    results: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    for kind, payload in entries:
        if kind == "release":
            for job in payload:
                try:
                    alloc.release(job)
                except UnknownJobError:
                    continue  # the job was refused earlier: nothing to free
                results[index[job]]["released"] = True
            continue
        job, gpus = payload
        index[job] = len(results)
        res = alloc.try_allocate(job, gpus)
        if isinstance(res, PlacementError):
            results.append({"job": job, "error": res.reason, "code": res.code})
        else:
            results.append(_result(res))
    if args.json:
        _out(json.dumps(results))
    else:
        for r in results:
            if "error" in r:
                _out(f"{r['job']}: not placed ({r['code']}): {r['error']}")
                continue
            if r.get("released"):
                _out(f"{r['job']}: {len(r['gpus'])} GPUs on leaves {r['leaves']} (released later)")
            else:
                _out(
                    f"{r['job']}: {len(r['gpus'])} GPUs on leaves {r['leaves']}"
                    + (f" via spines {r['spines']}" if r["spines"] else " (single leaf)")
                )
        _out(f"free GPUs: {alloc.free_gpu_count()} of {spec.total_gpus}")
    return 0


def _load_allocations(spec: FabricSpec, path: str) -> list[Allocation]:
    data = _read_json(path, "allocations file")
    if not isinstance(data, list):
        raise InputError("allocations file must be a JSON list")
    allocs: list[Allocation] = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise InputError(f"allocations[{i}] must be an object")
        if "error" in item or item.get("released") is True:
            continue  # refused, or freed later in the same `allocate --json` run
        try:
            allocs.append(Allocation.from_dict(item))
        except ValueError as exc:
            raise InputError(f"allocations[{i}]: {exc}") from exc
    VClosAllocator(spec).restore(allocs)  # raises AllocationConflictError on overlap
    return allocs


def cmd_check(args: argparse.Namespace) -> int:
    """Per job and across jobs: links that carry more than one flow in a step."""
    spec = load_spec(args.topology)
    allocs = _load_allocations(spec, args.allocations)
    router: Router = (
        SourceRouting(spec, allocs)
        if args.routing == "source"
        else EcmpRouting(spec, seed=args.seed)
    )
    ids = LinkIds(spec)
    per_job: dict[str, Any] = {}
    job_steps: list[list[Step]] = []
    for a in allocs:
        steps = pattern_steps(args.pattern, a.gpus, 1.0, a.gpus_per_leaf)
        job_steps.append(steps)
        rep = analyze(spec, steps, router)
        per_job[a.job_id] = {
            "steps": len(steps),
            "contended_steps": rep.contended_steps,
            "max_flows": rep.max_flows,
            "slowdown": round(rep.slowdown, 4),
            "links": sorted({ids.describe(link) for s in rep.steps for link in s.contended}),
        }
    longest = max((len(s) for s in job_steps), default=0)
    together = [
        Step(
            tuple(f for steps in job_steps if steps for f in steps[t % len(steps)].flows),
            f"step {t}",
        )
        for t in range(longest)
    ]
    rep = analyze(spec, together, router)
    summary = {
        "pattern": args.pattern,
        "routing": args.routing,
        "jobs": per_job,
        "together": {
            "steps": len(together),
            "contended_steps": rep.contended_steps,
            "max_flows": rep.max_flows,
            "slowdown": round(rep.slowdown, 4),
            "links": sorted({ids.describe(link) for s in rep.steps for link in s.contended}),
        },
    }
    if args.json:
        _out(json.dumps(summary))
    else:
        for job, r in per_job.items():
            state = (
                "contention-free"
                if not r["contended_steps"]
                else f"{r['contended_steps']} contended steps"
            )
            _out(f"{job}: {state}, max {r['max_flows']} flows/link, slowdown {r['slowdown']}")
            for link in r["links"]:
                _out(f"  shared: {link}")
        t = summary["together"]
        state = (
            "contention-free"
            if not t["contended_steps"]
            else f"{t['contended_steps']} contended steps"
        )
        _out(
            f"all jobs together: {state}, max {t['max_flows']} flows/link, slowdown {t['slowdown']}"
        )
        for link in t["links"]:
            _out(f"  shared: {link}")
    return 0


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise InputError(f"expected a comma-separated list of integers, got {text!r}") from exc
    if not vals or any(v < 1 for v in vals):
        raise InputError(f"expected positive integers, got {text!r}")
    return vals


def cmd_collisions(args: argparse.Namespace) -> int:
    """ECMP collision measurement over fabrics of several sizes."""
    rows = []
    if args.trials < 1 or args.job_gpus < 1:
        raise InputError("--trials and --job-gpus must be positive")
    for leaves in _int_list(args.leaves):
        spec = FabricSpec(
            leaves=leaves,
            spines=args.spines,
            servers_per_leaf=args.servers_per_leaf,
            gpus_per_server=args.gpus_per_server,
        )
        if args.job_gpus > spec.total_gpus:
            raise InputError(
                f"--job-gpus {args.job_gpus} exceeds the {spec.total_gpus} GPUs of {leaves} leaves"
            )
        for placement, routing in (("random", "ecmp"), ("vclos", "ecmp"), ("vclos", "source")):
            st = measure(
                spec,
                args.job_gpus,
                args.trials,
                args.seed,
                placement,
                routing,
                args.pattern,
                args.jobs,
            )
            row = st.to_dict()
            row["p_worst_ge"] = {str(k): round(st.p_worst_at_least(k), 4) for k in range(2, 9)}
            rows.append(row)
            if not args.json:
                hist = " ".join(f"{w}:{c}" for w, c in st.worst_link_hist)
                _out(
                    f"{leaves:4d} leaves {spec.total_gpus:6d} GPUs {st.jobs:4d} jobs  {placement:6s}+{routing:6s} "
                    f"P(contention)={st.p_contention:6.1%}  jobs slowed={st.slowed_job_fraction:6.1%}  "
                    f"mean slowdown={st.mean_slowdown:5.2f}  worst-link flows [{hist}]"
                )
    if args.json:
        _out(json.dumps(rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m fabric``."""
    p = _Parser(prog="python -m fabric", description="Leaf-spine fabric tools (vClos).")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    a = sub.add_parser("allocate", help="place jobs in order with the vClos allocator")
    a.add_argument("--topology", required=True, help="topology JSON or YAML")
    a.add_argument(
        "--jobs", required=True, help='JSON list of {"job": ID, "gpus": N} / {"release": [IDs]}'
    )
    a.add_argument("--json", action="store_true", help="print a JSON list, one object per job")
    a.set_defaults(func=cmd_allocate)
    c = sub.add_parser("check", help="find links shared by flows in allocations")
    c.add_argument("--topology", required=True)
    c.add_argument("--allocations", required=True, help="JSON list as printed by allocate --json")
    c.add_argument("--pattern", choices=PATTERNS, default="ring")
    c.add_argument("--routing", choices=("source", "ecmp"), default="source")
    c.add_argument("--seed", type=int, default=0, help="ECMP hash seed")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_check)
    k = sub.add_parser("collisions", help="measure ECMP flow collisions for concurrent jobs")
    k.add_argument("--leaves", default="2,4,8,16,32,64", help="comma list of leaf counts")
    k.add_argument("--spines", type=int, default=16)
    k.add_argument("--servers-per-leaf", type=int, default=4)
    k.add_argument("--gpus-per-server", type=int, default=4)
    k.add_argument("--job-gpus", type=int, default=16)
    k.add_argument(
        "--jobs", type=int, default=None, help="concurrent jobs (default: fill the fabric)"
    )
    k.add_argument("--pattern", choices=PATTERNS, default="ring")
    k.add_argument("--trials", type=int, default=200)
    k.add_argument("--seed", type=int, default=0)
    k.add_argument("--json", action="store_true")
    k.set_defaults(func=cmd_collisions)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
        status: int = args.func(args)
        return status
    except (InputError, FabricError, ValueError) as exc:
        msg = " ".join(str(exc).split()) or type(exc).__name__
        _err(f"error: {msg}")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
