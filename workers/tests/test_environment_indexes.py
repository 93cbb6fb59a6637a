"""A job's own extra package indexes (``environment.indexes``): https URLs only, never
credentials; part of the stored field and of the key, absent when none are asked."""

from __future__ import annotations

import pytest

from workers.environment import EnvironmentSpec, check_environment, environment_key
from workers.program import ProgramError

INDEX = "https://pypi.example.org/simple"


def refused(indexes: object) -> ProgramError:
    with pytest.raises(ProgramError) as caught:
        check_environment({"requirements": ["einops"], "indexes": indexes})
    assert caught.value.field == "environment.indexes", caught.value
    return caught.value


# ------------------------------------------------------------------------------ attacks


@pytest.mark.parametrize(
    "url",
    [
        "https://user:secret@pypi.example.org/simple",
        "https://token@pypi.example.org/simple",
        "https://:secret@pypi.example.org/simple",
    ],
)
def test_an_index_carrying_credentials_is_refused_saying_why(url: str) -> None:
    problem = refused([url])
    assert "credentials" in problem.message
    assert "secret" not in problem.message  # the refusal does not echo the password


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://pypi.example.org/simple", "https://"),
        ("file:///etc/passwd", "https://"),
        ("ftp://pypi.example.org/simple", "https://"),
        ("pypi.example.org/simple", "https://"),
        ("https:///simple", "host"),
        ("https://pypi.example.org/simple#frag", "fragment"),
        ("https://pypi example.org/simple", "without spaces"),
        ("https://10.0.0.5/simple", "DNS name"),
        ("https://[::1]/simple", "DNS name"),
        ("https://localhost/simple", "DNS name"),
        ("https://pypi.example.org/simple?token=s3cret", "query"),
        ("https://pypi.example.org:99999/simple", "port"),
        ("https://-bad-.example/simple", "host"),
        ("https://pypi.example.org/" + "a" * 400, "400"),
        ("https://pypi.example.org/simple\n--index-url=https://evil.example", "https://"),
        (3, "list of https:// URLs"),
    ],
)
def test_an_index_that_is_not_a_plain_https_url_is_refused(url: object, says: str) -> None:
    assert says in refused([url]).message


def test_more_than_three_indexes_are_refused() -> None:
    assert "at most 3" in refused([f"https://i{n}.example.org/simple" for n in range(4)]).message
    assert "list of https:// URLs" in refused(INDEX).message


# ---------------------------------------------------------------------------- behaviour


def test_indexes_are_read_stored_and_read_back() -> None:
    spec = check_environment({"requirements": ["einops"], "indexes": [INDEX, INDEX + "2/"]})
    assert spec.indexes == (INDEX, INDEX + "2/")
    assert spec.to_dict()["indexes"] == [INDEX, INDEX + "2/"]
    assert check_environment(spec.to_dict()) == spec
    assert check_environment(spec.as_field()) == spec
    assert spec.with_bundle(("six",)).indexes == spec.indexes


def test_a_job_asking_only_for_an_index_keeps_it_for_its_bundles_requirements() -> None:
    spec = check_environment({"indexes": [INDEX]})
    assert spec.as_field() == {
        "requirements": [], "python": None, "replace": [], "indexes": [INDEX]
    }  # fmt: skip
    assert spec.with_bundle(("six",)) == EnvironmentSpec(("six",), indexes=(INDEX,))


def test_a_spec_without_indexes_keeps_its_stored_field_and_its_key() -> None:
    spec = check_environment({"requirements": ["einops==0.8.1"], "indexes": []})
    assert spec.to_dict() == {"requirements": ["einops==0.8.1"], "python": None, "replace": []}
    # computed before indexes existed: a node's cache keeps its builds
    assert environment_key(spec, "base-a") == "7916529a3ba55092d82a949ad6bf27ea"


def test_a_different_index_is_a_different_environment() -> None:
    plain = check_environment({"requirements": ["einops==0.8.1"]})
    one = check_environment({"requirements": ["einops==0.8.1"], "indexes": [INDEX]})
    other = check_environment({"requirements": ["einops==0.8.1"], "indexes": [INDEX + "2/"]})
    keys = {environment_key(spec, "base-a") for spec in (plain, one, other)}
    assert len(keys) == 3
