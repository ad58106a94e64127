r"""Credit assignment: the reward each action is trained on, owned by the environment.

An environment turns its coach's verdicts and the episode's outcome into one reward per
action under its ``credit_mode``; ``env.rewards``, the trajectories, the saved rollouts
and a trainer's loss all read that one number. Given an episode's actions
``a_0..a_{n-1}`` (all agents, in order), their coach scores scaled to [0, 1] ``s_i``
(``None`` when the coach's verdict was invalid), the episode's outcome reward ``o`` in
[0, 1] and, for ``agent_oracle``, whether the acting agent's own final answer was right
``c_i`` in {0, 1}:

- ``process`` (the paper): ``r_i = s_i``, the coach's graded judgement of the action.
- ``outcome`` (the paper's baseline): ``r_i = o`` for every action: one shared signal.
- ``agent_oracle``: ``r_i = c_i``: each agent is paid for its own final answer by the
  ground truth, 1 or 0. It gives credit per agent without a graded judgement, so
  comparing it with ``process`` tells "credit per agent" apart from "the coach's
  grading", and comparing it with ``outcome`` measures what per-agent credit alone buys.
- ``mixed``: ``r_i = (1 - w) s_i + w o``.
- ``backprop`` (toward the paper's future work: blame passed backward from the outcome
  to upstream agents): the final action is re-scored by the verified outcome, and each
  upstream action moves toward it by a share of the final coach's error that decays
  with distance: ``e = o - s_{n-1}``, ``r_i = clip(s_i + lambda^(n-1-i) e, 0, 1)`` (so
  ``r_{n-1} = o``). Without a valid final score there is no error to pass back.

An action whose own coach score is invalid gets ``None`` in every mode that uses its
score: it is masked out of a loss, never filled in with a made-up value.

During an episode an environment pays each action its **provisional** reward
(:func:`provisional_reward`: the part known when the action is taken) and at the end the
difference to the final reward, so an agent's cumulative return is the sum of its
actions' final rewards.

The modes are plug-ins (:class:`CreditRule`, looked up by name): the built-in ones live in
:mod:`mappa_env.credit_modes` and are loaded on first use, so listing names (what a
config's check reads) imports nothing else. A mode of one's own is one file::

    from mappa_env.credit import CreditRule, register_credit_mode

    def provisional(score, credit):  # when the action is taken
        return score

    def settle(scores, outcome, credit, agent_correct):  # at the episode's end
        return [None if s is None else max(s, outcome) for s in scores]

    register_credit_mode("best_of", CreditRule(provisional, settle, uses_coach=True))

:class:`CreditSettings` is the credit of a run as one value (the mode and its weights),
made once (``TrainConfig.credit``, an environment's ``credit``) and asked for the
rewards (:meth:`~CreditSettings.provisional`, :meth:`~CreditSettings.settle`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

CreditMode = Literal["process", "outcome", "mixed", "backprop", "agent_oracle"]

ProvisionalFn = Callable[[float | None, "CreditSettings"], float | None]
"""``(score, credit) -> reward`` of an action when it is taken (``None``: masked)."""

SettleFn = Callable[
    [Sequence[float | None], float, "CreditSettings", Sequence[float | None] | None],
    list[float | None],
]
"""``(scores, outcome, credit, agent_correct) -> rewards``: the final reward of every
action of a finished episode, in episode order (``None``: masked)."""


@dataclass(frozen=True)
class CreditRule:
    """How one credit mode pays: a reward when the action is taken, the final one at the end.

    Attributes:
        provisional: ``(score, credit) -> reward``: the part known when the action is
            taken (the score is the action's coach score in [0, 1], ``None`` when
            invalid); an environment pays the rest at the end.
        settle: ``(scores, outcome, credit, agent_correct) -> rewards``: every action's
            final reward (see the module docstring); ``agent_correct`` is given only
            with ``needs_agent_correct``.
        uses_coach: Whether its rewards read the coach's scores (an environment without
            a coach refuses such a mode).
        weights: Which of the :class:`CreditSettings` weights it reads
            (``"outcome_weight"``, ``"backprop_decay"``): only those can make rewards
            paid under other settings disagree.
        needs_agent_correct: Whether ``settle`` needs, per action, whether the acting
            agent's own final answer was right (the environment's
            ``episode_outcome()["agent_correct"]``).
        name: The name it was registered under (set by :func:`register_credit_mode`).
    """

    provisional: ProvisionalFn
    settle: SettleFn
    uses_coach: bool = True
    weights: tuple[str, ...] = ()
    needs_agent_correct: bool = False
    name: str = ""


_Entry = CreditRule | str

# The registry (like the advantage estimators'): name -> rule, or "module:attribute" of
# one imported on first use. Insertion order is the order the names are listed in.
_MODES: dict[str, _Entry] = {
    "process": "mappa_env.credit_modes:PROCESS",
    "outcome": "mappa_env.credit_modes:OUTCOME",
    "mixed": "mappa_env.credit_modes:MIXED",
    "backprop": "mappa_env.credit_modes:BACKPROP",
    "agent_oracle": "mappa_env.credit_modes:AGENT_ORACLE",
}


class _ModeNames(Sequence[str]):
    """The registered credit modes' names, read live (a mode registered later is in it).

    Compares, prints and iterates like the tuple of names it holds now, so it serves as
    argparse ``choices`` and in messages. With ``coach=True``: the modes that use the
    coach's scores (which loads their rules).
    """

    def __init__(self, *, coach: bool = False) -> None:
        self._coach = coach

    def _names(self) -> tuple[str, ...]:
        if not self._coach:
            return tuple(_MODES)
        return tuple(name for name in _MODES if get_credit_rule(name).uses_coach)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...

    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, value: object) -> bool:
        return value in self._names()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _ModeNames):
            return self._names() == other._names()
        return isinstance(other, tuple) and self._names() == other

    def __hash__(self) -> int:
        return hash(self._names())

    def __repr__(self) -> str:
        return repr(self._names())


#: The registered credit modes' names (the built-in ones first), read live.
CREDIT_MODES: Sequence[str] = _ModeNames()
#: Modes whose rewards use the coach's scores (the others need no coach at all).
COACH_MODES: Sequence[str] = _ModeNames(coach=True)


def register_credit_mode(name: str, rule: CreditRule | str, *, replace: bool = False) -> _Entry:
    """Register a credit mode under ``name``.

    Args:
        name: What ``credit_mode`` (``--credit-mode``) selects.
        rule: A :class:`CreditRule`, or the ``"module:attribute"`` path of one
            (imported on first use).
        replace: Allow replacing a mode already registered under ``name``.

    Returns:
        What was registered (the rule with its ``name`` set, or the path).

    Raises:
        ValueError: When ``name`` is taken (and ``replace`` is false) or empty, or a
            path is malformed.
        TypeError: When ``rule`` is neither a :class:`CreditRule` nor a path.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a credit mode name must be a non-empty string, got {name!r}")
    if name in _MODES and not replace:
        raise ValueError(
            f"a credit mode named {name!r} is already registered: pick another name, or "
            "pass replace=True to override it"
        )
    entry: _Entry
    if isinstance(rule, CreditRule):
        entry = dataclasses.replace(rule, name=name)
    elif isinstance(rule, str):
        from mappa_env.import_paths import split_import_path

        split_import_path(rule, "a credit mode")
        entry = rule
    else:
        raise TypeError(
            f"a credit mode is a CreditRule or a 'module:attribute' path; got {type(rule).__name__}"
        )
    _MODES[name] = entry
    return entry


def unregister_credit_mode(name: str) -> None:
    """Remove ``name`` from the registry (e.g. a test's mode after the test).

    Raises:
        KeyError: When no credit mode has that name.
    """
    if name not in _MODES:
        raise KeyError(f"no credit mode named {name!r}; registered: {tuple(_MODES)}")
    del _MODES[name]


def credit_mode_names() -> tuple[str, ...]:
    """Names of the registered credit modes, the built-in ones first (imports nothing)."""
    return tuple(_MODES)


def get_credit_rule(mode: str) -> CreditRule:
    """The rule registered under ``mode`` (importing it on first use).

    Raises:
        ValueError: For an unknown mode, with the registered ones.
        TypeError: When a registered path does not name a :class:`CreditRule`.
    """
    entry = _MODES.get(mode)
    if entry is None:
        raise ValueError(f"unknown credit mode {mode!r}; use one of {CREDIT_MODES}")
    if isinstance(entry, CreditRule):
        return entry
    # Imported here: a learner rank reads this registry's names and never a path.
    from mappa_env.import_paths import load_import_path

    loaded = load_import_path(entry, "a credit mode")
    if not isinstance(loaded, CreditRule):
        raise TypeError(f"{entry!r} (credit mode {mode!r}) is not a CreditRule")
    rule = dataclasses.replace(loaded, name=mode)
    _MODES[mode] = rule
    return rule


def check_credit(mode: str, outcome_weight: float = 0.5, backprop_decay: float = 0.5) -> None:
    """Refuse an unknown mode or a weight outside [0, 1], naming the setting.

    Raises:
        ValueError: With the allowed values.
    """
    if mode not in CREDIT_MODES:
        raise ValueError(f"unknown credit mode {mode!r}; use one of {CREDIT_MODES}")
    for name, value in (("outcome_weight", outcome_weight), ("backprop_decay", backprop_decay)):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
        if not 0.0 <= value <= 1.0:  # also refuses NaN
            raise ValueError(f"{name} must be in [0, 1], got {value}")


@dataclass(frozen=True)
class CreditSettings:
    """The credit of a run or an environment as one value: the mode and its weights.

    Checked when made (:func:`check_credit`); the weights are kept as floats. Made once
    from a config (``TrainConfig.credit``) or an environment's options, and asked for
    the rewards.

    Attributes:
        mode: A registered credit mode (:data:`CREDIT_MODES`).
        outcome_weight: ``w`` of ``mixed``.
        backprop_decay: ``lambda`` of ``backprop``.

    Raises:
        ValueError: For an unknown mode or a weight outside [0, 1].
    """

    mode: str = "process"
    outcome_weight: float = 0.5
    backprop_decay: float = 0.5

    def __post_init__(self) -> None:
        check_credit(self.mode, self.outcome_weight, self.backprop_decay)
        object.__setattr__(self, "outcome_weight", float(self.outcome_weight))
        object.__setattr__(self, "backprop_decay", float(self.backprop_decay))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CreditSettings:
        """The settings :meth:`to_dict` wrote (``mode``, ``outcome_weight``, ...)."""
        return cls(**data)

    @property
    def rule(self) -> CreditRule:
        """The mode's :class:`CreditRule`."""
        return get_credit_rule(self.mode)

    @property
    def uses_coach(self) -> bool:
        """Whether the rewards read the coach's scores (see :data:`COACH_MODES`)."""
        return self.rule.uses_coach

    @property
    def needs_agent_correct(self) -> bool:
        """Whether settling needs each acting agent's own correctness."""
        return self.rule.needs_agent_correct

    def provisional(self, score: float | None) -> float | None:
        """The reward an action gets when it is taken (:func:`provisional_reward`).

        Args:
            score: The action's coach score in [0, 1], ``None`` when invalid.

        Returns:
            The reward, or ``None`` when it rests on an invalid score.
        """
        return self.rule.provisional(score, self)

    def settle(
        self,
        scores: Sequence[float | None],
        outcome: float,
        agent_correct: Sequence[float | None] | None = None,
    ) -> list[float | None]:
        """Final rewards of one finished episode's actions (:func:`episode_action_rewards`).

        Args:
            scores: Coach scores of the actions in [0, 1], in episode order; ``None`` =
                invalid.
            outcome: The episode's outcome reward in [0, 1].
            agent_correct: For a mode that needs it (``agent_oracle``): per action, 1.0
                when the acting agent's own final answer is right, else 0.0 (``None``:
                the environment could not tell).

        Returns:
            One reward (or ``None``: masked) per action.

        Raises:
            ValueError: For ``agent_oracle`` without one correctness value per action.
        """
        return self.rule.settle(scores, outcome, self, agent_correct)

    def to_dict(self) -> dict[str, Any]:
        """The settings as ``infos`` and the trajectories record them (a new dict).

        Returns:
            ``{"mode": ..., "outcome_weight": ..., "backprop_decay": ...}``.
        """
        return {
            "mode": self.mode,
            "outcome_weight": self.outcome_weight,
            "backprop_decay": self.backprop_decay,
        }

    def env_options(self) -> dict[str, Any]:
        """The keyword arguments an environment is made with (``credit_mode``, ...)."""
        return {
            "credit_mode": self.mode,
            "outcome_weight": self.outcome_weight,
            "backprop_decay": self.backprop_decay,
        }

    def compared_keys(self) -> tuple[str, ...]:
        """The keys of :meth:`to_dict` that decide the rewards.

        The mode and the weights its rule reads: a weight it does not read cannot make
        rewards paid under other settings disagree.
        """
        return ("mode", *self.rule.weights)


def provisional_reward(score: float | None, mode: str, outcome_weight: float = 0.5) -> float | None:
    """The reward an action gets when it is taken, before the episode's outcome is known.

    ``process`` and ``backprop``: ``s``; ``mixed``: ``(1 - w) s``; ``outcome`` and
    ``agent_oracle``: ``0`` (everything they pay is known only at the end).

    Args:
        score: The action's coach score in [0, 1], ``None`` when invalid.
        mode: The credit mode.
        outcome_weight: ``w`` of ``mixed``.

    Returns:
        The reward, or ``None`` when it rests on an invalid score.

    Raises:
        ValueError: For an unknown mode or a weight outside [0, 1].
    """
    return CreditSettings(mode, outcome_weight).provisional(score)


def episode_action_rewards(
    scores: Sequence[float | None],
    outcome: float,
    mode: str = "process",
    outcome_weight: float = 0.5,
    backprop_decay: float = 0.5,
    agent_correct: Sequence[float | None] | None = None,
) -> list[float | None]:
    """Final rewards of one finished episode's actions (see the module docstring).

    Args:
        scores: Coach scores of the actions in [0, 1], in episode order; ``None`` = invalid.
        outcome: The episode's outcome reward in [0, 1].
        mode: One of :data:`CREDIT_MODES`.
        outcome_weight: ``w`` of ``mixed``.
        backprop_decay: ``lambda`` of ``backprop``.
        agent_correct: ``agent_oracle`` only: per action, 1.0 when the acting agent's own
            final answer is right, else 0.0 (``None``: the environment could not tell).

    Returns:
        One reward (or ``None``: masked) per action.

    Raises:
        ValueError: For an unknown mode, out-of-range weights, or ``agent_oracle``
            without one correctness value per action.
    """
    credit = CreditSettings(mode, outcome_weight, backprop_decay)
    return credit.settle(scores, outcome, agent_correct)
