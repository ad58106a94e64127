r"""Coaches by name: the registry :func:`~mappa_env.coach.make_coach` reads a spec with.

A coach spec is ``"<name>"`` (``"rules"``) or, for a coach that takes an argument,
``"<name>:<argument>"`` (``"llm:<model>"``). Making a coach usable by name is one file::

    from mappa_env.coach import register_coach

    @register_coach("keyword")
    class KeywordCoach:
        name = "keyword"
        ...  # score() and ascore(), see mappa_env.coach.base.Coach

then ``make_coach("keyword")``, ``coach: keyword`` in a config or ``--coach keyword``
(with the file imported first). The built-in coaches (``rules``, ``llm``) are registered
by import path and loaded on first use, so listing names imports neither the rubrics
nor litellm.

This module imports nothing heavy: coaches appear in annotations only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

from mappa_env.import_paths import split_import_path

if TYPE_CHECKING:
    from mappa_env.coach.base import Coach

CoachFactory = Callable[..., "Coach"]
"""Makes a coach: ``factory(**options)``, or ``factory(spec, **options)`` for a coach
registered with an ``argument`` (it gets the whole spec, e.g. ``"llm:<model>?..."``)."""

__all__ = [
    "CoachFactory",
    "coach_forms",
    "coach_names",
    "get_coach_factory",
    "register_coach",
    "unregister_coach",
]


@dataclass(frozen=True)
class _Entry:
    factory: CoachFactory | str  # or "module:attribute" of one, imported on first use
    argument: str | None  # what follows "<name>:" in a spec; None: the name alone


# Insertion order is the order the error for an unknown coach lists them in.
_COACHES: dict[str, _Entry] = {
    "rules": _Entry("mappa_env.coach.rules:RulesCoach", None),
    "llm": _Entry("mappa_env.coach.llm:LLMCoach.from_spec", "model"),
}


@overload
def register_coach(
    name: str, factory: None = None, *, argument: str | None = None, replace: bool = False
) -> Callable[[CoachFactory], CoachFactory]: ...


@overload
def register_coach(
    name: str,
    factory: CoachFactory | str,
    *,
    argument: str | None = None,
    replace: bool = False,
) -> CoachFactory | str: ...


def register_coach(
    name: str,
    factory: CoachFactory | str | None = None,
    *,
    argument: str | None = None,
    replace: bool = False,
) -> CoachFactory | str | Callable[[CoachFactory], CoachFactory]:
    """Register a coach under ``name``; also usable as a decorator of a class or function.

    Examples:
        ``register_coach("keyword", KeywordCoach)``, ``register_coach("keyword",
        "my_package.coaches:KeywordCoach")`` (imported on first use), or
        ``@register_coach("judge", argument="model")`` on a function ``(spec,
        **options) -> Coach`` that reads ``"judge:<model>"``.

    Args:
        name: What a spec names (no ``:``).
        factory: A coach class or a function returning a coach, or its
            ``"module:attribute"`` path. ``None`` returns a decorator.
        argument: For a coach whose spec carries an argument (``"<name>:<argument>"``):
            how to call the argument in messages (e.g. ``"model"``). Its factory is then
            called with the whole spec first; without it, with the options only, and a
            spec with an argument is refused.
        replace: Allow replacing a coach already registered under ``name``.

    Returns:
        What was registered (the decorator form returns the decorated object unchanged).

    Raises:
        ValueError: When ``name`` is taken (and ``replace`` is false), empty or holds a
            ``:``, or a path is malformed.
        TypeError: When ``factory`` is neither callable nor a path.
    """
    if not isinstance(name, str) or not name.strip() or ":" in name:
        raise ValueError(f"a coach name must be a non-empty string without ':', got {name!r}")
    if name in _COACHES and not replace:
        raise ValueError(
            f"a coach named {name!r} is already registered: pick another name, or pass "
            "replace=True to override it"
        )
    if factory is None:

        def decorator(function: CoachFactory) -> CoachFactory:
            register_coach(name, function, argument=argument, replace=replace)
            return function

        return decorator
    if isinstance(factory, str):
        split_import_path(factory, "a coach")
    elif not callable(factory):
        raise TypeError(
            "a coach factory is a coach class, a function returning a coach, or a "
            f"'module:attribute' path; got {type(factory).__name__}"
        )
    _COACHES[name] = _Entry(factory, argument)
    return factory


def unregister_coach(name: str) -> None:
    """Remove ``name`` from the registry (e.g. a test's coach after the test).

    Raises:
        KeyError: When no coach has that name.
    """
    if name not in _COACHES:
        raise KeyError(f"no coach named {name!r}; registered: {coach_names()}")
    del _COACHES[name]


def coach_names() -> tuple[str, ...]:
    """Names of the registered coaches, sorted."""
    return tuple(sorted(_COACHES))


def coach_forms() -> tuple[str, ...]:
    """How each registered coach is written in a spec, in registration order.

    E.g. ``("rules", "llm:<model>")``: what the error for an unknown coach lists.
    """
    return tuple(
        name if entry.argument is None else f"{name}:<{entry.argument}>"
        for name, entry in _COACHES.items()
    )


def get_coach_factory(spec: str) -> tuple[CoachFactory, bool] | None:
    """The factory a spec names (importing it on first use), or ``None`` for none.

    Args:
        spec: ``"<name>"`` or ``"<name>:<argument>"``.

    Returns:
        ``(factory, takes_spec)``: call ``factory(spec, **options)`` when ``takes_spec``,
        else ``factory(**options)``; ``None`` when no coach of that name is registered,
        or the spec's form does not fit it (an argument given to a coach without one,
        or none to a coach that takes one).

    Raises:
        TypeError: When a registered path does not name something callable.
    """
    name, separator, _ = spec.partition(":")
    entry = _COACHES.get(name)
    if entry is None or bool(separator) != (entry.argument is not None):
        return None
    if isinstance(entry.factory, str):
        module_name, attribute = split_import_path(entry.factory, "a coach")
        loaded: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            loaded = getattr(loaded, part)
        if not callable(loaded):
            raise TypeError(f"{entry.factory!r} (coach {name!r}) is not callable")
        entry = _Entry(loaded, entry.argument)
        _COACHES[name] = entry
    return entry.factory, entry.argument is not None  # type: ignore[return-value]
