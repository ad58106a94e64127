"""mean@k / pass@k estimators, K samples per task in ``mappa eval``, checkpoint specs,
``api:`` spec query strings and the all-episodes-failed stop."""

from __future__ import annotations

import json
import shutil

import pytest

from mappa_agents.checkpoints import CheckpointError, latest_checkpoint, resolve_checkpoint
from mappa_agents.cli import NOTHING_MEASURED, eval_plan, nothing_measured
from mappa_agents.metrics import (
    bootstrap_interval,
    estimate,
    mean_at_k,
    paired_difference,
    pass_at_k,
    sample_metrics,
)
from mappa_agents.report import (
    AllEpisodesFailedError,
    check_some_finished,
    per_task_results,
    plot_report,
    summarize_samples,
)
from mappa_agents.runner import classify_verdict, progress_postfix
from mappa_agents.system import parse_system_spec
from mappa_agents.trajectory import EpisodeResult
from tests.openai_stub_server import StubReply, run_stub_server

AGENTS = ["problem_solver", "code_executor", "verifier"]

# ------------------------------------------------------------------ estimators


def test_pass_at_k_matches_hand_computed_values():
    # 1 - C(n-c, k) / C(n, k)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # C(3,2)=3, C(4,2)=6
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # C(2,2)=1
    assert pass_at_k(5, 1, 3) == pytest.approx(1 - 4 / 10)  # C(4,3)=4, C(5,3)=10
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 1, 4) == 1.0  # n - c < k: every draw holds the correct one
    assert pass_at_k(3, 3, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(mean_at_k(4, 1)) == 0.25  # pass@1 = c/n
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_sample_metrics_average_over_tasks():
    # tasks: 2/4, 0/4, 4/4 correct -> mean@4 = (0.5 + 0 + 1) / 3, pass@4 = (1 + 0 + 1) / 3
    # pass@2 of the first: 1 - C(2,2)/C(4,2) = 5/6
    metrics = sample_metrics([(4, 2), (4, 0), (4, 4), (0, 0)], k=4)
    assert metrics["mean_at_k"]["value"] == pytest.approx(0.5)
    assert metrics["pass_at_k"]["value"] == pytest.approx(2 / 3)
    assert metrics["mean_at_k"]["tasks"] == 3  # the task without samples is left out
    assert sample_metrics([(4, 2), (4, 0)], k=2)["pass_at_k"]["value"] == pytest.approx(5 / 12)


def test_bootstrap_interval_is_fixed_and_brackets_the_mean():
    values = [0.0, 0.25, 0.5, 1.0, 1.0, 0.75]
    low, high = bootstrap_interval(values)
    assert low <= sum(values) / len(values) <= high
    assert 0.0 <= low < high <= 1.0
    assert bootstrap_interval(values) == (low, high)  # fixed seed
    assert bootstrap_interval([0.4]) == (0.4, 0.4)
    assert bootstrap_interval([]) is None
    assert estimate([]) == {"value": None, "ci95": None, "tasks": 0}
    same = estimate([1.0, 1.0, 1.0])
    assert same["value"] == 1.0
    assert same["ci95"] == [1.0, 1.0]


def test_paired_difference_uses_shared_tasks_only():
    base = {"a": 0.0, "b": 0.5, "c": 1.0}
    other = {"a": 0.5, "b": 1.0, "d": 0.0}
    diff = paired_difference(base, other)
    assert diff["tasks"] == 2
    assert diff["value"] == pytest.approx(0.5)
    assert diff["ci95"] == [pytest.approx(0.5), pytest.approx(0.5)]
    assert paired_difference({"a": 1.0}, {"b": 1.0}) is None


# ------------------------------------------------------------------ report rows


def _episode(index, task_id, correct, task_type="arithmetic", error=None):
    outcome = (
        {"error": error, "aborted": True}
        if error
        else {"correct": correct, "reward": float(correct), "task_type": task_type}
    )
    return EpisodeResult(f"ep-{index:05d}", task_id, "MathChat-v0", [], outcome)


def test_per_task_rows_and_per_task_type_metrics():
    episodes = [
        _episode(0, "t0", True),
        _episode(1, "t0", False),
        _episode(2, "t1", False, "algebra"),
        _episode(3, "t1", False, "algebra"),
        _episode(4, "t1", False, error="generation failed"),
    ]
    rows = per_task_results(episodes)
    assert rows[0] == {
        "task_id": "t0",
        "task_type": "arithmetic",
        "samples": 2,
        "correct": 1,
        "aborted": 0,
        "mean_outcome_reward": 0.5,
    }
    assert rows[1]["samples"] == 2
    assert rows[1]["aborted"] == 1
    summary = summarize_samples(rows, k=2)
    assert summary["mean_at_k"]["value"] == pytest.approx(0.25)
    assert summary["pass_at_k"]["value"] == pytest.approx(0.5)
    assert summary["per_task_type"]["arithmetic"]["pass_at_k"]["value"] == 1.0
    assert summary["per_task_type"]["algebra"]["mean_at_k"]["value"] == 0.0


def test_all_failed_episodes_stop_with_the_first_error(tmp_path):
    episodes = [
        _episode(0, "", False, error="reset failed: boom"),
        _episode(1, "", False, error="x"),
    ]
    with pytest.raises(AllEpisodesFailedError, match=r"all 2 episodes failed.*reset failed: boom"):
        check_some_finished(episodes)
    check_some_finished([*episodes, _episode(2, "t0", True)])
    assert plot_report(episodes, tmp_path) == []  # no action, no plot (and no crash)


def test_eval_plan_runs_each_task_k_times():
    ids = ["a", "b", "c"]
    assert eval_plan(ids) is None
    assert eval_plan(ids, episodes=5) is None
    plan = eval_plan(ids, samples_per_task=2, num_eval_tasks=2)
    assert [o["task_id"] for o in plan] == ["a", "a", "b", "b"]
    assert len(eval_plan(ids, samples_per_task=4)) == 12
    with pytest.raises(SystemExit, match="--episodes conflicts"):
        eval_plan(ids, episodes=4, samples_per_task=2)
    with pytest.raises(SystemExit, match="between 1 and the 3 tasks"):
        eval_plan(ids, num_eval_tasks=9)
    with pytest.raises(SystemExit, match="task list"):
        eval_plan([], samples_per_task=2)


def test_coach_verdicts_are_classified_for_the_progress_line():
    assert classify_verdict(None) is None
    assert classify_verdict({"valid": True, "score": 5}) == "valid"
    timeout = {"valid": False, "error": "transient API error ...: APITimeoutError: Timeout"}
    assert classify_verdict(timeout) == "timeout"
    assert classify_verdict({"valid": False, "error": "deadline_s=60 passed"}) == "timeout"
    assert classify_verdict({"valid": False, "error": "no usable score"}) == "invalid"
    postfix = progress_postfix({}, {"valid": 7, "timeout": 1, "invalid": 2})
    assert postfix == {"success": "0/0", "coach_timeouts": "1", "coach_invalid": "3/10"}
    assert progress_postfix({}, {}) == {"success": "0/0"}


def test_eval_reports_verdict_failures_by_cause():
    from mappa_agents.report import format_table
    from mappa_agents.runner import verdict_failure

    assert verdict_failure(None) is None
    assert verdict_failure({"valid": True, "score": 5}) is None
    assert verdict_failure({"valid": False, "failure": "http_500", "error": "..."}) == "http_500"
    assert verdict_failure({"valid": False, "failure": "timeout"}) == "timeout"
    assert verdict_failure({"valid": False, "error": "deadline_s=60 passed"}) == "timeout"
    assert verdict_failure({"valid": False, "error": "rubric failed"}) == "invalid"
    report = {
        "env_id": "MathChat-v0", "episodes": 2, "success_rate": 0.0,
        "mean_outcome_reward": 0.0, "invalid_coach_rate": 1.0, "per_agent": {},
        "coach_failures": {"connection": 2, "http_429": 1, "http_500": 3},
    }  # fmt: skip
    assert "(by cause: connection 2, http_429 1, http_500 3)" in format_table(report)


# ------------------------------------------------------------------ checkpoint specs


def _fake_checkpoint(run, step, agents, system=None):
    path = run / "checkpoints" / f"step-{step:06d}"
    for agent in agents:
        (path / "agents" / agent).mkdir(parents=True)
        (path / "agents" / agent / "config.json").write_text("{}")
    state = {"step": step, "config": {"system": system} if system else {}}
    (path / "trainer_state.json").write_text(json.dumps(state))
    (path / "COMPLETE").write_text(f"step {step}\n")
    return path


def test_checkpoint_specs_resolve_per_agent(tmp_path, caplog):
    run = tmp_path / "run"
    _fake_checkpoint(run, 5, AGENTS)
    newest = _fake_checkpoint(run, 10, AGENTS)
    (run / "checkpoints" / "step-000020").mkdir()  # no COMPLETE marker: not a checkpoint
    assert latest_checkpoint(run / "checkpoints") == newest
    for spec in (run, run / "checkpoints", newest):
        assert resolve_checkpoint(spec) == newest
        per_agent = parse_system_spec(str(spec), AGENTS)
        assert per_agent == {a: str(newest / "agents" / a) for a in AGENTS}
    mixed = parse_system_spec(f"problem_solver={run},code_executor=m,verifier=m", AGENTS)
    assert mixed["problem_solver"] == str(newest / "agents" / "problem_solver")
    assert mixed["verifier"] == "m"

    frozen = _fake_checkpoint(tmp_path / "frozen", 3, ["problem_solver"], system="base-model")
    with caplog.at_level("WARNING"):
        per_agent = parse_system_spec(str(tmp_path / "frozen"), AGENTS)
    assert per_agent["problem_solver"] == str(frozen / "agents" / "problem_solver")
    assert per_agent["verifier"] == "base-model"
    assert "frozen in training" in caplog.text


def _train_run_dir(run, step=10):
    """A run directory as ``mappa train`` leaves it: its TrainConfig in config.json too."""
    from mappa_train.config import TrainConfig

    checkpoint = _fake_checkpoint(run, step, AGENTS)
    run.joinpath("config.json").write_text(json.dumps(TrainConfig().to_dict()))
    run.joinpath("metrics.jsonl").write_text('{"step": 1}\n')
    return checkpoint


def test_a_real_run_dir_with_its_training_config_is_a_checkpoint_spec(tmp_path):
    run = tmp_path / "run"
    newest = _train_run_dir(run)
    assert parse_system_spec(str(run), AGENTS) == {a: str(newest / "agents" / a) for a in AGENTS}
    # A model directory stays one, beside a run's files or not.
    model = tmp_path / "model"
    model.mkdir()
    model.joinpath("config.json").write_text('{"model_type": "llama"}')
    assert parse_system_spec(str(model), AGENTS) == dict.fromkeys(AGENTS, str(model))


def test_the_documented_checkpoint_eval_commands_resolve(tmp_path, monkeypatch):
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "evaluation.md"
    commands = [
        line.split("#")[0].split("--system", 1)[1].strip().strip('"')
        for line in page.read_text().splitlines()
        if line.startswith("mappa eval --system") and "runs/x" in line
    ]
    assert len(commands) >= 3, commands
    _train_run_dir(tmp_path / "runs" / "x")
    monkeypatch.chdir(tmp_path)
    for spec in commands:
        per_agent = parse_system_spec(spec, AGENTS)
        assert set(per_agent) == set(AGENTS), spec


def test_checkpoint_spec_errors_say_what_to_do(tmp_path):
    lacking = tmp_path / "lacking"
    _fake_checkpoint(lacking, 1, ["problem_solver"])
    with pytest.raises(CheckpointError, match="no weights for agent 'code_executor'"):
        parse_system_spec(str(lacking), AGENTS)
    empty = tmp_path / "empty" / "checkpoints"
    empty.mkdir(parents=True)
    with pytest.raises(CheckpointError, match="holds no complete checkpoint"):
        parse_system_spec(str(tmp_path / "empty"), AGENTS)


def test_an_incomplete_checkpoint_given_explicitly_says_so(tmp_path):
    run = tmp_path / "run"
    complete = _fake_checkpoint(run, 10, AGENTS)
    incomplete = _fake_checkpoint(run, 20, AGENTS)
    (incomplete / "COMPLETE").unlink()  # still being written
    with pytest.raises(CheckpointError, match="is an incomplete checkpoint") as caught:
        parse_system_spec(str(incomplete), AGENTS)
    assert "no COMPLETE marker" in str(caught.value)
    assert f"the newest complete checkpoint beside it is {complete}" in str(caught.value)
    # a lone incomplete checkpoint, named or not like step-NNNNNN
    lone = tmp_path / "lone" / "step-000001"
    (lone / "agents" / "verifier").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="no complete checkpoint beside it"):
        parse_system_spec(str(lone), AGENTS)
    renamed = tmp_path / "my-ckpt"
    (renamed / "agents").mkdir(parents=True)
    (renamed / "trainer_state.json").write_text("{}")
    with pytest.raises(CheckpointError, match="is an incomplete checkpoint"):
        parse_system_spec(str(renamed), AGENTS)
    assert parse_system_spec(str(run), AGENTS)["verifier"] == str(complete / "agents/verifier")


def test_each_distinct_checkpoint_spec_is_resolved_once(tmp_path, monkeypatch):
    from mappa_agents import checkpoints

    run = tmp_path / "run"
    _fake_checkpoint(run, 1, AGENTS)
    calls = []
    real = checkpoints.resolve_checkpoint

    def resolve_then_save_newer(path):
        calls.append(str(path))
        found = real(path)
        _fake_checkpoint(run, 1 + len(calls), AGENTS)  # training saves on meanwhile
        return found

    monkeypatch.setattr(checkpoints, "resolve_checkpoint", resolve_then_save_newer)
    per_agent = parse_system_spec(str(run), AGENTS)
    assert calls == [str(run)]
    assert per_agent == {a: str(run / "checkpoints" / "step-000001" / "agents" / a) for a in AGENTS}


# ------------------------------------------------------------------ end to end


def _eval(*extra):
    pytest.importorskip("transformers")
    from mappa_train.command import main

    return main(
        [
            "eval", "--env", "MathChat-v0", "--coach", "rules", "--max-new-tokens", "4",
            "--num-tasks", "3", "--sandbox", "none", "--no-progress", *extra,
        ]
    )  # fmt: skip


def test_eval_samples_per_task_reports_mean_and_pass_at_k(tmp_path, capsys):
    from mappa_agents.tiny_models import tiny_model_dir

    model = tiny_model_dir(tmp_path / "model")
    out = tmp_path / "out"
    code = _eval(
        "--system", str(model), "--samples-per-task", "2", "--num-eval-tasks", "2",
        "--out", str(out),
    )  # fmt: skip
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["episodes"] == 4
    assert report["samples_per_task"] == 2
    assert [(r["task_id"], r["samples"]) for r in report["per_task"]] == [
        (report["per_task"][0]["task_id"], 2),
        (report["per_task"][1]["task_id"], 2),
    ]
    for key in ("mean_at_k", "pass_at_k"):
        assert report[key]["tasks"] == 2
        assert len(report[key]["ci95"]) == 2
    assert report["per_task_type"]
    assert "mean@2" in capsys.readouterr().out


def test_eval_a_checkpoint_gives_each_agent_its_weights(tmp_path, monkeypatch):
    from mappa_agents import models
    from mappa_agents.tiny_models import tiny_model_dir

    model = tiny_model_dir(tmp_path / "model")
    step = tmp_path / "run" / "checkpoints" / "step-000002"
    for agent in AGENTS:
        shutil.copytree(model, step / "agents" / agent)
    (step / "trainer_state.json").write_text('{"step": 2, "config": {}}')
    (step / "COMPLETE").write_text("step 2\n")
    real_load = models.load_policy

    def load_while_training_saves(spec, **kwargs):
        # The run saves a newer checkpoint while eval loads: the report keeps the one used.
        newer = tmp_path / "run" / "checkpoints" / "step-000004"
        if not newer.exists():
            shutil.copytree(step, newer)
        return real_load(spec, **kwargs)

    monkeypatch.setattr(models, "load_policy", load_while_training_saves)
    out = tmp_path / "out"
    assert _eval("--system", str(tmp_path / "run"), "--episodes", "1", "--out", str(out)) == 0
    assert (tmp_path / "run" / "checkpoints" / "step-000004" / "COMPLETE").is_file()
    report = json.loads((out / "report.json").read_text())
    assert report["system_per_agent"] == {a: str(step / "agents" / a) for a in AGENTS}
    rows = [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]
    assert {row["agent"]: row["policy"] for row in rows} == {
        a: str(step / "agents" / a) for a in AGENTS
    }


def test_api_spec_query_reaches_the_local_server():
    pytest.importorskip("litellm")
    from mappa_agents.models import load_policy
    from mappa_agents.policy import SamplingParams

    with run_stub_server(lambda _request: "\\boxed{4}") as server:
        policy = load_policy(
            f"api:openai/stub-model?api_base={server.base_url}&api_key=k&timeout=20"
        )
        try:
            assert policy.model == "openai/stub-model"
            assert policy.timeout_s == 20.0
            [generation] = policy.generate(
                [[{"role": "user", "content": "2+2?"}]], SamplingParams()
            )
        finally:
            policy.close()
        assert generation.text == "\\boxed{4}"
        assert server.request_count == 1
        assert server.requests[0].body["model"] == "stub-model"
        assert server.requests[0].headers["Authorization"] == "Bearer k"


def test_eval_stops_clearly_when_every_episode_fails(tmp_path, capsys):
    pytest.importorskip("litellm")
    with run_stub_server(lambda _r: StubReply(status=500, error_message="overloaded")) as server:
        spec = f"api:openai/stub-model?api_base={server.base_url}&api_key=k&num_retries=0"
        with pytest.raises(SystemExit) as stopped:
            _eval("--system", spec, "--episodes", "2", "--out", str(tmp_path / "out"))
        assert server.request_count >= 2
    assert stopped.value.code == NOTHING_MEASURED == 3
    assert "mappa eval: all 2 episodes failed; the first error" in capsys.readouterr().err
    assert (tmp_path / "out" / "transcripts.jsonl").exists()
    assert not (tmp_path / "out" / "report.json").exists()


def test_eval_exits_nonzero_when_no_coach_verdict_was_valid(tmp_path, monkeypatch, capsys):
    import mappa_env.coach
    from mappa_agents.tiny_models import tiny_model_dir
    from tests.fakes import FixedCoach

    monkeypatch.setattr(mappa_env.coach, "make_coach", lambda spec: FixedCoach(score=None))
    out = tmp_path / "out"
    code = _eval("--system", str(tiny_model_dir(tmp_path / "model")), "--episodes", "2",
                 "--out", str(out))  # fmt: skip
    assert code == NOTHING_MEASURED  # it exited 0: nothing tells a script the run was void
    report = json.loads((out / "report.json").read_text())  # written all the same
    assert report["coach_verdicts"] == {"invalid": report["actions"]}
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("mappa eval: nothing was measured: none of the ")
    assert "coach verdicts was valid (invalid " in last
    assert "fix the --coach" in last
    assert nothing_measured({"coach_verdicts": {"valid": 1, "invalid": 5}}) is None
    assert nothing_measured({"coach_verdicts": {}}) is None  # no coach ran: nothing to fault


def test_eval_stops_at_the_first_call_a_server_calls_malformed(tmp_path, capsys):
    pytest.importorskip("litellm")
    with run_stub_server(lambda _r: StubReply(status=400, error_message="bad model")) as server:
        spec = f"api:openai/stub-model?api_base={server.base_url}&api_key=k&num_retries=5"
        status = _eval("--system", spec, "--episodes", "2", "--out", str(tmp_path / "out"))
        # Not one failed episode after another: the first answer stops the run.
        assert server.request_count <= 2
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mappa eval: policy openai/stub-model: the server at http")
    assert "HTTP 400: bad model" in err
    assert len(err.splitlines()) == 1


def test_eval_stops_when_the_coach_key_is_rejected(tmp_path, capsys):
    # The coach's 401 used to end each episode in turn (or make invalid verdicts).
    pytest.importorskip("litellm")
    with run_stub_server(lambda _r: "\\boxed{4}", api_key="right") as server:
        system = f"api:openai/stub-model?api_base={server.base_url}&api_key=right"
        coach = f"llm:openai/judge?api_base={server.base_url}&api_key=wrong&structured_output=text"
        status = _eval(
            "--system", system, "--coach", coach, "--episodes", "2", "--out", str(tmp_path / "o")
        )
        judged = [r for r in server.requests if r.body["model"] == "judge"]
        # At most one call per episode in flight: none is retried.
        assert 1 <= len(judged) <= 2
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("mappa eval: coach llm:openai/judge: ")
    assert "rejected the API key (HTTP 401" in err[0]


def test_coach_spec_sets_reply_budget_and_timeout():
    pytest.importorskip("litellm")
    from mappa_env.coach import make_coach

    coach = make_coach("llm:openai/judge?api_base=http://127.0.0.1:9/v1&max_tokens=512&timeout=30")
    try:
        assert (coach.max_tokens, coach.timeout_s, coach.api_base) == (
            512,
            30.0,
            "http://127.0.0.1:9/v1",
        )
    finally:
        coach.close()


def test_a_lora_checkpoint_loads_each_agents_adapter(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from mappa_agents.lora import LoRASettings, shared_lora_model
    from mappa_agents.models import load_policy
    from mappa_agents.tiny_models import tiny_model_dir

    base_dir = tiny_model_dir(tmp_path / "base")
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(base_dir)
    model = shared_lora_model(base, ["problem_solver"], LoRASettings(rank=4))
    step = tmp_path / "run" / "checkpoints" / "step-000001"
    model.save_pretrained(step / "agents", selected_adapters=["problem_solver"])  # as training does
    tokenizer.save_pretrained(step / "agents" / "problem_solver")
    (step / "trainer_state.json").write_text(json.dumps({"config": {"system": str(base_dir)}}))
    (step / "COMPLETE").write_text("step 1\n")
    per_agent = parse_system_spec(str(tmp_path / "run"), AGENTS)
    assert per_agent["problem_solver"] == str(step / "agents" / "problem_solver")
    assert per_agent["verifier"] == str(base_dir)  # frozen in training: the run's model
    policy = load_policy(per_agent["problem_solver"], device="cpu")
    try:
        assert getattr(policy.model, "_hf_peft_config_loaded", False)  # the adapter is on
    finally:
        policy.close()


def test_a_full_disk_while_plotting_is_one_line_and_keeps_the_report(tmp_path, monkeypatch, capsys):
    from mappa_agents import report as report_module
    from mappa_agents.tiny_models import tiny_model_dir

    model = tiny_model_dir(tmp_path / "model")
    out = tmp_path / "out"

    def full(episodes, directory):
        raise OSError(28, "No space left on device", str(directory / "rewards.png"))

    monkeypatch.setattr(report_module, "plot_report", full)
    code = _eval("--system", str(model), "--episodes", "2", "--out", str(out))
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err  # transformers' loading bars come before it
    assert err.splitlines()[-1].startswith("mappa eval: the disk is full")
    assert f"the disk is full writing {out / 'rewards.png'}" in err
    assert "Free space and run the command again" in err
    assert json.loads((out / "report.json").read_text())["episodes"] == 2


def test_a_full_disk_in_training_says_how_to_resume(monkeypatch, capsys):
    import mappa_train.cli
    from mappa_train.command import main

    def full(args):
        raise OSError(122, "Disk quota exceeded", "runs/train/checkpoints/step-3/model.pt")

    monkeypatch.setattr(mappa_train.cli, "run_train", full)
    assert main(["train", "--steps", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert "the disk is full writing runs/train/checkpoints/step-3/model.pt" in err
    assert "it resumes from the newest checkpoint (--resume-intact" in err
    assert len(err.splitlines()) == 1


def test_other_os_errors_are_not_called_a_full_disk(monkeypatch):
    import mappa_train.cli
    from mappa_train.command import main

    def denied(args):
        raise PermissionError(13, "Permission denied", "/root/x")

    monkeypatch.setattr(mappa_train.cli, "run_train", denied)
    with pytest.raises(PermissionError):
        main(["train", "--steps", "1"])


def test_eval_streams_transcripts_and_keeps_them_when_the_disk_fills(tmp_path, monkeypatch):
    from mappa_agents import trajectory
    from mappa_agents.tiny_models import tiny_model_dir

    model = tiny_model_dir(tmp_path / "model")
    out = tmp_path / "out"
    synced = []
    real_fsync = trajectory.os.fsync

    def fsync_until_full(fd):
        # Each finished episode is on disk before the run ends; the third finds it full.
        if len(synced) == 2:
            raise OSError(28, "No space left on device")
        real_fsync(fd)
        synced.append((out / "transcripts.jsonl").read_text().count("\n"))

    monkeypatch.setattr(trajectory.os, "fsync", fsync_until_full)
    code = _eval("--system", str(model), "--episodes", "4", "--concurrency", "1", "--out", str(out))
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["episodes"] == 4
    assert report["transcripts"]["episodes"] == 2
    assert "No space left on device" in report["transcripts"]["error"]
    rows = [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]
    assert len({row["episode_id"] for row in rows}) == 2
    assert len(rows) == synced[-1]  # the failed third episode left no partial lines
