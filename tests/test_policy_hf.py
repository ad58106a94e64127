"""HFPolicy on a tiny random model: exact ids, logprobs, padding, stops, seeding."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from mappa_agents.graph_decode import GraphDecoder  # noqa: E402
from mappa_agents.hf import (  # noqa: E402
    MIN_CACHE_LENGTH,
    HFPolicy,
    decode_attention,
    decode_batch_rows,
    pick_next_ids,
    static_cache_length,
)
from mappa_agents.policy import (  # noqa: E402
    Generation,
    Policy,
    SamplingParams,
    chat_prompt_ids,
    normalize_batch,
    split_reasoning,
)
from mappa_agents.tiny_models import (  # noqa: E402
    CHAT_TEMPLATE,
    build_tiny_model,
    build_tiny_tokenizer,
    tiny_model_and_tokenizer,
    tiny_model_dir,
)

SHORT = [{"role": "user", "content": "What is 2 + 3?"}]
LONG = [
    {"role": "system", "content": "You are the verifier of a three agent chain. " * 4},
    {"role": "user", "content": "Check the product 123456789 * 987654321 and box it."},
]
THIRD = [{"role": "user", "content": "def f(x): return x ** 2"}]


@pytest.fixture(scope="module")
def tiny():
    return tiny_model_and_tokenizer()


@pytest.fixture(scope="module")
def policy(tiny):
    model, tokenizer = tiny
    return HFPolicy(model, tokenizer, max_batch_size=4)


def teacher_forced_logprobs(model, generation: Generation) -> tuple[list[float], list[int]]:
    """Raw-model logprob and argmax of each response token from one plain forward pass."""
    ids = torch.tensor([generation.prompt_ids + generation.response_ids])
    with torch.no_grad():
        logprobs = model(ids).logits[0].float().log_softmax(-1)
    start = len(generation.prompt_ids) - 1
    steps = range(start, start + len(generation.response_ids))
    chosen = [logprobs[s, t].item() for s, t in zip(steps, generation.response_ids)]
    argmax = [int(logprobs[s].argmax()) for s in steps]
    return chosen, argmax


# ---------------------------------------------------------------- ids and logprobs


def test_is_a_policy(policy):
    assert isinstance(policy, Policy)
    assert policy.name


def test_prompt_ids_are_the_chat_template(policy, tiny):
    _, tokenizer = tiny
    generations = policy.generate([LONG, SHORT], SamplingParams(max_new_tokens=4, seed=0))
    for generation, messages in zip(generations, [LONG, SHORT]):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert generation.prompt_ids == tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.pad_token_id not in generation.prompt_ids


def test_chat_template_kwargs_reach_the_template(tiny):
    model, _ = tiny
    tokenizer = build_tiny_tokenizer()
    # Like Qwen3: thinking switched off opens and closes an empty block in the prompt.
    tokenizer.chat_template = CHAT_TEMPLATE + (
        "{%- if add_generation_prompt and enable_thinking is defined and not enable_thinking"
        " -%}<think></think>{%- endif -%}"
    )
    think_ids = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    plain = chat_prompt_ids(tokenizer, SHORT)
    no_thinking = chat_prompt_ids(tokenizer, SHORT, {"enable_thinking": False})
    assert no_thinking == plain + think_ids
    policy = HFPolicy(model, tokenizer, chat_template_kwargs={"enable_thinking": False})
    assert policy.prompt_ids(SHORT) == no_thinking
    assert HFPolicy(model, tokenizer).prompt_ids(SHORT) == plain


def test_ids_decode_back_to_text(policy, tiny):
    _, tokenizer = tiny
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=1)
    generations = policy.generate([SHORT, LONG, THIRD], params)
    assert len(generations) == 3
    for generation in generations:
        decoded = tokenizer.decode(
            generation.response_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        assert generation.reasoning is None
        assert decoded == generation.text
        assert len(generation.logprobs) == len(generation.response_ids) > 0
        assert generation.trainable


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=16, temperature=1.0, seed=2),
        # Temperature and truncation shape sampling, not the reported (raw) logprobs.
        SamplingParams(max_new_tokens=16, temperature=0.5, top_k=8, top_p=0.9, seed=3),
    ],
    ids=["t1", "t0.5-topk-topp"],
)
def test_logprobs_match_teacher_forcing(architecture, params):
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, architecture=architecture, seed=5)
    policy = HFPolicy(model, tokenizer)
    for generation in policy.generate([SHORT, LONG], params):
        expected, _ = teacher_forced_logprobs(model, generation)
        assert generation.logprobs == pytest.approx(expected, abs=1e-4)


def test_greedy_is_argmax_of_the_model_alone(tiny):
    """The model's own generation config (penalties, top-k) must not leak into decoding."""
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=0)
    model.generation_config.repetition_penalty = 5.0
    model.generation_config.top_k = 1
    model.generation_config.temperature = 0.01
    policy = HFPolicy(model, tokenizer)
    (greedy,) = policy.generate([LONG], SamplingParams(max_new_tokens=20, temperature=0))
    _, argmax = teacher_forced_logprobs(model, greedy)
    assert greedy.response_ids == argmax
    # With the model's top_k=1 leaking in, every seed would give the same sample.
    samples = {
        tuple(policy.generate([SHORT], SamplingParams(max_new_tokens=8, seed=s))[0].response_ids)
        for s in range(4)
    }
    assert len(samples) > 1


def test_left_padding_does_not_change_results(policy):
    params = SamplingParams(max_new_tokens=20, temperature=0)
    (alone,) = policy.generate([SHORT], params)
    in_batch = policy.generate([LONG, SHORT, THIRD], params)
    assert in_batch[1].prompt_ids == alone.prompt_ids
    assert in_batch[1].response_ids == alone.response_ids
    assert in_batch[1].logprobs == pytest.approx(alone.logprobs, abs=1e-4)


def test_batches_larger_than_max_batch_size_keep_order(tiny):
    model, tokenizer = tiny
    small_batches = HFPolicy(model, tokenizer, max_batch_size=2)
    one_batch = HFPolicy(model, tokenizer, max_batch_size=16)
    prompts = [LONG, SHORT, THIRD, SHORT, LONG]
    params = SamplingParams(max_new_tokens=8, temperature=0)
    split = small_batches.generate(prompts, params)
    whole = one_batch.generate(prompts, params)
    assert [g.prompt_ids for g in split] == [small_batches.prompt_ids(p) for p in prompts]
    assert [g.response_ids for g in split] == [g.response_ids for g in whole]


# ---------------------------------------------------------------- endings


def test_length_finish_reason(policy):
    generations = policy.generate([SHORT, LONG], SamplingParams(max_new_tokens=5, temperature=0))
    for generation in generations:
        assert generation.finish_reason == "length"
        assert generation.truncated
        assert len(generation.response_ids) == 5


def test_eos_ends_the_response_and_is_kept():
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=0)
    params = SamplingParams(max_new_tokens=12, temperature=0)
    (free,) = HFPolicy(model, tokenizer).generate([LONG], params)
    # Declare the greedy path's fourth token an end-of-sequence token.
    end_token = free.response_ids[3]
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, end_token]
    stopping = HFPolicy(model, tokenizer)
    assert end_token in stopping.eos_token_ids
    generations = stopping.generate([LONG, SHORT], params)
    first_end = free.response_ids.index(end_token) + 1
    assert generations[0].response_ids == free.response_ids[:first_end]
    assert generations[0].finish_reason == "stop"
    assert len(generations[0].logprobs) == first_end
    assert generations[0].logprobs == pytest.approx(free.logprobs[:first_end], abs=1e-4)


def test_finish_generation_cuts_padding_after_eos(policy, tiny):
    _, tokenizer = tiny
    body = tokenizer("the answer is 5", add_special_tokens=False)["input_ids"]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    generated = [*body, eos, pad, pad]
    generation = policy.finish_generation(
        [7, 8], generated, [-0.5] * len(generated), SamplingParams(max_new_tokens=10)
    )
    assert generation.response_ids == [*body, eos]
    assert generation.logprobs == [-0.5] * (len(body) + 1)
    assert generation.text == "the answer is 5"
    assert generation.finish_reason == "stop"


def _clean_window(text: str, width: int = 3) -> str:
    """A short piece of ``text`` from its middle without replacement characters."""
    for start in range(len(text) // 3, len(text) - width):
        piece = text[start : start + width]
        if "\ufffd" not in piece and piece.strip():
            return piece
    pytest.skip("no clean window in the sampled text")


def test_stop_strings_cut_text_and_ids(policy):
    params = SamplingParams(max_new_tokens=24, temperature=0)
    free = policy.generate([LONG, SHORT], params)
    stop = _clean_window(free[0].text)
    stopped = policy.generate([LONG, SHORT], dataclasses.replace(params, stop=(stop,)))
    for before, after in zip(free, stopped):
        if stop not in before.text:
            assert after.response_ids == before.response_ids
            assert after.finish_reason == before.finish_reason
            continue
        assert after.text == before.text[: before.text.find(stop)]
        assert after.finish_reason == "stop"
        # The ids end with the token that completed the stop string.
        k = len(after.response_ids)
        assert after.response_ids == before.response_ids[:k]
        assert stop in policy.decode(before.response_ids[:k])
        assert stop not in policy.decode(before.response_ids[: k - 1])
        assert len(after.logprobs) == k


def test_reasoning_is_split_and_ids_stay_complete(policy, tiny):
    _, tokenizer = tiny
    ids = tokenizer("<think>add them</think> The answer is 5.", add_special_tokens=False)
    generated = [*ids["input_ids"], tokenizer.eos_token_id]
    generation = policy.finish_generation(
        [1], generated, [0.0] * len(generated), SamplingParams(max_new_tokens=64)
    )
    assert generation.reasoning == "add them"
    assert generation.text == "The answer is 5."
    assert generation.response_ids == generated
    decoded = policy.decode(generation.response_ids)
    assert decoded == "<think>add them</think> The answer is 5."


@pytest.mark.parametrize(
    ("text", "answer", "reasoning"),
    [
        ("plain answer", "plain answer", None),
        ("<think>\nstep 1\n</think>\n\nAnswer: 5", "Answer: 5", "step 1"),
        ("Hm <think>never closed", "Hm", "never closed"),
        ("opened by the template</think> 42", "42", "opened by the template"),
    ],
)
def test_split_reasoning(text, answer, reasoning):
    assert split_reasoning(text) == (answer, reasoning)


# ---------------------------------------------------------------- seeding


def test_seeded_sampling_is_reproducible_and_leaves_global_rng_alone(policy):
    prompts = [SHORT, LONG]
    state = torch.random.get_rng_state()
    first = policy.generate(prompts, SamplingParams(max_new_tokens=12, seed=11))
    assert torch.equal(torch.random.get_rng_state(), state)
    again = policy.generate(prompts, SamplingParams(max_new_tokens=12, seed=11))
    other = policy.generate(prompts, SamplingParams(max_new_tokens=12, seed=12))
    assert [g.response_ids for g in first] == [g.response_ids for g in again]
    assert [g.logprobs for g in first] == [g.logprobs for g in again]
    assert [g.response_ids for g in first] != [g.response_ids for g in other]


def test_identical_prompts_in_one_batch_get_different_samples(policy):
    generations = policy.generate([SHORT] * 3, SamplingParams(max_new_tokens=10, seed=0))
    assert len({tuple(g.response_ids) for g in generations}) > 1


def test_seeded_sampling_is_reproducible_with_policies_in_concurrent_threads():
    """Policies share torch's global generator; concurrent seeded calls must not mix."""
    tokenizer = build_tiny_tokenizer()
    policies = [
        HFPolicy(build_tiny_model(tokenizer, seed=weights), tokenizer, name=f"tiny-{weights}")
        for weights in (1, 2)
    ]
    # Different seeds and prompts per job, so a job that reseeds or draws from the
    # generator while another samples changes that other job's output.
    jobs = [
        (policies[i % 2], [SHORT, LONG, THIRD][i % 3], SamplingParams(max_new_tokens=24, seed=i))
        for i in range(8)
    ]

    def run(job):
        policy, prompt, params = job
        return [(g.response_ids, g.logprobs) for g in policy.generate([prompt, SHORT], params)]

    expected = [run(job) for job in jobs]
    start = threading.Barrier(len(jobs))

    def run_together(job):
        start.wait(timeout=30)
        return run(job)

    for _ in range(3):
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            assert list(pool.map(run_together, jobs)) == expected


# ---------------------------------------------------------------- loading and API


def test_loads_from_a_directory_with_dtype(tmp_path, tiny):
    model, tokenizer = tiny
    directory = tiny_model_dir(tmp_path / "tiny")
    loaded = HFPolicy(directory, device="cpu")
    assert loaded.dtype == torch.float32
    assert loaded.name == str(directory)
    params = SamplingParams(max_new_tokens=10, temperature=0)
    in_memory = HFPolicy(model, tokenizer).generate([LONG], params)
    assert loaded.generate([LONG], params)[0].response_ids == in_memory[0].response_ids
    half = HFPolicy(directory, device="cpu", dtype="bf16", name="tiny-bf16")
    assert half.dtype == torch.bfloat16
    assert half.name == "tiny-bf16"
    (generation,) = half.generate([SHORT], SamplingParams(max_new_tokens=6, seed=0))
    assert len(generation.response_ids) == len(generation.logprobs) == 6


def test_agenerate_matches_generate(policy):
    params = SamplingParams(max_new_tokens=8, temperature=0)

    async def both():
        return await asyncio.gather(
            policy.agenerate([SHORT], params), policy.agenerate([LONG], params)
        )

    short, long = asyncio.run(both())
    assert short[0].response_ids == policy.generate([SHORT], params)[0].response_ids
    assert long[0].response_ids == policy.generate([LONG], params)[0].response_ids


def test_to_dict_is_json_ready(policy):
    (generation,) = policy.generate([SHORT], SamplingParams(max_new_tokens=4, seed=0))
    data = json.loads(json.dumps(generation.to_dict()))
    assert data["response_ids"] == generation.response_ids
    assert data["num_response_tokens"] == 4
    assert data["num_prompt_tokens"] == len(generation.prompt_ids)
    assert data["trainable"] is True
    assert data["finish_reason"] == "length"


def test_empty_batch_and_bad_input(policy):
    assert policy.generate([], SamplingParams()) == []
    with pytest.raises(TypeError, match="single message"):
        policy.generate(SHORT, SamplingParams())  # a prompt, not a batch
    with pytest.raises(TypeError):
        normalize_batch([[{"role": "user"}]])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_new_tokens": 0},
        {"temperature": -0.1},
        {"top_p": 0.0},
        {"top_k": -1},
        {"stop": ("",)},
    ],
)
def test_sampling_params_are_validated(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_sampling_params_accept_a_single_stop_string():
    assert SamplingParams(stop="\n\n").stop == ("\n\n",)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")
    assert SamplingParams(temperature=0).greedy


def test_a_model_object_needs_a_tokenizer(tiny):
    model, _ = tiny
    with pytest.raises(ValueError, match="tokenizer"):
        HFPolicy(model)


def test_closed_policy_refuses_to_generate(tiny):
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer)
    policy.close()
    with pytest.raises(RuntimeError, match="closed"):
        policy.generate([SHORT], SamplingParams(max_new_tokens=2))


# ---------------------------------------------------------------- compiled decoding


def test_compiled_decode_shapes_are_bucketed():
    counts = range(1, 65)
    rows = [decode_batch_rows(n, 64) for n in counts]
    assert sorted(set(rows)) == [4, 16, 64]  # three recorded batch shapes up to 64 rows
    assert all(r >= n for r, n in zip(rows, counts))
    # One prompt runs as 4 rows: a one-row batch would record a shape of its own.
    assert [decode_batch_rows(n, 64) for n in (1, 2, 4, 5, 16, 17, 64)] == [4, 4, 4, 16, 16, 64, 64]
    assert decode_batch_rows(40, 48) == 48  # never above the policy's largest batch
    assert decode_batch_rows(1, 2) == 2
    assert static_cache_length(1, 1) == MIN_CACHE_LENGTH
    assert static_cache_length(200, 312) == 512
    assert static_cache_length(200, 313) == 1024
    # A run's prompts of 100..2,100 tokens plus 256 new ones: four cache shapes.
    lengths = {static_cache_length(width, 256) for width in range(100, 2101)}
    assert lengths == {512, 1024, 2048, 4096}
    assert all(static_cache_length(w, 256) >= w + 256 for w in range(1, 5000, 37))


def _spy_on_decoding(monkeypatch):
    """Every ``GraphDecoder.decode`` call, as calls come: thread, arguments and raw ids."""
    calls = []
    decode = GraphDecoder.decode

    def spy(self, input_ids, attention_mask, **kwargs):
        call = SimpleNamespace(decoder=self, thread=threading.current_thread(), kwargs=kwargs)
        call.input_ids = input_ids
        calls.append(call)
        call.ids, call.logprobs, call.lengths = decode(self, input_ids, attention_mask, **kwargs)
        return call.ids, call.logprobs, call.lengths

    monkeypatch.setattr(GraphDecoder, "decode", spy)
    return calls


def _decoders_made(monkeypatch):
    """The threads each ``GraphDecoder`` of a policy was made on, as they are made."""
    from mappa_agents import hf

    threads = []

    class Counted(GraphDecoder):
        def __init__(self, *args, **kwargs):
            threads.append(threading.current_thread())
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(hf, "GraphDecoder", Counted)
    return threads


def test_compile_decode_pads_the_batch_without_changing_results(tiny, caplog, monkeypatch):
    # On the CPU GraphDecoder runs its steps eagerly, so this checks what compile_decode
    # adds around the graphs: filler rows, the static cache and the picking of ids.
    model, tokenizer = tiny
    with caplog.at_level("WARNING", logger="mappa_agents.hf"):
        compiled = HFPolicy(model, tokenizer, max_batch_size=4, compile_decode=True)
    assert "without CUDA graphs" in caplog.text
    plain = HFPolicy(model, tokenizer, max_batch_size=4)
    calls = _spy_on_decoding(monkeypatch)
    prompts = [LONG, SHORT, THIRD]  # padded to 4 rows
    params = SamplingParams(max_new_tokens=10, temperature=0)
    padded = compiled.generate(prompts, params)
    expected = plain.generate(prompts, params)
    assert len(padded) == 3
    for got, want in zip(padded, expected):
        assert got.prompt_ids == want.prompt_ids
        assert got.response_ids == want.response_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
        assert got.info["batch_size"] == 3
        assert got.info["decode_rows"] == 4
        assert got.info["latency_s"] > 0
    (call,) = calls  # the plain policy decoded through generate
    width = max(len(g.prompt_ids) for g in padded)
    assert tuple(call.input_ids.shape) == (4, width)
    assert call.kwargs["ended"].tolist() == [False, False, False, True]
    assert call.kwargs["cache_length"] == static_cache_length(width, 10)
    assert call.kwargs["max_new_tokens"] == 10
    assert call.kwargs["stopped"] is None


def test_three_policies_record_one_shape_per_batch_rows_and_cache_length(monkeypatch):
    # What a run's first steps pay for: each shape a policy meets records a graph once
    # (a fraction of a second on a GPU). Batches of 1, 3 and 10 prompts at two prompt
    # widths make 4 shapes per policy: 4 and 16 rows, 512 and 1024 cache positions.
    made = _decoders_made(monkeypatch)
    policies = [
        HFPolicy(*tiny_model_and_tokenizer(seed=seed), compile_decode=True, max_batch_size=16)
        for seed in range(3)  # three agents of one architecture, as in MathChat
    ]
    params = SamplingParams(max_new_tokens=4, temperature=0)
    widths = set()
    for words in (5, 100):
        for count in (1, 3, 10):
            prompts = [
                [{"role": "user", "content": "hello " * words + str(k)}] for k in range(count)
            ]
            for policy in policies:
                generations = policy.generate(prompts, params)
                assert [g.info["decode_rows"] for g in generations] == [
                    4 if count < 5 else 16
                ] * count
                widths.add(static_cache_length(max(len(g.prompt_ids) for g in generations), 4))
    assert widths == {512, 1024}
    assert len(made) == 3  # one decoder per policy, made at its first call
    for policy in policies:
        assert policy._decoder.shapes == [(4, 512), (4, 1024), (16, 512), (16, 1024)]


def test_filler_rows_end_at_once_and_real_rows_keep_decoding(tiny, monkeypatch):
    model, tokenizer = tiny
    compiled = HFPolicy(model, tokenizer, max_batch_size=4, compile_decode=True)
    calls = _spy_on_decoding(monkeypatch)
    params = SamplingParams(max_new_tokens=6, temperature=0)
    (generation,) = compiled.generate([SHORT], params)
    assert generation.finish_reason == "length"
    assert len(generation.response_ids) == 6
    pad = compiled.pad_token_id
    for prompts in ([SHORT], [SHORT, LONG], [SHORT, LONG, THIRD]):
        compiled.generate(prompts, params)
        ids = calls[-1].ids
        assert ids.shape[0] == 4  # one to three prompts run as four rows
        assert (ids[len(prompts) :] == pad).all()  # filler rows: padding from the start
        assert (ids[: len(prompts)] != pad).all()  # real rows: 6 ids each


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=16, seed=2),
        SamplingParams(max_new_tokens=16, temperature=0.7, top_k=20, top_p=0.9, seed=3),
    ],
    ids=["t1", "t0.7-topk-topp"],
)
def test_seeded_compiled_sampling_is_reproducible_and_draws_what_generate_draws(tiny, params):
    model, tokenizer = tiny
    compiled = HFPolicy(model, tokenizer, max_batch_size=4, compile_decode=True)
    plain = HFPolicy(model, tokenizer, max_batch_size=4)
    prompts = [SHORT, LONG, THIRD, SHORT]  # four rows: no filler rows draw beside them

    def ids(generations):
        return [g.response_ids for g in generations]

    first = compiled.generate(prompts, params)
    assert ids(compiled.generate(prompts, params)) == ids(first)
    # The same warpers in the same order over (nearly) the same logits: the same draws.
    assert ids(plain.generate(prompts, params)) == ids(first)
    other_seed = dataclasses.replace(params, seed=params.seed + 1)
    assert ids(compiled.generate(prompts, other_seed)) != ids(first)


def test_top_k_top_p_and_temperature_reach_the_pick(tiny):
    model, tokenizer = tiny
    compiled = HFPolicy(model, tokenizer, max_batch_size=4, compile_decode=True)
    prompts = [SHORT, LONG, THIRD]

    def ids(**settings):
        params = SamplingParams(max_new_tokens=12, seed=0, **settings)
        return [g.response_ids for g in compiled.generate(prompts, params)]

    greedy = ids(temperature=0)
    assert ids() != greedy  # sampling at temperature 1 strays from the argmax
    assert ids(top_k=1) == greedy
    assert ids(top_p=1e-6) == greedy  # the likeliest id alone holds that mass


def test_pick_next_ids_applies_temperature_top_k_and_top_p():
    torch.manual_seed(0)
    scores = torch.tensor([[0.0, 1.0, 2.0, 3.0]]).repeat(4000, 1)
    kept = scores.clone()

    def shares(**settings):
        params = SamplingParams(**settings)
        picked = pick_next_ids(scores, params)
        return torch.bincount(picked, minlength=4).float() / len(picked)

    assert shares(temperature=0).tolist() == [0.0, 0.0, 0.0, 1.0]
    assert torch.allclose(shares(), torch.softmax(scores[0], -1), atol=0.03)
    cold = torch.softmax(scores[0] / 0.25, -1)  # [0.0000, 0.0003, 0.0180, 0.9817]
    assert torch.allclose(shares(temperature=0.25), cold, atol=0.02)
    assert shares(top_k=1).tolist() == [0.0, 0.0, 0.0, 1.0]
    assert shares(top_k=2)[:2].tolist() == [0.0, 0.0]
    # softmax: 0.032, 0.087, 0.237, 0.644; top_p drops the least likely ids whose mass is
    # at most 1 - top_p: 0.3 drops two of them, 0.4 three.
    nucleus = shares(top_p=0.7)
    assert nucleus[:2].tolist() == [0.0, 0.0]
    assert (nucleus[2:] > 0).all()
    assert shares(top_p=0.6).tolist() == [0.0, 0.0, 0.0, 1.0]
    assert torch.equal(scores, kept)  # the decoder's log-probs come from the same tensor


def test_stop_strings_end_compiled_decoding_as_they_end_generate(tiny, monkeypatch):
    model, tokenizer = tiny
    compiled = HFPolicy(model, tokenizer, max_batch_size=4, compile_decode=True)
    plain = HFPolicy(model, tokenizer, max_batch_size=4)
    params = SamplingParams(max_new_tokens=24, temperature=0)
    prompts = [SHORT, LONG]  # the shorter first: batch rows in the prompts' order
    free = plain.generate(prompts, params)
    stop = _clean_window(free[1].text)
    stopping = dataclasses.replace(params, stop=(stop,))
    calls = _spy_on_decoding(monkeypatch)
    raw = []
    generate = model.generate

    def spy(**kwargs):
        output = generate(**kwargs)
        raw.append(output.sequences[:, kwargs["input_ids"].shape[1] :])
        return output

    monkeypatch.setattr(model, "generate", spy)
    got = compiled.generate(prompts, stopping)
    want = plain.generate(prompts, stopping)
    for mine, theirs in zip(got, want):
        assert mine.response_ids == theirs.response_ids
        assert mine.text == theirs.text
        assert mine.finish_reason == theirs.finish_reason
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)
    assert got[1].finish_reason == "stop"
    end = len(got[1].response_ids)
    assert end < len(free[1].response_ids)
    # Decoding itself ended the row at the id that completed the stop string (padding
    # after it), as generate's stopping criterion ends it.
    pad = compiled.pad_token_id
    decoded = calls[0].ids[:2].tolist()
    assert decoded[1][end:] == [pad] * (len(decoded[1]) - end)
    generated = raw[0].tolist()
    width = params.max_new_tokens
    assert [row + [pad] * (width - len(row)) for row in decoded] == [
        row + [pad] * (width - len(row)) for row in generated
    ]


def test_a_stop_the_text_does_not_show_ends_the_response_at_its_id(tiny):
    # A special-token stop is cut from the decoded text, so only the decoder knows
    # where the row ended: the response stops there (no padding ids, no "length").
    model, tokenizer = tiny
    compiled = HFPolicy(model, tokenizer, max_batch_size=4, compile_decode=True)
    user = tokenizer.convert_tokens_to_ids("<|user|>")
    assert user not in compiled.eos_token_ids
    assert user != compiled.pad_token_id or compiled.pad_token_id not in compiled.eos_token_ids
    steps = []

    def forced(scores, params):
        chosen = scores.argmax(-1)
        if len(steps) == 2:
            chosen[:] = user
        steps.append(1)
        return chosen

    compiled.pick = forced
    params = SamplingParams(max_new_tokens=8, temperature=0, stop=("<|user|>",))
    (generation,) = compiled.generate([SHORT], params)
    assert len(generation.response_ids) == 3
    assert generation.response_ids[-1] == user
    assert len(generation.logprobs) == 3
    assert generation.finish_reason == "stop"


def test_a_model_the_graph_decoder_cannot_decode_generates_instead(caplog):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = build_tiny_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        use_sliding_window=True, sliding_window=8, max_window_layers=0,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )  # fmt: skip
    model = Qwen3ForCausalLM(config).eval()  # every layer attends over 8 positions
    with caplog.at_level("WARNING", logger="mappa_agents.hf"):
        policy = HFPolicy(model, tokenizer, compile_decode=True)
    assert "compile_decode is off" in caplog.text
    assert "sliding_attention" in caplog.text
    assert not policy.compile_decode
    (generation,) = policy.generate([SHORT], SamplingParams(max_new_tokens=4, temperature=0))
    assert len(generation.response_ids) == 4
    assert policy._decoder is None  # generate decoded it


def _generating_threads(model, monkeypatch):
    """The threads ``model.generate`` runs on, one entry a call, as calls come."""
    threads = []
    generate = model.generate

    def spy(**kwargs):
        threads.append(threading.current_thread())
        return generate(**kwargs)

    monkeypatch.setattr(model, "generate", spy)
    return threads


def test_compiled_decoding_runs_on_the_policy_thread_only(tiny, monkeypatch):
    model, tokenizer = tiny
    made = _decoders_made(monkeypatch)
    compiled = HFPolicy(model, tokenizer, max_batch_size=4, compile_decode=True)
    calls = _spy_on_decoding(monkeypatch)
    params = SamplingParams(max_new_tokens=3, seed=0)
    compiled.generate([SHORT], params)

    async def from_the_event_loop():
        await asyncio.gather(*(compiled.agenerate([LONG], params) for _ in range(3)))

    asyncio.run(from_the_event_loop())
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: compiled.generate([THIRD], params), range(2)))
    threads = [call.thread for call in calls]
    assert len(threads) == 6
    assert len(set(threads)) == 1
    assert threads[0].name.startswith("mappa-decode")
    assert made == threads[:1]  # one decoder, made on that thread
    assert {id(call.decoder) for call in calls} == {id(compiled._decoder)}
    compiled.close()
    assert compiled._decoder is None  # its caches go with the model
    with pytest.raises(RuntimeError, match="closed"):
        compiled.generate([SHORT], params)


def test_eager_calls_from_event_loops_run_on_the_policys_own_thread(tiny, monkeypatch):
    # A rollout runs each step on a new event loop, whose executor starts new threads;
    # per-thread state (cuDNN plans on a GPU) would start cold every step there.
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer, max_batch_size=4)
    threads = _generating_threads(model, monkeypatch)
    params = SamplingParams(max_new_tokens=3, seed=0)

    async def a_step():
        await asyncio.gather(*(policy.agenerate([LONG], params) for _ in range(2)))

    for _ in range(3):  # three steps, three loops
        asyncio.run(a_step())
    assert len(threads) == 6
    assert len(set(threads)) == 1
    assert threads[0].name.startswith("mappa-decode")
    # A direct call stays in the caller's thread (where a Ctrl-C stops it at once).
    policy.generate([SHORT], params)
    assert threads[-1] is threading.current_thread()
    policy.close()

    async def after_close():
        await policy.agenerate([SHORT], params)

    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(after_close())


def test_closing_a_compiled_policy_ends_queued_calls_with_the_closed_error(tiny, monkeypatch):
    model, tokenizer = tiny
    compiled = HFPolicy(model, tokenizer, max_batch_size=4, compile_decode=True)
    entered, release = threading.Event(), threading.Event()
    decode = GraphDecoder.decode

    def slow(self, *args, **kwargs):
        entered.set()
        release.wait(60)
        return decode(self, *args, **kwargs)

    monkeypatch.setattr(GraphDecoder, "decode", slow)
    params = SamplingParams(max_new_tokens=2, seed=0)

    def call():
        try:
            return compiled.generate([SHORT], params)
        except RuntimeError as error:
            return error

    with ThreadPoolExecutor(4) as pool:
        running = pool.submit(call)
        assert entered.wait(60)  # decoding, holding the generate lock
        queued = [pool.submit(call) for _ in range(2)]
        while compiled._decode_executor._work_queue.qsize() < 2:
            threading.Event().wait(0.01)
        closing = pool.submit(compiled.close)
        # Queued calls end at once, while the running one still holds the lock.
        for future in queued:
            assert "closed" in str(future.result(timeout=60))
        release.set()
        closing.result(timeout=60)
        assert isinstance(running.result(timeout=60), list)  # the running call finished
    with pytest.raises(RuntimeError, match="closed"):
        compiled.generate([SHORT], params)
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(compiled.agenerate([SHORT], params))


def test_compile_decode_is_fixed_when_the_policy_is_built(tiny):
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer)
    with pytest.raises(AttributeError):
        policy.compile_decode = True


def test_compile_decode_refuses_a_lora_adapter(tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="compile_decode"):
        HFPolicy(model, tokenizer, adapter="writer", compile_decode=True)


# ---------------------------------------------------------------- CUDA


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_generation_is_exact_and_seeded(tmp_path):
    directory = tiny_model_dir(tmp_path / "tiny")
    policy = HFPolicy(directory)  # device and dtype "auto": CUDA, bfloat16
    assert policy.device.startswith("cuda")
    assert policy.dtype == torch.bfloat16
    policy32 = HFPolicy(directory, dtype="float32")
    model32 = policy32.model
    params = SamplingParams(max_new_tokens=16, seed=7)
    cuda_state = torch.cuda.get_rng_state()
    first = policy32.generate([SHORT, LONG, THIRD], params)
    assert torch.equal(torch.cuda.get_rng_state(), cuda_state)
    again = policy32.generate([SHORT, LONG, THIRD], params)
    assert [g.response_ids for g in first] == [g.response_ids for g in again]
    for generation in first:
        ids = torch.tensor([generation.prompt_ids + generation.response_ids], device="cuda")
        with torch.no_grad():
            logprobs = model32(ids).logits[0].float().log_softmax(-1)
        start = len(generation.prompt_ids) - 1
        expected = [logprobs[start + i, t].item() for i, t in enumerate(generation.response_ids)]
        # Cached decoding and one full forward pass run different GPU kernels.
        assert generation.logprobs == pytest.approx(expected, abs=1e-3)
    half = policy.generate([SHORT, LONG], SamplingParams(max_new_tokens=8, seed=0))
    for generation in half:
        assert len(generation.response_ids) == len(generation.logprobs) == 8
        assert policy.decode(generation.response_ids) == generation.text


def test_eager_decoding_on_cuda_leaves_out_cudnn_attention_and_elsewhere_keeps_the_default():
    import torch

    before = torch.backends.cuda.cudnn_sdp_enabled()
    with decode_attention("cuda", static_cache=False):
        # cuDNN plans each new key length once per thread: decoding would pay every step.
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    for device_type, static_cache in (("cpu", False), ("cuda", True)):
        with decode_attention(device_type, static_cache):
            assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_generate_runs_under_the_attention_choice_of_its_device(policy, monkeypatch):
    import contextlib

    from mappa_agents import hf

    entered = []

    @contextlib.contextmanager
    def recording(device_type, static_cache):
        entered.append((device_type, static_cache))
        yield

    monkeypatch.setattr(hf, "decode_attention", recording)
    policy.generate([[{"role": "user", "content": "hi"}]], SamplingParams(max_new_tokens=2))
    assert entered == [(policy.model.device.type, False)]
