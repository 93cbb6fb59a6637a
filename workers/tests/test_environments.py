"""Building tenants' environments with uv: from a local wheel directory (no network), for real.

Each test makes small pure-Python wheels (a real wheel: metadata, RECORD with
hashes, console scripts) and has the cache build with the real ``uv`` against
this interpreter as the base layer: what the plan keeps, installs and refuses,
the cache's hit, its lock, its memory of failures, its eviction.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest

from workers.agent.environments import (
    BaseLayer,
    EnvironmentCache,
    EnvironmentFailed,
    EnvironmentSettings,
    Plan,
    plan_of,
    replaced,
)
from workers.environment import check_environment


def make_wheel(
    where: Path,
    name: str,
    version: str,
    requires: tuple[str, ...] = (),
    script: str | None = None,
) -> Path:
    """A pure-Python wheel of ``name`` whose module says its version."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n\ndef main():\n    print({name!r}, VERSION)\n",
        f"{dist}/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    if script:
        files[f"{dist}/entry_points.txt"] = f"[console_scripts]\n{script} = {name}:main\n"
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = "\n".join(record) + "\n"
    where.mkdir(parents=True, exist_ok=True)
    wheel = where / f"{name}-{version}-py3-none-any.whl"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    wheel.write_bytes(buffer.getvalue())
    return wheel


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    where = tmp_path / "wheels"
    make_wheel(where, "alpha", "1.0", requires=("beta>=1",), script="alpha-say")
    make_wheel(where, "beta", "1.2")
    make_wheel(where, "beta", "0.9")
    return where


def cache_of(tmp_path: Path, wheels: Path, **settings: object) -> EnvironmentCache:
    given = {
        "root": tmp_path / "envs",
        "find_links": str(wheels),
        "no_index": True,
        "timeout_s": 120.0,
        **settings,
    }
    return EnvironmentCache(EnvironmentSettings(**given))  # type: ignore[arg-type]


def run_with(env_site: Path, code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(env_site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_a_request_is_built_once_beyond_the_base_and_a_second_job_hits_the_cache(
    tmp_path: Path, wheels: Path
) -> None:
    cache = cache_of(tmp_path, wheels)
    spec = check_environment({"requirements": ["alpha==1.0", "packaging"]})
    log = io.StringIO()
    built = cache.ensure(spec, log)
    assert not built.hit and built.packages == ("alpha==1.0", "beta==1.2")  # not packaging
    assert "[environment]" in log.getvalue()
    assert (
        run_with(built.site, "import alpha, beta; print(alpha.VERSION, beta.VERSION)") == "1.0 1.2"
    )
    assert (built.scripts / "alpha-say").is_file()
    assert not os.access(built.site / "alpha" / "__init__.py", os.W_OK) or os.geteuid() == 0
    assert oct((built.site / "alpha" / "__init__.py").stat().st_mode & 0o777) == "0o444"
    manifest = json.loads((built.path / "manifest.json").read_text())
    assert manifest["requirements"] == ["alpha==1.0", "packaging"]
    again = cache.ensure(spec)
    assert again.hit and again.path == built.path and again.packages == built.packages
    assert "cache hit" in again.used().describe() and "built in" in built.used().describe()
    assert not [p for p in cache.root.iterdir() if p.name.startswith(".build-")]


def test_what_the_base_already_has_installs_nothing(tmp_path: Path, wheels: Path) -> None:
    cache = cache_of(tmp_path, wheels)
    empty = cache.ensure(check_environment({"requirements": ["packaging", "torch"]}))
    assert empty.packages == () and list(empty.site.iterdir()) == []


def test_a_pin_that_would_replace_the_nodes_torch_fails_and_the_failure_is_remembered(
    tmp_path: Path, wheels: Path
) -> None:
    cache = cache_of(tmp_path, wheels)
    spec = check_environment({"requirements": ["torch==2.3.0"]})
    with pytest.raises(EnvironmentFailed, match="would replace the node's torch") as first:
        cache.ensure(spec)
    assert not first.value.known
    with pytest.raises(EnvironmentFailed) as second:  # told at once, not rebuilt
        cache.ensure(spec)
    assert second.value.known and second.value.reason == first.value.reason
    assert not [p for p in cache.root.iterdir() if not p.name.startswith(".")]


def test_a_dependency_that_would_swap_a_base_package_is_caught_too(
    tmp_path: Path, wheels: Path
) -> None:
    """Not a direct pin: gamma needs an older packaging than the node's."""
    make_wheel(wheels, "gamma", "1.0", requires=("packaging<20",))
    make_wheel(wheels, "packaging", "19.0")
    cache = cache_of(tmp_path, wheels)
    with pytest.raises(EnvironmentFailed) as caught:
        cache.ensure(check_environment({"requirements": ["gamma"]}))
    assert "would replace the node's packaging" in caught.value.reason
    assert "with 19.0" in caught.value.reason
    allowed = cache.ensure(check_environment({"requirements": ["gamma"], "replace": ["packaging"]}))
    assert set(allowed.packages) == {"gamma==1.0", "packaging==19.0"}


def test_an_unresolvable_request_fails_with_uvs_words(tmp_path: Path, wheels: Path) -> None:
    cache = cache_of(tmp_path, wheels)
    with pytest.raises(EnvironmentFailed) as caught:
        cache.ensure(check_environment({"requirements": ["alpha==9.9"]}))
    assert caught.value.reason.startswith("the environment did not build:")
    assert "alpha" in caught.value.reason and "9.9" in caught.value.reason


def test_a_package_with_sources_only_is_not_built(tmp_path: Path, wheels: Path) -> None:
    """Building sources would run the package's code on the node: wheels only."""
    (wheels / "delta-1.0.tar.gz").write_bytes(b"not really an sdist")
    cache = cache_of(tmp_path, wheels)
    with pytest.raises(EnvironmentFailed, match="did not build"):
        cache.ensure(check_environment({"requirements": ["delta"]}))


def test_a_package_whose_build_script_would_escape_never_runs(tmp_path: Path, wheels: Path) -> None:
    """A real sdist with an in-tree build backend (needs nothing from an index) that writes
    outside when it is imported: nothing of it runs on the node."""
    marker = tmp_path / "escaped"
    backend = f"import os\nopen({str(marker)!r}, 'w').write('ran as ' + str(os.getuid()))\n"
    backend += "def get_requires_for_build_wheel(config_settings=None):\n    return []\n"
    project = '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
    with tarfile.open(wheels / "evil-1.0.tar.gz", "w:gz") as sdist:
        for name, text in (
            ("evil-1.0/backend.py", backend),
            ("evil-1.0/pyproject.toml", project),
            ("evil-1.0/PKG-INFO", "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n"),
        ):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            sdist.addfile(info, io.BytesIO(data))
    cache = cache_of(tmp_path, wheels)
    with pytest.raises(EnvironmentFailed, match=r"no usable wheels|building from source"):
        cache.ensure(check_environment({"requirements": ["evil"]}))
    assert not marker.exists()


def test_the_node_runs_one_python(tmp_path: Path, wheels: Path) -> None:
    cache = cache_of(tmp_path, wheels)
    other = "3.9" if cache.base.python != "3.9" else "3.10"
    with pytest.raises(EnvironmentFailed, match=f"asks for Python {other}; this node runs"):
        cache.ensure(check_environment({"requirements": ["alpha"], "python": other}))


def test_concurrent_requests_of_one_key_build_it_once(tmp_path: Path, wheels: Path) -> None:
    cache = cache_of(tmp_path, wheels)
    spec = check_environment({"requirements": ["alpha"]})
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.ensure(spec))) for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 3 and sum(not r.hit for r in results) == 1


def test_the_least_recently_used_go_first_and_never_one_in_use(
    tmp_path: Path, wheels: Path
) -> None:
    cache = cache_of(tmp_path, wheels)
    first = cache.ensure(check_environment({"requirements": ["alpha"]}))
    second = cache.ensure(check_environment({"requirements": ["beta==0.9"]}))
    os.utime(cache.root / ".used" / first.key, (1, 1))  # the oldest use
    small = cache_of(tmp_path, wheels, max_bytes=1)
    assert small.evict(in_use={first.key}) == [second.key]
    assert small.ready(first.key) is not None and small.ready(second.key) is None
    assert small.evict() == [first.key]


def test_uvs_plan_is_read_or_refused() -> None:
    output = (
        "Resolved 2 packages in 3ms\nWould download 2 packages\nWould uninstall 1 package\n"
        "Would install 2 packages\n + einops==0.8.1\n - numpy==2.4.6\n + numpy==1.26.4\n"
    )
    plan = plan_of(output)
    assert plan == Plan(
        install=(("einops", "0.8.1"), ("numpy", "1.26.4")), remove=(("numpy", "2.4.6"),)
    )
    assert replaced(plan, check_environment({"requirements": ["x"]})) == [
        "the requirements would replace the node's numpy 2.4.6 with 1.26.4: jobs build on the "
        "node's numpy; pin a compatible version, or list 'numpy' in environment.replace to "
        "install another"
    ]
    assert replaced(plan, check_environment({"requirements": ["x"], "replace": ["numpy"]})) == []
    assert plan_of("Resolved 1 package in 2ms\nAudited 1 package in 0ms\n") == Plan()
    with pytest.raises(ValueError, match="could not be read"):
        plan_of("Would install 2 packages\n + einops==0.8.1\n")


def test_the_key_depends_on_the_base_layer(tmp_path: Path, wheels: Path) -> None:
    spec = check_environment({"requirements": ["alpha"]})
    base = BaseLayer.running()
    other = BaseLayer(base.python, base.executable, {**base.packages, "torch": "9.9"})
    settings = EnvironmentSettings(root=tmp_path)
    assert EnvironmentCache(settings, base).key(spec) != EnvironmentCache(settings, other).key(spec)


def test_a_failure_is_remembered_for_a_while_then_built_again(tmp_path: Path, wheels: Path) -> None:
    """An index that was down must not condemn a request for ever."""
    spec = check_environment({"requirements": ["alpha==9.9"]})
    remembering = cache_of(tmp_path, wheels)
    with pytest.raises(EnvironmentFailed):
        remembering.ensure(spec)
    with pytest.raises(EnvironmentFailed) as told:
        remembering.ensure(spec)
    assert told.value.known
    forgetting = cache_of(tmp_path, wheels, failure_memory_s=0.0)
    with pytest.raises(EnvironmentFailed) as again:
        forgetting.ensure(spec)
    assert not again.value.known  # built (and failed) anew


def test_a_complete_environment_is_measured_once(
    tmp_path: Path, wheels: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reports and evictions list the cache every minute: a read-only tree is walked once."""
    from workers.agent.quota import measure

    cache = cache_of(tmp_path, wheels)
    built = cache.ensure(check_environment({"requirements": ["alpha"]}))
    walks: list[object] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        walks.append(args)
        return measure(*args, **kwargs)

    monkeypatch.setattr("workers.agent.environments.measure", counted)
    [(key, size, _)] = cache.entries()
    assert key == built.key and size > 0 and len(walks) == 1
    assert cache.entries()[0][:2] == (key, size) and len(walks) == 1  # from memory
    cache.remove(key)
    again = cache.ensure(check_environment({"requirements": ["alpha"]}))
    assert cache.entries()[0][0] == again.key and len(walks) == 2  # a new tree: walked
