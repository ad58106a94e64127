"""The progress line moves with every action, not only when an episode ends.

With every episode in flight (eight at eight concurrency), a bar over episodes stood at
0/8 until the first one ended; a bar over actions moves at the first action.
"""

from __future__ import annotations

from typing import ClassVar

import pytest

import mappa_env
from mappa_agents.runner import RolloutRunner, most_actions
from mappa_agents.scripted import ScriptedPolicy
from mappa_agents.system import AgentSystem
from tests.fakes import InProcessSandbox
from tests.test_runner import AGENTS, TASKS, solver_script

tqdm_auto = pytest.importorskip("tqdm.auto")


class RecordingBar:
    """Stands in for tqdm: keeps what the runner told it."""

    made: ClassVar[list[RecordingBar]] = []

    def __init__(self, total=None, **kwargs):
        self.total = total
        self.n = 0
        self.kwargs = kwargs
        self.totals: list[int] = []
        self.postfix: dict[str, str] = {}
        self.closed = False
        RecordingBar.made.append(self)

    def update(self, k=1):
        self.n += k

    def set_postfix(self, postfix, refresh=True):
        self.postfix = dict(postfix)

    def refresh(self):
        self.totals.append(self.total)

    def close(self):
        self.closed = True


def make_env():
    return mappa_env.make("MathChat-v0", tasks=TASKS, sandbox=InProcessSandbox, coach="rules")


@pytest.mark.parametrize("schedule", ["ticks", "continuous"])
def test_the_bar_counts_actions_before_the_first_episode_ends(monkeypatch, schedule):
    RecordingBar.made = []
    monkeypatch.setattr(tqdm_auto, "tqdm", RecordingBar)
    seen_at_first_end: list[int] = []

    def on_episode(episode):
        (bar,) = RecordingBar.made
        seen_at_first_end.append(bar.n)

    system = AgentSystem.shared(ScriptedPolicy(solver_script), AGENTS)
    runner = RolloutRunner(
        make_env, system, concurrency=6, seed=0, schedule=schedule, on_episode=on_episode
    )
    episodes = runner.run(6)

    (bar,) = RecordingBar.made
    actions = sum(len(e.actions) for e in episodes)
    probe = make_env()
    try:
        bound = most_actions(probe)
    finally:
        probe.close()
    assert bar.kwargs["unit"] == "action"
    # Known from the start: every episode's most actions (the environment's turn limits).
    assert bar.totals[0] == 6 * bound
    # All six were in flight: the bar had moved by the time the first of them ended.
    assert seen_at_first_end[0] >= len(episodes[0].actions) > 0
    # Each ended episode gave back the turns it did not use: the count is exact at the end.
    assert bar.n == bar.total == actions
    assert bar.postfix["episodes"] == "6/6"
    assert bar.closed


def test_no_bar_when_progress_is_off(monkeypatch):
    RecordingBar.made = []
    monkeypatch.setattr(tqdm_auto, "tqdm", RecordingBar)
    system = AgentSystem.shared(ScriptedPolicy(solver_script), AGENTS)
    RolloutRunner(make_env, system, concurrency=2, progress=False).run(2)
    assert RecordingBar.made == []
