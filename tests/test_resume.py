"""Resume takes only a whole checkpoint of the run's own settings, and says why not."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from mappa_agents.tiny_models import build_tiny_model, build_tiny_tokenizer, tiny_model_dir  # noqa: E402
from mappa_train import checkpoint as ckpt  # noqa: E402
from mappa_train.resume import (  # noqa: E402
    ResumeError,
    checkpoint_damage,
    checkpoint_to_resume,
    resume_mismatches,
)
from mappa_train.trainer import Trainer  # noqa: E402
from tests.toy_env import LetterEnv, toy_train_config  # noqa: E402


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A Letter-v0 run of two steps with a checkpoint after each (width-64 model)."""
    base = tmp_path_factory.mktemp("resume")
    model = tiny_model_dir(base / "model")
    config = toy_train_config(
        base, model, steps=2, prompts_per_step=1, samples_per_prompt=2, max_new_tokens=4,
        train_batch_size=2, micro_batch_size=2, save_every=1, keep_checkpoints=0,
    )  # fmt: skip
    trainer = Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)
    trainer.train()
    return base, model, config


def _trainer(config):
    return Trainer(config, env_factory=LetterEnv, eval_env_factory=LetterEnv)


def test_a_checkpoint_of_another_model_is_refused_naming_the_fix(trained_run, tmp_path):
    _, _, config = trained_run
    wide = tmp_path / "wide"
    tokenizer = build_tiny_tokenizer()
    build_tiny_model(tokenizer, hidden_size=128).save_pretrained(wide)
    tokenizer.save_pretrained(wide)
    trainer = _trainer(dataclasses.replace(config, system=str(wide)))
    with pytest.raises(ResumeError) as caught:
        trainer.setup()
    message = str(caught.value)
    assert "writer was trained from" in message
    assert "hidden_size 64 vs 128" in message
    assert f"--system '{config.system}'" in message
    assert "another --output-dir" in message


def test_other_environment_agents_or_lora_are_named(trained_run):
    base, _, config = trained_run
    newest = ckpt.latest_checkpoint(base / "run" / "checkpoints")
    specs = {"writer": config.system}
    assert resume_mismatches(newest, config, specs, ["writer"]) == []
    other_env = dataclasses.replace(config, env="MathChat-v0")
    (problem,) = resume_mismatches(newest, other_env, specs, ["writer"])
    assert "trained on 'Letter-v0', this run asks for 'MathChat-v0' (--env Letter-v0)" in problem
    (problem,) = resume_mismatches(newest, config, {**specs, "reader": "m"}, ["writer", "reader"])
    assert "this run trains ['reader', 'writer'] (--train-agents writer)" in problem
    lora = dataclasses.replace(config, lora_rank=8)
    assert "(--lora-rank 0)" in resume_mismatches(newest, lora, specs, ["writer"])[0]


def test_a_damaged_newest_checkpoint_is_named_and_the_intact_one_offered(trained_run, tmp_path):
    base, _, config = trained_run
    run = tmp_path / "run"

    shutil.copytree(base / "run", run)
    root = run / "checkpoints"
    older, newest = ckpt.complete_checkpoints(root)
    weights = newest / "agents" / "writer" / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    assert checkpoint_damage(older) is None
    assert checkpoint_damage(newest).startswith("agents/writer/model.safetensors: truncated")
    config = dataclasses.replace(config, output_dir=str(run))
    with pytest.raises(ResumeError) as caught:
        checkpoint_to_resume(root, config, {"writer": config.system}, ["writer"])
    message = str(caught.value)
    assert f"{newest} is damaged (agents/writer/model.safetensors: truncated" in message
    assert f"the newest intact one is {older}. Pass --resume-intact" in message
    resumed = _trainer(dataclasses.replace(config, resume_intact=True))
    resumed.setup()
    assert resumed.step == 1
    assert (root / "step-000002.damaged").is_dir()
    assert ckpt.latest_checkpoint(root) == older


def test_other_damage_is_found_too(trained_run, tmp_path):
    base, _, _ = trained_run

    checkpoint = tmp_path / "step-000001"
    shutil.copytree(ckpt.complete_checkpoints(base / "run" / "checkpoints")[0], checkpoint)
    optimizer = checkpoint / "agents" / "writer" / "optimizer.pt"
    os.truncate(optimizer, optimizer.stat().st_size - 10)
    assert checkpoint_damage(checkpoint).startswith("agents/writer/optimizer.pt: ")
    (checkpoint / "trainer_state.json").write_text('{"step": ')
    assert checkpoint_damage(checkpoint).startswith("trainer_state.json: JSONDecodeError")
    (checkpoint / "trainer_state.json").write_text(json.dumps({"step": 1}))


def _train_argv(model, out, *flags):
    return [
        "train", "--system", str(model), "--tasks", "gen:8", "--sandbox", "none",
        "--prompts-per-step", "1", "--samples-per-prompt", "2", "--max-new-tokens", "4",
        "--train-batch-size", "2", "--micro-batch-size", "2", "--output-dir", str(out),
        "--no-progress", "--no-tensorboard", "--save-every", "1", *flags,
    ]  # fmt: skip


def test_a_resumed_run_says_where_it_restarted_and_counts_only_its_own_steps(tmp_path, capsys):
    from mappa_train.command import main

    model = tiny_model_dir(tmp_path / "model")
    out = tmp_path / "run"
    assert main(_train_argv(model, out, "--steps", "1")) == 0
    assert capsys.readouterr().out.startswith("trained 1 step (step 1); ")
    assert main(_train_argv(model, out, "--steps", "3")) == 0
    printed = capsys.readouterr().out.splitlines()
    newest = out / "checkpoints" / "step-000001"
    assert printed[0] == f"mappa train: resumed from step 1 (checkpoint {newest})"
    # It said "trained 3 steps" after training two.
    assert printed[1].startswith("trained 2 steps (steps 2..3); ")


def test_ctrl_c_in_training_is_one_line_with_the_command_that_resumes(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    model = tiny_model_dir(tmp_path / "model")
    out = tmp_path / "run"
    # -X faulthandler: a child that does not stop is made to print every thread's stack.
    argv = [sys.executable, "-X", "faulthandler", "-m", "mappa_train",
            *_train_argv(model, out, "--steps", "100000")]  # fmt: skip
    # A process started with SIGINT ignored (a background job of a script, nohup) passes
    # that on, and Python then leaves Ctrl-C ignored, as asked: the suite run that way
    # would find training going on for good. The child gets Python's own handler, so
    # what is tested is what a terminal's Ctrl-C does (handlers become the default at exec).
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
    finally:
        signal.signal(signal.SIGINT, ignored)
    try:
        # Interrupted once training runs: a step logged and its checkpoint complete.
        deadline = time.monotonic() + 300
        while ckpt.latest_checkpoint(out / "checkpoints") is None:
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, "training never started"
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        try:
            output, _ = process.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)  # faulthandler prints the stacks
            stacks, _ = process.communicate(timeout=60)
            pytest.fail(f"training went on 150 s after Ctrl-C; its threads:\n{stacks[-8000:]}")
    finally:
        if process.poll() is None:
            process.kill()
    lines = output.strip().splitlines()
    assert process.returncode == 130, output
    assert "Traceback" not in output  # it was a 75-line chained traceback
    assert lines[-1].startswith("mappa train: interrupted after "), output
    assert f"of 100000 steps; `{sys.executable} -m mappa_train train --system {model} " in lines[-1]
    assert "` resumes it from its newest checkpoint (" in lines[-1]


def test_a_ctrl_c_that_lands_in_a_finalizer_still_stops_training_after_its_step(tmp_path, recwarn):
    import gc
    import signal

    from mappa_train.interrupts import ctrl_c_guard

    class DropsItsException:
        """Python prints and drops what a finalizer raises: a Ctrl-C landing here is lost."""

        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # bytecode boundaries, where Python runs the handler
                pass

    trainer = Trainer(
        toy_train_config(tmp_path, tiny_model_dir(tmp_path / "model"), steps=3),
        env_factory=LetterEnv,
        eval_env_factory=LetterEnv,
    )
    rollout = trainer.rollout

    def rollout_then_a_lost_ctrl_c(step):
        episodes = rollout(step)
        if step == 0:
            DropsItsException()
            gc.collect()
        return episodes

    trainer.rollout = rollout_then_a_lost_ctrl_c
    # As in a terminal: Python's own handler (a test runner may have set another).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with ctrl_c_guard(), pytest.raises(KeyboardInterrupt):
            trainer.train()
    finally:
        signal.signal(signal.SIGINT, previous)
        trainer.close()
    assert trainer.step == 1  # not 3: the Ctrl-C stopped it after its step
    # Recorded, not raised, inside the finalizer: nothing printed as "Exception ignored".
    assert not [
        w for w in recwarn if issubclass(w.category, pytest.PytestUnraisableExceptionWarning)
    ]


def test_a_full_disk_in_safetensors_is_the_one_line_of_a_full_disk(tmp_path, monkeypatch, capsys):
    import transformers.modeling_utils
    from safetensors import SafetensorError

    from mappa_train.command import main

    def full(*args, **kwargs):
        # What safetensors raises when the disk fills up while it writes weights.
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    model = tiny_model_dir(tmp_path / "model")
    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)
    out = tmp_path / "run"
    assert main(_train_argv(model, out, "--steps", "1")) == 1
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err  # it was a 38-line traceback
    last = err.splitlines()[-1]
    assert last.startswith(f"mappa train: the disk is full writing {out / 'checkpoints'}/")
    assert "/agents/" in last  # the agent's weights being written
    assert "(No space left on device). Free space and run the same command again" in last
    quota = SafetensorError("I/O error: Disk quota exceeded (os error 122)")
    assert ckpt.os_error_of(quota, "x").errno == 122
    assert ckpt.os_error_of(SafetensorError("header too large"), "x") is None
