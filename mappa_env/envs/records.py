"""What an episode keeps: each action's record, and the outcome that settles its rewards.

Owns :class:`ToolOutcome` (what an action did besides producing text), :class:`ActionRecord`
(one action as the transcript keeps it) and :class:`EpisodeRecords`, the part of
:class:`~mappa_env.envs.pipeline.PipelineEnv` that reads the transcript (an agent's
records, the transcript as text, the state snapshot, each step's ``infos``) and ends an
episode: its outcome (:class:`~mappa_env.envs.outcome.EpisodeOutcome`, built here from
``episode_outcome()``), and every action's final reward under the credit mode
(:mod:`mappa_env.credit`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from mappa_env.coach.base import CoachVerdict
from mappa_env.credit import CreditSettings
from mappa_env.envs.outcome import EpisodeOutcome, usable_reward
from mappa_env.sandbox.base import ExecResult


@dataclass
class ToolOutcome:
    """What an action did besides producing text.

    Attributes:
        code: The code that ran (all blocks joined), or ``None`` when none ran.
        result: The sandbox's result, or ``None`` when no code ran.
        output: The result as rendered for the agent and the coach.
        ends_slot: True when this action ends the agent's slot early.
        extra: Environment-specific facts for ``infos`` and the coach (e.g. files).
    """

    code: str | None = None
    result: ExecResult | None = None
    output: str | None = None
    ends_slot: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ActionRecord:
    """One action of one agent, as kept in the transcript.

    Attributes:
        agent: Agent id.
        turn: 0-based turn of this agent.
        messages: The exact chat messages the agent was prompted with.
        action: The action text as used by the environment (after cutting oversize text).
        action_truncated: True when the submitted action was longer than allowed.
        tool: What running the action did.
        verdict: The coach's verdict, or ``None`` when no coach was called.
        reward: The action's reward under the environment's credit mode: provisional
            while the episode runs, final once it has ended
            (:mod:`mappa_env.credit`); ``invalid_reward`` (NaN by default) when it
            rests on an invalid coach verdict.
        reward_valid: False when ``reward`` rests on an invalid verdict (or the episode
            could not be credited): it must not be trained on. Read both through
            :attr:`usable_reward`.
    """

    agent: str
    turn: int
    messages: tuple[dict[str, str], ...]
    action: str
    action_truncated: bool
    tool: ToolOutcome
    verdict: CoachVerdict | None = None
    reward: float = 0.0
    reward_valid: bool = True

    @property
    def usable_reward(self) -> float | None:
        """The reward to train on or report, ``None`` when there is none."""
        return usable_reward(self.reward, self.reward_valid)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-serialisable) of the record."""
        return {
            "agent": self.agent,
            "turn": self.turn,
            "messages": [dict(m) for m in self.messages],
            "action": self.action,
            "action_truncated": self.action_truncated,
            "code": self.tool.code,
            "tool": None if self.tool.result is None else self.tool.result.to_dict(),
            "tool_output": self.tool.output,
            "coach": None if self.verdict is None else self.verdict.to_dict(),
            "reward": self.reward,
            "reward_valid": self.reward_valid,
        }


class EpisodeRecords:
    """The transcript's readers and the episode's end, for :class:`PipelineEnv`.

    A mixin: :class:`~mappa_env.envs.pipeline.PipelineEnv` holds the state it reads
    (``transcript``, the agents' dicts, the credit options) and the hooks it calls
    (``task_facts``, ``episode_outcome``, ``on_episode_end``).
    """

    env_id: ClassVar[str]
    episode_index: int
    agents: list[str]
    agent_selection: str
    transcript: list[ActionRecord]
    outcome: EpisodeOutcome | None
    rewards: dict[str, float]
    terminations: dict[str, bool]
    truncations: dict[str, bool]
    infos: dict[str, dict[str, Any]]
    credit: CreditSettings
    invalid_reward: float

    def state(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot of the episode: task, actions so far, outcome."""
        task_id, task_text, _ = self.task_facts()
        return {
            "env_id": self.env_id,
            "episode_index": self.episode_index,
            "task_id": task_id,
            "task": task_text,
            "agent_selection": self.agent_selection if self.agents else None,
            "actions": [r.to_dict() for r in self.transcript],
            "outcome": None if self.outcome is None else self.outcome.to_dict(),
        }

    def transcript_text(self) -> str:
        """The episode so far as readable text."""
        task_id, task_text, _ = self.task_facts()
        lines = [f"=== {self.env_id} | task {task_id} ===", task_text, ""]
        for r in self.transcript:
            lines.append(f"--- {r.agent} (turn {r.turn + 1}) ---")
            lines.append(r.action)
            if r.tool.output is not None:
                lines.append(f"--- tool output ---\n{r.tool.output}")
            if r.verdict is not None:
                score = "invalid" if not r.verdict.valid else f"{r.verdict.score:g}/10"
                lines.append(f"--- coach: {score} | {r.verdict.analysis}")
            lines.append("")
        if self.outcome is not None:
            lines.append(f"=== outcome: {self.outcome.to_dict()} ===")
        return "\n".join(lines)

    def last_record(self, agent: str) -> ActionRecord | None:
        """The most recent action of ``agent`` in this episode, if any."""
        for record in reversed(self.transcript):
            if record.agent == agent:
                return record
        return None

    def records_of(self, agent: str) -> list[ActionRecord]:
        """All actions of ``agent`` in this episode, in order."""
        return [r for r in self.transcript if r.agent == agent]

    @property
    def credit_settings(self) -> dict[str, Any]:
        """The credit mode and its weights, as recorded in ``infos`` and trajectories."""
        return self.credit.to_dict()

    def _final_rewards(self, outcome: EpisodeOutcome) -> list[float | None]:
        """Every action's final reward under the credit mode, in transcript order."""
        scores = [
            None if r.verdict is None or not r.verdict.valid else r.verdict.reward
            for r in self.transcript
        ]
        agent_correct = None
        if self.credit.needs_agent_correct:
            correct = outcome.agent_correct
            if not isinstance(correct, Mapping):
                raise RuntimeError(
                    f"{type(self).__name__}.episode_outcome() returned no 'agent_correct' "
                    "mapping, which agent_oracle credit pays"
                )
            agent_correct = [
                None if correct.get(r.agent) is None else float(bool(correct[r.agent]))
                for r in self.transcript
            ]
        # An outcome without a reward settles as 0.0, as it always has.
        reward = 0.0 if outcome.reward is None else float(outcome.reward)
        return self.credit.settle(scores, reward, agent_correct)

    def _step_info(self, record: ActionRecord) -> dict[str, Any]:
        verdict = record.verdict
        task_id, _, _ = self.task_facts()
        return {
            "env_id": self.env_id,
            "task_id": task_id,
            "episode_index": self.episode_index,
            "turn": record.turn,
            "action_truncated": record.action_truncated,
            "code": record.tool.code,
            "tool": None if record.tool.result is None else record.tool.result.to_dict(),
            "tool_output": record.tool.output,
            "coach": None if verdict is None else verdict.to_dict(),
            "credit": self.credit_settings,
            "reward_valid": record.reward_valid,
            **record.tool.extra,
        }

    async def _finish(self, truncated: bool) -> None:
        outcome = EpisodeOutcome.from_dict({**await self.episode_outcome(), "truncated": truncated})
        self.outcome = outcome
        shown = outcome.to_dict()
        # Each action's reward becomes final; every agent is paid what its actions were
        # not paid along the way, so its return is the sum of their final rewards.
        owed = dict.fromkeys(self.agents, 0.0)
        for record, final in zip(self.transcript, self._final_rewards(outcome)):
            paid = record.usable_reward
            record.reward, record.reward_valid = (
                (self.invalid_reward, False) if final is None else (final, True)
            )
            if final is not None and final != paid and record.agent in owed:
                owed[record.agent] += final - (paid or 0.0)
        for agent in self.agents:
            if owed[agent]:
                self.rewards[agent] += owed[agent]
            self.infos[agent] = {
                **self.infos[agent],
                "outcome": shown,
                "action_rewards": [r.usable_reward for r in self.records_of(agent)],
            }
            if truncated:
                self.truncations[agent] = True
            else:
                self.terminations[agent] = True
        await self.on_episode_end()
