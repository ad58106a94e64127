"""Judging an action: what the coach is shown, whether it sees the truth, and caps.

Owns :class:`CoachJudging`, the part of :class:`~mappa_env.envs.pipeline.PipelineEnv`
that checks the coach and credit options, builds each action's
:class:`~mappa_env.coach.base.CoachRequest` (with the ground truth only where
:data:`REVEAL_POLICIES` says), asks the coach, caps its verdict by a measured outcome and
turns it into the action's provisional reward; and the checks of ``reveal`` and
``invalid_reward``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import reprlib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from mappa_env.coach.base import (
    Coach,
    CoachRequest,
    CoachStop,
    CoachVerdict,
    FileInfo,
    RevealPolicy,
    Rubric,
    cap_verdict,
)
from mappa_env.coach.facts import CoachFacts, PlainFacts
from mappa_env.credit import (
    COACH_MODES,
    CREDIT_MODES,
    CreditMode,
    CreditSettings,
)
from mappa_env.envs.records import ActionRecord
from mappa_env.options import number_option

logger = logging.getLogger(__name__)

REVEAL_POLICIES: tuple[str, ...] = ("never", "last_agent", "always")


def file_infos(files: Sequence[Mapping[str, Any] | FileInfo]) -> tuple[FileInfo, ...]:
    """File listings travel as plain dicts in ``infos``; coaches get :class:`FileInfo`."""
    return tuple(f if isinstance(f, FileInfo) else FileInfo(f["name"], f["size"]) for f in files)


def check_invalid_reward(value: Any) -> float:
    """``invalid_reward`` checked: NaN, or a number in ``[-1, 0]``.

    The reward recorded for an action whose verdict is invalid must never pay more
    than the worst real score (0): NaN (the default) marks it unmistakably; a number
    in ``[-1, 0]`` is accepted for code that cannot hold NaN.

    Raises:
        TypeError: For a value that is not a number.
        ValueError: For a number outside ``[-1, 0]`` other than NaN.
    """
    if isinstance(value, float) and math.isnan(value):
        return value
    return number_option(
        "invalid_reward",
        value,
        low=-1.0,
        high=0.0,
        hint="an invalid verdict must never pay more than the worst real score; "
        "NaN (the default) marks such rewards unmistakably",
    )


class CoachJudging:
    """The coach's side of every step, for :class:`PipelineEnv`.

    A mixin: :class:`~mappa_env.envs.pipeline.PipelineEnv` holds the state it reads
    (``coach``, ``reveal``, the agents, the credit options) and the hooks it calls
    (``task_facts``, ``role_description``, ``coach_metadata`` or :meth:`coach_facts`).
    """

    env_id: ClassVar[str]
    coach_rubrics: ClassVar[Mapping[str, str]]
    shows_workspace: ClassVar[bool]
    rules_rubric: ClassVar[Rubric | None]
    reports_agent_correct: ClassVar[bool]
    #: The environment's facts class, whose ``from_dict`` class method reads their
    #: plain-data form back: a request built by hand from ``metadata`` then shows in an
    #: LLM coach's prompt as the environment's own do. ``None``: it shows no sections.
    coach_facts_type: ClassVar[type | None] = None
    possible_agents: list[str]
    coach: Coach | None
    reveal: RevealPolicy
    credit: CreditSettings
    invalid_reward: float

    def _take_coach(
        self,
        coach: Coach | str | None,
        credit_mode: CreditMode,
        outcome_weight: float,
        backprop_decay: float,
        reward_mode: str | None,
        reveal: RevealPolicy | None,
    ) -> tuple[Coach | None, CreditSettings, CreditMode, RevealPolicy]:
        """The coach (built from a spec string), the credit, its mode and the reveal, checked.

        Raises:
            TypeError: For a coach that is not a Coach, a spec string or None.
            ValueError: For a credit mode the coach (or the environment) cannot pay, or
                an unknown reveal policy.
        """
        # A coach built here from a spec string belongs to this env and is closed with it;
        # a coach object passed in is shared (e.g. by every env of a runner) and is not.
        self._owns_coach = isinstance(coach, str)
        if coach is not None and not isinstance(coach, (str, Coach)):
            # Taken as is, it failed at the first reset with an AttributeError.
            raise TypeError(
                f"coach={reprlib.repr(coach)}: coach must be a Coach object (with name, "
                "score() and ascore()), a spec string ('rules' or 'llm:<model>') or None, "
                f"got {type(coach).__name__}"
            )
        if isinstance(coach, str):
            from mappa_env.coach import make_coach

            coach = make_coach(coach)
        if reward_mode is not None:
            warnings.warn(
                "reward_mode is deprecated: pass credit_mode (the same values, and more)",
                DeprecationWarning,
                stacklevel=3,  # the caller of PipelineEnv.__init__
            )
            credit_mode = reward_mode  # type: ignore[assignment]
        credit = CreditSettings(credit_mode, outcome_weight, backprop_decay)
        if coach is None and credit.uses_coach:
            free = [m for m in CREDIT_MODES if m not in COACH_MODES]
            raise ValueError(
                f"credit_mode={credit_mode!r} needs a coach; pass coach=... "
                f"or use a credit mode that needs none ({', '.join(free)})"
            )
        if credit.needs_agent_correct and not self.reports_agent_correct:
            raise ValueError(
                f"{type(self).__name__} cannot pay {credit_mode} credit: its episode_outcome() "
                "does not say whether each agent's own answer was right (set the class "
                "attribute reports_agent_correct = True once it returns 'agent_correct'); "
                f"use one of {[m for m in CREDIT_MODES if m != credit_mode]}"
            )
        if reveal is None:
            reveal = getattr(coach, "default_reveal", "last_agent")
        if reveal not in REVEAL_POLICIES:
            raise ValueError(f"reveal must be one of {REVEAL_POLICIES}, got {reveal!r}")
        return coach, credit, credit_mode, reveal

    def coach_sees_truth(self, agent: str) -> bool:
        """Whether the coach judges ``agent``'s actions with the ground truth in view.

        As :attr:`reveal` says: every agent (``"always"``), the last one
        (``"last_agent"``) or none (``"never"``). Environments that hand the coach more
        facts (:meth:`coach_facts`) hold back the ones that give the answer away when
        this is False.
        """
        is_last = agent == self.possible_agents[-1]
        return self.reveal == "always" or (self.reveal == "last_agent" and is_last)

    async def _judge(self, record: ActionRecord) -> CoachVerdict:
        assert self.coach is not None
        result = record.tool.result
        if result is not None and result.error is not None and result.error.name == "SandboxError":
            # The environment failed to run the code, not the agent: no score, flagged.
            return CoachVerdict.invalid(
                f"not scored: the sandbox could not run this action's code ({result.error.value})",
                coach=self.coach.name,
            )
        failure = record.tool.extra.get("environment_error")
        if failure is not None:
            # The environment could not carry the action out: whatever a coach made of
            # it would score the environment's fault as the agent's.
            return CoachVerdict.invalid(
                f"not scored: the environment could not carry out this action ({failure})",
                coach=self.coach.name,
            )
        # The request's facts are read from agent text (answers, code): off the loop.
        request = await asyncio.to_thread(self._coach_request, record)
        try:
            verdict = await self.coach.ascore(request)
        except CoachStop:
            raise
        except Exception as exc:  # a coach bug must not lose the episode
            logger.exception("coach %s raised while scoring %s", self.coach.name, record.agent)
            return CoachVerdict.invalid(
                f"coach raised {type(exc).__name__}: {exc}", coach=self.coach.name
            )
        # A cap from a measured outcome binds the verdict, whatever the coach made of it.
        return cap_verdict(verdict, request.score_cap)

    def _coach_request(self, record: ActionRecord) -> CoachRequest:
        """What the coach is shown about ``record``."""
        task_id, task_text, truth = self.task_facts()
        is_last = record.agent == self.possible_agents[-1]
        tool = record.tool
        return CoachRequest(
            env_id=self.env_id,
            task_id=task_id,
            task=task_text,
            agent=record.agent,
            system_description=self.system_description,
            role_description=self.role_description(record.agent),
            agent_input=record.messages,
            action=record.action,
            turn=record.turn,
            is_last_agent=is_last,
            tool_result=None if tool.result is None else tool.result.to_dict(),
            tool_output=tool.output,
            files=file_infos(tool.extra.get("files", ())),
            upstream_files=file_infos(tool.extra.get("upstream_files", ())),
            ground_truth=truth if self.coach_sees_truth(record.agent) else None,
            facts=self.coach_facts(record),
            rubric=self.coach_rubrics.get(record.agent),
            shows_workspace=self.shows_workspace,
            rules_rubric=type(self).rules_rubric,
        )

    def coach_facts(self, record: ActionRecord) -> CoachFacts:
        """The environment's facts about ``record`` for the coach (override to type them).

        An environment returns a frozen dataclass of its own that follows
        :class:`~mappa_env.coach.facts.CoachFacts` (a misspelt fact is then an error):
        rules coaches read its plain-data form, LLM coaches the sections it shows, and
        its ``score_cap`` binds the verdict. Naming the class as the environment's
        ``coach_facts_type`` lets a request built by hand from the plain-data form show
        as the environment's do. The default: :meth:`coach_metadata`'s mapping, which
        caps but shows in no section.
        """
        return PlainFacts(self.coach_metadata(record))

    def _provisional_reward(self, verdict: CoachVerdict | None) -> tuple[float, bool]:
        """``(reward, valid)`` of an action when it is taken (see :mod:`mappa_env.credit`)."""
        score = None if verdict is None else verdict.reward
        reward = self.credit.provisional(score)
        return (self.invalid_reward, False) if reward is None else (reward, True)
