"""A policy that answers with a Python function: for examples, tests and env benchmarks."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mappa_agents.policy import ChatMessages, Generation, SamplingParams, normalize_batch


class ScriptedPolicy:
    """Answers each prompt with ``respond(messages)``; no model, no token ids.

    Useful to run environments end to end without a model (examples, tests, measuring
    environment overhead). Its generations are not trainable (no ids or logprobs).

    Args:
        respond: Maps a prompt's chat messages to the reply text.
        name: Label recorded in trajectories.
    """

    def __init__(
        self, respond: Callable[[list[dict[str, str]]], str], name: str = "scripted"
    ) -> None:
        self.respond = respond
        self.name = name
        self.calls = 0

    def generate(self, batch: Sequence[ChatMessages], params: SamplingParams) -> list[Generation]:
        """One scripted reply per prompt."""
        prompts = normalize_batch(batch)
        self.calls += 1
        return [
            Generation(text=self.respond(p), info={"batch_size": len(prompts)}) for p in prompts
        ]

    async def agenerate(
        self, batch: Sequence[ChatMessages], params: SamplingParams
    ) -> list[Generation]:
        """Same as :meth:`generate` (instant)."""
        return self.generate(batch, params)

    def close(self) -> None:
        """Nothing to release."""
