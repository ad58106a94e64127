"""``benchmarks.bench_step_gpu`` on CPU with a tiny model: the report adds up."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from benchmarks.bench_step_gpu import (
    main,
    make_parser,
    steady_state,
    step_breakdown,
    step_config,
)
from mappa_agents.tiny_models import tiny_model_dir

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "configs" / "mathchat-smollm2.yaml"


def test_step_breakdown_keeps_the_rest_apart():
    metrics = {
        "rollout/seconds": 3.0,
        "train/logprob_seconds": 1.0,
        "train/update_seconds": 2.0,
        "rollout/response_tokens": 300,
        "train/tokens": 900,
    }
    parts = step_breakdown(7.5, metrics)
    assert parts["other_s"] == pytest.approx(1.5)
    assert step_breakdown(5.0, metrics)["other_s"] == 0.0  # clock noise never goes below 0
    first, later = {"step_s": 100.0}, [{"step_s": 5.0}, {"step_s": 7.0}, {"step_s": 6.0}]
    later[0]["compile"] = {"graphs": 1}  # totals ride along; medians are of numbers only
    assert steady_state([first, *later])["step_s"] == 6.0  # the compiling first step is out
    assert steady_state([first])["step_s"] == 100.0


def test_bench_step_runs_whole_steps_and_writes_the_figures(tmp_path, monkeypatch):
    import benchmarks.bench_step_gpu as bench

    model = tiny_model_dir(tmp_path / "model")
    out = tmp_path / "out"
    before_sweep: dict = {}

    def sweep_after_the_figures_are_written(*args, **kwargs):
        # A sweep stopped by a call's time limit must leave the step figures on disk.
        before_sweep.update(json.loads((out / "step_tiny.json").read_text()))
        return real_sweep(*args, **kwargs)

    real_sweep = bench.timed_sweep
    monkeypatch.setattr(bench, "timed_sweep", sweep_after_the_figures_are_written)
    summary = main(
        [
            "--shape", str(model), "--steps", "2", "--prompts", "2", "--samples", "2",
            "--max-new-tokens", "8", "--sandbox", "none", "--out", str(out),
            "--name", "step_tiny", "--train-truncated", "--schedule", "episodes",
            "--sweep-runs", "2", "--sweep-steps", "1",
        ]
    )  # fmt: skip
    written = json.loads((out / "step_tiny.json").read_text())
    assert written["steps"] == summary["steps"] == before_sweep["steps"]
    assert before_sweep["sweep"] is None
    assert written["sweep"] == summary["sweep"]
    assert len(summary["steps"]) == 2
    steady = summary["steady_step"]
    parts = steady["rollout_s"] + steady["logprob_s"] + steady["update_s"] + steady["other_s"]
    assert parts == pytest.approx(steady["step_s"], rel=1e-2)
    assert summary["policy_same_prompts"]["tokens"] > 0
    assert set(summary["policy_same_prompts"]["per_agent"]) == {
        "problem_solver",
        "code_executor",
        "verifier",
    }
    assert summary["rollout_vs_policy"] > 0
    assert summary["update_tok_s"] > 0
    assert summary["naive_same_rows"] == {}  # the plain step needs CUDA
    # On the CPU the decode step is timed eagerly, and says so: no floor is claimed.
    floor = summary["decode_floor"]
    assert (floor["method"], floor["batch"]) == ("eager", 4)
    assert floor["tokens_per_s"] > 0
    assert summary["rollout_vs_floor"] > 0
    sweep = summary["sweep"]
    assert (sweep["runs"], sweep["steps"], sweep["failed"]) == (2, 1, [])
    # What the process held after each step and before the sweep's runs closed.
    for held in [step["held"] for step in summary["steps"]] + [sweep["held_before_close"]]:
        assert set(held) == {"open_files", "child_processes"}
        assert held["open_files"] > 0
        assert held["child_processes"] >= 0
    assert "held" not in steady
    assert sweep["device_minutes"] == pytest.approx(sweep["seconds"] / 60, abs=0.01)
    # torch.compile's totals after each step: never fewer graphs later than earlier.
    first, last = summary["first_step_compile"], summary["last_step_compile"]
    assert set(first) == {"graphs", "compile_s", "inductor_s"}
    assert last["graphs"] >= first["graphs"] >= 0
    assert "compile" not in steady


def test_engine_agreement_tells_a_synced_engine_from_the_base_weights(tmp_path):
    from benchmarks.bench_step_gpu import engine_agreement, engine_weights
    from mappa_agents.trajectory import load_jsonl
    from mappa_train.trainer import Trainer
    from tests.toy_env import LetterEnv, toy_train_config

    config = toy_train_config(
        tmp_path, tiny_model_dir(tmp_path / "model"), steps=2, prompts_per_step=2,
        samples_per_prompt=2, concurrency=4, max_new_tokens=8,
    )  # fmt: skip
    trainer = Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)
    try:
        trainer.train(until=2)
        samples = load_jsonl(trainer.out / "rollouts" / "step-000001.jsonl")
        learner = trainer.learners["writer"]
        assert engine_agreement(trainer, samples) == {}  # no agent has an engine
        learner.engine = learner.policy  # an "engine" that acts with the learner's weights
        synced = engine_agreement(trainer, samples)["writer"]
        assert synced["tokens"] > 0
        assert synced["mean_abs_diff_learner"] < 1e-4
        # Two steps at lr 1e-2 moved the weights: the base model scores the tokens apart.
        assert synced["mean_abs_diff_reference"] > 100 * max(synced["mean_abs_diff_learner"], 1e-5)
        # The weight check asks the engine's worker for its model, as vLLM's
        # collective_rpc does: a stand-in that holds the learner's model, then the base.
        held = {"model": learner.model}
        worker = SimpleNamespace(get_model=lambda: held["model"])
        learner.engine = SimpleNamespace(
            llm=SimpleNamespace(collective_rpc=lambda fn: [fn(worker)])
        )
        (checked,) = engine_weights(trainer).values()
        assert checked["engine_equals_learner"]
        assert checked["elements_changed_by_training"] > 0
        assert checked["reference"] != checked["learner"]
        held["model"] = learner.ref_model  # an engine that missed the sync
        assert not engine_weights(trainer)["writer"]["engine_equals_learner"]
    finally:
        learner.engine = None
        trainer.close()


def test_the_decode_floor_refuses_a_cache_too_short_and_times_the_step():
    from benchmarks.decode_floor import decode_floor
    from mappa_agents.tiny_models import build_tiny_model, build_tiny_tokenizer

    model = build_tiny_model(build_tiny_tokenizer())
    with pytest.raises(ValueError, match="give at least 26"):
        decode_floor(model, 2, 20, repeats=10)
    model.train()
    timed = decode_floor(model, 3, 32, repeats=4)
    assert (timed["method"], timed["batch"], timed["context_tokens"]) == ("eager", 3, 32)
    assert timed["tokens_per_s"] == pytest.approx(3 / (timed["step_ms"] / 1000), rel=0.01)
    assert model.training  # left as it was found


def _parsed(argv):
    return make_parser().parse_args(argv)


def test_bench_step_times_the_recipe_a_config_names_with_the_options_given_on_top(tmp_path):
    model = tiny_model_dir(tmp_path / "model")
    args = _parsed(["--config", str(RECIPE), "--shape", str(model), "--steps", "3",
                    "--no-compile-decode", "--schedule", "episodes"])  # fmt: skip
    config, system = step_config(args, tmp_path / "work")
    assert system == str(model)
    # The recipe's own values where no option was given...
    assert (config.prompts_per_step, config.samples_per_prompt) == (16, 2)
    assert (config.max_new_tokens, config.micro_batch_tokens) == (256, 16384)
    assert config.env_options["tasks"]["kinds"] == ["word_one_step"]
    assert config.lr == 5.0e-5
    assert config.mask_truncated is False
    # ...the options given on top, and what the timing needs.
    assert (config.steps, config.rollout_schedule, config.compile_decode) == (3, "episodes", False)
    assert (config.save_every, config.tensorboard, config.progress) == (0, False, False)
    assert config.output_dir == str(tmp_path / "work" / "run")

    # Without a config the benchmark's own workload, its defaults, and options given win.
    args = _parsed(["--shape", str(model), "--prompts", "3", "--sandbox", "none"])
    config, _ = step_config(args, tmp_path / "work2")
    assert (config.prompts_per_step, config.samples_per_prompt, config.concurrency) == (3, 2, 6)
    assert (config.max_new_tokens, config.micro_batch_size, config.rollout_schedule) == (
        384,
        4,
        "ticks",
    )
    assert config.env_options == {"tasks": "gen:256", "sandbox": None}
    assert config.compile_decode is True
