"""The client against a fake server (httpx.MockTransport): errors, logs, uploads, downloads."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from portalctl.client import Artifact, Client, PortalError
from tests.cli.test_packing import tree

ROOT = Path(__file__).resolve().parents[2]
BLOB = bytes(range(256)) * 40
SHA = hashlib.sha256(BLOB).hexdigest()


def client_of(handler: Any) -> Client:
    return Client("http://portal.test/", "secret", transport=httpx.MockTransport(handler))


def test_the_client_imports_without_django() -> None:
    code = "import sys, portalctl, portalctl.client, portalctl.cli; print('django' in sys.modules)"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "False"


def test_a_refusal_carries_the_servers_message_and_field_errors() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["Authorization"] == "Token secret"
        body = {"message": "Invalid input.", "errors": {"gpus": ["Must be at least 1."]}}
        return httpx.Response(400, json=body)

    with pytest.raises(PortalError) as caught:
        client_of(handler).jobs.submit(name="x", gpus=0)
    assert caught.value.status == 400
    assert caught.value.field_errors == {"gpus": ["Must be at least 1."]}
    assert str(caught.value) == "Invalid input. (gpus: Must be at least 1.)"


def test_a_page_that_is_not_the_api_and_a_dead_url_are_clear() -> None:
    with pytest.raises(PortalError, match="is this the portal's URL"):
        client_of(lambda request: httpx.Response(404, text="<html>")).jobs.get(1)
    with pytest.raises(
        PortalError, match=r"cannot reach the portal at http://127\.0\.0\.1:9"
    ) as dead:
        Client("http://127.0.0.1:9", "t").jobs.get(1)
    assert dead.value.status == 0


def test_lists_follow_the_next_links() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        page = request.url.params.get("page", "1")
        nxt = "http://portal.test/api/v1/jobs/?page=2" if page == "1" else None
        item = {"id": int(page), "name": f"j{page}", "state": "queued", "extra": True}
        return httpx.Response(200, json={"count": 2, "next": nxt, "results": [item]})

    jobs = client_of(handler).jobs.list(state="queued")
    assert [job.id for job in jobs] == [1, 2]
    assert jobs[0].raw["extra"] is True and not jobs[0].done


def sse(*events: str) -> bytes:
    return "".join(events).encode()


def line_event(cursor: str, text: str) -> str:
    data = {"cursor": cursor, "text": text, "worker": "w", "rank": 0, "generation": 1, "node": "n"}
    return f"id: {cursor}\ndata: {json.dumps(data)}\n\n"


def test_follow_reads_the_stream_and_resumes_after_a_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("portalctl.client.time.sleep", lambda seconds: None)
    asked: list[dict[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(dict(request.url.params))
        if len(asked) == 1:  # cut before the end event
            return httpx.Response(200, content=sse(line_event("1:0", "a"), ": heartbeat\n\n"))
        return httpx.Response(
            200, content=sse(line_event("1:1", "b"), 'event: end\ndata: {"cursor": "1:1"}\n\n')
        )

    lines = list(client_of(handler).jobs.logs(7, follow=True, tail=5))
    assert [line.text for line in lines] == ["a", "b"]
    assert asked[0] == {"tail": "5", "follow": "1"}
    assert asked[1] == {"since": "1:0", "follow": "1"}


def test_polling_follows_the_cursor_until_done() -> None:
    pages = iter(
        [
            {"lines": [{"cursor": "1:0", "text": "a"}], "cursor": "1:0", "done": False},
            {"lines": [{"cursor": "1:1", "text": "b"}], "cursor": "1:1", "done": True},
        ]
    )
    lines = client_of(lambda r: httpx.Response(200, json=next(pages))).jobs.logs(
        1, follow=True, transport="poll"
    )
    assert [line.text for line in lines] == ["a", "b"]


def test_upload_is_skipped_when_the_server_has_the_bundle(tmp_path: Path) -> None:
    root = tree(tmp_path / "code", {"train.py": "print(1)\n"})
    known: set[str] = set()
    posts: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            sha = request.url.path.split("/")[-2]
            if sha not in known:
                return httpx.Response(404, json={"message": "Not found.", "errors": {}})
            return httpx.Response(200, json={"id": sha, "size": 1, "files": 1})
        body = request.read()
        posts.append(body)
        assert b'name="archive"; filename="code.tar.gz"' in body
        sha = next(iter(pending))
        known.add(sha)
        return httpx.Response(201, json={"id": sha, "size": 1, "files": 1})

    from portalctl.packing import pack_directory

    pending = {pack_directory(root).sha256}
    seen: list[tuple[int, int]] = []
    client = client_of(handler)
    first = client.code.upload(root, progress=lambda done, total: seen.append((done, total)))
    second = client.code.upload(root)
    assert first.uploaded and not second.uploaded and len(posts) == 1
    assert first.bundle.id == second.bundle.id == next(iter(pending))
    assert seen and seen[-1][0] == seen[-1][1]


def artifact(sha: str = SHA) -> Artifact:
    return Artifact(id=5, kind="final", name="final.pt", path="p", size=len(BLOB), sha256=sha)


def test_a_download_resumes_with_a_range_and_checks_the_sha256(tmp_path: Path) -> None:
    ranges: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        ranges.append(request.headers.get("Range"))
        assert request.headers.get("If-Range") == f'"{SHA}"'
        start = int(request.headers["Range"].removeprefix("bytes=").rstrip("-"))
        return httpx.Response(206, content=BLOB[start:], headers={"ETag": f'"{SHA}"'})

    target = tmp_path / "final.pt"
    (tmp_path / "final.pt.part").write_bytes(BLOB[:1000])
    client_of(handler).artifacts.download(1, artifact(), target)
    assert ranges == ["bytes=1000-"]
    assert target.read_bytes() == BLOB and not (tmp_path / "final.pt.part").exists()


def test_a_corrupt_download_is_refused_and_its_partial_file_removed(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=BLOB[:-1] + b"!", headers={"ETag": f'"{SHA}"'})

    with pytest.raises(PortalError, match="checksum mismatch"):
        client_of(handler).artifacts.download(1, artifact(), tmp_path / "f.pt")
    assert list(tmp_path.iterdir()) == []
