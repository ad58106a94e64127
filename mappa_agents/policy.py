"""The policy protocol: a batch of chat prompts in, generations with exact token ids out.

Every backend (:class:`~mappa_agents.hf.HFPolicy`, :class:`~mappa_agents.vllm_policy.
VLLMPolicy`, :class:`~mappa_agents.api.LiteLLMPolicy`) returns :class:`Generation`
records. A trainer trains on ``prompt_ids`` + ``response_ids`` exactly as sampled and
never re-tokenises ``text`` (re-tokenised text is not what the model produced).

A backend whose engine batches requests as they arrive also implements
:class:`RequestPolicy` (one prompt per call, see :func:`batches_requests`).

Which backends give token ids:

- ``HFPolicy`` and ``VLLMPolicy``: always (prompt ids, response ids, logprobs);
- ``LiteLLMPolicy``: only when the server returns them (a vLLM OpenAI server asked for
  token ids); otherwise the ids are empty and :attr:`Generation.trainable` is False.

This module imports neither torch nor any backend.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from mappa_env.text import strip_think

FinishReason = Literal["stop", "length"]
"""``"stop"``: the model ended (EOS token or a stop string); ``"length"``: the
``max_new_tokens`` limit cut it."""

ChatMessages = Sequence[Mapping[str, str]]
"""One prompt: chat messages ``{"role": ..., "content": ...}``, system prompt included."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one generation per prompt.

    Attributes:
        max_new_tokens: Largest number of response tokens (EOS included); reaching it
            without stopping gives ``finish_reason == "length"``.
        temperature: Sampling temperature; 0 means greedy decoding.
        top_p: Nucleus sampling mass; 1.0 turns it off.
        top_k: Sample among the ``top_k`` most likely tokens; 0 turns it off.
        stop: Strings that end the generation. The returned text stops before the
            first one; the ids end with the token that completed it.
        seed: Seed for sampling; ``None`` leaves randomness free. What it seeds
            depends on the backend:

            - ``HFPolicy``: one seed for the whole batch call. The same seed, batch
              (prompts and their order), ``max_batch_size`` and device give the same
              generations, but a prompt's sample depends on the rest of its batch, so
              sending it alone or in another batch usually gives a different one. Identical
              prompts in one batch still get different samples.
            - ``VLLMPolicy`` and ``LiteLLMPolicy``: prompt ``i`` of the batch is sent
              with seed ``seed + i``, so a prompt's sample depends on its position,
              not on the other prompts. vLLM repeats a seeded request with the same
              engine and settings (up to numerical effects of its batching); an API
              only as far as its provider honours seeds (many treat them as best
              effort, some ignore them).

            The same seed gives different samples on different backends, even for
            the same weights.
    """

    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        # Accept a list or a single string for convenience; store a tuple (hashable).
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        """Whether decoding is greedy (temperature 0)."""
        return self.temperature == 0


@dataclass
class Generation:
    """One sampled response to one prompt.

    Attributes:
        text: The answer text an environment should parse: the decoded response
            without special tokens, cut before a stop string, with any reasoning block
            (``<think>...</think>``) moved to ``reasoning``.
        reasoning: The inside of the reasoning block of a thinking model, or ``None``
            when the response had none.
        prompt_ids: The exact ids fed to the model (chat template applied, no padding).
        response_ids: The exact sampled ids, ending with the EOS token when the model
            stopped on one, or with the token that completed a stop string. Reasoning
            tokens stay in here: training sees the whole response.
        logprobs: For each id of ``response_ids``, its log-probability under the
            model's own next-token distribution: log-softmax of the raw logits, that is
            temperature 1 with no top-k/top-p truncation, whatever temperature was
            used to sample. This is what a trainer recomputes with a plain forward
            pass (and equals the sampling distribution in MAPPA's temperature-1
            rollouts). Empty when the backend did not report them.
        finish_reason: ``"stop"`` (EOS or stop string) or ``"length"`` (cut by
            ``max_new_tokens``; trainers mask these out).
        usage: Token counts reported by an API (``prompt_tokens``,
            ``completion_tokens``); ``None`` for local backends, whose ids are exact.
        cost_usd: Price of the call when the API backend knows it, else ``None``.
        info: Backend details worth keeping (model name, latency, raw finish reason).
    """

    text: str
    reasoning: str | None = None
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason = "stop"
    usage: dict[str, int] | None = None
    cost_usd: float | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt length: ``len(prompt_ids)``, or the API's count when ids are absent."""
        if self.prompt_ids or not self.usage:
            return len(self.prompt_ids)
        return int(self.usage.get("prompt_tokens", 0))

    @property
    def num_response_tokens(self) -> int:
        """Response length: ``len(response_ids)``, or the API's count when ids are absent."""
        if self.response_ids or not self.usage:
            return len(self.response_ids)
        return int(self.usage.get("completion_tokens", 0))

    @property
    def trainable(self) -> bool:
        """Whether exact prompt ids, response ids and one logprob per response id exist."""
        return (
            bool(self.prompt_ids)
            and bool(self.response_ids)
            and len(self.logprobs) == len(self.response_ids)
        )

    @property
    def truncated(self) -> bool:
        """Whether the length limit cut the response."""
        return self.finish_reason == "length"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of all fields plus the token counts and ``trainable``."""
        data = dataclasses.asdict(self)
        data["num_prompt_tokens"] = self.num_prompt_tokens
        data["num_response_tokens"] = self.num_response_tokens
        data["trainable"] = self.trainable
        return data


class GenerationError(RuntimeError):
    """Some prompts of a batch got no generation; the others are kept.

    Attributes:
        generations: One entry per prompt: the generation, or ``None`` where it failed.
        errors: One entry per prompt: the exception, or ``None`` where it worked.
    """

    def __init__(
        self, generations: list[Generation | None], errors: list[BaseException | None]
    ) -> None:
        failed = [e for e in errors if e is not None]
        first = failed[0] if failed else None
        super().__init__(
            f"{len(failed)} of {len(errors)} generations failed; first error: "
            f"{type(first).__name__}: {first}"
        )
        self.generations = generations
        self.errors = errors


@runtime_checkable
class Policy(Protocol):
    """Turns a batch of chat prompts into one :class:`Generation` each.

    Attributes:
        name: A label for logs and results (usually the model name).
    """

    name: str

    def generate(self, batch: Sequence[ChatMessages], params: SamplingParams) -> list[Generation]:
        """Generate one response per prompt, in the order of ``batch``.

        Args:
            batch: Prompts, each a sequence of chat messages.
            params: Sampling settings shared by the batch.

        Returns:
            One generation per prompt.
        """
        ...

    async def agenerate(
        self, batch: Sequence[ChatMessages], params: SamplingParams
    ) -> list[Generation]:
        """Async :meth:`generate` (local backends run it in a worker thread)."""
        ...

    def close(self) -> None:
        """Release the model, threads and connections."""
        ...


@runtime_checkable
class RequestPolicy(Policy, Protocol):
    """A :class:`Policy` whose engine batches requests continuously, as they arrive.

    Such an engine (vLLM's async engine, an inference server, the stand-in
    :class:`~mappa_agents.standin.StandInEngine`) adds a request to the running batch at
    the next decode step and hands it back as soon as its own reply ends, so one prompt
    per call costs no batching: the runner's ``"episodes"`` schedule sends each turn of
    each episode on its own through :meth:`agenerate_one`. :func:`batches_requests`
    tells such a policy from one that only takes whole batches.

    Attributes:
        continuous_batching: True when :meth:`agenerate_one` joins a continuously
            batching engine (a policy can have the method and still say False, e.g. one
            that falls back to a one-prompt batch).
    """

    continuous_batching: bool

    async def agenerate_one(self, messages: ChatMessages, params: SamplingParams) -> Generation:
        """Generate one response to one prompt, batched by the engine with other requests.

        Args:
            messages: The prompt's chat messages.
            params: Sampling settings of this request.

        Returns:
            The generation.
        """
        ...


def batches_requests(policy: Any) -> bool:
    """Whether ``policy`` serves single requests through a continuously batching engine.

    Args:
        policy: Any policy.

    Returns:
        True when it declares ``continuous_batching`` and has an ``agenerate_one``.
    """
    return bool(getattr(policy, "continuous_batching", False)) and callable(
        getattr(policy, "agenerate_one", None)
    )


async def generate_in_thread(
    policy: Policy, batch: Sequence[ChatMessages], params: SamplingParams
) -> list[Generation]:
    """Run a blocking ``policy.generate`` in a worker thread (an ``agenerate`` helper).

    Args:
        policy: The policy.
        batch: Prompts.
        params: Sampling settings.

    Returns:
        The generations.
    """
    return await asyncio.to_thread(policy.generate, batch, params)


def optional_sampling_fields(params: SamplingParams, index: int) -> dict[str, Any]:
    """The sampling fields a request carries only when set: top-k, stop strings, seed.

    Args:
        params: Sampling settings.
        index: Position of the prompt in its batch: a seeded batch gives prompt ``i``
            the seed ``seed + i``, so identical prompts still get different samples.

    Returns:
        ``top_k`` when above 0, ``stop`` when any, ``seed`` when seeded.
    """
    fields: dict[str, Any] = {}
    if params.top_k > 0:
        fields["top_k"] = params.top_k
    if params.stop:
        fields["stop"] = list(params.stop)
    if params.seed is not None:
        fields["seed"] = params.seed + index
    return fields


def chat_prompt_ids(
    tokenizer: Any,
    messages: ChatMessages,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """The exact ids of a prompt: the chat template with the generation prompt, tokenised.

    Tokenising inside ``apply_chat_template`` keeps the template's own special tokens
    and adds none twice (tokenising the rendered text could add a BOS again).

    Args:
        tokenizer: A Hugging Face tokenizer with a chat template.
        messages: Chat messages.
        chat_template_kwargs: Extra variables for the template, e.g.
            ``{"enable_thinking": False}`` for Qwen3.

    Returns:
        The prompt's token ids.
    """
    encoded = tokenizer.apply_chat_template(
        [dict(m) for m in messages],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        **dict(chat_template_kwargs or {}),
    )
    return list(encoded["input_ids"])


def batch_prompt_ids(
    prompt_ids: Callable[[list[dict[str, str]]], list[int]],
    prompts: Sequence[list[dict[str, str]]],
) -> list[list[int]]:
    """The ids of every prompt of a batch, each distinct prompt rendered and tokenised once.

    A rollout step sends each prompt several times (the samples of a group): the chat
    template and the tokenizer give the same ids every time, so they run once per
    distinct prompt. Every prompt still gets its own list.

    Args:
        prompt_ids: Renders and tokenises one prompt (a policy's ``prompt_ids``).
        prompts: Prompts as :func:`normalize_batch` returns them (plain role and
            content dicts, so two prompts with the same messages are the same prompt).

    Returns:
        One list of ids per prompt, in order.
    """
    known: dict[tuple[tuple[str, str], ...], list[int]] = {}
    out = []
    for messages in prompts:
        key = tuple((m["role"], m["content"]) for m in messages)
        ids = known.get(key)
        if ids is None:
            ids = known[key] = prompt_ids(messages)
        out.append(list(ids))
    return out


def normalize_batch(batch: Sequence[ChatMessages]) -> list[list[dict[str, str]]]:
    """Check a batch of prompts and copy it into plain lists of plain dicts.

    Args:
        batch: Prompts, each a sequence of ``{"role", "content"}`` mappings.

    Returns:
        The prompts as ``list[list[dict]]``.

    Raises:
        TypeError: If ``batch`` is a single prompt (a sequence of messages) or a
            message is not a mapping with string ``role`` and ``content``.
    """
    if isinstance(batch, (str, Mapping)):
        raise TypeError("batch must be a sequence of prompts (each a sequence of messages)")
    prompts = []
    for i, prompt in enumerate(batch):
        if isinstance(prompt, Mapping):
            raise TypeError(
                f"batch[{i}] is a single message; pass a batch of prompts, "
                "e.g. generate([messages], params)"
            )
        messages = []
        for message in prompt:
            if not isinstance(message, Mapping):
                raise TypeError(f"batch[{i}] holds {type(message).__name__}, not a message dict")
            role, content = message.get("role"), message.get("content")
            if not isinstance(role, str) or not isinstance(content, str):
                raise TypeError(f"batch[{i}]: each message needs string 'role' and 'content'")
            messages.append({"role": role, "content": content})
        prompts.append(messages)
    return prompts


_THINK_INSIDE = re.compile(r"<think>(.*?)(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)
_CLOSE_THINK = re.compile(r"</think>", re.IGNORECASE)


def split_reasoning(text: str) -> tuple[str, str | None]:
    """Separate a thinking model's reasoning from its answer.

    Handles ``<think>...</think>`` blocks, an unclosed ``<think>`` (everything after it
    is reasoning), and a lone ``</think>`` (the chat template opened the block in the
    prompt, so everything before it is reasoning). Without reasoning markers the text
    is returned unchanged; with them both parts are stripped of surrounding whitespace.

    Args:
        text: The decoded response.

    Returns:
        ``(answer, reasoning)``; ``reasoning`` is ``None`` when there was none.
    """
    lowered = text.lower()
    if "<think>" in lowered:
        reasoning = "\n".join(part.strip() for part in _THINK_INSIDE.findall(text))
    elif "</think>" in lowered:
        reasoning = _CLOSE_THINK.split(text)[0].strip()
    else:
        return text, None
    return strip_think(text).strip(), reasoning


def find_stop(text: str, stops: Sequence[str]) -> int | None:
    """Position of the earliest occurrence of any stop string in ``text``.

    Args:
        text: Text to search.
        stops: Stop strings.

    Returns:
        The character index where the first stop string starts, or ``None``.
    """
    positions = [pos for pos in (text.find(s) for s in stops) if pos >= 0]
    return min(positions) if positions else None


def normalize_finish_reason(reason: str | None) -> FinishReason:
    """Map a backend's finish reason onto ``"stop"`` or ``"length"``.

    Args:
        reason: E.g. ``"stop"``, ``"eos"``, ``"length"``, ``"max_tokens"``,
            ``"content_filter"`` (anything but a length limit counts as a stop).

    Returns:
        ``"length"`` for length limits, else ``"stop"``.
    """
    if reason in ("length", "max_tokens", "max_output_tokens", "MAX_TOKENS"):
        return "length"
    return "stop"
