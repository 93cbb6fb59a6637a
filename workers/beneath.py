"""File operations beneath a directory that never follow a symbolic link.

A directory artifact store holds folders a tenant's program can write (its
job's prefix is bound read-write into its sandbox), and the code that reads,
writes and deletes there runs as root (the node agent) or as the web server.
A link planted below the store's root must not send that code anywhere else,
so every path below a trusted root is walked one component at a time::

    root/                 opened once, links followed: the operator chose it
      a/                  openat(root_fd, "a", O_DIRECTORY | O_NOFOLLOW)
        b/                openat(a_fd, "b", ...)        a link here: LinkRefused
          object          openat(b_fd, "object", O_NOFOLLOW), then fstat: regular only

Writes go to a temporary name in the parent's descriptor and are renamed
over the final name within it (a link there is replaced, never written
through); deletes unlink names relative to their parent's descriptor, and a
tree is removed depth first with each directory opened the same way (a link
found where a directory was is unlinked as a link).  Nothing here knows about
artifacts: names are plain components, checked only to be single components.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress

_DIRECTORY_FLAGS = (
    os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
)
# O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class LinkRefused(OSError):
    """A symbolic link met below the root (never followed), or an entry that is neither a
    regular file nor a directory where a file was asked for (a FIFO, a socket, a device:
    never opened for its content).  ``filename`` is the path below the root that met it."""


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"not a single path component: {name!r}")


def _refused_link(shown: str) -> LinkRefused:
    return LinkRefused(errno.ELOOP, "a symbolic link, never followed", shown)


def _open_child_directory(parent: int, name: str, *, create: bool, shown: str) -> int:
    """The directory ``name`` of ``parent``, opened without following a link (made if asked)."""
    _check_name(name)
    try:
        return os.open(name, _DIRECTORY_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
    except NotADirectoryError:  # O_DIRECTORY | O_NOFOLLOW says ENOTDIR for a link too
        if _is_link(parent, name):
            raise _refused_link(shown) from None
        raise
    with suppress(FileExistsError):  # made meanwhile by another writer: the open decides
        os.mkdir(name, 0o777, dir_fd=parent)
    return _open_child_directory(parent, name, create=False, shown=shown)


def _is_link(parent: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode)
    except FileNotFoundError:
        return False


def open_directory_below(start: int, parts: Sequence[str], *, create: bool = False) -> int:
    """A new descriptor of ``start/parts...``, no component followed if it is a link.

    ``create`` makes missing directories one at a time.  Raises
    :class:`LinkRefused` at a link, ``FileNotFoundError`` or
    ``NotADirectoryError`` as ``openat`` does; the caller closes what it gets
    (``start`` stays open).
    """
    current = os.dup(start)
    try:
        for depth, name in enumerate(parts):
            shown = "/".join(parts[: depth + 1])
            child = _open_child_directory(current, name, create=create, shown=shown)
            os.close(current)
            current = child
    except BaseException:
        os.close(current)
        raise
    return current


@contextmanager
def directory(root: str, parts: Sequence[str] = (), *, create: bool = False) -> Iterator[int]:
    """A descriptor of ``root/parts...``: ``root`` as given (it may be a link), the rest never.

    ``create`` makes ``root`` (with its parents) and every missing component.
    """
    if create:
        os.makedirs(root, exist_ok=True)
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        found = open_directory_below(top, parts, create=create)
    finally:
        os.close(top)
    try:
        yield found
    finally:
        os.close(found)


def open_regular(start: int, parts: Sequence[str]) -> int:
    """A read-only descriptor of the regular file ``start/parts...``, walked without links.

    The type is checked on the opened descriptor (``fstat``), so what is read is
    what was checked.  A directory raises ``IsADirectoryError``; a link or
    another kind of entry raises :class:`LinkRefused`.
    """
    if not parts:
        raise ValueError("a file needs at least one path component")
    shown = "/".join(parts)
    parent = open_directory_below(start, parts[:-1])
    try:
        _check_name(parts[-1])
        try:
            found = os.open(parts[-1], _READ_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refused_link(shown) from None
            raise
    finally:
        os.close(parent)
    try:
        mode = os.fstat(found).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "a directory, not an object", shown)
        if not stat.S_ISREG(mode):
            raise LinkRefused(errno.EINVAL, "not a regular file, never opened", shown)
        os.set_blocking(found, True)
    except BaseException:
        os.close(found)
        raise
    return found


def is_regular(parent: int, name: str) -> bool:
    """Whether ``name`` in ``parent`` is a regular file itself (a link to one is not)."""
    _check_name(name)
    try:
        return stat.S_ISREG(os.lstat(name, dir_fd=parent).st_mode)
    except FileNotFoundError:
        return False


def regular_files(start: int, prefix: str = "") -> Iterator[tuple[str, int]]:
    """(``prefix`` + relative POSIX path, size) of the regular files below ``start``.

    Files of a directory come first, by name, then its subdirectories', by
    name.  Links are neither returned nor descended into; FIFOs, sockets and
    devices are left out.  The sizes are ``lstat``'s: a reader checks the
    descriptor it opens.
    """
    subdirectories = []
    for name in sorted(os.listdir(start)):
        try:
            mode, size = _mode_and_size(start, name)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(mode):
            yield f"{prefix}{name}", size
        elif stat.S_ISDIR(mode):
            subdirectories.append(name)
    for name in subdirectories:
        try:
            below = os.open(name, _DIRECTORY_FLAGS, dir_fd=start)
        except (FileNotFoundError, NotADirectoryError):  # gone, or swapped for a link
            continue
        try:
            yield from regular_files(below, f"{prefix}{name}/")
        finally:
            os.close(below)


def _mode_and_size(parent: int, name: str) -> tuple[int, int]:
    info = os.lstat(name, dir_fd=parent)
    return info.st_mode, info.st_size


def write_atomically(parent: int, name: str, temporary: str, chunks: Iterable[bytes]) -> None:
    """Write ``chunks`` to ``temporary`` in ``parent``, fsync, rename it over ``name``.

    The temporary file is created exclusively and without following a link;
    the rename replaces whatever entry ``name`` was (a link included: its
    target is never written).  On an error the temporary file is removed and
    ``name`` is untouched.
    """
    _check_name(name)
    _check_name(temporary)
    descriptor = os.open(temporary, _CREATE_FLAGS, 0o666, dir_fd=parent)
    try:
        with os.fdopen(descriptor, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temporary, dir_fd=parent)
        raise


def remove_entry(parent: int, name: str) -> None:
    """Unlink ``name`` in ``parent`` if it is not a directory (a link goes as a link)."""
    _check_name(name)
    with suppress(FileNotFoundError, IsADirectoryError):
        os.unlink(name, dir_fd=parent)


def remove_tree(parent: int, name: str) -> list[str]:
    """Remove ``name`` in ``parent`` and everything below it; the regular files removed.

    Paths are relative to ``parent`` (``name/...``).  A directory is opened
    without following a link before its entries go; a link, wherever it is
    met (``name`` itself included), is unlinked and never followed.
    """
    _check_name(name)
    try:
        below = os.open(name, _DIRECTORY_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return []
    except NotADirectoryError:  # a file, a link, a FIFO: the entry itself goes
        regular = is_regular(parent, name)
        remove_entry(parent, name)
        return [name] if regular else []
    removed: list[str] = []
    try:
        for child in sorted(os.listdir(below)):
            removed += [f"{name}/{path}" for path in remove_tree(below, child)]
    finally:
        os.close(below)
    with suppress(FileNotFoundError):
        os.rmdir(name, dir_fd=parent)
    return removed
