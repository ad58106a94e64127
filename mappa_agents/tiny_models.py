"""Tiny random causal LMs with a real tokenizer and chat template, built in-process.

For tests and smoke runs (of this project, and of your own environments and
algorithms) that need a model without downloading one: a byte-level BPE tokenizer
trained in well under a second on a fixed corpus (plus any text you add, so your
prompts tokenise compactly), and a 2-layer Llama- or Qwen3-shaped model with random
weights (seeded, so every run sees the same model). Needs the ``agents`` extra.

Example:
    >>> model, tokenizer = tiny_model_and_tokenizer()
    >>> path = tiny_model_dir(tmp_path)  # an HF directory ``from_pretrained`` loads
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

Architecture = Literal["llama", "qwen3"]

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|end|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, *ROLE_TOKENS)
# Reasoning markers are ordinary added tokens (as in Qwen3): decoding keeps them.
THINK_TOKENS = ("<think>", "</think>")

# One turn per message, the assistant turn left open when a reply is wanted.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)

_WORD_LINES = (
    "the problem solver writes a step by step solution and the verifier checks the final",
    "answer boxed value code executor runs python print result error traceback data",
    "engineer modeler analyst train test submission csv model accuracy score sum product",
    "integer prime number divide multiply add subtract equation solve find let we have",
    "therefore thus so because if then else for while def return import numpy pandas",
)
_WORDS = [word for line in _WORD_LINES for word in line.split()]


def _training_corpus() -> list[str]:
    """A few hundred varied lines: words, numbers, code, punctuation, unicode."""
    lines = []
    for i in range(300):
        words = [_WORDS[(i * 7 + j * 13) % len(_WORDS)] for j in range(4 + i % 9)]
        lines.append(" ".join(words) + f" {i * 37 % 1000} = {i % 17}.")
    lines += [
        "```python\nprint(2 + 3)\n```",
        "\\boxed{42} is the answer.",
        "def f(x):\n    return x ** 2\n",
        "Ünïcödé façade naïve — ok ✓",
        "<think>let me think</think> The answer is 5.",
    ]
    return lines


@functools.lru_cache(maxsize=8)
def _tokenizer_json(vocab_size: int, extra_corpus: tuple[str, ...] = ()) -> str:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([*_training_corpus(), *extra_corpus], trainer=trainer)
    return tokenizer.to_str()


def build_tiny_tokenizer(
    vocab_size: int = 512, extra_corpus: Sequence[str] = ()
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with pad/eos tokens, role tokens and a chat template.

    Args:
        vocab_size: Target vocabulary size of the BPE training (special and
            reasoning tokens come on top).
        extra_corpus: More training text, e.g. an environment's prompts, so that they
            take few tokens.

    Returns:
        A fresh tokenizer (training is cached, the wrapper is new on every call).
    """
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json(vocab_size, tuple(extra_corpus))),
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        additional_special_tokens=list(ROLE_TOKENS),
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_tokens(list(THINK_TOKENS))
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    architecture: Architecture = "llama",
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    initializer_range: float = 0.2,
    max_positions: int = 1024,
    tie_embeddings: bool = False,
) -> PreTrainedModel:
    """A random causal LM sized for ``tokenizer``, in float32 and eval mode.

    Args:
        tokenizer: The tokenizer whose vocabulary and special ids the model uses.
        architecture: ``"llama"`` or ``"qwen3"``.
        seed: Seed of the weight initialisation (the global RNG is left untouched).
        hidden_size: Width of the model (4 heads, 2 key/value heads).
        num_layers: Number of transformer layers.
        initializer_range: Standard deviation of the random weights; larger than the
            usual 0.02 so that next-token distributions are peaked and greedy decoding
            has no near-ties that float noise could flip.
        max_positions: Longest sequence (prompt and response) the model takes.
        tie_embeddings: The output head reuses the input embedding (as SmolLM2's does).

    Returns:
        The model.
    """
    common: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": hidden_size * 2,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": max_positions,
        "initializer_range": initializer_range,
        "tie_word_embeddings": tie_embeddings,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": None,
    }
    if architecture == "llama":
        config, model_class = LlamaConfig(**common), LlamaForCausalLM
    elif architecture == "qwen3":
        config = Qwen3Config(**common, head_dim=hidden_size // 4)
        model_class = Qwen3ForCausalLM
    else:
        raise ValueError(f"unknown architecture {architecture!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    return model.eval()


def tiny_model_and_tokenizer(
    *, architecture: Architecture = "llama", seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A tiny random model and its tokenizer, in memory.

    Args:
        architecture: ``"llama"`` or ``"qwen3"``.
        seed: Seed of the weights.

    Returns:
        ``(model, tokenizer)``.
    """
    tokenizer = build_tiny_tokenizer()
    return build_tiny_model(tokenizer, architecture=architecture, seed=seed), tokenizer


def tiny_model_dir(directory: Path, *, architecture: Architecture = "llama", seed: int = 0) -> Path:
    """Save a tiny random model and its tokenizer as an HF directory.

    Args:
        directory: Where to write (created if missing), e.g. pytest's ``tmp_path``.
        architecture: ``"llama"`` or ``"qwen3"``.
        seed: Seed of the weights.

    Returns:
        ``directory``, loadable with ``AutoModelForCausalLM.from_pretrained`` and
        ``AutoTokenizer.from_pretrained``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model, tokenizer = tiny_model_and_tokenizer(architecture=architecture, seed=seed)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
