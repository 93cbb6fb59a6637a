"""A job's declared dependencies: what it may ask for, bundle files, the base rule, the key."""

from __future__ import annotations

from typing import Any

import pytest

from workers.environment import (
    MAX_REQUIREMENTS,
    EnvironmentSpec,
    base_conflicts,
    bundle_requirements,
    check_environment,
    check_requirement,
    environment_key,
    pyproject_dependencies,
    requirements_txt,
)
from workers.program import ProgramError


def test_a_job_asks_with_requirements_a_python_and_what_it_may_replace() -> None:
    spec = check_environment(
        {"requirements": ["einops==0.8.1", "tqdm >= 4"], "python": "3.11", "replace": ["Torch"]}
    )
    assert spec == EnvironmentSpec(("einops==0.8.1", "tqdm>=4"), "3.11", ("torch",))
    assert check_environment(spec.to_dict()) == spec
    assert check_environment(None).empty and check_environment({}).empty


@pytest.mark.parametrize(
    ("raw", "field", "says"),
    [
        ("einops", "environment", "must be an object"),
        ({"packages": []}, "environment", "unknown keys: packages"),
        ({"requirements": "einops"}, "environment.requirements", "list of strings"),
        ({"requirements": [3]}, "environment.requirements", "list of strings"),
        ({"python": "3"}, "environment.python", "like '3.11'"),
        ({"python": "python3.11"}, "environment.python", "like '3.11'"),
        ({"replace": ["torch; rm -rf /"]}, "environment.replace", "not a package name"),
        ({"requirements": ["-e ."]}, "environment.requirements", "'-e' is not allowed"),
        (
            {"requirements": ["--index-url=https://evil.example/simple"]},
            "environment.requirements",
            "'--index-url' is not allowed: packages come from the operator's index",
        ),
        (
            {"requirements": ["einops @ https://evil.example/einops.whl"]},
            "environment.requirements",
            "einops @ ... is not allowed",
        ),
        ({"requirements": ["./local-package"]}, "environment.requirements", "not a requirement"),
        ({"requirements": ["einops==="]}, "environment.requirements", "not a requirement"),
        ({"requirements": ["x" * 401]}, "environment.requirements", "longer than 400"),
        (
            {"requirements": [f"p{n}" for n in range(MAX_REQUIREMENTS + 1)]},
            "environment.requirements",
            f"more than {MAX_REQUIREMENTS}",
        ),
    ],
)
def test_a_bad_environment_is_refused_naming_the_field(raw: object, field: str, says: str) -> None:
    with pytest.raises(ProgramError) as caught:
        check_environment(raw)
    assert caught.value.field == field and says in caught.value.message, caught.value


def test_requirements_txt_comments_continuations_and_options() -> None:
    text = "# pinned\neinops==0.8.1  # for rearrange\n\ntqdm>=4 \\\n  ,<5\nrich[jupyter]; python_version >= '3.8'\n"
    assert requirements_txt(text) == (
        "einops==0.8.1",
        "tqdm<5,>=4",
        'rich[jupyter]; python_version >= "3.8"',
    )
    for line in ("-r other.txt", "--extra-index-url https://x/simple", "-f /wheels", "-c c.txt"):
        with pytest.raises(ProgramError, match="is not allowed"):
            requirements_txt(f"einops\n{line}\n")


def test_pyproject_dependencies_and_what_a_bundle_declares() -> None:
    pyproject = '[project]\nname = "demo"\ndependencies = ["einops==0.8.1", "tqdm"]\n'
    assert pyproject_dependencies(pyproject) == ("einops==0.8.1", "tqdm")
    assert pyproject_dependencies("[tool.black]\nline-length = 99\n") == ()
    with pytest.raises(ProgramError, match="not valid TOML"):
        pyproject_dependencies("[project\n")
    files = {"pyproject.toml": pyproject.encode(), "requirements.txt": b"six==1.16.0\n"}
    assert bundle_requirements(files) == ("six==1.16.0",)  # requirements.txt first
    assert bundle_requirements({"pyproject.toml": pyproject.encode()}) == ("einops==0.8.1", "tqdm")
    assert bundle_requirements({}) == ()
    with pytest.raises(ProgramError, match="not UTF-8"):
        bundle_requirements({"requirements.txt": b"\xff\xfe"})
    spec = check_environment({"requirements": ["rich"]}).with_bundle(("six==1.16.0",))
    assert spec.requirements == ("six==1.16.0", "rich")


BASE = {"torch": "2.13.0", "numpy": "2.3.1", "edl": "0.1.0"}


def test_a_requirement_that_would_replace_the_nodes_torch_is_refused_unless_the_job_says_so() -> (
    None
):
    assert base_conflicts(check_environment({"requirements": ["torch", "torch>=2"]}), BASE) == []
    [problem] = base_conflicts(check_environment({"requirements": ["Torch==2.3.0", "six"]}), BASE)
    assert problem == (
        "'Torch==2.3.0' would replace the node's torch 2.13.0: jobs build on the node's torch; "
        "drop the pin, or list 'torch' in environment.replace to install another"
    )
    allowed = check_environment({"requirements": ["torch==2.3.0"], "replace": ["torch"]})
    assert base_conflicts(allowed, BASE) == []


def test_the_key_follows_the_request_and_the_base_layer() -> None:
    one = check_environment({"requirements": ["einops==0.8.1"]})
    assert environment_key(one, "base-a") == environment_key(
        check_environment({"requirements": ["einops == 0.8.1"]}), "base-a"
    )
    assert environment_key(one, "base-a") != environment_key(one, "base-b")
    assert environment_key(one, "base-a") != environment_key(
        check_environment({"requirements": ["einops==0.8.0"]}), "base-a"
    )
    assert len(environment_key(one, "base-a")) == 32
    assert check_requirement("  einops  ") == "einops"


def test_a_start_command_carries_the_jobs_request_checked_by_the_same_rule() -> None:
    from workers.protocol import Program, ProtocolError

    def program(environment: dict[str, Any]) -> Program:
        return Program(
            code="a" * 64,
            code_path="code/a.tar.gz",
            entrypoint=("main.py",),
            launcher="edl",
            environment=environment,
        )

    asked = program({"requirements": ["six == 1.16.0"]})
    assert asked.environment == {"requirements": ["six==1.16.0"], "python": None, "replace": []}
    assert program({}).environment == {}
    with pytest.raises(ProtocolError, match=r"program\.environment\.requirements: '-e' is not"):
        program({"requirements": ["-e ."]})


@pytest.mark.parametrize(
    ("text", "argv", "kind"),
    [
        ("train.py --lr 0.1", ("train.py", "--lr", "0.1"), "script"),
        ("python sub/dir/train.py", ("sub/dir/train.py",), "script"),
        ("python3 -m pkg.train --epochs 2", ("-m", "pkg.train", "--epochs", "2"), "module"),
        ("-m torch.distributed.run --help", ("-m", "torch.distributed.run", "--help"), "module"),
        ("alpha-say --loud", ("alpha-say", "--loud"), "command"),
    ],
)
def test_any_entrypoint_a_user_would_type(text: str, argv: tuple[str, ...], kind: str) -> None:
    from workers.program import entrypoint_kind, split_entrypoint

    assert split_entrypoint(text) == argv and entrypoint_kind(argv) == kind


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("-m", "-m needs a module name"),
        ("-m pkg..train", "-m needs a module name"),
        ("-m 'os; import x'", "-m needs a module name"),
        ("/usr/bin/env", "neither a Python file"),
        ("../up.py", "relative path inside the bundle"),
        ("bin/tool", "neither a Python file"),
        ("python", "must not be empty"),
    ],
)
def test_an_entrypoint_that_names_nothing_runnable_is_refused(text: str, says: str) -> None:
    from workers.program import split_entrypoint

    with pytest.raises(ProgramError, match=says):
        split_entrypoint(text)
