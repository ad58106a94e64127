"""Plotting leaves the user's matplotlib setup alone: no backend switch, no pyplot figures.

A notebook user who imports mappa has an inline or widget backend and maybe figures of
their own open; drawing our plots must change neither.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

matplotlib = pytest.importorskip("matplotlib")
pyplot = pytest.importorskip("matplotlib.pyplot")

from mappa_agents.trajectory import ActionSample, EpisodeResult  # noqa: E402

AGENTS = ["problem_solver", "code_executor", "verifier"]
# Not Agg, yet safe without a display, as a notebook's inline backend is.
USER_BACKEND = "svg"


def _forbidden(name: str):
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"plotting called {name}")

    return refuse


@pytest.fixture
def user_session():
    """A user's session: a non-Agg backend, one figure open; touching either fails."""
    original = matplotlib.get_backend()
    pyplot.switch_backend(USER_BACKEND)
    user_figure = pyplot.figure()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(matplotlib, "use", _forbidden("matplotlib.use"))
            for name in ("switch_backend", "figure", "subplots", "close"):
                patch.setattr(pyplot, name, _forbidden(f"pyplot.{name}"))
            yield user_figure
            assert matplotlib.get_backend() == USER_BACKEND
            assert pyplot.get_fignums() == [user_figure.number]
            assert pyplot.gcf() is user_figure
    finally:
        pyplot.close("all")
        pyplot.switch_backend(original)


def _assert_png(path: Path) -> None:
    assert path.read_bytes().startswith(b"\x89PNG")
    assert path.stat().st_size > 1000


def test_coach_report_plot(user_session, tmp_path):
    pytest.importorskip("sklearn")
    from mappa_env.coach.report import coach_report
    from tests.test_coach_report import synthetic_records

    _assert_png(coach_report(synthetic_records(regression_bonus=1.0)).plot(tmp_path / "c.png"))


def _action(rng: random.Random, episode: int, step: int, agent: str) -> ActionSample:
    return ActionSample(
        episode_id=f"ep-{episode}",
        task_id=f"t{episode}",
        env_id="MathChat-v0",
        agent=agent,
        turn=0,
        step=step,
        policy="p",
        messages=[],
        text="x",
        reasoning=None,
        prompt_ids=[],
        response_ids=list(range(rng.randint(1, 30))),
        logprobs=[],
        finish_reason="stop",
        reward=rng.random(),
        reward_valid=True,
        coach={"score": rng.uniform(0, 10), "valid": True},
        code="print(1)" if step % 2 else None,
    )


def _episodes() -> list[EpisodeResult]:
    rng = random.Random(0)
    return [
        EpisodeResult(
            f"ep-{e}",
            f"t{e}",
            "MathChat-v0",
            [_action(rng, e, i, agent) for i, agent in enumerate(AGENTS)],
            {},
        )
        for e in range(3)
    ]


def test_agents_report_plots(user_session, tmp_path):
    from mappa_agents.report import plot_report

    paths = plot_report(_episodes(), tmp_path)
    assert [p.name for p in paths] == ["rewards.png", "lengths.png"]
    for path in paths:
        _assert_png(path)


def test_trainer_plot(user_session, tmp_path):
    pytest.importorskip("torch")
    from mappa_train.plots import plot_history

    history = [
        {
            "step": step,
            "rollout/success_rate": step / 4,
            **({"eval/success_rate": step / 5} if step % 2 == 0 else {}),
            **{f"{a}/mean_reward": 0.1 * step for a in AGENTS},
            **{f"{a}/tool_call_rate": 0.5 for a in AGENTS},
            **{f"{a}/mean_response_tokens": 10 + step for a in AGENTS},
        }
        for step in range(4)
    ]
    # The trainer's curves: what it draws from its history at the end of train().
    path = plot_history(history, AGENTS, tmp_path / "training.png")
    assert path == tmp_path / "training.png"
    _assert_png(path)
