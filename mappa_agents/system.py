"""Multiagent systems: which policy acts for which environment agent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mappa_agents.policy import Policy


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
        cls, spec: str | Mapping[str, str], agents: Sequence[str], **policy_options: Any
    ) -> AgentSystem:
        """Build a system from model specs.

        Args:
            spec: One spec for every agent (``"smollm2-135m"``, an HF id or path,
                ``"api:<litellm model>"``, ``"vllm:<model>"``), a mapping agent -> spec,
                or a string ``"agent=spec,agent=spec"``. Agents with the same spec share one
                loaded policy (the weights are identical; training makes separate copies).
            agents: The environment's agent ids, in order.
            **policy_options: Passed to :func:`mappa_agents.models.load_policy`.

        Raises:
            ValueError: When an agent has no spec or a spec names an unknown agent.
        """
        from mappa_agents.models import load_policy

        per_agent = parse_system_spec(spec, agents)
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

    Raises:
        ValueError: For unknown agents or agents left without a spec.
    """
    if isinstance(spec, str) and "=" in spec and not spec.startswith(("api:", "vllm:")):
        mapping = {}
        for part in spec.split(","):
            agent, sep, model = part.partition("=")
            if not sep or not agent.strip() or not model.strip():
                raise ValueError(f"cannot read {part!r} in system spec {spec!r}: use agent=model")
            mapping[agent.strip()] = model.strip()
        spec = mapping
    if isinstance(spec, str):
        return dict.fromkeys(agents, spec)
    unknown = sorted(set(spec) - set(agents))
    if unknown:
        raise ValueError(f"system spec names unknown agents {unknown}; agents: {list(agents)}")
    missing = [a for a in agents if a not in spec]
    if missing:
        raise ValueError(f"system spec has no model for agents {missing}")
    return dict(spec)
