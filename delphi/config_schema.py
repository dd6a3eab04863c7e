"""Build frozen dataclasses from YAML dicts with errors that name the key.

Every config in Delphi is a tree of frozen dataclasses. `from_dict` rejects
unknown keys and wrong types with the dotted path of the offending key, so a
typo in a study file is a one-line error, not a silent default.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from delphi.errors import DelphiError, quoted
from delphi.io import read_yaml

T = TypeVar("T")


def from_dict(cls: type[T], data: Any, path: str = "") -> T:
    """Construct dataclass `cls` from `data`, recursing into nested dataclasses."""
    where = path or cls.__name__
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise DelphiError(f"{where}: expected a mapping, got {type(data).__name__} {quoted(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise DelphiError(f"{_join(path, unknown[0])}: unknown key (expected one of: {', '.join(sorted(fields))})")
    required = [
        name
        for name, f in fields.items()
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and name not in data
    ]
    if required:
        raise DelphiError(f"{_join(path, required[0])}: missing key (required: {', '.join(sorted(required))})")
    hints = typing.get_type_hints(cls)
    kwargs = {name: _coerce(hints[name], value, _join(path, name)) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise DelphiError(f"{where}: {e}") from None


def load_config(path: Any, build: Callable[[Any], T]) -> T:
    """Read the YAML file at `path` and `build` a config from it; every error names the file."""
    try:
        return build(read_yaml(path))
    except DelphiError as e:
        msg = str(e)
        raise DelphiError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None


def to_dict(obj: Any) -> Any:
    """Plain-dict view of a config, suitable for YAML and hashing."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _coerce(hint: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(option, value, path)
            except DelphiError as e:
                errors.append(str(e))
        raise DelphiError(errors[0] if len(errors) == 1 else f"{path}: {quoted(value)} does not fit {hint}")
    if origin is typing.Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise DelphiError(f"{path}: {quoted(value)} is not one of {', '.join(map(repr, allowed))}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise DelphiError(f"{path}: expected a list, got {quoted(value)}")
        (item,) = typing.get_args(hint)[:1] or (Any,)
        items = [_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise DelphiError(f"{path}: expected a mapping, got {quoted(value)}")
        return dict(value)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, path)
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise DelphiError(f"{path}: expected true or false, got {quoted(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
            raise DelphiError(f"{path}: expected an integer, got {quoted(value)}")
        return int(value)
    if hint is float:
        # YAML reads 1e-3 as a string; accept numeric strings.
        if isinstance(value, bool):
            raise DelphiError(f"{path}: expected a number, got {quoted(value)}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise DelphiError(f"{path}: expected a number, got {quoted(value)}") from None
        # .nan and .inf are numbers to YAML; no setting of Delphi means "infinitely large".
        if not math.isfinite(number):
            raise DelphiError(f"{path}: expected a finite number, got {quoted(value)}")
        return number
    if hint is str:
        if not isinstance(value, str):
            raise DelphiError(f"{path}: expected a string, got {quoted(value)}")
        return value
    return value
