"""Credit modes by name and credit as one value.

A credit mode of one file is paid by the environments, accepted by a config and by
``--credit-mode``; :class:`~mappa_env.credit.CreditSettings` gives the numbers the
functions of :mod:`mappa_env.credit` gave.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from mappa_env.credit import (
    COACH_MODES,
    CREDIT_MODES,
    CreditRule,
    CreditSettings,
    credit_mode_names,
    get_credit_rule,
    register_credit_mode,
    unregister_credit_mode,
)
from mappa_env.errors import SettingsError
from mappa_train.config import TrainConfig
from tests.test_credit import REPLIES, SCORES, JudgedPairEnv, play

ROOT = Path(__file__).resolve().parents[1]
BUILT_IN = ("process", "outcome", "mixed", "backprop", "agent_oracle")


def _half_now(score: float | None, credit: CreditSettings) -> float | None:
    return None if score is None else score / 2


def _best_of(
    scores: Sequence[float | None],
    outcome: float,
    credit: CreditSettings,
    agent_correct: Sequence[float | None] | None,
) -> list[float | None]:
    return [None if s is None else max(s, outcome) for s in scores]


@pytest.fixture
def best_of():
    register_credit_mode("best_of", CreditRule(_half_now, _best_of, uses_coach=True))
    yield
    unregister_credit_mode("best_of")


def test_a_registered_mode_is_paid_by_the_environment(best_of):
    env = JudgedPairEnv(credit_mode="best_of")
    env.reset(seed=0)
    env.step(REPLIES["writer"])
    assert env.rewards["writer"] == SCORES["writer"] / 2  # provisional, when taken
    env.close()
    env = JudgedPairEnv(credit_mode="best_of")
    returns = play(env, REPLIES)
    # The episode failed (outcome 0): each action is paid its score in the end.
    assert [r.reward for r in env.transcript] == [SCORES["writer"], SCORES["editor"]]
    assert returns == pytest.approx(SCORES)
    assert env.credit_settings["mode"] == "best_of"
    env.close()


def test_a_registered_mode_is_a_choice_everywhere_names_are_checked(best_of):
    assert "best_of" in CREDIT_MODES
    assert "best_of" in COACH_MODES
    assert credit_mode_names() == (*BUILT_IN, "best_of")
    assert TrainConfig(credit_mode="best_of").credit.mode == "best_of"
    # argparse reads CREDIT_MODES when it parses, so --credit-mode takes it too.
    import argparse

    from mappa_agents.cli import add_env_arguments

    parser = argparse.ArgumentParser()
    add_env_arguments(parser)
    args, _ = parser.parse_known_args(["--credit-mode", "best_of"])
    assert args.credit_mode == "best_of"


def test_the_built_in_names_read_as_before():
    assert CREDIT_MODES == BUILT_IN
    assert repr(CREDIT_MODES) == repr(BUILT_IN)
    assert list(COACH_MODES) == ["process", "mixed", "backprop"]
    with pytest.raises(ValueError) as info:
        CreditSettings("best")
    assert str(info.value) == f"unknown credit mode 'best'; use one of {BUILT_IN}"
    with pytest.raises(SettingsError, match=r"credit_mode must be one of \('process'"):
        TrainConfig(credit_mode="best")


def test_settings_are_one_checked_frozen_value():
    credit = CreditSettings("mixed", 1, 0.25)
    assert credit.outcome_weight == 1.0
    assert isinstance(credit.outcome_weight, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        credit.mode = "process"  # type: ignore[misc]
    assert credit.to_dict() == {"mode": "mixed", "outcome_weight": 1.0, "backprop_decay": 0.25}
    assert credit.to_dict() is not credit.to_dict()  # infos get a dict of their own
    assert CreditSettings.from_dict(credit.to_dict()) == credit
    assert credit.env_options() == {
        "credit_mode": "mixed",
        "outcome_weight": 1.0,
        "backprop_decay": 0.25,
    }
    assert credit.compared_keys() == ("mode", "outcome_weight")
    assert CreditSettings("backprop").compared_keys() == ("mode", "backprop_decay")
    assert CreditSettings("outcome").compared_keys() == ("mode",)
    for bad in (-0.1, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="outcome_weight"):
            CreditSettings("mixed", bad)  # type: ignore[arg-type]


def test_settings_pay_what_the_formulas_say():
    scores = [0.9, 0.8, None, 1.0]
    assert CreditSettings("process").settle(scores, 0.0) == scores
    assert CreditSettings("outcome").settle(scores, 1.0) == [1.0] * 4
    mixed = CreditSettings("mixed", outcome_weight=0.25).settle(scores, 0.0)
    assert mixed == [0.75 * 0.9, 0.75 * 0.8, None, 0.75 * 1.0]
    back = CreditSettings("backprop", backprop_decay=0.5).settle(scores, 0.0)
    assert back == [0.9 - 0.125, 0.8 - 0.25, None, 0.0]
    oracle = CreditSettings("agent_oracle").settle(scores, 0.0, [1, 0, 1, None])
    assert oracle == [1.0, 0.0, 1.0, None]
    with pytest.raises(ValueError, match="agent_oracle credit needs"):
        CreditSettings("agent_oracle").settle(scores, 0.0)
    assert CreditSettings("mixed", 0.25).provisional(0.8) == (1.0 - 0.25) * 0.8
    assert CreditSettings("outcome").provisional(None) == 0.0
    assert CreditSettings("process").provisional(None) is None
    assert TrainConfig(credit_mode="mixed", outcome_weight=0.25).credit == CreditSettings(
        "mixed", 0.25
    )


def test_an_environment_holds_its_credit_as_one_value():
    env = JudgedPairEnv(credit_mode="backprop", backprop_decay=0.25)
    assert env.credit == CreditSettings("backprop", 0.5, 0.25)
    assert env.credit_settings == env.credit.to_dict()
    env.close()


def test_a_taken_or_bad_registration_is_refused(best_of):
    rule = get_credit_rule("best_of")
    assert rule.name == "best_of"
    with pytest.raises(ValueError, match="already registered"):
        register_credit_mode("best_of", rule)
    with pytest.raises(ValueError, match="module:attribute"):
        register_credit_mode("pathless", "no_colon_here")
    with pytest.raises(TypeError, match="CreditRule"):
        register_credit_mode("function", _best_of)  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="no credit mode named"):
        unregister_credit_mode("never-registered")


def test_listing_and_checking_credit_modes_imports_no_mode():
    code = (
        "import json, sys\n"
        "from mappa_env.credit import credit_mode_names, check_credit\n"
        "credit_mode_names(); check_credit('mixed', 0.25)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    loaded = set(json.loads(result.stdout.strip().splitlines()[-1]))
    assert "mappa_env.credit_modes" not in loaded
