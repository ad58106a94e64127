"""Environment ids: ``register``, ``make`` and PettingZoo's registry.

An environment is registered once under an id (``"MathChat-v0"``) with the import path
of its AEC class and, optionally, default options; ``make`` builds it by id, and every
registered id is also ``mappa/<id>`` in PettingZoo's AEC and parallel registries.
``make`` also takes an import path (``"my_pkg.envs:PlannerCoderEnv"``) for a class that
was never registered, which is how ``mappa eval --env`` reaches a user's own file.
"""

from __future__ import annotations

import importlib
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pettingzoo import AECEnv, ParallelEnv

from mappa_env.errors import SettingsError

NAMESPACE = "mappa"
_ID_PATTERN = re.compile(r"^[A-Za-z][\w.-]*-v\d+$")


@dataclass(frozen=True)
class EnvSpec:
    """A registered environment.

    Attributes:
        env_id: The id, e.g. ``"MathChat-v0"``.
        entry_point: ``"module:Class"`` of its AEC environment, or the class itself.
        defaults: Options passed to the constructor unless the caller gives them.
    """

    env_id: str
    entry_point: str | type[AECEnv]
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def load(self) -> type[AECEnv]:
        """The environment class (imported on first use)."""
        if isinstance(self.entry_point, type):
            return self.entry_point
        return load_entry_point(self.entry_point)


_REGISTRY: dict[str, EnvSpec] = {}
_ENTRY_POINTS: dict[str, str | type[AECEnv]] = {}

#: Environment id -> ``"module:Class"``: a live, read-only view of what is registered.
ENV_ENTRY_POINTS: Mapping[str, str | type[AECEnv]] = MappingProxyType(_ENTRY_POINTS)


def register(
    env_id: str,
    entry_point: str | type[AECEnv],
    *,
    replace: bool = False,
    **defaults: Any,
) -> EnvSpec:
    """Register an environment under ``env_id`` (and ``mappa/<env_id>`` in PettingZoo).

    Args:
        env_id: ``Name-vN``, e.g. ``"PlannerCoder-v0"``.
        entry_point: ``"module:Class"`` (imported when first made) or the class.
        replace: Allow replacing an id that is already registered.
        **defaults: Constructor options used unless ``make`` is given them, e.g.
            ``coach="llm:openai/gpt-4o-mini"``.

    Returns:
        The registered :class:`EnvSpec`.

    Raises:
        ValueError: For an id not of the form ``Name-vN``, an entry point that is not
            ``"module:Class"``, or an id already registered (without ``replace``).
    """
    if not _ID_PATTERN.match(env_id):
        raise ValueError(f"environment ids look like 'Name-v0'; got {env_id!r}")
    if isinstance(entry_point, str) and entry_point.count(":") != 1:
        raise ValueError(f"entry_point must be 'module:Class', got {entry_point!r}")
    if env_id in _REGISTRY and not replace:
        raise ValueError(
            f"{env_id!r} is already registered ({_describe(_REGISTRY[env_id])}); "
            "pass replace=True to replace it, or bump the version (Name-v1)"
        )
    spec = EnvSpec(env_id, entry_point, MappingProxyType(dict(defaults)))
    _REGISTRY[env_id] = spec
    _ENTRY_POINTS[env_id] = entry_point
    _register_with_pettingzoo(spec)
    return spec


def is_registered(env_id: str) -> bool:
    """Whether ``env_id`` (with or without the ``mappa/`` prefix) is registered."""
    return _strip_namespace(env_id) in _REGISTRY


def registered_ids() -> list[str]:
    """Every registered id, sorted."""
    return sorted(_REGISTRY)


def registered_env_attribute(env_id: str, name: str, default: Any = None) -> Any:
    """Attribute ``name`` of the class registered as ``env_id``, else ``default``.

    For code that only has an id (a request built by hand, a report of saved episodes):
    ``default`` too when the id is not registered or its module cannot be imported.
    """
    if not is_registered(env_id):
        return default
    try:
        return getattr(env_class(env_id), name, default)
    except ValueError:  # registered, but its module cannot be imported
        return default


def env_class(env_id: str) -> type[AECEnv]:
    """The AEC environment class of a registered id or a ``"module:Class"`` path.

    Raises:
        ValueError: For an id that is neither registered nor an import path.
    """
    return _resolve(env_id)[0]


def make(env_id: str, **options: Any) -> AECEnv:
    """Create an environment by id (or import path).

    Args:
        env_id: A registered id (``"MathChat-v0"``, ``"DSBench-v0"``, or one of yours;
            a ``"mappa/"`` prefix is accepted) or ``"module:Class"``.
        **options: Keyword arguments of the environment's constructor (``tasks``,
            ``coach``, ``sandbox``, ``seed``, ``credit_mode``, ...), over the defaults
            given at registration.

    Returns:
        A PettingZoo ``AECEnv``.

    Raises:
        ValueError: For an unknown id.
    """
    cls, defaults = _resolve(env_id)
    return cls(**{**defaults, **options})


def make_parallel(env_id: str, **options: Any) -> ParallelEnv:
    """Create the parallel view of an environment (PettingZoo's turn-based conversion).

    Each parallel ``step`` acts for the one agent whose turn it is (the others' actions
    are ignored); ``infos[agent]["active_agent"]`` names who acts next.
    """
    from pettingzoo.utils.conversions import turn_based_aec_to_parallel

    return turn_based_aec_to_parallel(make(env_id, **options))


def load_entry_point(path: str) -> type[AECEnv]:
    """Import ``"module:Class"`` and check that it is an AEC environment class.

    Raises:
        ValueError: If the module or the attribute cannot be found, or it is not an
            ``AECEnv`` subclass.
    """
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise  # the module was found but fails to import one of its own imports
        raise ValueError(
            f"cannot import {module_name!r} for environment {path!r}: {exc}. Run from "
            "the folder that holds it (mappa adds the working directory), or install it"
        ) from exc
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, AECEnv)):
        raise ValueError(f"{path!r} is not a PettingZoo AECEnv class (found {cls!r})")
    return cls


def register_with_pettingzoo() -> None:
    """Register every environment as ``mappa/<id>`` in PettingZoo's registries.

    Safe to call more than once; :func:`register` already does it for each new id.
    """
    for spec in _REGISTRY.values():
        _register_with_pettingzoo(spec)


# ------------------------------------------------------------------------------ helpers


def _strip_namespace(env_id: str) -> str:
    return env_id.split("/", 1)[1] if env_id.startswith(f"{NAMESPACE}/") else env_id


def _resolve(env_id: str) -> tuple[type[AECEnv], Mapping[str, Any]]:
    name = _strip_namespace(env_id)
    spec = _REGISTRY.get(name)
    if spec is not None:
        return spec.load(), spec.defaults
    if ":" in name:
        return load_entry_point(name), {}
    # A SettingsError (a ValueError): the mappa command prints it as one line.
    raise SettingsError(
        f"unknown environment {env_id!r}; registered: {registered_ids()}. Pass one of "
        "those to --env, register yours with mappa_env.register('Name-v0', "
        "'module:Class'), or pass 'module:Class'"
    )


def _describe(spec: EnvSpec) -> str:
    entry = spec.entry_point
    return entry if isinstance(entry, str) else f"{entry.__module__}:{entry.__qualname__}"


def _register_with_pettingzoo(spec: EnvSpec) -> None:
    from pettingzoo import aec_registry, parallel_registry
    from pettingzoo import register as pettingzoo_register

    full_id = f"{NAMESPACE}/{spec.env_id}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # re-registration on reload is expected
        for kind, registry in (("aec", aec_registry), ("parallel", parallel_registry)):
            registry.pop(full_id, None)  # a replaced id takes its new entry point
            entry = _Entry(spec.env_id, parallel=kind == "parallel")
            pettingzoo_register(kind, full_id, entry_point=entry)


class _Entry:
    """Picklable PettingZoo entry point that builds one registered environment."""

    def __init__(self, env_id: str, *, parallel: bool) -> None:
        self.env_id = env_id
        self.parallel = parallel

    def __call__(self, **options: Any) -> AECEnv | ParallelEnv:
        if self.parallel:
            return make_parallel(self.env_id, **options)
        return make(self.env_id, **options)


register("MathChat-v0", "mappa_env.envs.mathchat:MathChatEnv")
register("DSBench-v0", "mappa_env.envs.dsbench:DSBenchEnv")
