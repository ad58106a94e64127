"""A sweep: several training runs in one process, each as it would be alone."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from mappa_agents.tiny_models import tiny_model_dir  # noqa: E402
from mappa_train.sweep import Sweep  # noqa: E402
from mappa_train.trainer import Trainer  # noqa: E402
from tests.toy_env import LetterEnv, toy_train_config  # noqa: E402

# Two arms of different credit and seed: runs that differ from the first step on.
RUNS = {"process-s1": {"credit_mode": "process", "seed": 1}, "outcome-s2": {"seed": 2}}
STEPS = 2


def run_config(root: Path, model_dir: Path, name: str, **changes):
    return toy_train_config(
        root,
        model_dir,
        **{
            "steps": STEPS,
            "prompts_per_step": 2,
            "samples_per_prompt": 2,
            "max_new_tokens": 8,
            "train_batch_size": 4,
            "micro_batch_size": 2,
            "kl_coef": 0.01,  # the reference model takes part
            "save_every": 1,
            "keep_checkpoints": 0,
            "eval_every": 2,
            "eval_episodes": 2,
            "output_dir": str(root / name),
            **RUNS[name],
            **changes,
        },
    )


def trainers(root: Path, model_dir: Path, **changes) -> dict[str, Trainer]:
    return {
        name: Trainer(
            run_config(root, model_dir, name, **changes),
            env_factory=LetterEnv,
            eval_env_factory=LetterEnv,
        )
        for name in RUNS
    }


def metric_lines(run_dir: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # Timings differ between any two runs; everything else must not.
    return [{k: v for k, v in m.items() if "seconds" not in k and "per_s" not in k} for m in lines]


def weights(run_dir: Path, step: int) -> dict:
    from safetensors.torch import load_file

    folder = run_dir / "checkpoints" / f"step-{step:06d}" / "agents" / "writer"
    return load_file(str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("sweep") / "model")


@pytest.fixture(scope="module")
def alone(tmp_path_factory, model_dir):
    """Each run trained on its own, one after the other: what a sweep must equal."""
    root = tmp_path_factory.mktemp("alone")
    for trainer in trainers(root, model_dir).values():
        trainer.train()
    return root


def assert_same_runs(root: Path, alone: Path, model_dir: Path) -> None:
    initial = weights(alone / "process-s1", 1)  # not the start: a check that training moved
    for name in RUNS:
        got, expected = metric_lines(root / name), metric_lines(alone / name)
        differing = [
            (m["step"], key, m.get(key), e.get(key))
            for m, e in zip(got, expected)
            for key in sorted(m.keys() | e.keys())
            if m.get(key) != e.get(key)
        ]
        assert len(got) == len(expected), name
        assert not differing, (name, differing)
        for step in range(1, STEPS + 1):
            a, b = weights(alone / name, step), weights(root / name, step)
            assert a.keys() == b.keys()
            for key in a:
                assert torch.equal(a[key], b[key]), f"{name} step {step}: {key} differs"
    assert not torch.equal(
        initial["lm_head.weight"], weights(alone / "process-s1", STEPS)["lm_head.weight"]
    )
    # The two runs are not the same run: their rewards differ.
    rewards = {n: [m.get("writer/mean_reward") for m in metric_lines(alone / n)] for n in RUNS}
    assert rewards["process-s1"] != rewards["outcome-s2"]


@pytest.mark.parametrize("overlap", [True, False])
def test_runs_in_one_process_equal_runs_alone_round_robin(tmp_path, alone, model_dir, overlap):
    sweep = Sweep(trainers(tmp_path, model_dir), overlap=overlap)
    outcomes = sweep.run()
    assert all(o.ok for o in outcomes.values()), outcomes
    assert sweep.failed == []
    # Round-robin by step: every run's step k before any run's step k + 1.
    assert sweep.order == [
        ("process-s1", 0),
        ("outcome-s2", 0),
        ("process-s1", 1),
        ("outcome-s2", 1),
    ]
    # Rewards, losses, KL, evaluations and weights at every step: as each run alone.
    assert_same_runs(tmp_path, alone, model_dir)
    lines = metric_lines(tmp_path / "process-s1")
    assert lines[-1]["step"] == STEPS
    assert "eval/success_rate" in lines[-1]
    assert lines[-1]["writer/grad_norm"] > 0


@pytest.mark.parametrize("where", ["rollout", "update"])
def test_a_run_that_raises_is_stopped_alone_and_named(tmp_path, model_dir, where, caplog):
    runs = trainers(tmp_path, model_dir)
    broken = runs["process-s1"]
    if where == "rollout":
        original = broken.rollout

        def rollout(step):
            if step == 1:
                raise RuntimeError("the sandbox went away")
            return original(step)

        broken.rollout = rollout
    else:

        def learn(episodes):
            raise RuntimeError("the sandbox went away")

        broken.learn = learn
    sweep = Sweep(runs)
    with caplog.at_level(logging.ERROR, logger="mappa_train.sweep"):
        outcomes = sweep.run()
    assert sweep.failed == ["process-s1"]
    failed = outcomes["process-s1"]
    assert not failed.ok
    assert failed.error == "RuntimeError: the sandbox went away"
    assert failed.step == (1 if where == "rollout" else 0)
    assert "process-s1" in failed.describe()
    assert "failed" in failed.describe()
    assert any("process-s1" in r.getMessage() for r in caplog.records)
    # The other run carried on to its last step, and was not taken ahead of its turn.
    assert outcomes["outcome-s2"].ok
    assert [s for n, s in sweep.order if n == "outcome-s2"] == [0, 1]


def test_an_interrupted_sweep_resumes_each_run_exactly(tmp_path, alone, model_dir):
    runs = trainers(tmp_path, model_dir)
    second = runs["outcome-s2"]
    original = second.rollout

    def rollout(step):
        if step == 1:
            # As Ctrl-C, between the two runs' steps, once the first run's second update
            # (queued behind this run's first) has saved its checkpoint: an update not
            # yet started when the sweep stops is dropped, and redone at resume.
            saved = tmp_path / "process-s1" / "checkpoints" / "step-000002"
            deadline = time.monotonic() + 120
            while not saved.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            raise KeyboardInterrupt
        return original(step)

    second.rollout = rollout
    with pytest.raises(KeyboardInterrupt):
        Sweep(runs).run()
    # Killed with one run a step ahead of the other: each resumes from its own checkpoint.
    done = {n: sorted(p.name for p in (tmp_path / n / "checkpoints").glob("step-*")) for n in RUNS}
    assert done == {"process-s1": ["step-000001", "step-000002"], "outcome-s2": ["step-000001"]}
    sweep = Sweep(trainers(tmp_path, model_dir))
    outcomes = sweep.run()
    assert all(o.ok for o in outcomes.values()), outcomes
    assert sweep.order == [("outcome-s2", 1)]
    assert_same_runs(tmp_path, alone, model_dir)


def test_mappa_train_sweep_trains_each_run_and_exits_1_naming_a_failed_one(
    tmp_path, model_dir, monkeypatch, capsys
):
    from mappa_train.command import main

    recipe = {
        "env": "MathChat-v0",
        "system": str(model_dir),
        "coach": "rules",
        "env_options": {"sandbox": None, "tasks": "gen:4"},
        "steps": 1,
        "prompts_per_step": 1,
        "samples_per_prompt": 2,
        "max_new_tokens": 8,
        "train_batch_size": 2,
        "micro_batch_size": 2,
        "tensorboard": False,
        "progress": False,
        "gradient_checkpointing": False,
    }
    (tmp_path / "recipe.json").write_text(json.dumps(recipe))
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(
        "recipe: recipe.json\narms:\n  outcome: {credit_mode: outcome}\n"
        "  process: {credit_mode: process}\nseeds: [3]\n"
    )
    learn = Trainer.learn

    def failing_learn(self, episodes):
        if self.config.credit_mode == "process":
            raise RuntimeError("out of memory")
        return learn(self, episodes)

    monkeypatch.setattr(Trainer, "learn", failing_learn)
    out = tmp_path / "runs"
    code = main(["train", "--sweep", str(sweep_file), "--output-dir", str(out), "--lr", "1e-3"])
    captured = capsys.readouterr()
    assert code == 1
    assert "1 of 2 runs failed: process-s3" in captured.err
    summary = json.loads((out / "sweep.json").read_text())
    assert summary["outcome-s3"]["ok"]
    assert summary["process-s3"]["error"] == "RuntimeError: out of memory"
    saved = json.loads((out / "outcome-s3" / "config.json").read_text())
    assert (saved["seed"], saved["lr"], saved["credit_mode"]) == (3, 1e-3, "outcome")
    # A file that is not a sweep file: one line saying what it must hold.
    sweep_file.write_text("recipe: recipe.json\nseed: [3]\n")
    assert main(["train", "--sweep", str(sweep_file)]) == 2
    assert "unknown keys ['seed']" in capsys.readouterr().err
