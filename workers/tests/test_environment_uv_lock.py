"""A bundle's ``uv.lock``: its index packages become exact pins; anything else is refused.

The fixture ``fixtures/uv.lock`` is what ``uv lock`` writes for a small project
(``mine``: einops, rich, tqdm; a ``dev`` group with pygments).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.environment import (
    BUNDLE_FILES,
    MAX_FILE_BYTES,
    MAX_REQUIREMENTS,
    bundle_requirements,
    lock_markers,
    uv_lock_pins,
)
from workers.program import ProgramError

LOCK = (Path(__file__).parent / "fixtures" / "uv.lock").read_text()
HEAD = 'version = 1\nrequires-python = ">=3.10"\n\n'
PROJECT = '[[package]]\nname = "mine"\nversion = "0.1.0"\nsource = { editable = "." }\n\n'


def package(name: str, version: str, source: str) -> str:
    return f'[[package]]\nname = "{name}"\nversion = "{version}"\nsource = {source}\n\n'


def refusal(text: str) -> ProgramError:
    with pytest.raises(ProgramError) as caught:
        uv_lock_pins(text)
    assert caught.value.field == "uv.lock", caught.value
    return caught.value


# ------------------------------------------------------------------------------ attacks


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        ('{ git = "https://github.com/evil/einops?rev=main#0123abcd" }', "git"),
        ('{ path = "../../etc/wheels/einops-0.8.1-py3-none-any.whl" }', "path"),
        ('{ url = "https://evil.example/einops-0.8.1.tar.gz" }', "url"),
        ('{ directory = "/opt/elsewhere" }', "directory"),
        ('{ editable = "../sibling" }', "editable"),
        ('{ virtual = "vendored/einops" }', "virtual"),
    ],
)
def test_a_package_from_anywhere_but_the_index_is_refused_naming_it_and_its_source(
    source: str, kind: str
) -> None:
    text = HEAD + PROJECT + package("einops", "0.8.1", source)
    problem = refusal(text)
    assert "einops" in problem.message and kind in problem.message, problem
    assert "only packages from the operator's index" in problem.message


def test_a_lock_with_two_versions_of_one_package_is_refused_suggesting_requirements_txt() -> None:
    registry = '{ registry = "https://pypi.org/simple" }'
    text = (
        HEAD + PROJECT + package("numpy", "1.26.4", registry) + package("numpy", "2.1.3", registry)
    )
    problem = refusal(text)
    assert "numpy" in problem.message and "1.26.4" in problem.message
    assert "2.1.3" in problem.message and "requirements.txt" in problem.message


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[[package]\n", "not valid TOML"),
        ('version = 1\npackage = "einops"\n', "[[package]]"),
        (HEAD + '[[package]]\nversion = "1.0"\nsource = { registry = "x" }\n', "name"),
        (HEAD + '[[package]]\nname = "einops"\nsource = { registry = "x" }\n', "version"),
        (HEAD + '[[package]]\nname = "einops"\nversion = "0.8.1"\n', "source"),
        (HEAD + package("einops", "0.8.1", '"https://pypi.org/simple"'), "source"),
        (HEAD + package("einops; rm -rf /", "0.8.1", '{ registry = "x" }'), "not a package name"),
        (HEAD + package("einops", "0.8.1; sys_platform == 'x'", '{ registry = "x" }'), "version"),
        ("version = 7\n", "version"),
    ],
)
def test_a_malformed_lock_is_refused_naming_uv_lock(text: str, says: str) -> None:
    assert says in refusal(text).message


def test_a_lock_with_too_many_packages_or_too_many_bytes_is_refused() -> None:
    registry = '{ registry = "https://pypi.org/simple" }'
    many = HEAD + "".join(package(f"p{n}", "1.0", registry) for n in range(MAX_REQUIREMENTS + 1))
    with pytest.raises(ProgramError, match=f"more than {MAX_REQUIREMENTS}"):
        uv_lock_pins(many)
    with pytest.raises(ProgramError, match="larger than"):
        bundle_requirements({"uv.lock": b"#" * (MAX_FILE_BYTES + 1)})


# ---------------------------------------------------------------------------- behaviour


def test_a_lock_pins_every_package_of_the_index_and_skips_the_project_itself() -> None:
    assert uv_lock_pins(LOCK) == (
        'colorama==0.4.6; sys_platform == "win32"',  # only tqdm's, on Windows
        "einops==0.8.1",
        "markdown-it-py==3.0.0",
        "mdurl==0.1.2",
        "pygments==2.18.0",  # the dev group's, and rich's
        "rich==13.9.4",
        "tqdm==4.67.1",
        'typing-extensions==4.12.2; python_full_version < "3.11"',
    )


WIN = "sys_platform == 'win32'"
OLD = "python_version < '3.11'"


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        # a diamond: one path without a marker makes it always needed
        ({"me": [("a", None), ("b", WIN)], "a": [("c", None)], "b": [("c", WIN)]},
         {"me": None, "a": None, "b": WIN, "c": None}),
        # a chain: the markers of a path are all needed
        ({"me": [("b", WIN)], "b": [("c", OLD)]},
         {"me": None, "b": WIN, "c": f"(({OLD}) and ({WIN}))"}),
        # two paths, each with its marker: either
        ({"me": [("b", WIN), ("c", OLD)], "b": [("d", None)], "c": [("d", None)]},
         {"me": None, "b": WIN, "c": OLD, "d": f"{OLD} or {WIN}"}),
        # a cycle ends
        ({"me": [("b", WIN)], "b": [("c", None)], "c": [("b", None)]},
         {"me": None, "b": WIN, "c": WIN}),
        # a marker on an extra means nothing to a plain install: always
        ({"me": [("b", "extra == 'cpu'")]}, {"me": None, "b": None}),
        # too many alternatives: always
        ({"me": [(f"p{n}", f"python_version == '3.{n}'") for n in range(6)],
          **{f"p{n}": [("z", None)] for n in range(6)}},
         {"z": None}),
    ],
)  # fmt: skip
def test_a_package_keeps_the_markers_of_the_paths_that_reach_it(
    edges: dict[str, list[tuple[str, str | None]]], expected: dict[str, str | None]
) -> None:
    markers = lock_markers(["me"], edges)
    assert {name: markers[name] for name in expected} == expected


def test_a_lock_whose_marker_is_not_a_marker_is_refused() -> None:
    registry = '{ registry = "https://pypi.org/simple" }'
    text = (
        HEAD
        + '[[package]]\nname = "mine"\nversion = "0.1.0"\nsource = { editable = "." }\n'
        + 'dependencies = [{ name = "six", marker = "os.system(\'id\')" }]\n\n'
        + package("six", "1.16.0", registry)
    )
    assert "not a requirement" in refusal(text).message


def test_a_virtual_project_is_skipped_too_and_an_empty_lock_pins_nothing() -> None:
    virtual = HEAD + package("mine", "0.1.0", '{ virtual = "." }')
    assert uv_lock_pins(virtual + package("six", "1.16.0", '{ registry = "x" }')) == (
        "six==1.16.0",
    )
    assert uv_lock_pins(HEAD) == ()


def test_uv_lock_wins_over_requirements_txt_and_pyproject_toml() -> None:
    assert BUNDLE_FILES[0] == "uv.lock"
    files = {
        "uv.lock": LOCK.encode(),
        "requirements.txt": b"six==1.16.0\n",
        "pyproject.toml": b'[project]\nname = "mine"\ndependencies = ["einops"]\n',
    }
    assert bundle_requirements(files)[1] == "einops==0.8.1"
    with pytest.raises(ProgramError) as caught:
        bundle_requirements({"uv.lock": b"\xff", "requirements.txt": b"six\n"})
    assert caught.value.field == "uv.lock" and "UTF-8" in caught.value.message
