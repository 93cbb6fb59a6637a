"""A stand-in ``pynvml`` for a real agent process in tests: put this folder on PYTHONPATH.

Its GPUs are the JSON list in the file ``FAKE_NVML_FILE`` names, read at every
call (a test rewrites it to take a GPU away or heat one up), each as
``workers.tests.fake_nvml.FakeGpu``'s fields.  The library boundary is the
only thing faked: the agent imports it as it would import the real one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from workers.tests.fake_nvml import FakeGpu, FakeNvml


def _nvml() -> FakeNvml:
    rows = json.loads(Path(os.environ["FAKE_NVML_FILE"]).read_text())
    return FakeNvml([FakeGpu(**row) for row in rows])


def __getattr__(name: str) -> Any:
    """Every ``nvml*`` function and constant, answered from the file's GPUs now."""
    nvml = _nvml()
    if name == "nvmlDeviceGetHandleByIndex":
        return lambda index: index  # a handle is the index: the file is read again per call
    value = getattr(nvml, name)
    if callable(value) and name.startswith("nvmlDevice") and name != "nvmlDeviceGetCount":
        return lambda handle, *rest: getattr(_nvml(), name)(_nvml().gpus[handle], *rest)
    return value
