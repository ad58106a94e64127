"""A one-agent pipeline whose coach rewards a learnable behaviour: writing the letter "a".

Used to check that training improves a policy within a bounded number of steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mappa_env.coach.base import CoachRequest
from mappa_env.envs.pipeline import AgentSpec, PipelineEnv, ToolOutcome


def share_of_a(text: str) -> float:
    """Fraction of the characters of ``text`` that are the letter ``a`` (0 when empty)."""
    return text.count("a") / len(text) if text else 0.0


def letter_rubric(request: CoachRequest) -> tuple[float, str]:
    share = share_of_a(request.action)
    return 10.0 * share, f"{share:.0%} of the characters are 'a'"


@dataclass(frozen=True)
class ToyTask:
    id: str
    prompt: str
    metadata: Mapping[str, Any] = field(default_factory=dict)


class LetterEnv(PipelineEnv):
    """One agent, one turn: write text; reward = share of the letter 'a'."""

    metadata = {"render_modes": ["ansi"], "name": "letter_v0", "is_parallelizable": False}  # noqa: RUF012
    env_id = "Letter-v0"

    roles = (AgentSpec("writer", "writer", 1),)
    rules_rubric = staticmethod(letter_rubric)

    def __init__(self, task_prefix: str = "toy", **options: Any) -> None:
        self.tasks = [ToyTask(f"{task_prefix}-{i}", f"say something {i}") for i in range(4)]
        self.task = self.tasks[0]
        options.setdefault("coach", "rules")
        super().__init__(**options)

    @property
    def system_description(self) -> str:
        return "One writer."

    def role_description(self, agent: str) -> str:
        return "Write."

    def agent_messages(self, agent: str) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": "Write."},
            {"role": "user", "content": self.task.prompt},
        ]

    async def run_action(self, agent: str, action: str) -> ToolOutcome:
        return ToolOutcome()

    async def episode_outcome(self) -> dict[str, Any]:
        record = self.last_record("writer")
        share = share_of_a(record.action) if record else 0.0
        return {"success": share > 0.5, "reward": share}

    def select_task(self, options: Mapping[str, Any] | None) -> ToyTask:
        wanted = (options or {}).get("task_id")
        self.task = next((t for t in self.tasks if t.id == wanted), self.tasks[0])
        return self.task

    def task_facts(self) -> tuple[str, str, str | None]:
        return self.task.id, self.task.prompt, None


class LetterPairEnv(LetterEnv):
    """Two agents, one turn each, rewarded alike: for what spans agents (whitening)."""

    env_id = "LetterPair-v0"
    roles = (AgentSpec("writer", "writer", 1), AgentSpec("editor", "editor", 1))


def toy_train_config(tmp_path: Any, model_dir: Any, **changes: Any) -> Any:
    """Trainer settings for ``Letter-v0`` with a tiny model: a few seconds a step on CPU.

    Args:
        tmp_path: The test's folder; the run writes under ``tmp_path / "run"``.
        model_dir: The tiny model's directory.
        **changes: Fields that differ from these defaults.
    """
    from mappa_train.config import TrainConfig

    config: dict[str, Any] = dict(
        env="Letter-v0",
        system=str(model_dir),
        steps=14,
        prompts_per_step=4,
        samples_per_prompt=4,
        concurrency=16,
        max_new_tokens=12,
        lr=1e-2,
        kl_coef=0.0,
        mask_truncated=False,  # a random tiny model rarely emits EOS within 12 tokens
        train_batch_size=16,
        micro_batch_size=8,
        warmup_ratio=0.0,
        gradient_checkpointing=False,
        save_every=0,
        tensorboard=False,
        progress=False,
        output_dir=str(tmp_path / "run"),
        seed=1,
    )
    config.update(changes)
    return TrainConfig(**config)
