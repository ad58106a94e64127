"""``benchmarks.bench_vs_trl`` on CPU: one task, one reward, both trainers, one report."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from benchmarks import bench_vs_trl
from benchmarks.bench_vs_trl import (
    CharShareEnv,
    char_share,
    comparison_rows,
    make_tasks,
    ratio,
    summarize,
)
from mappa_agents.policy import SamplingParams

TINY = [
    "--model", "tiny", "--engine", "hf", "--samples", "8", "--samples-per-prompt", "4",
    "--max-new-tokens", "16", "--micro-batch", "4", "--warmup-steps", "1", "--steps", "2",
]  # fmt: skip


def test_the_environment_pays_the_rule_that_trl_gets():
    env = CharShareEnv(num_tasks=4, isolation="none")
    try:
        env.reset(options={"task_id": "write-2"})
        messages = env.observe("writer")["messages"]
        assert [m["role"] for m in messages] == ["user"]
        assert messages[0]["content"] == env.tasks[2].prompt
        reply = "a banana, a salad"
        env.step(reply)
        assert env.rewards["writer"] == pytest.approx(char_share(reply, "a"))
        assert env.outcome["reward"] == pytest.approx(7 / 17)
    finally:
        env.close()
    assert char_share("", "a") == 0.0


def test_prompts_are_distinct_in_both_styles():
    english = make_tasks(300)
    assert len({t.prompt for t in english}) == 300
    assert {t.target for t in english} == {"a"}
    words = make_tasks(50, "words")
    assert len({t.prompt for t in words}) == 50
    assert all(w.startswith("w") for t in words for w in t.prompt.split())
    assert {t.target for t in words} == {"7"}  # a word-level vocabulary writes no letter a
    assert make_tasks(50, "words") == words  # seeded
    with pytest.raises(ValueError, match="prompt_style"):
        make_tasks(1, "french")  # type: ignore[arg-type]


def test_summary_takes_medians_of_the_timed_steps_and_totals_for_rates():
    steps = [
        {"step_s": 50.0, "generation_s": 40.0, "prompt_tokens": 10, "completion_tokens": 90,
         "mean_reward": 0.1, "block": 1, "timed": False},
        {"step_s": 4.0, "generation_s": 3.0, "prompt_tokens": 10, "completion_tokens": 30,
         "mean_reward": 0.2, "block": 1, "timed": True},
        {"step_s": 30.0, "generation_s": 20.0, "prompt_tokens": 10, "completion_tokens": 90,
         "mean_reward": 0.2, "block": 2, "timed": False},
        {"step_s": 6.0, "generation_s": 3.0, "prompt_tokens": 10, "completion_tokens": 60,
         "mean_reward": 0.3, "block": 2, "timed": True},
    ]  # fmt: skip
    summary = summarize(steps)
    assert summary["step_s"] == 5.0
    assert (summary["step_s_min"], summary["step_s_max"]) == (4.0, 6.0)
    assert summary["step_s_blocks"] == [4.0, 6.0]
    assert summary["timed_steps"] == 2
    assert summary["generation_s"] == 3.0
    assert summary["update_s"] == 2.0  # median of 1 and 3
    assert summary["generated_tok_s"] == 15.0  # 90 tokens in 6 s
    assert summary["update_tok_s"] == 27.5  # 110 row tokens in 4 s
    assert (summary["reward_first_step"], summary["reward_last_step"]) == (0.1, 0.3)
    with pytest.raises(ValueError, match="no timed steps"):
        summarize([s for s in steps if not s["timed"]])
    assert ratio(2.0, 4.0) == 0.5
    assert ratio(None, 4.0) is None
    assert ratio(1.0, 0.0) is None
    rows = comparison_rows(64, {"step_s": 3.0}, {"step_s": 6.0})
    assert rows[0] == {"samples": 64, "what": "step s", "mappa": 3.0, "trl": 6.0, "mappa/trl": 0.5}


def workload(**changes):
    args = bench_vs_trl.make_parser().parse_args([*TINY, *changes.pop("argv", [])])
    return bench_vs_trl.workload(args, 8, "model", "english")


def test_each_trainer_runs_two_blocks_each_after_its_own_warmup():
    work = workload(argv=["--steps", "5", "--warmup-steps", "2"])
    assert work.block_steps == (3, 2)
    assert work.total_steps == 9
    assert work.step_plan == [
        (1, False), (1, False), (1, True), (1, True), (1, True),
        (2, False), (2, False), (2, True), (2, True),
    ]  # fmt: skip
    assert work.reply_tokens_per_step == 8 * 16
    assert bench_vs_trl.make_parser().parse_args([]).steps == 10
    with pytest.raises(ValueError, match="two timed blocks"):
        workload(argv=["--steps", "1"])


def test_trl_gets_fixed_length_replies_for_its_engine():
    pytest.importorskip("trl")
    for engine, key in (("hf", "min_new_tokens"), ("vllm", "min_tokens")):
        work = dataclasses.replace(workload(), engine=engine)
        config = bench_vs_trl.trl_config(work, "unused")
        assert config.generation_kwargs == {key: 16}


def test_mappa_gets_fixed_length_replies_the_same_way():
    from transformers import GenerationConfig

    class Policy:
        def _generation_config(self, params, prompt_width):
            return GenerationConfig(max_new_tokens=params.max_new_tokens)

    policy = Policy()
    bench_vs_trl.fix_reply_length(policy, "hf")
    params = SamplingParams(max_new_tokens=12)
    assert policy._generation_config(params, 5).min_new_tokens == 12
    # Decoding through recorded graphs: the pick never takes an end id.

    from mappa_agents.hf import HFPolicy
    from mappa_agents.tiny_models import tiny_model_and_tokenizer

    compiled = HFPolicy(*tiny_model_and_tokenizer(), compile_decode=True, max_batch_size=4)
    offered = []

    def greedy_pick(scores, params):
        offered.append(scores)
        return scores.argmax(-1)

    compiled.pick = greedy_pick
    bench_vs_trl.fix_reply_length(compiled, "hf")
    greedy = SamplingParams(max_new_tokens=12, temperature=0)
    (reply,) = compiled.generate([[{"role": "user", "content": "hi"}]], greedy)
    assert len(reply.response_ids) == 12
    assert len(offered) == 12
    for scores in offered:
        assert (scores[:, compiled.eos_token_ids] == float("-inf")).all()
    with pytest.raises(TypeError, match="generation config"):
        bench_vs_trl.fix_reply_length(object(), "hf")


def test_different_reply_tokens_are_caught():
    work = workload()
    steps = [{"completion_tokens": 128}] * work.total_steps
    same = bench_vs_trl.reply_tokens(work, {"steps": steps}, {"steps": steps})
    assert same == {"expected": 128, "mappa": [128] * 4, "trl": [128] * 4, "same": True}
    short = [*steps[:-1], {"completion_tokens": 127}]
    assert not bench_vs_trl.reply_tokens(work, {"steps": steps}, {"steps": short})["same"]
    assert not bench_vs_trl.reply_tokens(work, {"steps": steps}, {"steps": steps[:-1]})["same"]


def fake_runners(seen):
    """Runners that record what ran when: mappa's pauses between its blocks, as the real one."""

    def result(name):
        return {
            "config": {"trainer": name},
            "device": "cpu",
            "step_s": 2.0 if name == "mappa" else 4.0,
            "generated_tok_s": 100.0,
            "steps": [{"completion_tokens": 64}] * 4,  # 8 samples x 8 tokens, 4 steps
        }

    def mappa(work, directory):
        seen.append(("mappa 1", work.samples_per_step, work.prompt_style, work.model_dir))
        yield
        seen.append(("mappa 2", work.samples_per_step, work.prompt_style, work.model_dir))
        return result("mappa")

    def trl(work, directory):
        seen.append(("trl", work.samples_per_step, work.prompt_style, work.model_dir))
        return result("trl")

    return {"mappa": mappa, "trl": trl}


ORDER = ["mappa 1", "trl", "mappa 2"]  # TRL's two blocks run in one train() call


def test_one_process_runs_mappa_trl_trl_mappa(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(bench_vs_trl, "RUNNERS", fake_runners(seen))
    summary = bench_vs_trl.main([*TINY, "--max-new-tokens", "8", "--out", str(tmp_path)])
    assert [name for name, *_ in seen] == ORDER
    (run,) = summary["runs"]
    assert run["order"] == ["mappa block 1", "trl block 1", "trl block 2", "mappa block 2"]
    assert run["reply_tokens_per_step"]["same"]


def test_a_child_process_runs_one_trainer_at_one_size(tmp_path, monkeypatch):
    """``--processes each``: the parent's options reach each child, with its own size."""
    seen = []
    monkeypatch.setattr(bench_vs_trl, "RUNNERS", fake_runners(seen))
    children = {}

    class InProcessChild:  # the child's command line, run here in a thread
        def __init__(self, command, result):
            assert command[1:3] == ["-m", "benchmarks.bench_vs_trl"]
            self.result, self.paused, self.go = result, threading.Event(), threading.Event()
            children[result] = self
            self.thread = threading.Thread(target=bench_vs_trl.main, args=(command[3:],))
            self.thread.start()

        def wait_paused(self):
            assert self.paused.wait(30)

        def finish(self):
            self.go.set()
            self.thread.join(30)
            return json.loads(self.result.read_text())

    def pause(result_file):
        children[result_file].paused.set()
        assert children[result_file].go.wait(30)

    monkeypatch.setattr(bench_vs_trl, "spawn", InProcessChild)
    monkeypatch.setattr(bench_vs_trl, "pause_between_blocks", pause)
    out = tmp_path / "out"
    argv = [*TINY, "--max-new-tokens", "8", "--samples", "8,16", "--processes", "each"]
    with pytest.raises(bench_vs_trl.RepliesDiffer, match=r"at \[16\] samples"):
        bench_vs_trl.main([*argv, "--out", str(out)])  # writes the JSON, then fails
    summary = json.loads((out / "vs_trl_tiny.json").read_text())
    assert [(name, size) for name, size, _, _ in seen] == [
        ("mappa 1", 8), ("trl", 8), ("mappa 2", 8), ("mappa 1", 16), ("trl", 16), ("mappa 2", 16),
    ]  # fmt: skip
    assert {style for _, _, style, _ in seen} == {"english"}
    assert len({model_dir for *_, model_dir in seen}) == 1  # built once, by the parent
    assert [run["ratios"]["step s"] for run in summary["runs"]] == [0.5, 0.5]
    assert summary["runs"][0]["mappa_config"] == {"trainer": "mappa"}  # as the child ran it
    assert summary["runs"][0]["trl_config"] == {"trainer": "trl"}
    assert summary["processes"] == "each"
    # 8 samples x 8 tokens in every step of both at 8 samples; not at 16: the run says so.
    assert [run["reply_tokens_per_step"]["same"] for run in summary["runs"]] == [True, False]


def test_a_child_pauses_until_the_parent_resumes_it(tmp_path):
    result = tmp_path / "result.json"
    code = (
        "import json, pathlib, sys; from benchmarks.bench_vs_trl import pause_between_blocks; "
        "p = pathlib.Path(sys.argv[1]); pause_between_blocks(p); p.write_text(json.dumps(7))"
    )
    child = bench_vs_trl.Child([sys.executable, "-c", code, str(result)], result)
    child.wait_paused()
    assert not result.exists()  # waiting for the go
    assert child.finish() == 7
    other = tmp_path / "other.json"
    failing = bench_vs_trl.Child([sys.executable, "-c", "raise SystemExit(3)"], other)
    with pytest.raises(subprocess.CalledProcessError):
        failing.wait_paused()


@pytest.mark.slow
def test_both_trainers_take_a_step_on_the_same_prompts_and_the_report_compares_them(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    out = tmp_path / "out"
    summary = bench_vs_trl.main([*TINY, "--out", str(out)])

    written = json.loads((out / "vs_trl_tiny.json").read_text())
    assert written["rows"] == summary["rows"]
    (run,) = written["runs"]
    mappa, trl = run["mappa"], run["trl"]
    for result in (mappa, trl):
        assert result["weight_elements_changed"] > 0  # the step trained
        assert result["peak_gpu_gib"] is None  # CPU
        # Two blocks of a warm-up step and a timed step; every reply 16 tokens long (the
        # tiny model samples EOS early when it is not masked).
        assert [(s["block"], s["timed"]) for s in result["steps"]] == [
            (1, False), (1, True), (2, False), (2, True),
        ]  # fmt: skip
        assert [s["completion_tokens"] for s in result["steps"]] == [8 * 16] * 4
        assert all(0.0 <= s["mean_reward"] <= 1.0 for s in result["steps"])
        assert result["timed_steps"] == 2
    assert run["reply_tokens_per_step"]["same"]
    # The same prompts, so the same prompt tokens, in the same step.
    for mine, theirs in zip(mappa["steps"], trl["steps"]):
        assert mine["task_ids"] == theirs["task_ids"]
        assert len(mine["task_ids"]) == 2
        assert mine["prompt_tokens"] == theirs["prompt_tokens"]
    assert mappa["reward_rule_max_error"] < 1e-9  # the environment paid the shared rule
    # Both rows and their ratio, per figure.
    by_what = {row["what"]: row for row in written["rows"]}
    step = by_what["step s"]
    assert step["mappa"] == mappa["step_s"]
    assert step["trl"] == trl["step_s"]
    assert step["mappa/trl"] == pytest.approx(mappa["step_s"] / trl["step_s"], rel=1e-2)
    assert by_what["generated tok/s"]["mappa/trl"] > 0
    assert by_what["peak GPU GiB"]["mappa/trl"] is None
    # The pairing, as recorded.
    config, trl_config = run["mappa_config"], run["trl_config"]
    assert trl_config["num_generations"] == config["samples_per_prompt"] == 4
    assert trl_config["generation_batch_size"] == config["train_batch_size"] == 8
    assert trl_config["per_device_train_batch_size"] == config["micro_batch_size"] == 4
    assert trl_config["gradient_accumulation_steps"] == 2
    assert trl_config["beta"] == config["kl_coef"]
    assert config["kl_estimator"] == "k3"
    assert trl_config["epsilon"] == config["clip_eps"]
    assert trl_config["learning_rate"] == config["lr"]
    assert trl_config["scale_rewards"] == "group"
    assert config["advantage_estimator"] == "grpo"
    assert written["differences"]
