"""Training curves drawn from a run's metric history (``training.png``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["plot_history"]


def plot_history(
    history: Sequence[Mapping[str, Any]], agents: Sequence[str], path: Path
) -> Path | None:
    """Rewards per agent, tool use, response lengths and success rate, saved to ``path``.

    Returns:
        ``path``, or ``None`` for an empty history (nothing drawn).
    """
    if not history:
        return None
    # Drawn outside pyplot: a notebook user's matplotlib backend stays as it is.
    from mappa_env.plotting import new_figure

    steps = [m["step"] for m in history]
    fig, axes = new_figure(2, 2, figsize=(11, 7), purpose="training plots")
    panels = [
        (axes[0, 0], "mean_reward", "mean action reward"),
        (axes[0, 1], "tool_call_rate", "tool-call rate"),
        (axes[1, 0], "mean_response_tokens", "response tokens"),
    ]
    for ax, key, title in panels:
        for agent in agents:
            ys = [m.get(f"{agent}/{key}") for m in history]
            ax.plot(steps, [math.nan if y is None else y for y in ys], label=agent)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    ax = axes[1, 1]
    rollout = [m.get("rollout/success_rate") for m in history]
    ax.plot(steps, [math.nan if y is None else y for y in rollout], label="rollout")
    evals = [(m["step"], m["eval/success_rate"]) for m in history if "eval/success_rate" in m]
    if evals:
        ax.plot(*zip(*evals), marker="o", label="held-out eval")
    ax.set_title("success rate")
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path
