"""Token log-probabilities of sampled responses, without full-vocabulary float32 logits.

A causal LM's logits for a batch are ``[B, L, V]``: for a 50k vocabulary and long
responses, materialising them in float32 dominates training memory. Here the decoder
runs once, and the output head plus log-softmax run over chunks of response positions
only, each chunk under activation checkpointing (by default), so at most
``chunk_size x V`` float32 logits exist at any time, in the forward and in the backward
pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint


@dataclass
class PackedBatch:
    """Prompt + response rows, right-padded, ready for a forward pass.

    Attributes:
        input_ids: ``[B, L]`` prompt ids followed by response ids, then padding.
        attention_mask: ``[B, L]`` 1 on real tokens.
        response_mask: ``[B, T]`` 1 on response tokens (``T`` = longest response).
        response_ids: ``[B, T]`` response ids (padding 0).
        prompt_lengths: Prompt length of each row.
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    response_ids: Tensor
    prompt_lengths: list[int]

    def to(self, device: Any) -> PackedBatch:
        """The same batch on ``device`` (copied without blocking the host on CUDA)."""
        return PackedBatch(
            move_to(self.input_ids, device),
            move_to(self.attention_mask, device),
            move_to(self.response_mask, device),
            move_to(self.response_ids, device),
            self.prompt_lengths,
        )


def move_to(tensor: Tensor, device: Any) -> Tensor:
    """Copy ``tensor`` to ``device``; to CUDA through pinned memory, without blocking.

    A blocking host-to-device copy waits for the GPU queue, so one between two launches
    stalls the pipeline of kernels.
    """
    if str(device).startswith("cuda"):
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def pack(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int
) -> PackedBatch:
    """Concatenate each prompt with its exact sampled response and right-pad the batch."""
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts for {len(responses)} responses")
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    width = max(lengths)
    resp_width = max(len(r) for r in responses)
    rows = len(prompts)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    response_ids = torch.zeros((rows, resp_width), dtype=torch.long)
    response_mask = torch.zeros((rows, resp_width), dtype=torch.float32)
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        ids = list(prompt) + list(response)
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention[i, : len(ids)] = 1
        if response:
            response_ids[i, : len(response)] = torch.tensor(list(response), dtype=torch.long)
            response_mask[i, : len(response)] = 1.0
    return PackedBatch(input_ids, attention, response_mask, response_ids, [len(p) for p in prompts])


def _chunk_logprobs(
    hidden: Tensor, head_weight: Tensor, head_bias: Tensor | None, targets: Tensor
) -> Tensor:
    logits = torch.nn.functional.linear(hidden, head_weight, head_bias).float()
    # log p(y) = -cross_entropy: one fused log-softmax pass over the vocabulary, where
    # logsumexp plus a gather makes several (this is most of the head's time on a GPU).
    return -torch.nn.functional.cross_entropy(logits, targets, reduction="none")


def response_logprobs(
    model: Any,
    batch: PackedBatch,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    recompute_logits: bool = True,
) -> Tensor:
    """Log-probs of each response token under ``model``: ``[B, T]`` (0 on padding).

    The logit at position ``p`` predicts token ``p + 1``, so a response starting at
    prompt length ``n`` is scored by the hidden states ``n - 1 .. n + T - 2``.

    Args:
        model: A transformers causal LM (with ``get_decoder()`` and an output head).
        batch: Packed prompt + response rows.
        chunk_size: Response positions per output-head chunk.
        temperature: Divide logits by this before the log-softmax (1.0 = the model).
        recompute_logits: With grad enabled, recompute each chunk's logits in the
            backward pass instead of keeping its float32 log-softmax (4 bytes x
            vocabulary per response token) until then.

    Returns:
        ``[B, T]`` float32 log-probs; gradients flow when called with grad enabled.
    """
    decoder = model.get_decoder()
    head = model.get_output_embeddings()
    # No KV cache: nothing generates from this pass, and building one costs memory.
    hidden = decoder(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
    ).last_hidden_state
    rows, resp_width = batch.response_ids.shape
    # Through pinned memory: a plain copy to the GPU would wait for its queue.
    starts = move_to(torch.tensor(batch.prompt_lengths) - 1, hidden.device)
    offsets = torch.arange(resp_width, device=hidden.device)
    index = (starts[:, None] + offsets[None, :]).clamp(max=hidden.shape[1] - 1)
    selected = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))
    flat_hidden = selected.reshape(-1, hidden.shape[-1])
    flat_targets = batch.response_ids.reshape(-1).to(hidden.device)
    weight = head.weight if temperature == 1.0 else head.weight / temperature
    bias = getattr(head, "bias", None)
    if bias is not None and temperature != 1.0:
        bias = bias / temperature
    pieces = []
    for start in range(0, flat_hidden.shape[0], chunk_size):
        h = flat_hidden[start : start + chunk_size]
        y = flat_targets[start : start + chunk_size]
        if torch.is_grad_enabled() and recompute_logits:
            # The chunk draws no random numbers: nothing to replay, and saving and
            # restoring the process's generator here (the default) would reach into what
            # another thread is sampling (a sweep's rollouts beside this update).
            pieces.append(
                checkpoint(
                    _chunk_logprobs, h, weight, bias, y, use_reentrant=False,
                    preserve_rng_state=False,
                )
            )  # fmt: skip
        else:
            pieces.append(_chunk_logprobs(h, weight, bias, y))
    logprobs = torch.cat(pieces).reshape(rows, resp_width)
    # where, not a product: an inf on a padded position would turn into NaN.
    return torch.where(batch.response_mask.to(logprobs.device) > 0, logprobs, 0.0)
