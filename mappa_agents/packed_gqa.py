"""One-token attention over grouped key/value heads without copying the cache.

A model with grouped-query attention (GQA) has ``g`` query heads per key/value head
(SmolLM2-135M: 9 query heads over 3 key/value heads, ``g = 3``). With an attention mask,
transformers' ``sdpa`` attention before it learned to pack heads (it does in later 5.x
releases) copies every key and value head ``g`` times before calling
``scaled_dot_product_attention`` (``repeat_kv``): in a decode step over a static cache that
copy touches the whole cache, each layer, each step. On one H100 the copies were the
largest share of a SmolLM2-shaped decode step's GPU time (``aten::copy_``, 28%).

For one query token the copy is not needed. Query head ``h`` attends with key/value head
``h // g``; fold the ``g`` query heads of each group into ``g`` query *positions* of one
head::

    q: (batch, heads, 1, d) -> (batch, heads / g, g, d)
    out = softmax(q k^T * scale + mask) v          # k, v: (batch, heads / g, length, d)
    out: (batch, heads / g, g, d) -> (batch, 1, heads, d)

Each folded position is the same query token, so the one mask row applies to all of them
(a mask shared by every head, ``(batch, 1, 1, length)``, broadcasts unchanged). The result
is the same attention, computed by the same kernel family, without the ``g``-fold copy.

:func:`use_packed_attention` switches a model to it for the duration of a ``with`` block
(the decode steps of :class:`mappa_agents.graph_decode.GraphDecoder`); every other call
(prompts, training, a mask per head) goes to transformers' own ``sdpa`` unchanged.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

PACKED_ATTENTION = "mappa_packed_gqa_sdpa"
"""The name this attention is registered under in transformers' attention registries."""


def transformers_packs_heads() -> bool:
    """Whether the installed transformers already packs one-token GQA attention itself."""
    from transformers.integrations import sdpa_attention

    return hasattr(sdpa_attention, "pack_gqa")


def packed_gqa_sdpa(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """Attention as transformers' ``sdpa`` computes it, one-token GQA steps packed (see above).

    Args:
        module: The attention layer (its ``num_key_value_groups`` is ``g``).
        query: ``(batch, heads, q_len, d)``.
        key: ``(batch, heads / g, length, d)``.
        value: ``(batch, heads / g, length, d)``.
        attention_mask: Additive or boolean mask, ``(batch, 1 or heads, q_len, length)``,
            or ``None``.
        dropout: Attention dropout probability.
        scaling: Softmax scale (``1 / sqrt(d)`` when ``None``).
        **kwargs: Passed on to transformers' ``sdpa`` attention where it runs.

    Returns:
        ``(output, None)``, output ``(batch, q_len, heads, d)``, as transformers' attention
        functions return it.
    """
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    packable = (
        query.shape[2] == 1
        and groups > 1
        and query.shape[1] == key.shape[1] * groups
        and (attention_mask is None or attention_mask.shape[1] == 1)
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
    )
    if not packable:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            **kwargs,
        )
    batch, heads, _, dim = query.shape
    value_dim = value.shape[-1]
    if attention_mask is not None:
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]
    output = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(batch, heads // groups, groups, dim),
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=False,
    )
    return output.reshape(batch, heads, 1, value_dim).transpose(1, 2).contiguous(), None


def register_packed_attention() -> None:
    """Register :func:`packed_gqa_sdpa` (and ``sdpa``'s mask) under :data:`PACKED_ATTENTION`.

    The mask is registered too: transformers builds no mask at all for an attention name
    its mask registry lacks, so a forward with a 2-D padding mask under this name would
    otherwise attend to padding.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(PACKED_ATTENTION, packed_gqa_sdpa)
    AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask)


def wants_packed_attention(model: Any) -> bool:
    """Whether one-token steps of ``model`` gain from :func:`packed_gqa_sdpa`.

    True for a model on ``sdpa`` attention with grouped key/value heads, under a
    transformers that does not pack them itself.
    """
    config = getattr(model, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return (
        getattr(config, "_attn_implementation", None) == "sdpa"
        and heads is not None
        and kv_heads is not None
        and heads > kv_heads
        and not transformers_packs_heads()
    )


_SWITCHES_GUARD = threading.Lock()
_SWITCHES: dict[int, tuple[Any, int, Any]] = {}
"""Per config object switched now (by ``id``): the config, the blocks inside, its name before."""


@contextlib.contextmanager
def use_packed_attention(model: Any, enabled: bool = True) -> Iterator[None]:
    """Run ``model``'s attention through :func:`packed_gqa_sdpa` inside the block.

    Only the attention name on the model's own config object changes (read at every
    forward; its sub-configs keep theirs); it is restored when the last block on that
    config object ends, also after an error, so blocks of two models sharing one config
    may overlap. Another thread's forward on a switched model meanwhile gets the same
    results (every call the packing does not apply to goes to ``sdpa``), so the switch
    is safe if not exclusive.

    Args:
        model: A transformers model on ``sdpa`` attention.
        enabled: ``False`` makes the block do nothing (callers decide once).
    """
    if not enabled:
        yield
        return
    register_packed_attention()
    config = model.config
    with _SWITCHES_GUARD:
        _, inside, before = _SWITCHES.get(id(config), (config, 0, None))
        if not inside:
            before = config._attn_implementation_internal
            # The stored name itself: transformers' setter would also rename sub-configs.
            config._attn_implementation_internal = PACKED_ATTENTION
        _SWITCHES[id(config)] = (config, inside + 1, before)
    try:
        yield
    finally:
        with _SWITCHES_GUARD:
            _, inside, before = _SWITCHES[id(config)]
            if inside == 1:
                del _SWITCHES[id(config)]
                config._attn_implementation_internal = before
            else:
                _SWITCHES[id(config)] = (config, inside - 1, before)
