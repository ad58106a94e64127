"""``GraphDecoder``: its own decode loop gives what ``generate`` gives (eagerly on the CPU,
replaying recorded CUDA graphs on a GPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from mappa_agents.graph_decode import GraphDecoder  # noqa: E402
from mappa_agents.hf import HFPolicy  # noqa: E402
from mappa_agents.tiny_models import tiny_model_and_tokenizer  # noqa: E402

CHATS = [[{"role": "user", "content": "count the shells " * n}] for n in (1, 6, 3)]


def padded(policy: HFPolicy, chats=CHATS):
    prompts = [policy.prompt_ids(chat) for chat in chats]
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), policy.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


@pytest.fixture
def tiny_policy():
    """A plain policy over a tiny model, and ``CHATS`` left-padded for it."""
    model, tokenizer = tiny_model_and_tokenizer()
    policy = HFPolicy(model, tokenizer)
    return (policy, *padded(policy))


def greedy(scores):
    return scores.argmax(-1)


def decode(decoder, policy, ids, mask, new=16, cache_length=512, **kwargs):
    return decoder.decode(
        ids.to(decoder.device),
        mask.to(decoder.device),
        max_new_tokens=new,
        cache_length=cache_length,
        pick=kwargs.pop("pick", greedy),
        eos_token_ids=policy.eos_token_ids,
        pad_token_id=policy.pad_token_id,
        **kwargs,
    )


def waiting_on_the_host(forward):
    """``forward``, then a wait for its logits on the host: a capture of it fails."""

    def waits(*args, **kwargs):
        output = forward(*args, **kwargs)
        output.logits.sum().item()  # not allowed while a CUDA graph is being captured
        return output

    return waits


def teacher_forced(policy, prompt_ids, mask, ids):
    """Per row: the response up to its first EOS, and the model's log-probs over it."""
    rows = []
    for row in range(len(ids)):
        prompt = prompt_ids[row][mask[row].bool()]
        response = ids[row]
        end = len(response)
        for position, token in enumerate(response.tolist()):
            if token in policy.eos_token_ids:
                end = position + 1
                break
        sequence = torch.cat([prompt, response[:end]])[None]
        with torch.no_grad():
            logits = policy.model(sequence).logits[0, len(prompt) - 1 : -1].float()
        rows.append((response[:end], torch.log_softmax(logits, -1)))
    return rows


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
def test_greedy_ids_are_the_models_argmax_with_its_logprobs(architecture):
    # Another decoding path sums in another order: a random tiny model's near-ties may
    # go either way, so each id is checked against the model's own scores, not against
    # generate's ids.
    model, tokenizer = tiny_model_and_tokenizer(architecture=architecture)
    policy = HFPolicy(model, tokenizer)
    prompt_ids, mask = padded(policy)
    ids, logprobs, _ = decode(GraphDecoder(policy.model), policy, prompt_ids, mask)
    assert ids.shape == (3, 16)
    for row, (response, forced) in enumerate(teacher_forced(policy, prompt_ids, mask, ids)):
        chosen = forced.gather(1, response[:, None])[:, 0]
        assert (chosen >= forced.max(-1).values - 1e-4).all()  # an argmax at every step
        assert logprobs[row, : len(response)].tolist() == pytest.approx(chosen.tolist(), abs=1e-4)


def test_logprobs_are_the_models_under_teacher_forcing_also_when_sampling():
    model, tokenizer = tiny_model_and_tokenizer()
    policy = HFPolicy(model, tokenizer)
    prompt_ids, mask = padded(policy)

    def sample(scores):
        scores[:, 0] = float("-inf")  # a pick may change its scores: logprobs stay raw
        return torch.multinomial(torch.softmax(scores / 0.7, dim=-1), 1)[:, 0]

    torch.manual_seed(3)
    ids, logprobs, _ = decode(GraphDecoder(policy.model), policy, prompt_ids, mask, pick=sample)
    for row, (response, forced) in enumerate(teacher_forced(policy, prompt_ids, mask, ids)):
        chosen = forced.gather(1, response[:, None])[:, 0]
        assert logprobs[row, : len(response)].tolist() == pytest.approx(chosen.tolist(), abs=1e-4)


def test_rows_ended_before_the_start_give_padding_and_a_shape_is_kept(tiny_policy):
    policy, ids, mask = tiny_policy
    decoder = GraphDecoder(policy.model)
    alone, _, _ = decode(decoder, policy, ids, mask)
    ended = torch.tensor([False, True, False])
    with_filler, _, lengths = decode(decoder, policy, ids, mask, ended=ended)
    assert with_filler[1].tolist() == [policy.pad_token_id] * with_filler.shape[1]
    assert with_filler[0].tolist() == alone[0, : with_filler.shape[1]].tolist()
    assert lengths[1] == 0
    assert decoder.shapes == [(3, 512)]  # the second call reused the first call's cache


def test_only_live_rows_are_picked_so_filler_rows_draw_no_random_numbers(tiny_policy):
    policy, ids, mask = tiny_policy
    seen = []

    def sample(scores):
        seen.append(scores.shape[0])
        return torch.multinomial(torch.softmax(scores, dim=-1), 1)[:, 0]

    decoder = GraphDecoder(policy.model)
    torch.manual_seed(0)
    alone, _, _ = decode(decoder, policy, ids[[0, 2]], mask[[0, 2]], pick=sample)
    assert set(seen) == {2}
    torch.manual_seed(0)
    ended = torch.tensor([False, True, False])
    with_filler, _, _ = decode(decoder, policy, ids, mask, pick=sample, ended=ended)
    assert set(seen) == {2}  # the filler row was never offered to the pick
    assert with_filler[[0, 2]].tolist() == alone.tolist()  # so the draws are the same


def test_decoding_stops_once_every_row_has_ended():
    model, tokenizer = tiny_model_and_tokenizer()
    policy = HFPolicy(model, tokenizer)
    eos = policy.eos_token_ids[0]
    ids, _, lengths = decode(
        GraphDecoder(policy.model), policy, *padded(policy), new=64,
        pick=lambda scores: torch.full(scores.shape[:1], eos),
    )  # fmt: skip
    assert ids.shape[1] < 64  # stopped at the first check after every row ended
    assert (ids[:, 0] == eos).all()
    assert lengths == [1, 1, 1]  # the padding after the end is no part of a row


def test_a_stop_callback_ends_its_row():
    model, tokenizer = tiny_model_and_tokenizer()
    policy = HFPolicy(model, tokenizer)
    seen = []

    def stopped(generated):
        seen.append(generated.shape[1])
        return (
            torch.tensor([True, False, False])
            if generated.shape[1] == 2
            else torch.zeros(3, dtype=torch.bool)
        )

    ids, _, lengths = decode(GraphDecoder(policy.model), policy, *padded(policy), stopped=stopped)
    assert seen[:3] == [1, 2, 3]
    assert (ids[0, 2:] == policy.pad_token_id).all()
    assert lengths[0] == 2  # the id that completed the stop ends the row
    assert lengths[1:] == [16, 16]  # never ended: every step taken


def test_bad_arguments_are_clear_errors(tiny_policy):
    policy, ids, mask = tiny_policy
    decoder = GraphDecoder(policy.model)
    with pytest.raises(ValueError, match="cannot hold"):
        decoder.decode(
            ids, mask, max_new_tokens=600, cache_length=512, pick=greedy,
            eos_token_ids=policy.eos_token_ids, pad_token_id=0,
        )  # fmt: skip
    with pytest.raises(ValueError, match="CUDA"):
        GraphDecoder(policy.model, use_graphs=True)
    policy.model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        GraphDecoder(policy.model)


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"_attn_implementation": "sdpa", "layer_types": ["full_attention"] * 2}, None),
        ({"_attn_implementation": "eager"}, None),
        ({"_attn_implementation": "flash_attention_2"}, "attn_implementation='sdpa'"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "1 sliding_attention"),
        ({"layer_types": ["chunked_attention"]}, "chunked_attention"),
        ({"sliding_window": 4096}, "sliding_attention"),  # a window without layer types
        ({"sliding_window": 4096, "use_sliding_window": False}, None),
    ],
)
def test_models_one_full_attention_mask_cannot_stand_for_are_named(config, says):
    from types import SimpleNamespace

    from mappa_agents.graph_decode import unsupported_reason

    reason = unsupported_reason(SimpleNamespace(config=SimpleNamespace(**config)))
    if says is None:
        assert reason is None
    else:
        assert says in reason


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_replayed_graphs_give_the_eager_steps_ids_and_see_weight_changes():
    model, tokenizer = tiny_model_and_tokenizer()
    policy = HFPolicy(model.to("cuda"), tokenizer)
    ids, mask = padded(policy)
    eager = GraphDecoder(policy.model, use_graphs=False)
    graphs = GraphDecoder(policy.model)
    assert graphs.use_graphs
    expected, expected_logprobs, _ = decode(eager, policy, ids, mask)
    for _ in range(2):  # recorded on the first call, replayed on both
        got, logprobs, _ = decode(graphs, policy, ids, mask)
        assert got.tolist() == expected.tolist()
        assert torch.allclose(logprobs, expected_logprobs, atol=1e-3)
    assert graphs.recorded_s > 0
    assert graphs.recordings == 1
    assert graphs.fallbacks == {}
    with torch.no_grad():  # an optimizer step changes weights in place
        policy.model.lm_head.weight.mul_(-1)
    assert (
        decode(graphs, policy, ids, mask)[0].tolist()
        == decode(eager, policy, ids, mask)[0].tolist()
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_step_that_cannot_be_recorded_is_decoded_eagerly_and_said(caplog):
    model, tokenizer = tiny_model_and_tokenizer()
    policy = HFPolicy(model.to("cuda"), tokenizer)
    ids, mask = padded(policy)
    expected, _, _ = decode(GraphDecoder(policy.model, use_graphs=False), policy, ids, mask)
    forward = policy.model.forward
    policy.model.forward = waiting_on_the_host(forward)
    decoder = GraphDecoder(policy.model)
    with caplog.at_level("WARNING", logger="mappa_agents.graph_decode"):
        got, _, _ = decode(decoder, policy, ids, mask)
    assert got.tolist() == expected.tolist()
    assert list(decoder.fallbacks) == [(3, 512)]
    assert "capture failed" in decoder.fallbacks[3, 512]
    assert "eagerly" in caplog.text
    # Sampling still works in this process after the failed capture.
    torch.multinomial(torch.ones(2, 4, device="cuda"), 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_shape_recorded_after_every_earlier_graph_was_let_go_gets_a_graph_too():
    # torch frees a graph pool with its last graph; capturing into the freed pool's
    # handle failed an allocator assert on one H100 and left the shape eager.
    model, tokenizer = tiny_model_and_tokenizer()
    policy = HFPolicy(model.to("cuda"), tokenizer)
    ids, mask = padded(policy)
    expected, _, _ = decode(GraphDecoder(policy.model, use_graphs=False), policy, ids, mask)
    decoder = GraphDecoder(policy.model, max_cache_bytes=1)  # one shape at a time
    for length in (512, 1024, 512):
        got, _, _ = decode(decoder, policy, ids, mask, cache_length=length)
        assert decoder.shapes == [(3, length)]
        assert got.tolist() == expected.tolist()
    assert decoder.fallbacks == {}
    assert decoder.recordings == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_decoder_samples_on_while_another_thread_records_a_shape():
    # A capture freezes the device's random generator: a draw meanwhile would fail.
    import threading

    model, tokenizer = tiny_model_and_tokenizer()
    policy = HFPolicy(model.to("cuda"), tokenizer)
    ids, mask = padded(policy)
    sampling = GraphDecoder(policy.model)
    decode(sampling, policy, ids, mask)  # its shape recorded before the race
    other_model, _ = tiny_model_and_tokenizer()
    recording = GraphDecoder(other_model.to("cuda"))
    stop, errors = threading.Event(), []

    def sample():
        def draw(scores):
            return torch.multinomial(torch.softmax(scores, -1), 1)[:, 0]

        try:
            while not stop.is_set():
                decode(sampling, policy, ids, mask, new=4, pick=draw)
        except RuntimeError as error:
            errors.append(error)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    for length in (512, 1024, 2048):  # three recordings while the other thread samples
        decode(recording, policy, ids, mask, new=4, cache_length=length)
    stop.set()
    thread.join(60)
    assert errors == []
    assert recording.fallbacks == {}
    assert recording.recordings == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graphs_recorded_before_a_failed_capture_replay_on_the_default_stream():
    model, tokenizer = tiny_model_and_tokenizer()
    policy = HFPolicy(model.to("cuda"), tokenizer)
    ids, mask = padded(policy)
    expected, _, _ = decode(GraphDecoder(policy.model, use_graphs=False), policy, ids, mask)
    decoder = GraphDecoder(policy.model)
    decode(decoder, policy, ids, mask)  # (3, 512) recorded
    forward = policy.model.forward
    policy.model.forward = waiting_on_the_host(forward)
    decode(decoder, policy, ids, mask, cache_length=1024)
    assert list(decoder.fallbacks) == [(3, 1024)]
    # The failed capture's stream is not left current for this thread's later work.
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    policy.model.forward = forward
    again, _, _ = decode(decoder, policy, ids, mask)  # (3, 512) replayed
    assert again.tolist() == expected.tolist()
    torch.multinomial(torch.ones(2, 4, device="cuda"), 1)


def test_a_float64_model_decodes_with_its_own_mask_dtype(tiny_policy):
    policy, ids, mask = tiny_policy
    policy.model.double()
    got, logprobs, _ = decode(GraphDecoder(policy.model), policy, ids, mask, new=4)
    assert got.shape == (3, 4)
    assert torch.isfinite(logprobs).all()


def test_shapes_used_longest_ago_are_let_go_beyond_the_cache_budget(tiny_policy):
    policy, ids, mask = tiny_policy
    sizing = GraphDecoder(policy.model)
    first, _, _ = decode(sizing, policy, ids, mask)
    one = sizing.cache_bytes  # (3, 512): 1,536 positions
    assert one > 0
    decoder = GraphDecoder(policy.model, max_cache_bytes=2 * one)

    def run(rows, length):
        decode(decoder, policy, ids[:rows], mask[:rows], new=4, cache_length=length)

    run(3, 512)
    run(2, 512)  # two thirds of one more: both fit
    assert decoder.shapes == [(2, 512), (3, 512)]
    run(3, 1024)  # twice the first alone: both earlier shapes go
    assert decoder.shapes == [(3, 1024)]
    assert decoder.cache_bytes == 2 * one
    again, _, _ = decode(decoder, policy, ids, mask)  # (3, 512) comes back
    assert decoder.shapes == [(3, 512)]
    assert again.tolist() == first.tolist()


def test_a_model_left_in_training_mode_decodes_in_eval_mode_and_is_given_back_so(tiny_policy):
    policy, ids, mask = tiny_policy
    decoder = GraphDecoder(policy.model)
    expected, _, _ = decode(decoder, policy, ids, mask)
    modes = []
    forward = policy.model.forward

    def noting_the_mode(*args, **kwargs):
        modes.append(policy.model.training)
        return forward(*args, **kwargs)

    policy.model.forward = noting_the_mode
    policy.model.train()
    got, _, _ = decode(decoder, policy, ids, mask)
    assert set(modes) == {False}
    assert policy.model.training
    assert got.tolist() == expected.tolist()
