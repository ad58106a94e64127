"""Type checks of settings against their annotations: the dataclass is the source.

:func:`check_fields` checks every field of a config dataclass against its own type
annotation, and :func:`check_env_options` checks environment options against the
environment constructor's parameters. A wrong value stops with the setting's name, the
value, the type it must have and, for text that reads like a boolean or a number, the
fix (YAML and JSON read ``"false"`` and ``"3"`` as text).

Values are never guessed into another type: ``"false"`` is not ``False`` and ``1.5`` is
not an integer. Only lossless widenings pass: an integer where a number is expected,
an integral number (``2.0``) where an integer is, a list where a tuple is, and a
``pathlib.Path`` where a path string is.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import logging
import os
import re
import types
import typing
from typing import Any

from mappa_env.errors import SettingsError

logger = logging.getLogger(__name__)

__all__ = ["SettingsTypeError", "check_env_options", "check_fields", "check_value"]


class SettingsTypeError(SettingsError):
    """A setting whose value has the wrong type; the message names the expected type."""


class _Unchecked(Exception):
    """An annotation this module cannot check (a protocol, a class of the user's)."""


_NUMBER_TEXT = re.compile(r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$")


def check_value(name: str, value: Any, annotation: Any) -> Any:
    """``value`` if it has the annotated type (widened where lossless), else an error.

    Args:
        name: The setting's name, for the message.
        value: What was given.
        annotation: The resolved type annotation (``int``, ``float | None``,
            ``dict[str, Any]``, ``tuple[float, float]``, ``Literal[...]``, ...).

    Returns:
        The value, an ``int`` turned ``float`` for a number, a list turned tuple for a
        tuple, an integral float turned ``int`` for an integer.

    Raises:
        SettingsTypeError: Naming ``name``, the value and the expected type.
    """
    try:
        return _convert(value, annotation)
    except _Mismatch:
        pass
    except _Unchecked:
        return value
    raise SettingsTypeError(_message(name, value, annotation))


def check_fields(config: Any) -> None:
    """Check (and widen in place) every field of a dataclass against its annotation.

    Raises:
        SettingsTypeError: For the first field whose value has the wrong type.
    """
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        checked = check_value(field.name, value, hints[field.name])
        if checked is not value:
            setattr(config, field.name, checked)


def check_env_options(env_id: str, options: Any, *, setting: str = "env_options") -> None:
    """Check environment options against the environment constructor's parameters.

    The parameters are those of the class's ``__init__`` and, while it passes
    ``**options`` on, of its bases'. Unknown names are refused (with the known ones)
    unless the chain ends in ``**options``; values are checked against annotations this
    module can read, and left to the constructor otherwise.

    Args:
        env_id: A registered id or ``module:Class``.
        options: The options (a mapping of name -> value).
        setting: What the options are called where the user gave them
            (``env_options``, ``--env-option``), for the message.

    Raises:
        SettingsTypeError: For options that are not a mapping, or a value of the wrong type.
        SettingsError: For an option the environment does not take.
    """
    if not isinstance(options, collections.abc.Mapping) or not all(
        isinstance(k, str) for k in options
    ):
        raise SettingsTypeError(
            f"{setting} must be a mapping of option name -> value (a JSON object such as "
            f'{{"tasks": "gen:64"}}), got {options!r} ({_kind(options)})'
        )
    from mappa_env.registry import env_class

    params, open_ended = _constructor_parameters(env_class(env_id))
    unknown = sorted(set(options) - set(params))
    if unknown and not open_ended:
        raise SettingsError(
            f"{setting} names {unknown}, which {env_id} does not take; its options: "
            f"{sorted(params)}"
        )
    for name, value in options.items():
        if name in params and params[name] is not inspect.Parameter.empty:
            check_value(f"{setting}.{name}", value, params[name])


# ---------------------------------------------------------------------- internals


class _Mismatch(Exception):
    """The value does not have the type."""


def _convert(value: Any, annotation: Any) -> Any:
    if annotation is Any or annotation is object:
        return value
    if annotation is None or annotation is type(None):
        if value is None:
            return value
        raise _Mismatch
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        unchecked = False
        for member in args:
            try:
                return _convert(value, member)
            except _Mismatch:
                continue
            except _Unchecked:
                unchecked = True
        if unchecked:
            raise _Unchecked
        raise _Mismatch
    if origin is typing.Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        raise _Mismatch
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _Mismatch
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _Mismatch
    if annotation is str:
        if isinstance(value, str):
            return value
        if isinstance(value, os.PathLike):  # a path where a path string is expected
            return os.fspath(value)
        raise _Mismatch
    if origin in (list, collections.abc.Sequence) or annotation in (list,):
        if isinstance(value, (list, tuple)) and not isinstance(value, str):
            item = args[0] if args else Any
            converted = [_convert(v, item) for v in value]
            return converted if origin is list or annotation is list else value
        raise _Mismatch
    if origin is tuple or annotation is tuple:
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        if args and args[-1] is Ellipsis:
            return tuple(_convert(v, args[0]) for v in value)
        if args and len(args) != len(value):
            raise _Mismatch
        return tuple(_convert(v, a) for v, a in zip(value, args or [Any] * len(value)))
    if origin in (dict, collections.abc.Mapping) or annotation is dict:
        if not isinstance(value, collections.abc.Mapping):
            raise _Mismatch
        key_type, value_type = args if len(args) == 2 else (Any, Any)
        converted = {_convert(k, key_type): _convert(v, value_type) for k, v in value.items()}
        return value if converted == value else converted
    raise _Unchecked


def _describe(annotation: Any) -> str:
    """How a type reads in a message: ``an integer``, ``a list of strings``, ..."""
    if annotation is None or annotation is type(None):
        return "null"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        parts: list[str] = []
        for member in args:
            if member is bool:
                parts += ["true", "false"]
            elif typing.get_origin(member) is typing.Literal:
                parts += [repr(a) for a in typing.get_args(member)]
            else:
                parts.append(_describe(member))
        return ", ".join(parts[:-1]) + " or " + parts[-1]
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    simple = {
        bool: "a boolean (true or false)",
        int: "an integer",
        float: "a number",
        str: "a string",
        Any: "any value",
    }
    if annotation in simple:
        return simple[annotation]
    if origin in (list, collections.abc.Sequence):
        return f"a list of {_plural(args[0]) if args else 'values'}"
    if origin is tuple:
        if args and args[-1] is Ellipsis:
            return f"a list of {_plural(args[0])}"
        if args and len(set(args)) == 1:
            return f"a list of {len(args)} {_plural(args[0])}"
        return f"a list of {len(args)} values"
    if origin in (dict, collections.abc.Mapping):
        value_type = args[1] if len(args) == 2 else Any
        inner = "" if value_type is Any else f" to {_plural(value_type)}"
        return f"a mapping (a JSON object) of names{inner}"
    return getattr(annotation, "__name__", str(annotation))


def _plural(annotation: Any) -> str:
    words = {bool: "booleans", int: "integers", float: "numbers", str: "strings", Any: "values"}
    if annotation in words:
        return words[annotation]
    if typing.get_origin(annotation) in (dict, collections.abc.Mapping):
        return "mappings"
    if typing.get_origin(annotation) in (list, tuple, collections.abc.Sequence):
        return "lists"
    return _describe(annotation).removeprefix("a ").removeprefix("an ") + "s"


def _kind(value: Any) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        tuple: "a list",
        dict: "a mapping",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)


def _message(name: str, value: Any, annotation: Any) -> str:
    message = f"{name} must be {_describe(annotation)}, got {value!r} ({_kind(value)})"
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("true", "false", "yes", "no", "on", "off") and _accepts(annotation, bool):
            plain = "true" if text in ("true", "yes", "on") else "false"
            message += f": write {plain} without quotes"
        elif _NUMBER_TEXT.match(value) and (
            _accepts(annotation, float) or _accepts(annotation, int)
        ):
            message += f": write {value.strip()} without quotes"
    elif isinstance(value, float) and _accepts(annotation, int):
        message += ": a count cannot be fractional"
    return message


def _accepts(annotation: Any, kind: type) -> bool:
    """Whether ``annotation`` is ``kind`` or a union with ``kind`` among its members."""
    if annotation is kind:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_accepts(a, kind) for a in typing.get_args(annotation))
    return False


def _constructor_parameters(cls: type) -> tuple[dict[str, Any], bool]:
    """Keyword parameters (name -> annotation) along the ``**options`` chain of ``cls``.

    Returns:
        The parameters and whether the chain ends in ``**options`` (any name may pass).
    """
    params: dict[str, Any] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        if klass is object:
            return params, False
        try:
            signature = inspect.signature(init)
            hints = typing.get_type_hints(init)
        except (TypeError, ValueError, NameError, AttributeError):
            return params, True  # unreadable: leave the names to the constructor
        passes_on = False
        for parameter in signature.parameters.values():
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                passes_on = True
            elif (
                parameter.kind is not inspect.Parameter.VAR_POSITIONAL and parameter.name != "self"
            ):
                params.setdefault(
                    parameter.name, hints.get(parameter.name, inspect.Parameter.empty)
                )
        if not passes_on:
            return params, False
    return params, True
