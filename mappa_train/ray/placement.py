"""Where a Ray run's actors go: learner ranks and rollout engines on the cluster's GPUs.

One placement group per run. Bundle ``r < ranks_per_agent`` holds rank ``r`` of every
agent's learner group (the ranks of one group are then on different GPUs, as NCCL
needs); engines share those bundles (``colocate_engines``) or have bundles of their own.
On the CPU there is no placement: actors take no resources and share the machine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = [
    "actor_options",
    "agents_at_once",
    "engine_bundle",
    "placement_bundles",
    "reserve_gpus",
]


def actor_options(placement: Any, bundle: int, gpus: float) -> dict[str, Any]:
    """Ray options of an actor placed in bundle ``bundle`` of ``placement``.

    On GPUs: its share ``gpus`` inside the bundle; without a placement (CPU), no
    resources at all (the ranks share the machine's CPUs).
    """
    if placement is None:
        return {"num_cpus": 0, "num_gpus": 0}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = PlacementGroupSchedulingStrategy(
        placement_group=placement, placement_group_bundle_index=bundle
    )
    return {"num_cpus": 0, "num_gpus": gpus, "scheduling_strategy": strategy}


def placement_bundles(config: Any, agents: int) -> list[dict[str, float]]:
    """GPUs of each bundle of the run's placement group.

    Bundle ``r < ranks_per_agent`` holds rank ``r`` of every agent's group (so the ranks
    of one group are in different bundles, on different GPUs, as NCCL needs). With
    ``colocate_engines`` it also holds engine ``e`` of every agent for ``e % ranks ==
    r``; without, engine ``e`` of every agent has bundle ``ranks + e`` of its own. A
    bundle has as many whole GPUs as its actors' shares add up to (rounded up), which
    Ray then shares out among them::

        GPU(r) = ceil(agents * gpus_per_rank + agents * engines(r) * gpus_per_engine)
    """
    world = config.ranks_per_agent
    bundles = []
    for rank in range(world):
        engines = 0
        if config.colocate_engines:
            engines = sum(1 for e in range(config.engines_per_agent) if e % world == rank)
        need = agents * config.gpus_per_rank + agents * engines * config.gpus_per_engine
        bundles.append({"GPU": float(math.ceil(need - 1e-9))})
    if not config.colocate_engines:
        need = agents * config.gpus_per_engine
        bundles += [{"GPU": float(math.ceil(need - 1e-9))}] * config.engines_per_agent
    return bundles


def engine_bundle(config: Any, index: int) -> int:
    """The placement bundle of each agent's engine ``index`` (see :func:`placement_bundles`)."""
    if config.colocate_engines:
        return index % config.ranks_per_agent
    return config.ranks_per_agent + index


def agents_at_once(setting: bool | str, group_gpus: Sequence[Sequence[str | None]]) -> bool:
    """Whether the agents' groups should run their log-prob passes and updates at once.

    Args:
        setting: The config's ``agents_in_parallel`` (``True``, ``False`` or ``"auto"``).
        group_gpus: Per agent, the GPUs of its group's ranks (``None`` on CPU); a group of
            one rank may be given as ``[]`` (it runs no collectives).

    ``"auto"`` is ``True`` unless two groups of several ranks share a GPU: one group's
    collectives would spin there while the other's kernels hold the GPU.
    """
    if setting != "auto":
        return bool(setting)
    taken: set[str] = set()
    for gpus in group_gpus:
        mine = {g for g in gpus if g is not None} if len(gpus) > 1 else set()
        if mine & taken:
            return False
        taken |= mine
    return True


def reserve_gpus(ray: Any, config: Any, agents: int) -> Any:
    """The run's placement group on GPUs (see :func:`placement_bundles`), or ``None``.

    Args:
        ray: The ``ray`` module (started).
        config: The run's settings.
        agents: How many agents are trained.

    Raises:
        ValueError: When the config asks for CUDA and the cluster has no GPU, or the
            cluster has fewer GPUs than the placement needs.
    """
    available = float(ray.cluster_resources().get("GPU", 0))
    if config.device.startswith("cuda") and available == 0:
        raise ValueError(
            f"device {config.device!r}, but the Ray cluster has no GPU: start Ray "
            "where the GPUs are (or join that cluster with ray_address), or use "
            "device: cpu"
        )
    if config.device == "cpu" or available == 0:
        return None
    from ray.util.placement_group import placement_group

    bundles = placement_bundles(config, agents)
    needed = sum(b["GPU"] for b in bundles)
    if needed > available:
        raise ValueError(
            f"{agents} agents x {config.ranks_per_agent} ranks at "
            f"gpus_per_rank={config.gpus_per_rank} (and {config.engines_per_agent} "
            f"engines per agent at gpus_per_engine={config.gpus_per_engine}) need "
            f"{needed:g} GPUs, the cluster has {available:g}: lower ranks_per_agent or "
            "the GPU shares (ranks of one agent need a GPU each)"
        )
    group = placement_group(bundles, strategy="PACK")
    ray.get(group.ready())
    return group
