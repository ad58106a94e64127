"""``benchmarks.bench_vs_trl`` on CPU: one task, one reward, both trainers, one report."""

from __future__ import annotations

import json

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

TINY = [
    "--model", "tiny", "--engine", "hf", "--samples", "8", "--samples-per-prompt", "4",
    "--max-new-tokens", "16", "--micro-batch", "4", "--warmup-steps", "0", "--steps", "1",
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
         "mean_reward": 0.1},
        {"step_s": 4.0, "generation_s": 3.0, "prompt_tokens": 10, "completion_tokens": 30,
         "mean_reward": 0.2},
        {"step_s": 6.0, "generation_s": 3.0, "prompt_tokens": 10, "completion_tokens": 60,
         "mean_reward": 0.3},
    ]  # fmt: skip
    summary = summarize(steps, warmup=1)
    assert summary["step_s"] == 5.0
    assert summary["generation_s"] == 3.0
    assert summary["update_s"] == 2.0  # median of 1 and 3
    assert summary["generated_tok_s"] == 15.0  # 90 tokens in 6 s
    assert summary["update_tok_s"] == 27.5  # 110 row tokens in 4 s
    assert (summary["reward_first_step"], summary["reward_last_step"]) == (0.1, 0.3)
    with pytest.raises(ValueError, match="no timed steps"):
        summarize(steps, warmup=3)
    assert ratio(2.0, 4.0) == 0.5
    assert ratio(None, 4.0) is None
    assert ratio(1.0, 0.0) is None
    rows = comparison_rows(64, {"step_s": 3.0}, {"step_s": 6.0})
    assert rows[0] == {"samples": 64, "what": "step s", "mappa": 3.0, "trl": 6.0, "mappa/trl": 0.5}


def test_a_child_process_runs_one_trainer_at_one_size(tmp_path, monkeypatch):
    """``--processes each``: the parent's options reach each child, with its own size."""
    seen = []

    def fake_runner(name):
        def run(work, directory):
            seen.append((name, work.samples_per_step, work.prompt_style, work.model_dir))
            return {
                "config": {"trainer": name},
                "device": "cpu",
                "step_s": 2.0 if name == "mappa" else 4.0,
                "generated_tok_s": 100.0,
            }

        return run

    monkeypatch.setattr(bench_vs_trl, "RUNNERS", {n: fake_runner(n) for n in ("mappa", "trl")})

    def in_process(command):  # the child's command line, run here
        assert command[1:3] == ["-m", "benchmarks.bench_vs_trl"]
        bench_vs_trl.main(command[3:])

    monkeypatch.setattr(bench_vs_trl, "run_command", in_process)
    out = tmp_path / "out"
    argv = [*TINY, "--samples", "8,16", "--processes", "each", "--out", str(out)]
    summary = bench_vs_trl.main(argv)
    assert [(name, size) for name, size, _, _ in seen] == [
        ("mappa", 8), ("trl", 8), ("mappa", 16), ("trl", 16),
    ]  # fmt: skip
    assert {style for _, _, style, _ in seen} == {"english"}
    assert len({model_dir for *_, model_dir in seen}) == 1  # built once, by the parent
    assert [run["ratios"]["step s"] for run in summary["runs"]] == [0.5, 0.5]
    assert summary["runs"][0]["mappa_config"] == {"trainer": "mappa"}  # as the child ran it
    assert summary["runs"][0]["trl_config"] == {"trainer": "trl"}
    assert json.loads((out / "vs_trl_tiny.json").read_text())["processes"] == "each"


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
        (step,) = result["steps"]
        assert step["completion_tokens"] > 0
        assert 0.0 <= step["mean_reward"] <= 1.0
    # The same prompts, so the same prompt tokens, in the same step.
    assert mappa["steps"][0]["task_ids"] == trl["steps"][0]["task_ids"]
    assert len(mappa["steps"][0]["task_ids"]) == 2
    assert mappa["steps"][0]["prompt_tokens"] == trl["steps"][0]["prompt_tokens"]
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
