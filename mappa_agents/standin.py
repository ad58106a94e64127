"""A stand-in for a continuously batching inference engine: no model, a fixed token latency.

:class:`StandInEngine` behaves, as far as timing goes, like vLLM's async engine serving one
model: a decode tick takes ``token_latency_s`` and gives every active request one token,
whatever the batch size; requests join and leave at tick boundaries; a request's reply
has a length of its own. Its replies are deterministic (the token ids are a pure function
of the prompt, the engine's seed and its weights version) and it counts what a scheduler
is judged by: decode ticks, tokens, the most requests decoded at once, and how many
times each caller waited on it. Tests and benchmarks use it to measure rollout schedules
without a model or an accelerator.

It is a :class:`~mappa_agents.policy.RequestPolicy`: :meth:`StandInEngine.agenerate_one`
sends one request into the running batch. :meth:`StandInEngine.agenerate` serves a whole
batch the way an offline engine call (``vllm.LLM.generate``) does: the call returns when
its longest reply ends, and calls take turns.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mappa_agents.policy import ChatMessages, Generation, SamplingParams, normalize_batch
from mappa_env._async import run_sync

FIRST_REPLY_ID = 256
"""Reply token ids start here (prompt ids are the prompt's UTF-8 bytes, 0-255)."""

ReplyLength = int | tuple[int, int] | Callable[[Sequence[int]], int]
"""A reply's length in tokens: a fixed number, a ``(low, high)`` range (each prompt gets a
length in it, drawn from the prompt's hash), or a function of the prompt ids."""


@dataclass
class _Job:
    """One request in the engine: tokens still to decode, and who waits for them."""

    remaining: int
    done: asyncio.Future[None] = field(repr=False)


class StandInEngine:
    """A model-free policy with continuous batching at a fixed per-token latency.

    Args:
        token_latency_s: Seconds per decode tick (one token for every active request).
        reply_tokens: Each reply's length (see :data:`ReplyLength`), cut at the
            request's ``max_new_tokens`` (then ``finish_reason == "length"``).
        vocab_size: Reply ids are drawn from ``[FIRST_REPLY_ID, vocab_size)``.
        seed: Mixed into every reply, with the weights version.
        name: Label recorded in trajectories.

    Attributes:
        weights_version: Bumped by :meth:`load_weights`; part of every reply's hash, and
            recorded in each generation's ``info``.
        decode_ticks: Decode ticks run so far.
        tokens: Tokens decoded so far (the sum of the batch sizes of all ticks).
        requests: Requests served so far.
        batch_calls: :meth:`agenerate` calls so far (they take turns: each one is a wait
            every caller of the engine sits through).
        waits: Requests of :meth:`agenerate_one` per awaiting asyncio task name: one
            episode's sequential waits when each episode runs in a task of its own.
        most_in_flight: The most requests decoded in one tick.
    """

    continuous_batching = True

    def __init__(
        self,
        *,
        token_latency_s: float = 0.002,
        reply_tokens: ReplyLength = 16,
        vocab_size: int = 1024,
        seed: int = 0,
        name: str = "standin",
    ) -> None:
        if token_latency_s < 0:
            raise ValueError(f"token_latency_s must be >= 0, got {token_latency_s}")
        if vocab_size <= FIRST_REPLY_ID:
            raise ValueError(f"vocab_size must be above {FIRST_REPLY_ID}, got {vocab_size}")
        self.token_latency_s = float(token_latency_s)
        self.reply_tokens = reply_tokens
        self.vocab_size = int(vocab_size)
        self.seed = int(seed)
        self.name = name
        self.weights_version = 0
        self._joining: list[_Job] = []
        self._active = 0
        self._ticker: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self.reset_counters()

    # ------------------------------------------------------------------ counters

    def reset_counters(self) -> None:
        """Zero every counter (e.g. between two measured runs)."""
        self.decode_ticks = 0
        self.tokens = 0
        self.requests = 0
        self.batch_calls = 0
        self.waits: Counter[str] = Counter()
        self.most_in_flight = 0

    @property
    def mean_batch_size(self) -> float:
        """Tokens per decode tick (0.0 before any tick)."""
        return self.tokens / self.decode_ticks if self.decode_ticks else 0.0

    @property
    def sequential_waits(self) -> int:
        """Waits on the engine that followed one another.

        The batch calls (which take turns) plus the longest chain of single requests
        of one task.
        """
        return self.batch_calls + max(self.waits.values(), default=0)

    # ------------------------------------------------------------------ the Policy API

    async def agenerate_one(self, messages: ChatMessages, params: SamplingParams) -> Generation:
        """One request into the running batch; returns when its own reply is decoded.

        Args:
            messages: The prompt's chat messages.
            params: Sampling settings (only ``max_new_tokens`` matters here).

        Returns:
            The generation (token ids, one log-prob each, ``info["weights_version"]``).
        """
        (prompt,) = normalize_batch([messages])
        task = asyncio.current_task()
        self.waits[task.get_name() if task is not None else "?"] += 1
        return await self._serve(prompt, params)

    async def agenerate(
        self, batch: Sequence[ChatMessages], params: SamplingParams
    ) -> list[Generation]:
        """A whole batch as one blocking engine call: it ends with its longest reply.

        Calls take turns (as ``vllm.LLM.generate`` calls do under their lock), so a call
        waits for the one before it.
        """
        prompts = normalize_batch(batch)
        async with self._batch_lock():
            self.batch_calls += 1
            return list(await asyncio.gather(*(self._serve(p, params) for p in prompts)))

    def generate(self, batch: Sequence[ChatMessages], params: SamplingParams) -> list[Generation]:
        """Synchronous :meth:`agenerate`."""
        return run_sync(self.agenerate(batch, params))

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Take "new weights": the replies change from now on (the version is bumped).

        Raises:
            RuntimeError: If requests are being decoded: their replies would mix two
                versions of the weights, which no on-policy step may do.
        """
        in_flight = self._active + len(self._joining)
        if in_flight:
            raise RuntimeError(
                f"new weights while {in_flight} requests are decoding: the replies would "
                "mix two policies; load weights between rollout steps"
            )
        for _ in weights:  # consumed, as a real engine does
            pass
        self.weights_version += 1

    def close(self) -> None:
        """Nothing to release."""

    # ------------------------------------------------------------------ internals

    def prompt_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """A prompt's ids: the UTF-8 bytes of its messages, ``role\\ncontent\\n`` each."""
        text = "".join(f"{m['role']}\n{m['content']}\n" for m in messages)
        return list(text.encode())

    def reply(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Generation:
        """The deterministic reply to ``prompt_ids`` (no waiting, no counting)."""
        digest = hashlib.blake2b(
            f"{self.seed}:{self.weights_version}:".encode() + bytes(prompt_ids), digest_size=8
        ).digest()
        rng = random.Random(int.from_bytes(digest, "little"))
        wanted = max(1, self._length(prompt_ids, rng))
        count = min(wanted, max_new_tokens)
        ids = [rng.randrange(FIRST_REPLY_ID, self.vocab_size) for _ in range(count)]
        return Generation(
            text=" ".join(f"w{t}" for t in ids),
            prompt_ids=list(prompt_ids),
            response_ids=ids,
            logprobs=[-rng.expovariate(1.0) for _ in ids],
            finish_reason="length" if wanted > max_new_tokens else "stop",
            info={"model": self.name, "weights_version": self.weights_version},
        )

    def _length(self, prompt_ids: Sequence[int], rng: random.Random) -> int:
        spec = self.reply_tokens
        if callable(spec):
            return int(spec(prompt_ids))
        if isinstance(spec, tuple):
            low, high = spec
            return rng.randint(int(low), int(high))
        return int(spec)

    async def _serve(self, prompt: list[dict[str, str]], params: SamplingParams) -> Generation:
        """Decode one request in the shared batch and return its reply."""
        generation = self.reply(self.prompt_ids(prompt), params.max_new_tokens)
        self.requests += 1
        job = _Job(len(generation.response_ids), asyncio.get_running_loop().create_future())
        self._joining.append(job)
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.create_task(self._decode(), name=f"{self.name}-decode")
        try:
            await job.done
        finally:
            job.done.cancel()  # a caller that gave up leaves the batch at the next tick
        return generation

    async def _decode(self) -> None:
        """Decode ticks while any request is active; requests join at tick boundaries.

        Tick ``k`` of a busy spell ends ``k * token_latency_s`` after the spell began, as
        an engine in its own process would keep time.
        """
        active: list[_Job] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        try:
            while True:
                active += self._joining
                self._joining = []
                # Requests of a finished loop (an earlier run) or whose caller left.
                active = [j for j in active if not j.done.done() and j.done.get_loop() is loop]
                self._active = len(active)
                if not active:
                    return
                # Ticks keep to the engine's own clock: an event loop busy with other
                # work (environment steps) delays when a tick is seen, not how many run.
                deadline += self.token_latency_s
                await asyncio.sleep(max(0.0, deadline - loop.time()))
                self.decode_ticks += 1
                self.tokens += len(active)
                self.most_in_flight = max(self.most_in_flight, len(active))
                for job in active:
                    job.remaining -= 1
                    if job.remaining <= 0 and not job.done.done():
                        job.done.set_result(None)
        finally:
            self._active = 0
            for job in active:
                job.done.cancel()

    def _batch_lock(self) -> asyncio.Lock:
        """The lock batch calls take turns on, one per event loop (runs may use new loops)."""
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock
