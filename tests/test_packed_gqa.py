"""One-token attention over grouped key/value heads, packed instead of copied."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from mappa_agents import packed_gqa  # noqa: E402
from mappa_agents.graph_decode import GraphDecoder  # noqa: E402
from mappa_agents.hf import HFPolicy  # noqa: E402
from mappa_agents.packed_gqa import (  # noqa: E402
    PACKED_ATTENTION,
    packed_gqa_sdpa,
    use_packed_attention,
    wants_packed_attention,
)
from mappa_agents.tiny_models import tiny_model_and_tokenizer  # noqa: E402


def attention_with_copied_heads(query, key, value, mask, groups):
    """Every key/value head copied ``groups`` times, then softmax attention (float64)."""
    key = key.double().repeat_interleave(groups, dim=1)
    value = value.double().repeat_interleave(groups, dim=1)
    scores = query.double() @ key.transpose(-1, -2) / query.shape[-1] ** 0.5
    if mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    else:
        scores = scores + mask.double()
    return (torch.softmax(scores, -1) @ value).transpose(1, 2)


@pytest.mark.parametrize("boolean_mask", [False, True])
def test_one_token_attention_is_the_attention_over_copied_heads(boolean_mask):
    generator = torch.Generator().manual_seed(0)
    batch, kv_heads, groups, length, dim = 2, 2, 3, 10, 8
    query = torch.randn(batch, kv_heads * groups, 1, dim, generator=generator)
    key = torch.randn(batch, kv_heads, length, dim, generator=generator)
    value = torch.randn(batch, kv_heads, length, dim, generator=generator)
    seen = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    seen[0, ..., :4] = False  # left padding of the first row
    seen[1, ..., 7:] = False  # cache positions not written yet
    mask = seen if boolean_mask else torch.where(seen, 0.0, torch.finfo(torch.float32).min)
    module = SimpleNamespace(num_key_value_groups=groups, is_causal=True)
    output, weights = packed_gqa_sdpa(module, query, key, value, mask)
    assert weights is None
    assert output.shape == (batch, 1, kv_heads * groups, dim)
    expected = attention_with_copied_heads(query, key, value, seen, groups)
    assert torch.allclose(output.double(), expected, atol=1e-6)


def test_other_calls_go_to_transformers_sdpa_unchanged():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    generator = torch.Generator().manual_seed(1)
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True)
    key = torch.randn(1, 2, 5, 4, generator=generator)
    value = torch.randn(1, 2, 5, 4, generator=generator)
    prompt = torch.randn(1, 4, 5, 4, generator=generator)  # five query positions
    per_head = torch.zeros(1, 4, 1, 5)  # a mask per head cannot be shared by a group
    for query, mask in ((prompt, None), (prompt[:, :, :1], per_head)):
        got, _ = packed_gqa_sdpa(module, query, key, value, mask)
        expected, _ = sdpa_attention_forward(module, query, key, value, mask)
        assert torch.equal(got, expected)


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
def test_a_decoder_on_packed_heads_gives_the_models_argmax_and_logprobs(architecture, monkeypatch):
    model, tokenizer = tiny_model_and_tokenizer(architecture=architecture)
    assert model.config.num_attention_heads > model.config.num_key_value_heads
    policy = HFPolicy(model, tokenizer)
    chats = [[{"role": "user", "content": "count the shells " * n}] for n in (1, 6, 3)]
    prompts = [policy.prompt_ids(chat) for chat in chats]
    width = max(map(len, prompts))
    prompt_ids = torch.full((3, width), policy.pad_token_id)
    mask = torch.zeros((3, width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        prompt_ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    packed_calls = []

    def counted(module, query, *args, **kwargs):
        packed_calls.append(query.shape[2])
        return packed_gqa_sdpa(module, query, *args, **kwargs)

    monkeypatch.setattr(packed_gqa, "packed_gqa_sdpa", counted)
    decoder = GraphDecoder(policy.model, pack_heads=True)
    ids, logprobs, _ = decoder.decode(
        prompt_ids, mask, max_new_tokens=12, cache_length=512, pick=lambda s: s.argmax(-1),
        eos_token_ids=policy.eos_token_ids, pad_token_id=policy.pad_token_id,
    )  # fmt: skip
    assert packed_calls
    assert set(packed_calls) == {1}  # the decode steps only
    assert policy.model.config._attn_implementation == "sdpa"
    for row in range(3):
        prompt = prompt_ids[row][mask[row].bool()]
        response = ids[row]
        with torch.no_grad():
            forced = policy.model(torch.cat([prompt, response])[None]).logits[0]
        forced = torch.log_softmax(forced[len(prompt) - 1 : -1].float(), -1)
        end = next(
            (i + 1 for i, t in enumerate(response.tolist()) if t in policy.eos_token_ids),
            len(response),
        )
        chosen = forced[:end].gather(1, response[:end, None])[:, 0]
        assert (chosen >= forced[:end].max(-1).values - 1e-4).all()
        assert logprobs[row, :end].tolist() == pytest.approx(chosen.tolist(), abs=1e-4)


def test_a_padded_prompt_under_the_packed_name_is_masked_as_under_sdpa():
    # transformers builds no mask for an attention name its mask registry lacks: a
    # forward on another thread during a decode step would then attend to padding.
    model, _ = tiny_model_and_tokenizer()
    ids = torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
        with use_packed_attention(model):
            assert model.config._attn_implementation == PACKED_ATTENTION
            got = model(ids, attention_mask=mask).logits
    assert torch.allclose(got, expected, atol=1e-5)
    assert model.config._attn_implementation == "sdpa"


def test_the_attention_name_is_given_back_after_an_error():
    model, _ = tiny_model_and_tokenizer()
    with pytest.raises(RuntimeError, match="mid-step"), use_packed_attention(model):
        raise RuntimeError("mid-step")
    assert model.config._attn_implementation == "sdpa"
    with use_packed_attention(model, enabled=False):
        assert model.config._attn_implementation == "sdpa"


def test_only_grouped_sdpa_models_under_a_transformers_that_copies_heads_are_packed(
    monkeypatch,
):
    def model(implementation="sdpa", heads=4, kv_heads=2):
        config = SimpleNamespace(
            _attn_implementation=implementation,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
        )
        return SimpleNamespace(config=config)

    monkeypatch.setattr(packed_gqa, "transformers_packs_heads", lambda: False)
    assert wants_packed_attention(model())
    assert not wants_packed_attention(model(implementation="eager"))
    assert not wants_packed_attention(model(kv_heads=4))  # one query head per key head
    assert not wants_packed_attention(model(kv_heads=None))
    monkeypatch.setattr(packed_gqa, "transformers_packs_heads", lambda: True)
    assert not wants_packed_attention(model())
    tiny, _ = tiny_model_and_tokenizer()
    assert GraphDecoder(tiny).pack_heads is False
    assert GraphDecoder(tiny, pack_heads=True).pack_heads is True


def test_value_heads_of_another_width_are_attended_as_with_copied_heads():
    generator = torch.Generator().manual_seed(2)
    query = torch.randn(2, 6, 1, 8, generator=generator)
    key = torch.randn(2, 2, 5, 8, generator=generator)
    value = torch.randn(2, 2, 5, 6, generator=generator)
    seen = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    output, _ = packed_gqa_sdpa(module, query, key, value, seen)
    expected = attention_with_copied_heads(query, key, value, seen, 3)
    assert torch.allclose(output.double(), expected, atol=1e-6)


@pytest.mark.parametrize("extra", [{"softcap": 30.0}, {"position_bias": torch.zeros(1, 4, 1, 5)}])
def test_calls_with_a_softcap_or_a_position_bias_go_to_sdpa(extra, monkeypatch):
    from transformers.integrations import sdpa_attention

    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward", lambda *a, **k: ("sdpa", None))
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True)
    query, key = torch.zeros(1, 4, 1, 4), torch.zeros(1, 2, 5, 4)
    assert packed_gqa_sdpa(module, query, key, key, None, **extra)[0] == "sdpa"


def test_blocks_of_models_sharing_one_config_may_overlap_and_sub_configs_keep_theirs():
    from transformers import LlamaConfig, LlavaConfig

    config = LlamaConfig(num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    first, second = SimpleNamespace(config=config), SimpleNamespace(config=config)
    with use_packed_attention(first):
        with use_packed_attention(second):
            assert config._attn_implementation == PACKED_ATTENTION
        assert config._attn_implementation == PACKED_ATTENTION  # the first block goes on
    assert config._attn_implementation == "sdpa"
    outer = use_packed_attention(first)
    inner = use_packed_attention(second)
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)  # ends before the block it let in
    assert config._attn_implementation == PACKED_ATTENTION
    inner.__exit__(None, None, None)
    assert config._attn_implementation == "sdpa"
    composite = LlavaConfig()
    composite._attn_implementation = {"": "sdpa", "vision_config": "eager", "text_config": "sdpa"}
    with use_packed_attention(SimpleNamespace(config=composite)):
        assert composite.vision_config._attn_implementation == "eager"
    assert composite._attn_implementation == "sdpa"
    assert composite.vision_config._attn_implementation == "eager"
    assert composite.text_config._attn_implementation == "sdpa"
