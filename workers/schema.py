"""Strict JSON records: frozen dataclasses that check themselves.

The base of every message that crosses a process boundary in ``workers/``:
the agent protocol (``workers.protocol``) and the elastic runtime's plans and
requests (``workers.elastic.messages``).  A record's fields are checked
against their annotations on construction (JSON lists become tuples, ints
become floats where a float is expected); ``Record.from_fields`` refuses
unknown and missing fields; ``parse`` picks a ``Message`` class by the
``type`` key of a registry.  Every refusal is a ``ProtocolError`` whose text
names the field, so a malformed message from a peer never becomes a
``KeyError`` deep inside the code that uses it.

Pure Python: no Django, Celery or torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar, Union

_MAX_ID_LENGTH = 200
_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class ProtocolError(ValueError):
    """A message that does not follow the protocol; the text says what is wrong."""


# --------------------------------------------------------------------------- checking


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is type(None):
        return "null"
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in typing.get_args(tp))
    if origin is Literal:
        return "one of " + ", ".join(repr(arg) for arg in typing.get_args(tp))
    if origin is tuple:
        return f"list of {_type_name(typing.get_args(tp)[0])} values"
    if origin is dict:
        return "object"
    if dataclasses.is_dataclass(tp):
        return "object"
    if tp is float:
        return "number"
    if tp is int:
        return "integer"
    if tp is str:
        return "string"
    if tp is bool:
        return "boolean"
    return str(tp)


def check_text(value: str, path: str) -> str:
    """``value`` if UTF-8 can encode it: no lone surrogate (JSON's ``"\\ud800"`` makes one).

    Such a string parses, but signing (``workers.signing.canonical_json``), the
    broker and PostgreSQL all refuse it, far from where it came in.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError(f"{path} holds text that does not encode (a lone surrogate)") from None
    return value


def _json_value(value: Any, path: str) -> Any:
    """Accept only JSON-representable values (so a message survives the broker)."""
    if isinstance(value, str):
        return check_text(value, path)
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ProtocolError(f"{path} must be a finite number")
        return value
    if isinstance(value, list | tuple):
        return [_json_value(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ProtocolError(f"{path} must have string keys")
            check_text(key, f"{path} key")
            out[key] = _json_value(item, f"{path}.{key}")
        return out
    raise ProtocolError(f"{path} must be JSON data, not {type(value).__name__}")


def _convert(value: Any, tp: Any, path: str) -> Any:
    """Return ``value`` checked against the annotation ``tp`` (lists become tuples)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return _json_value(value, path)
    if tp is type(None):
        if value is not None:
            raise ProtocolError(f"{path} must be null")
        return None
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        real = [option for option in options if option is not type(None)]
        if len(real) == 1:  # Optional[X]: X's own message says what is wrong
            return _convert(value, real[0], path)
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(value, option, path)
            except ProtocolError:
                continue
        raise ProtocolError(f"{path} must be {_type_name(tp)}")
    if origin is Literal:
        if value not in typing.get_args(tp) or isinstance(value, bool):
            raise ProtocolError(f"{path} must be {_type_name(tp)}, not {value!a}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ProtocolError(f"{path} must be a {_type_name(tp)}")
        item_type = typing.get_args(tp)[0]
        return tuple(_convert(item, item_type, f"{path}[{i}]") for i, item in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError(f"{path} must be an object")
        return _json_value(value, path)
    if isinstance(tp, type) and issubclass(tp, Record):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ProtocolError(f"{path} must be an object")
        if issubclass(tp, Message):
            # A nested message keeps its "type" on the wire; it must be the right one.
            value = dict(value)
            nested_type = value.pop(tp.KEY, tp.TYPE)
            if nested_type != tp.TYPE:
                raise ProtocolError(f"{path} must be a {tp.TYPE}, not {nested_type!r}")
        try:
            return tp.from_fields(value, path)
        except ProtocolError as exc:
            if str(exc).startswith(path):
                raise
            raise ProtocolError(f"{path}: {exc}") from None
    if tp is bool:
        if not isinstance(value, bool):
            raise ProtocolError(f"{path} must be a boolean")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"{path} must be an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProtocolError(f"{path} must be a number")
        if not math.isfinite(value):
            raise ProtocolError(f"{path} must be a finite number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ProtocolError(f"{path} must be a string")
        return check_text(value, path)
    raise TypeError(f"protocol: unsupported annotation {tp!r} at {path}")  # a bug, not input


def check_id(value: str, path: str) -> None:
    if (
        not value
        or len(value) > _MAX_ID_LENGTH
        or not value.isprintable()
        or value != value.strip()
    ):
        raise ProtocolError(
            f"{path} must be a non-empty printable string of at most {_MAX_ID_LENGTH} "
            "characters without surrounding spaces"
        )


def check_name(value: str, path: str) -> None:
    """Refuse a job, worker or node id that is unsafe in Redis keys, queues, command lines."""
    if not _NAME_PATTERN.fullmatch(value):
        raise ProtocolError(
            f"{path} must be 1-128 letters, digits, '.', '_' or '-' (starting with a letter "
            f"or digit), not {value!r}"
        )


def check_ids(values: tuple[str, ...], path: str) -> None:
    if not values:
        raise ProtocolError(f"{path} must not be empty")
    for i, value in enumerate(values):
        check_name(value, f"{path}[{i}]")
    duplicates = sorted({v for v in values if values.count(v) > 1})
    if duplicates:
        raise ProtocolError(f"{path} repeats {', '.join(duplicates)}")


def at_least(value: float | None, minimum: float, path: str) -> None:
    if value is not None and value < minimum:
        raise ProtocolError(f"{path} must be at least {minimum}, not {value}")


R = TypeVar("R", bound="Record")


_FIELD_TYPES: dict[type, tuple[tuple[str, Any], ...]] = {}


def _field_types(cls: type) -> tuple[tuple[str, Any], ...]:
    """Each field's name and resolved annotation: resolved once per class, not per record.

    Resolving string annotations (``typing.get_type_hints``) compiles each of
    them again; a tick builds a few dozen commands and an agent parses every
    message it gets, so once per class is what keeps construction cheap.
    """
    known = _FIELD_TYPES.get(cls)
    if known is None:
        hints = typing.get_type_hints(cls)
        known = tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))
        _FIELD_TYPES[cls] = known  # a race computes the same tuple twice: harmless
    return known


@dataclass(frozen=True, kw_only=True)
class Record:
    """Base of every protocol dataclass: type checks on construction, dict round trip."""

    def __post_init__(self) -> None:
        prefix = f"{self.TYPE}." if isinstance(self, Message) else ""
        for name, hint in _field_types(type(self)):
            converted = _convert(getattr(self, name), hint, f"{prefix}{name}")
            object.__setattr__(self, name, converted)
        self.validate()

    def validate(self) -> None:
        """Semantic checks beyond types; raise ``ProtocolError``."""

    @classmethod
    def from_fields(cls: type[R], data: dict[str, Any], path: str) -> R:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(key) for key in data if key not in names)
        if unknown:
            raise ProtocolError(f"{path}: unknown field(s) {', '.join(unknown)}")
        missing = sorted(
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in data
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        )
        if missing:
            raise ProtocolError(f"{path}: missing field(s) {', '.join(missing)}")
        return cls(**data)

    def to_json(self) -> str:
        """``to_dict()`` as JSON text."""
        return json.dumps(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """The JSON object for this record (tuples become lists)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            out[f.name] = _plain(getattr(self, f.name))
        return out


def _plain(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


@dataclass(frozen=True, kw_only=True)
class Message(Record):
    """A record that travels on its own: its JSON carries its ``TYPE`` under ``KEY``."""

    TYPE: ClassVar[str] = ""
    KEY: ClassVar[str] = "type"

    def to_dict(self) -> dict[str, Any]:
        """The JSON object for this message, the type key first."""
        return {self.KEY: self.TYPE, **super().to_dict()}


def parse(data: Any, registry: Mapping[str, type[Any]], kind: str, key: str = "type") -> Any:
    """The ``Message`` of ``registry`` named by ``data[key]``, built from the other fields."""
    if not isinstance(data, dict):
        raise ProtocolError(f"a {kind} must be a JSON object, not {type(data).__name__}")
    type_name = data.get(key)
    if not isinstance(type_name, str):
        raise ProtocolError(f"a {kind} needs a string field {key!r}")
    cls = registry.get(type_name)
    if cls is None:
        known = ", ".join(sorted(registry))
        raise ProtocolError(f"unknown {kind} {key} {type_name!r} (known: {known})")
    fields = {name: value for name, value in data.items() if name != key}
    return cls.from_fields(fields, type_name)
