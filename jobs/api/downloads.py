"""``GET /api/v1/jobs/{id}/artifacts/{aid}/download/``: a stored object, streamed from the store.

::

    If-None-Match = "<sha256>"         304, no body
    Range: bytes=a-b | a- | -n         206 with Content-Range (one range; several, or a
                                       malformed header, are ignored: the whole object)
    Range past the end                 416 with Content-Range: bytes */size
                                       (positions of any length: a number longer than
                                       18 digits is past every end, never a 500)
    otherwise                          200, the whole object, hashed while it streams

Headers always: ``ETag: "<sha256>"``, ``Accept-Ranges: bytes``, ``Content-Length``
and ``Content-Disposition: attachment``.  The whole object is checked against
its recorded sha256 and size as it goes out; on a mismatch the stream stops
before its last bytes with an error in the log, so a client never holds a
corrupt file it believes complete.  Header parsing is pure (:func:`parse_range`,
:func:`etag_matches`); the rest is a thin adapter over ``ArtifactStore``.

The object is opened before anything is answered, and what is served is that
open object: in a directory store it was reached without following a link
(the job's prefix is tenant-written: a link there to ``/proc/self/environ``
or to ``/etc`` is refused by the store), and its size is the open
descriptor's.  A path that is missing, a directory, or meets a link raises
:class:`ObjectMissing` (the view answers 404, no byte served); a size that is
not the recorded one stops the stream before its first byte.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import IO

from django.http import HttpResponse, StreamingHttpResponse
from django.utils.http import content_disposition_header

from jobs.models import Artifact
from workers.artifacts import ArtifactStore
from workers.beneath import LinkRefused

log = logging.getLogger(__name__)

CHUNK_BYTES = 1024 * 1024
"""Bytes read from the store and sent at a time."""

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")

POSITION_DIGITS = 18
"""Digits of a byte position read as a number; a longer one (leading zeros aside) is past
the end of any object (10**18 bytes is an exabyte). RFC 9110 puts no bound on them, and
``int()`` of over 4300 digits raises: a 5,000-digit ``Range`` must not be a 500."""
BEYOND_ANY_OBJECT: int = 10**POSITION_DIGITS


class RangeNotSatisfiable(ValueError):
    """A well-formed range that lies wholly past the end of the object (416)."""


class ObjectMismatch(RuntimeError):
    """The bytes the store returned are not those recorded (size or sha256)."""


class ObjectMissing(LookupError):
    """No object the store may serve at the artifact's path: none, a directory, or a link."""


@dataclass(frozen=True)
class ByteRange:
    """Bytes ``[start, stop)`` of an object of ``size`` bytes."""

    start: int
    stop: int
    size: int

    @property
    def length(self) -> int:
        """How many bytes the range holds."""
        return self.stop - self.start

    @property
    def content_range(self) -> str:
        """The ``Content-Range`` header of a 206 answer."""
        return f"bytes {self.start}-{self.stop - 1}/{self.size}"


def position(digits: str) -> int:
    """A byte position or suffix length from its digits, bounded: a number of more than
    ``POSITION_DIGITS`` digits (leading zeros aside) reads as ``BEYOND_ANY_OBJECT``."""
    significant = digits.lstrip("0")
    if len(significant) > POSITION_DIGITS:
        return BEYOND_ANY_OBJECT
    return int(significant or "0")


def parse_range(header: str | None, size: int) -> ByteRange | None:
    """The single byte range a ``Range`` header asks of an object of ``size`` bytes.

    None means "send the whole object": no header, another unit, several
    ranges, or a header that does not parse (RFC 9110 lets a server ignore
    those).  A range that starts at or past the end, or an empty suffix,
    raises :class:`RangeNotSatisfiable`.
    """
    if not header:
        return None
    match = _RANGE.match(header.strip().replace(" ", ""))
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # bytes=-n: the last n bytes
        suffix = position(last)
        if suffix == 0 or size == 0:
            raise RangeNotSatisfiable(f"no last {suffix} bytes of {size}")
        return ByteRange(start=max(size - suffix, 0), stop=size, size=size)
    start = position(first)
    stop = size if not last else position(last) + 1
    if last and stop <= start:
        return None  # bytes=5-2 is not a valid range: ignored
    if start >= size:
        raise RangeNotSatisfiable(f"byte {start} is past the end ({size} bytes)")
    return ByteRange(start=start, stop=min(stop, size), size=size)


def etag_of(sha256: str) -> str:
    """The strong ETag of an object: its sha256, quoted."""
    return f'"{sha256}"'


def etag_matches(header: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` (or ``If-Range``) header names ``etag`` (or is ``*``)."""
    if not header:
        return False
    tags = [tag.strip().removeprefix("W/") for tag in header.split(",")]
    return "*" in tags or etag in tags


def whole_object(
    opened: IO[bytes], *, path: str, size: int, sha256: str, chunk: int = CHUNK_BYTES
) -> Iterator[bytes]:
    """The object's bytes, checked against ``size`` and ``sha256`` as they go.

    One chunk is always held back until the next one is read, so a mismatch
    found at the end stops the stream before its last bytes: the client sees
    a cut download, never a complete-looking corrupt one.
    """
    digest = hashlib.sha256()
    sent = 0
    pending = b""
    try:
        while True:
            data = opened.read(chunk)
            if not data:
                break
            sent += len(data)
            digest.update(data)
            if sent > size:
                break
            if pending:
                yield pending
            pending = data
        if sent != size or digest.hexdigest() != sha256:
            log.error(
                "artifact %s does not match its record (%d bytes, sha256 %s; recorded %d, %s): "
                "download aborted",
                path,
                sent,
                digest.hexdigest() if sent <= size else "-",
                size,
                sha256,
            )
            raise ObjectMismatch(f"{path} does not match its recorded size and sha256")
        if pending:
            yield pending
    finally:
        opened.close()


def object_range(opened: IO[bytes], span: ByteRange, chunk: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Bytes ``span`` of the object (a range cannot be hashed: only its length is checked)."""
    try:
        opened.seek(span.start)
        left = span.length
        while left > 0:
            data = opened.read(min(chunk, left))
            if not data:
                raise ObjectMismatch(f"the object ended {left} bytes before the range did")
            left -= len(data)
            yield data
    finally:
        opened.close()


def download_response(
    store: ArtifactStore,
    artifact: Artifact,
    *,
    range_header: str | None,
    if_none_match: str | None,
    if_range: str | None = None,
) -> HttpResponse | StreamingHttpResponse:
    """The answer to a download of ``artifact``; :class:`ObjectMissing` if the store has none.

    The object is opened first (a 304 too is only for an object that is
    there), so the bytes served are those of the object opened here.
    """
    try:
        opened, actual_size = store.open_sized(artifact.path)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, LinkRefused) as exc:
        if isinstance(exc, LinkRefused):
            log.warning("artifact %s not served: %s", artifact.path, exc)
        raise ObjectMissing(artifact.path) from exc
    try:
        response = _answer(
            opened,
            actual_size,
            artifact,
            range_header=range_header,
            if_none_match=if_none_match,
            if_range=if_range,
        )
    except BaseException:
        opened.close()
        raise
    if not isinstance(response, StreamingHttpResponse):
        opened.close()
    return response


def _answer(
    opened: IO[bytes],
    actual_size: int,
    artifact: Artifact,
    *,
    range_header: str | None,
    if_none_match: str | None,
    if_range: str | None,
) -> HttpResponse | StreamingHttpResponse:
    """The 304, 416, 206 or 200 for the opened object (streamed answers close it)."""
    etag = etag_of(artifact.sha256)
    common = {"ETag": etag, "Accept-Ranges": "bytes"}
    if etag_matches(if_none_match, etag):
        not_modified = HttpResponse(status=304)
        for name, value in common.items():
            not_modified[name] = value
        return not_modified
    size = artifact.size
    try:
        span = parse_range(range_header, size)
    except RangeNotSatisfiable:
        refused = HttpResponse(status=416)
        refused["Content-Range"] = f"bytes */{size}"
        for name, value in common.items():
            refused[name] = value
        return refused
    if span is not None and if_range is not None and not etag_matches(if_range, etag):
        span = None  # the client's copy is another object: send this one whole
    path = artifact.path

    def body() -> Generator[bytes, None, None]:
        if actual_size != size:  # before the first byte, of a range as of the whole
            opened.close()
            log.error(
                "artifact %s is %d bytes in the store, recorded %d: download aborted",
                path,
                actual_size,
                size,
            )
            raise ObjectMismatch(f"{path} does not match its recorded size")
        if span is None:
            yield from whole_object(opened, path=path, size=size, sha256=artifact.sha256)
        else:
            yield from object_range(opened, span)

    response = StreamingHttpResponse(
        _Body(opened, body()),
        status=200 if span is None else 206,
        content_type="application/octet-stream",
    )
    response["Content-Length"] = str(size if span is None else span.length)
    if span is not None:
        response["Content-Range"] = span.content_range
    response["Content-Disposition"] = content_disposition_header(True, artifact.filename) or ""
    for name, value in common.items():
        response[name] = value
    return response


class _Body:
    """A response's chunks; closing it (Django closes the response) closes the object too,
    whether or not it was ever read."""

    def __init__(self, opened: IO[bytes], chunks: Generator[bytes, None, None]) -> None:
        self._opened = opened
        self._chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        return self._chunks

    def close(self) -> None:
        self._chunks.close()
        self._opened.close()
