"""The signed envelope of the agent protocol (pure: no broker, no Django)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from workers.signing import (
    SignatureError,
    canonical_json,
    key_from_text,
    key_to_text,
    master_secret,
    node_key,
    open_envelope,
    read_key,
    seal,
)

MASTER = b"master-secret-of-the-tests"
NOW = 1_764_572_400.0
BODY = {"type": "stop_job", "job": "job-7", "command_id": "stop-1", "reason": "é <b>"}


def keys(node: str) -> bytes | None:
    return node_key(MASTER, node) if node.startswith("gpu-") else None


def check(envelope: Any, **kwargs: Any) -> Any:
    return open_envelope(envelope, key_for=keys, now=NOW, **kwargs)


def test_a_sealed_message_opens_to_its_node_time_and_body() -> None:
    envelope = seal(BODY, node="gpu-1", key=node_key(MASTER, "gpu-1"), now=NOW - 5)
    signed = check(envelope, expected_node="gpu-1")
    assert (signed.node, signed.ts, signed.body) == ("gpu-1", NOW - 5, BODY)


def test_canonical_json_ignores_key_order_and_keeps_unicode() -> None:
    assert canonical_json({"b": 1, "a": [1.5, "é"]}) == canonical_json({"a": [1.5, "é"], "b": 1})
    assert canonical_json({"a": "é"}) == '{"a":"é"}'.encode()
    with pytest.raises(ValueError):
        canonical_json({"a": float("nan")})


def test_each_node_has_its_own_key_and_the_master_defaults_to_the_secret_key() -> None:
    assert node_key(MASTER, "gpu-1") != node_key(MASTER, "gpu-2")
    assert node_key(MASTER, "gpu-1") != node_key(b"other master", "gpu-1")
    assert master_secret("set", "secret") == b"set"
    derived = master_secret("", "secret")
    assert derived == master_secret("", "secret") != master_secret("", "other secret")
    assert derived != b"secret"  # never the SECRET_KEY itself


def _sealed(**changes: Any) -> dict[str, Any]:
    envelope = seal(BODY, node="gpu-1", key=node_key(MASTER, "gpu-1"), now=NOW)
    envelope.update(changes)
    return envelope


@pytest.mark.parametrize(
    ("envelope", "reason"),
    [
        (BODY, "unsigned"),
        ([BODY], "unsigned"),
        ({**_sealed(), "extra": 1}, "unsigned"),
        (_sealed(body={**BODY, "job": "job-8"}), "bad signature"),
        (_sealed(ts=NOW + 1), "bad signature"),
        (_sealed(sig="0" * 64), "bad signature"),
        (seal(BODY, node="gpu-1", key=node_key(b"guess", "gpu-1"), now=NOW), "bad signature"),
        # Signed by gpu-2 with its own key but claiming to be gpu-1: gpu-1's key fails it.
        (
            {**seal(BODY, node="gpu-2", key=node_key(MASTER, "gpu-2"), now=NOW), "node": "gpu-1"},
            "bad signature",
        ),
        (seal(BODY, node="rogue", key=b"k" * 32, now=NOW), "unknown node"),
        (_sealed(ts="soon"), "ts must be a number"),
        (_sealed(ts=float("inf")), "ts must be a number"),
        (_sealed(body=[1]), "body must be an object"),
        (_sealed(sig=None), "sig must be a string"),
        (seal(BODY, node="gpu-1", key=node_key(MASTER, "gpu-1"), now=NOW - 901), "stale"),
        (seal(BODY, node="gpu-1", key=node_key(MASTER, "gpu-1"), now=NOW + 61), "future"),
    ],
)
def test_forged_or_stale_envelopes_are_refused_with_a_reason(envelope: Any, reason: str) -> None:
    with pytest.raises(SignatureError, match=reason):
        check(envelope)


def test_an_agent_accepts_only_envelopes_for_its_own_node() -> None:
    envelope = seal(BODY, node="gpu-2", key=node_key(MASTER, "gpu-2"), now=NOW)
    with pytest.raises(SignatureError, match="wrong node"):
        check(envelope, expected_node="gpu-1")


def test_the_window_is_a_parameter() -> None:
    old = seal(BODY, node="gpu-1", key=node_key(MASTER, "gpu-1"), now=NOW - 100)
    assert check(old, max_age_s=200).body == BODY
    with pytest.raises(SignatureError, match="stale"):
        check(old, max_age_s=50)


def test_keys_are_read_as_hex_from_a_value_or_a_file(tmp_path: Path) -> None:
    key = node_key(MASTER, "gpu-1")
    assert key_from_text(key_to_text(key) + "\n") == key
    path = tmp_path / "key"
    path.write_text(key_to_text(key))
    assert read_key(key=None, key_file=str(path)) == key
    assert read_key(key=key_to_text(key), key_file=None) == key
    for bad in ("zz", "00" * 31):
        with pytest.raises(SignatureError):
            key_from_text(bad)
    with pytest.raises(SignatureError, match="not both"):
        read_key(key=key_to_text(key), key_file=str(path))
    with pytest.raises(SignatureError, match="no agent key"):
        read_key(key=None, key_file=None)
    with pytest.raises(SignatureError, match="cannot read"):
        read_key(key=None, key_file=str(tmp_path / "missing"))
