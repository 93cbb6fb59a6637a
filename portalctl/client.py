"""The Python client of the portal's REST API (``/api/v1/``), on httpx; no Django.

::

    Client(url, token)
      ├─ .jobs       submit · get · list · cancel · scale · events · logs(follow) · wait · metrics
      ├─ .code       upload(dir | archive)  → pack, sha256, skip if known, POST with progress
      ├─ .artifacts  list · download(resumable with Range, sha256 = ETag verified)
      └─ .tenants()  · .me()

Every answer is a frozen dataclass (its ``raw`` field keeps the server's JSON);
every refusal is a :class:`PortalError` with the server's message and field
errors; a server that cannot be reached is a PortalError with status 0.
:data:`ENDPOINTS` lists every method and path the client calls, so a test can
hold them against the server's OpenAPI schema.
"""

from __future__ import annotations

import builtins
import dataclasses
import hashlib
import io
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from portalctl.packing import ARCHIVE_SUFFIXES, Packed, pack_directory, read_archive
from portalctl.sse import parse_events

ENDPOINTS: tuple[tuple[str, str], ...] = (
    ("GET", "/api/v1/me/"),
    ("GET", "/api/v1/tenants/"),
    ("GET", "/api/v1/jobs/"),
    ("POST", "/api/v1/jobs/"),
    ("GET", "/api/v1/jobs/{id}/"),
    ("PATCH", "/api/v1/jobs/{id}/"),
    ("POST", "/api/v1/jobs/{id}/cancel/"),
    ("GET", "/api/v1/jobs/{id}/events/"),
    ("GET", "/api/v1/jobs/{id}/logs/"),
    ("GET", "/api/v1/jobs/{id}/metrics/"),
    ("GET", "/api/v1/jobs/{id}/artifacts/"),
    ("GET", "/api/v1/jobs/{id}/artifacts/{artifact_id}/download/"),
    ("GET", "/api/v1/code/{id}/"),
    ("POST", "/api/v1/code/"),
    ("GET", "/api/v1/arrays/"),
    ("POST", "/api/v1/arrays/"),
    ("GET", "/api/v1/arrays/{id}/"),
    ("POST", "/api/v1/arrays/{id}/cancel/"),
    ("POST", "/api/v1/arrays/{id}/retry/"),
)
"""Every (method, path) the client calls, in the schema's form."""

TERMINAL_STATES = frozenset({"completed", "failed", "cancelled"})
BUNDLE_ID = re.compile(r"^[0-9a-f]{64}$")
PAGE_SIZE = 200
CHUNK_BYTES = 1024 * 1024

Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes in all) as an upload or a download goes."""


class PortalError(Exception):
    """The server refused (``status`` is its HTTP status) or could not be reached (status 0)."""

    def __init__(
        self, status: int, message: str, field_errors: Mapping[str, list[str]] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field_errors: dict[str, list[str]] = dict(field_errors or {})

    def __str__(self) -> str:
        details = "; ".join(
            f"{name}: {' '.join(messages)}"
            for name, messages in self.field_errors.items()
            if name != "non_field_errors" and messages
        )
        return f"{self.message} ({details})" if details else self.message


T = TypeVar("T")


def _build(cls: type[T], data: Mapping[str, Any]) -> T:
    """A result dataclass from the server's JSON: known fields taken, ``raw`` keeps it all."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values = {key: value for key, value in data.items() if key in names and key != "raw"}
    values["raw"] = dict(data)
    return cls(**values)


@dataclass(frozen=True)
class Job:
    """A job as the API returns it (``GET /api/v1/jobs/{id}/``)."""

    id: int
    name: str
    state: str
    tenant: str | None = None
    workload: str = ""
    gpus: int = 0
    min_gpus: int = 0
    max_gpus: int = 0
    parallelism: int = 0
    priority: int = 0
    restarts: int = 0
    max_restarts: int = 0
    max_runtime_s: int | None = None
    runtime_deadline: str | None = None
    code: str | None = None
    entrypoint: str = ""
    launcher: str = ""
    environment: dict[str, Any] = field(default_factory=dict)
    submitted_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    jct_seconds: float | None = None
    failure_reason: str = ""
    wait_reason: str = ""
    step: int = 0
    loss: float | None = None
    generation: int = 0
    after: list[dict[str, Any]] = field(default_factory=list)
    array: int | None = None
    array_index: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def done(self) -> bool:
        """The job is over (completed, failed or cancelled)."""
        return self.state in TERMINAL_STATES


@dataclass(frozen=True)
class Array:
    """A job array as the API returns it (``GET /api/v1/arrays/{id}/``): its tasks' counts per
    state and, from a single array's answer, each task's latest attempt."""

    id: int
    name: str
    size: int
    tenant: str | None = None
    max_running: int | None = None
    created_at: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    tasks: list[dict[str, Any]] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class JobEvent:
    """One entry of a job's history."""

    id: int
    at: str
    kind: str
    reason: str = ""
    from_state: str = ""
    to_state: str = ""
    from_parallelism: int | None = None
    to_parallelism: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class LogLine:
    """One line of a job's output."""

    cursor: str
    text: str
    worker: str = ""
    rank: int | None = None
    generation: int | None = None
    node: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Artifact:
    """An object a job stored: a checkpoint, the final checkpoint, a file it saved, its log."""

    id: int
    kind: str
    name: str
    path: str
    size: int
    sha256: str
    step: int | None = None
    created_at: str | None = None
    download_url: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Bundle:
    """A code bundle; its id is the archive's sha256."""

    id: str
    size: int = 0
    files: int = 0
    requirements: list[str] = field(default_factory=list)
    created_at: str | None = None
    tenant: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Upload:
    """What :meth:`CodeAPI.upload` did: the bundle, and whether bytes were sent."""

    bundle: Bundle
    uploaded: bool
    files: tuple[str, ...] = ()


@dataclass(frozen=True)
class Tenant:
    """A tenant as its members see it."""

    slug: str
    name: str = ""
    gpu_quota: int = 0
    gpus_in_use: int = 0
    role: str | None = None
    priority_weight: float = 1.0
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


class _ProgressReader(io.BytesIO):
    """The archive's bytes, reporting how many httpx has read."""

    def __init__(self, data: bytes, progress: Progress | None) -> None:
        super().__init__(data)
        self._total = len(data)
        self._progress = progress

    def read(self, size: int | None = -1, /) -> bytes:
        chunk = super().read(size)
        if self._progress is not None:
            self._progress(self.tell(), self._total)
        return chunk


def _error_of(response: httpx.Response) -> PortalError:
    """The server's refusal as an exception, with its message when it sent one."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        errors = body.get("errors") if isinstance(body.get("errors"), dict) else {}
        fields = {
            str(key): [str(m) for m in (value if isinstance(value, list) else [value])]
            for key, value in (errors or {}).items()
        }
        return PortalError(response.status_code, body["message"], fields)
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        return PortalError(response.status_code, body["detail"])
    return PortalError(
        response.status_code,
        f"HTTP {response.status_code} {response.reason_phrase} from {response.url} "
        "(is this the portal's URL?)",
    )


class Client:
    """A connection to one portal as one user (``Authorization: Token <secret>``)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Token {token}", "User-Agent": "portalctl"},
            timeout=timeout,
            transport=transport,
        )
        self.jobs = JobsAPI(self)
        self.code = CodeAPI(self)
        self.artifacts = ArtifactsAPI(self)
        self.arrays = ArraysAPI(self)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing

    def _unreachable(self, exc: httpx.TransportError) -> PortalError:
        reason = str(exc) or type(exc).__name__
        return PortalError(0, f"cannot reach the portal at {self.url}: {reason}")

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request; a refusal or a transport failure raises :class:`PortalError`."""
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None
        if response.status_code >= 400:
            raise _error_of(response)
        return response

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        """A request whose answer is JSON."""
        response = self.request(method, path, **kwargs)
        try:
            return response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise PortalError(
                response.status_code,
                f"{response.url} did not answer with JSON (is this the portal's URL?)",
            ) from None

    def pages(self, path: str, params: Mapping[str, Any] | None = None) -> Iterator[Any]:
        """Every result of a paginated list, page after page."""
        query: dict[str, Any] | None = {"page_size": PAGE_SIZE, **(params or {})}
        next_url: str | None = path
        while next_url:
            body = self.json("GET", next_url, params=query)
            query = None  # the next link carries the query (an empty one would erase it)
            if isinstance(body, list):  # an unpaginated list
                yield from body
                return
            yield from body.get("results", [])
            next_url = body.get("next")

    @contextmanager
    def stream(self, method: str, path: str, **kwargs: Any) -> Iterator[httpx.Response]:
        """A streamed request (SSE, downloads); a refusal raises :class:`PortalError`."""
        try:
            with self._http.stream(method, path, **kwargs) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _error_of(response)
                yield response
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None

    # ------------------------------------------------------------------ small endpoints

    def me(self) -> dict[str, Any]:
        """Who the token belongs to, and their tenants."""
        return dict(self.json("GET", "/api/v1/me/"))

    def tenants(self) -> list[Tenant]:
        """The caller's tenants with quota and GPUs in use."""
        return [_build(Tenant, item) for item in self.pages("/api/v1/tenants/")]


class JobsAPI:
    """``/api/v1/jobs/``."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def submit(self, **fields: Any) -> Job:
        """Submit a job with the API's fields (name, gpus, workload or code + entrypoint, ...)."""
        body = {key: value for key, value in fields.items() if value is not None}
        return _build(Job, self._client.json("POST", "/api/v1/jobs/", json=body))

    def get(self, job_id: int) -> Job:
        """One job."""
        return _build(Job, self._client.json("GET", f"/api/v1/jobs/{int(job_id)}/"))

    def list(self, *, state: str | None = None, tenant: str | None = None) -> builtins.list[Job]:
        """The caller's jobs, newest first; ``state`` may list several, comma-separated."""
        params = {k: v for k, v in {"state": state, "tenant": tenant}.items() if v}
        return [_build(Job, item) for item in self._client.pages("/api/v1/jobs/", params)]

    def cancel(self, job_id: int, reason: str = "") -> Job:
        """Cancel a job (a graceful stop)."""
        body = {"reason": reason} if reason else {}
        return _build(
            Job, self._client.json("POST", f"/api/v1/jobs/{int(job_id)}/cancel/", json=body)
        )

    def scale(
        self,
        job_id: int,
        *,
        min_gpus: int | None = None,
        max_gpus: int | None = None,
        priority: int | None = None,
    ) -> Job:
        """Change a job's elastic range (and priority), also while it runs."""
        body = {
            k: v
            for k, v in {"min_gpus": min_gpus, "max_gpus": max_gpus, "priority": priority}.items()
            if v is not None
        }
        return _build(Job, self._client.json("PATCH", f"/api/v1/jobs/{int(job_id)}/", json=body))

    def events(self, job_id: int) -> builtins.list[JobEvent]:
        """The job's history, oldest first."""
        items = self._client.pages(f"/api/v1/jobs/{int(job_id)}/events/")
        return [_build(JobEvent, item) for item in items]

    def metrics(self, job_id: int) -> dict[str, Any]:
        """Progress samples and the metrics the program logged."""
        return dict(self._client.json("GET", f"/api/v1/jobs/{int(job_id)}/metrics/"))

    def logs(
        self,
        job_id: int,
        *,
        follow: bool = False,
        tail: int | None = None,
        worker: str | None = None,
        since: str | None = None,
        transport: str = "sse",
        poll_seconds: float = 1.0,
    ) -> Iterator[LogLine]:
        """The job's output lines; with ``follow`` they keep coming until the job is over.

        ``transport="sse"`` follows the server's event stream (and reconnects from
        the last line on a cut); ``"poll"`` asks for the lines after a cursor again
        and again.
        """
        path = f"/api/v1/jobs/{int(job_id)}/logs/"
        params: dict[str, Any] = {
            k: v for k, v in {"tail": tail, "worker": worker, "since": since}.items() if v
        }
        if tail == 0:
            params["tail"] = 0
        if not follow:
            body = self._client.json("GET", path, params=params)
            for item in body["lines"]:
                yield _build(LogLine, item)
            return
        if transport == "poll":
            yield from self._poll_logs(path, params, poll_seconds)
            return
        yield from self._follow_logs(path, params)

    def _poll_logs(
        self, path: str, params: dict[str, Any], poll_seconds: float
    ) -> Iterator[LogLine]:
        while True:
            body = self._client.json("GET", path, params=params)
            for item in body["lines"]:
                yield _build(LogLine, item)
            if body["done"]:
                return
            params = {**params, "since": body["cursor"]}
            params.pop("tail", None)
            if not body["lines"]:
                time.sleep(poll_seconds)

    def _follow_logs(self, path: str, params: dict[str, Any]) -> Iterator[LogLine]:
        cuts = 0
        while True:
            query = {**params, "follow": 1}
            try:
                with self._client.stream(
                    "GET", path, params=query, timeout=httpx.Timeout(30.0, read=60.0)
                ) as response:
                    for event in parse_events(response.iter_lines()):
                        if event.event == "end":
                            return
                        if event.event == "error":
                            raise _event_error(event.data)
                        if event.event == "message" and event.data:
                            line = _build(LogLine, json.loads(event.data))
                            params = {**params, "since": line.cursor}
                            params.pop("tail", None)
                            cuts = 0
                            yield line
            except PortalError as exc:
                if exc.status != 0 or cuts >= 3:
                    raise
            except httpx.HTTPError:
                if cuts >= 3:
                    raise PortalError(0, "the log stream was cut and could not resume") from None
            cuts += 1  # cut without its end event: go on from the last line
            time.sleep(min(2.0**cuts, 8.0))

    def wait(self, job_id: int, timeout: float | None = None, poll_seconds: float = 2.0) -> Job:
        """Poll until the job is over; its last state.  TimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job.done:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is still {job.state} after {timeout} s")
            time.sleep(poll_seconds)


def _event_error(data: str) -> PortalError:
    try:
        body = json.loads(data)
    except json.JSONDecodeError:
        return PortalError(400, data)
    message = body.get("message", data) if isinstance(body, dict) else data
    errors = body.get("errors", {}) if isinstance(body, dict) else {}
    return PortalError(400, str(message), errors)


class ArraysAPI:
    """``/api/v1/arrays/``."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def submit(self, **fields: Any) -> Array:
        """Submit an array: a job's fields plus ``size`` and ``max_running``."""
        body = {key: value for key, value in fields.items() if value is not None}
        return _build(Array, self._client.json("POST", "/api/v1/arrays/", json=body))

    def get(self, array_id: int) -> Array:
        """One array, with its tasks."""
        return _build(Array, self._client.json("GET", f"/api/v1/arrays/{int(array_id)}/"))

    def list(self) -> builtins.list[Array]:
        """The caller's arrays, newest first."""
        return [_build(Array, item) for item in self._client.pages("/api/v1/arrays/")]

    def cancel(self, array_id: int, reason: str = "") -> Array:
        """Cancel every task that has not ended."""
        body = {"reason": reason} if reason else {}
        path = f"/api/v1/arrays/{int(array_id)}/cancel/"
        return _build(Array, self._client.json("POST", path, json=body))

    def retry(self, array_id: int) -> Array:
        """Submit again each failed task."""
        path = f"/api/v1/arrays/{int(array_id)}/retry/"
        return _build(Array, self._client.json("POST", path, json={}))


class CodeAPI:
    """``/api/v1/code/``: code bundles."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def get(self, bundle_id: str) -> Bundle | None:
        """The bundle with this id among the caller's, or None."""
        try:
            return _build(Bundle, self._client.json("GET", f"/api/v1/code/{bundle_id}/"))
        except PortalError as exc:
            if exc.status == 404:
                return None
            raise

    def upload(
        self,
        path: str | os.PathLike[str],
        *,
        tenant: str | None = None,
        progress: Progress | None = None,
    ) -> Upload:
        """Pack a directory (or take an archive), and upload it unless the server has its id."""
        source = Path(path)
        packed: Packed = pack_directory(source) if source.is_dir() else read_archive(source)
        known = self.get(packed.sha256)
        if known is not None:
            return Upload(bundle=known, uploaded=False, files=packed.files)
        name = source.name if source.name.endswith(ARCHIVE_SUFFIXES) else "code.tar.gz"
        body = _ProgressReader(packed.data, progress)
        data = {"tenant": tenant} if tenant else None
        answer = self._client.json(
            "POST",
            "/api/v1/code/",
            files={"archive": (name, body, "application/gzip")},
            data=data,
            timeout=httpx.Timeout(30.0, write=600.0),
        )
        return Upload(bundle=_build(Bundle, answer), uploaded=True, files=packed.files)


class ArtifactsAPI:
    """``/api/v1/jobs/{id}/artifacts/``: what jobs stored."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def list(self, job_id: int) -> builtins.list[Artifact]:
        """The job's artifacts, newest first."""
        items = self._client.pages(f"/api/v1/jobs/{int(job_id)}/artifacts/")
        return [_build(Artifact, item) for item in items]

    def final(self, job_id: int) -> Artifact | None:
        """The job's final checkpoint (the newest, if it has several), or None."""
        finals = [a for a in self.list(job_id) if a.kind == "final"]
        return finals[0] if finals else None

    def download(
        self,
        job_id: int,
        artifact: Artifact | int,
        path: str | os.PathLike[str],
        *,
        progress: Progress | None = None,
    ) -> Path:
        """Download to ``path``, resuming ``path.part`` with a Range; the sha256 must match."""
        if not isinstance(artifact, Artifact):
            found = [a for a in self.list(job_id) if a.id == int(artifact)]
            if not found:
                raise PortalError(404, f"job {job_id} has no artifact {artifact}")
            artifact = found[0]
        target = Path(path)
        partial = target.with_name(target.name + ".part")
        url = f"/api/v1/jobs/{int(job_id)}/artifacts/{artifact.id}/download/"
        etag = f'"{artifact.sha256}"'
        have = partial.stat().st_size if partial.exists() else 0
        if have > artifact.size:
            partial.unlink()
            have = 0
        if have < artifact.size or artifact.size == 0:
            headers = {"Range": f"bytes={have}-", "If-Range": etag} if have else {}
            try:
                with self._client.stream(
                    "GET", url, headers=headers, timeout=httpx.Timeout(30.0, read=120.0)
                ) as response:
                    served = response.headers.get("ETag")
                    if served and served != etag:
                        raise PortalError(
                            409, f"the server's object is {served}, not the listed {etag}"
                        )
                    mode = "ab" if response.status_code == 206 else "wb"
                    done = have if mode == "ab" else 0
                    with partial.open(mode) as out:
                        for chunk in response.iter_bytes(CHUNK_BYTES):
                            out.write(chunk)
                            done += len(chunk)
                            if progress is not None:
                                progress(done, artifact.size)
            except PortalError as exc:
                if exc.status != 416:
                    raise
        digest = hashlib.sha256()
        with partial.open("rb") as handle:
            for chunk in iter(lambda: handle.read(CHUNK_BYTES), b""):
                digest.update(chunk)
        if digest.hexdigest() != artifact.sha256:
            partial.unlink()
            raise PortalError(
                0,
                f"checksum mismatch for {artifact.name}: got sha256 {digest.hexdigest()}, "
                f"expected {artifact.sha256} (the partial file was removed; try again)",
            )
        partial.replace(target)
        return target


__all__ = [
    "BUNDLE_ID",
    "ENDPOINTS",
    "Array",
    "ArraysAPI",
    "Artifact",
    "Bundle",
    "Client",
    "Job",
    "JobEvent",
    "LogLine",
    "PortalError",
    "Tenant",
    "Upload",
]
