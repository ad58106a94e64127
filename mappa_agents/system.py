"""Multiagent systems: which policy acts for which environment agent."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mappa_agents.policy import Policy

logger = logging.getLogger(__name__)


class AgentSystem:
    """Maps each environment agent to the policy that acts for it.

    Separate weights per agent is the default of the method (each agent learns its own
    role); agents may also share one policy object, e.g. for evaluating a single model
    in every role.

    Args:
        policies: Agent id -> policy.

    Raises:
        ValueError: When ``policies`` is empty.
    """

    def __init__(self, policies: Mapping[str, Policy]) -> None:
        if not policies:
            raise ValueError("a system needs at least one agent -> policy entry")
        self.policies: dict[str, Policy] = dict(policies)

    @classmethod
    def shared(cls, policy: Policy, agents: Sequence[str]) -> AgentSystem:
        """Every agent acts with the same ``policy`` object."""
        return cls(dict.fromkeys(agents, policy))

    @classmethod
    def from_spec(
        cls,
        spec: str | Mapping[str, str],
        agents: Sequence[str],
        *,
        resolved: bool = False,
        **policy_options: Any,
    ) -> AgentSystem:
        """Build a system from model specs.

        Args:
            spec: One spec for every agent (``"smollm2-135m"``, an HF id or path,
                ``"api:<litellm model>[?api_base=...]"``, ``"vllm:<model>"``, a
                ``mappa train`` run dir or checkpoint: see :func:`parse_system_spec`),
                a mapping agent -> spec,
                or a string ``"agent=spec,agent=spec"``. Agents with the same spec share one
                loaded policy (the weights are identical; training makes separate copies).
            agents: The environment's agent ids, in order.
            resolved: ``spec`` is a mapping :func:`parse_system_spec` already returned:
                load exactly those specs, without resolving checkpoints again (so a
                caller that records the mapping records what was loaded, even while a
                run is still saving newer checkpoints).
            **policy_options: Passed to :func:`mappa_agents.models.load_policy`.

        Raises:
            ValueError: When an agent has no spec or a spec names an unknown agent.
        """
        from mappa_agents.models import load_policy

        per_agent = _per_agent_specs(spec, agents)
        if not resolved:
            per_agent = _resolve_checkpoints(per_agent, agents)
        loaded: dict[str, Policy] = {}
        policies = {}
        for agent in agents:
            model_spec = per_agent[agent]
            if model_spec not in loaded:
                loaded[model_spec] = load_policy(model_spec, **policy_options)
            policies[agent] = loaded[model_spec]
        return cls(policies)

    def policy_for(self, agent: str) -> Policy:
        """The policy acting for ``agent``.

        Raises:
            KeyError: Naming the agents the system covers.
        """
        try:
            return self.policies[agent]
        except KeyError:
            raise KeyError(
                f"the system has no policy for agent {agent!r}; it covers {sorted(self.policies)}"
            ) from None

    def unique_policies(self) -> list[Policy]:
        """Each distinct policy object once, in agent order."""
        seen: dict[int, Policy] = {}
        for policy in self.policies.values():
            seen.setdefault(id(policy), policy)
        return list(seen.values())

    def close(self) -> None:
        """Close every policy."""
        for policy in self.unique_policies():
            policy.close()


def parse_system_spec(spec: str | Mapping[str, str], agents: Sequence[str]) -> dict[str, str]:
    """Per-agent model specs from a single spec, a mapping, or ``"a=x,b=y"``.

    The one place system specs are read. A spec that is a checkpoint of ``mappa train``
    resolves per agent to that agent's own weights (see :mod:`mappa_agents.checkpoints`):

    - ``runs/x``: the newest complete checkpoint of the run;
    - ``runs/x/checkpoints``: the same;
    - ``runs/x/checkpoints/step-000010``: that checkpoint;

    each agent then gets ``<checkpoint>/agents/<agent>`` (an HF model dir, or with LoRA
    its peft adapter, which transformers loads over the base named in its
    ``adapter_config.json``). An agent the checkpoint lacks (frozen during training)
    gets the model the run's ``trainer_state.json`` names for it, with a warning.
    ``"problem_solver=runs/x,code_executor=runs/x,verifier=smollm2-135m"`` mixes
    checkpoints and models (every agent needs a spec).

    Each distinct checkpoint spec is resolved once, so every agent given ``runs/x`` gets
    the weights of the same checkpoint even while the run saves a newer one.

    Raises:
        ValueError: For unknown agents or agents left without a spec.
        CheckpointError: For a checkpoint spec without a complete checkpoint (or an
            incomplete checkpoint), or whose checkpoint and training config give an
            agent no weights.
    """
    return _resolve_checkpoints(_per_agent_specs(spec, agents), agents)


def _per_agent_specs(spec: str | Mapping[str, str], agents: Sequence[str]) -> dict[str, str]:
    """Agent -> spec as given (no checkpoint resolved), checking the agents."""
    if isinstance(spec, str) and "=" in spec and not spec.startswith(("api:", "vllm:")):
        mapping = {}
        for part in spec.split(","):
            agent, sep, model = part.partition("=")
            if not sep or not agent.strip() or not model.strip():
                raise ValueError(f"cannot read {part!r} in system spec {spec!r}: use agent=model")
            mapping[agent.strip()] = model.strip()
        spec = mapping
    if isinstance(spec, str):
        per_agent = dict.fromkeys(agents, spec)
    else:
        unknown = sorted(set(spec) - set(agents))
        if unknown:
            raise ValueError(f"system spec names unknown agents {unknown}; agents: {list(agents)}")
        missing = [a for a in agents if a not in spec]
        if missing:
            example = ",".join(f"{a}=<model>" for a in missing)
            raise ValueError(
                f"system spec has no model for agents {missing}: every agent of "
                f"{list(agents)} needs one, e.g. add {example!r}"
            )
        per_agent = {agent: spec[agent] for agent in agents}
    return per_agent


def _resolve_checkpoints(per_agent: Mapping[str, str], agents: Sequence[str]) -> dict[str, str]:
    """Each agent's spec, with checkpoint specs resolved once per distinct spec."""
    found: dict[str, Path | None] = {}
    return {
        agent: _resolve_checkpoint_spec(model, agent, agents, found)
        for agent, model in per_agent.items()
    }


def _checkpoint_of(model_spec: str, found: dict[str, Path | None]) -> Path | None:
    """The checkpoint ``model_spec`` names (None: not a checkpoint spec), resolved once."""
    from mappa_agents import checkpoints

    if model_spec not in found:
        is_spec = not model_spec.startswith(
            ("api:", "vllm:")
        ) and checkpoints.looks_like_checkpoint_spec(model_spec)
        found[model_spec] = checkpoints.resolve_checkpoint(model_spec) if is_spec else None
    return found[model_spec]


def _resolve_checkpoint_spec(
    model_spec: str, agent: str, agents: Sequence[str], found: dict[str, Path | None]
) -> str:
    """``model_spec`` itself, or the weights of ``agent`` when it names a checkpoint.

    ``found`` caches spec -> checkpoint across the agents of one system spec.
    """
    from mappa_agents import checkpoints

    checkpoint = _checkpoint_of(model_spec, found)
    if checkpoint is None:
        return model_spec
    try:
        return str(checkpoints.agent_weights(checkpoint, agent))
    except checkpoints.CheckpointError:
        trained_with = checkpoints.checkpoint_system_spec(checkpoint)
        if trained_with is None:
            raise
        fallback_spec = _per_agent_specs(trained_with, agents)[agent]
        if _checkpoint_of(fallback_spec, found) == checkpoint:
            raise
        fallback = _resolve_checkpoint_spec(fallback_spec, agent, agents, found)
        logger.warning(
            "checkpoint %s has no weights for %s (frozen in training): it acts with the "
            "run's model %s",
            checkpoint,
            agent,
            fallback,
        )
        return fallback
