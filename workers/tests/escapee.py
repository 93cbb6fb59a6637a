"""A source distribution whose build backend tries to leave the sandbox while uv builds it.

Shared by ``workers/tests/test_build_sandbox.py`` and the end-to-end test
(``tests/test_e2e.py``).  The backend needs no index (in-tree, no build
requirements); what its attempts saw is compiled into the package it builds
(``escapee.SEEN``, a JSON text), so a test or a job's program reads it back.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

ATTEMPTS = r"""
import os, socket, urllib.request

def attempts():
    seen = {"uid": os.getuid()}
    try:
        open(MARKER, "w").write("escaped")
        seen["host_tmp"] = "written in the sandbox's own /tmp"
    except OSError as exc:
        seen["host_tmp"] = type(exc).__name__
    for name, path in (("data", DATA_FILE), ("shadow", "/etc/shadow")):
        try:
            seen[name] = open(path).read()
        except OSError as exc:
            seen[name] = type(exc).__name__
    try:
        open(os.path.join(os.path.dirname(DATA_FILE), "planted"), "w").write("x")
        seen["plant"] = "planted"
    except OSError as exc:
        seen["plant"] = type(exc).__name__
    for name, port in (("loopback", LOOPBACK_PORT),):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=3).close()
            seen[name] = "connected"
        except OSError as exc:
            seen[name] = type(exc).__name__
    proxy = os.environ.get("HTTP_PROXY")
    if proxy:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy}))
        try:
            opener.open(f"http://127.0.0.1:{LOOPBACK_PORT}/", timeout=5)
            seen["via_proxy"] = "reached"
        except Exception as exc:
            seen["via_proxy"] = str(getattr(exc, "code", type(exc).__name__))
    return seen
"""

BACKEND = r"""
import base64, hashlib, json, os, zipfile
NAME, VERSION = "escapee", "1.0"

def _metadata():
    return f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"

def get_requires_for_build_wheel(config_settings=None):
    return []

def prepare_metadata_for_build_wheel(directory, config_settings=None):
    info = os.path.join(directory, f"{NAME}-{VERSION}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(_metadata())
    return os.path.basename(info)

def build_wheel(directory, config_settings=None, metadata_directory=None):
    seen = attempts()
    wheel = f"{NAME}-{VERSION}-py3-none-any.whl"
    files = {
        f"{NAME}/__init__.py": f"SEEN = {json.dumps(seen)!r}\n",
        f"{NAME}-{VERSION}.dist-info/METADATA": _metadata(),
        f"{NAME}-{VERSION}.dist-info/WHEEL":
            "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    with zipfile.ZipFile(os.path.join(directory, wheel), "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
            record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
        record.append(f"{NAME}-{VERSION}.dist-info/RECORD,,")
        archive.writestr(f"{NAME}-{VERSION}.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel
"""


def escapee_sdist(where: Path, marker: Path, data_file: Path, loopback_port: int) -> Path:
    """A source distribution whose build backend tries to leave (``ATTEMPTS``)."""
    constants = (
        f"MARKER = {str(marker)!r}\nDATA_FILE = {str(data_file)!r}\n"
        f"LOOPBACK_PORT = {loopback_port}\n"
    )
    files = {
        "escapee-1.0/backend.py": constants + ATTEMPTS + BACKEND,
        "escapee-1.0/pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\n'
        'backend-path = ["."]\n[project]\nname = "escapee"\nversion = "1.0"\n',
        "escapee-1.0/PKG-INFO": "Metadata-Version: 2.1\nName: escapee\nVersion: 1.0\n",
    }
    where.mkdir(parents=True, exist_ok=True)
    path = where / "escapee-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as sdist:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            sdist.addfile(info, io.BytesIO(data))
    return path
