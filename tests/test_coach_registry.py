"""Coaches by name: a coach of one file is usable wherever a coach spec is read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mappa_env.coach import (
    CoachVerdict,
    RulesCoach,
    coach_names,
    make_coach,
    register_coach,
    unregister_coach,
)

ROOT = Path(__file__).resolve().parents[1]


class KeywordCoach:
    """Scores 10 when the action holds the keyword."""

    def __init__(self, keyword: str = "yes") -> None:
        self.keyword = keyword
        self.name = f"keyword:{keyword}"

    def score(self, request):
        score = 10.0 if self.keyword in request.action else 0.0
        return CoachVerdict(score=score, valid=True, coach=self.name)

    async def ascore(self, request):
        return self.score(request)


@pytest.fixture
def keyword_coach():
    register_coach("keyword", KeywordCoach)
    yield
    unregister_coach("keyword")


def test_a_registered_coach_is_made_by_name_with_its_options(keyword_coach):
    coach = make_coach("keyword", keyword="boxed")
    assert isinstance(coach, KeywordCoach)
    assert coach.keyword == "boxed"
    assert "keyword" in coach_names()


def test_a_coach_with_an_argument_gets_the_whole_spec():
    seen = []

    @register_coach("judge", argument="model")
    def judge(spec, **options):
        seen.append((spec, options))
        return KeywordCoach(spec.partition(":")[2])

    try:
        coach = make_coach("judge:small")
        assert coach.keyword == "small"
        assert seen == [("judge:small", {})]
        # Its name alone is no spec of it, as "llm" alone is none of the LLM coach.
        with pytest.raises(ValueError, match="use 'rules', 'llm:<model>', 'judge:<model>'"):
            make_coach("judge")
    finally:
        unregister_coach("judge")


def test_unknown_coaches_get_the_same_message_as_before():
    for spec in ("foo", "llm", "rules:x", ""):
        with pytest.raises(ValueError) as info:
            make_coach(spec)
        assert str(info.value) == (
            f"unknown coach {spec!r}: use 'rules', 'llm:<model>' or a Coach object"
        )


def test_the_built_in_coaches_keep_their_names():
    assert isinstance(make_coach("rules"), RulesCoach)
    assert coach_names() == ("llm", "rules")


def test_a_taken_name_or_a_bad_one_is_refused(keyword_coach):
    with pytest.raises(ValueError, match="already registered"):
        register_coach("keyword", KeywordCoach)
    register_coach("keyword", KeywordCoach, replace=True)
    with pytest.raises(ValueError, match="without ':'"):
        register_coach("a:b", KeywordCoach)
    with pytest.raises(ValueError, match="module:attribute"):
        register_coach("pathless", "no_colon_here")
    with pytest.raises(TypeError, match="coach factory"):
        register_coach("number", 3)  # type: ignore[call-overload]
    with pytest.raises(KeyError, match="no coach named"):
        unregister_coach("never-registered")


def test_a_coach_registered_by_path_is_imported_on_first_use():
    register_coach("rules-by-path", "mappa_env.coach.rules:RulesCoach")
    try:
        assert isinstance(make_coach("rules-by-path"), RulesCoach)
    finally:
        unregister_coach("rules-by-path")


def test_listing_coaches_and_making_the_rules_coach_import_no_llm_code():
    code = (
        "import json, sys\n"
        "from mappa_env.coach import coach_names, make_coach\n"
        "coach_names(); make_coach('rules')\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    loaded = set(json.loads(result.stdout.strip().splitlines()[-1]))
    assert loaded.isdisjoint({"mappa_env.coach.llm", "litellm"})
