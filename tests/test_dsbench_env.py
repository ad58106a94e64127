"""DSBench-v0: conformance, scripted scikit-learn pipelines, blame, and agents' garbage."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from pettingzoo.test import api_test, parallel_api_test, seed_test

import mappa_env
from mappa_env.dsbench import skill_cap
from mappa_env.dsbench.reference import analyst_action as analyst
from mappa_env.dsbench.reference import engineer_action
from mappa_env.dsbench.reference import modeler_action as modeler
from mappa_env.dsbench.reference import reference_script as good_script
from mappa_env.envs import dsbench as dsbench_env
from mappa_env.envs.dsbench import DSBenchEnv
from tests.fakes import InProcessSandbox, csv_task


def make_env(**options) -> DSBenchEnv:
    options.setdefault("sandbox", InProcessSandbox)
    options.setdefault("task_ids", ["iris", "diabetes"])
    return mappa_env.make("DSBench-v0", **options)


def code(text: str) -> str:
    return f"Here is my code.\n```python\n{text}\n```"


def play(env: DSBenchEnv, script: dict[str, list[str]], task_id: str) -> None:
    env.reset(options={"task_id": task_id})
    queues = {a: list(v) for a, v in script.items()}
    for agent in env.agent_iter():
        _, _, terminated, truncated, _ = env.last()
        env.step(None if terminated or truncated else queues[agent].pop(0))


@pytest.fixture(scope="module")
def env():
    environment = make_env()
    yield environment
    environment.close()


def by_task(env, task_id):
    return next(t for t in env.tasks if t.id == task_id)


# ---------------------------------------------------------------- scripted episodes


@pytest.mark.parametrize("task_id", ["iris", "diabetes"])
def test_scripted_pipeline_solves_builtin_tasks(env, task_id):
    task = by_task(env, task_id)
    play(env, good_script(task), task_id)
    outcome = env.state()["outcome"]
    assert outcome["success"] is True, outcome
    if task_id == "iris":
        assert outcome["metric"] == "accuracy"
        assert outcome["value"] > 0.8
    else:
        assert outcome["metric"] == "rmse"
        assert outcome["value"] < 0.5 * task.target_range
    rewards = {(r.agent, r.turn): r.reward for r in env.transcript}
    # The top score, capped by how well the model's test predictions match the answers
    # (diabetes: a random forest's rank correlation about 0.6, so 8 on the ladder).
    model = env.transcript[2].tool.extra["artifacts"]["model.pkl"]
    cap = skill_cap(model["test_skill"], task.task_type) / 10
    assert cap >= 0.8
    assert rewards[("data_engineer", 0)] == min(0.9, cap)
    assert rewards[("modeler", 0)] == min(0.9, cap)
    assert rewards[("analyst", 0)] >= 0.6
    assert all(r.verdict.valid for r in env.transcript)


def test_shuffled_submission_scores_identically(env):
    task = by_task(env, "iris")
    play(env, good_script(task), "iris")
    straight = env.state()["outcome"]["value"]
    play(env, good_script(task, shuffle=True), "iris")
    assert env.state()["outcome"]["value"] == straight


def test_observations_list_files_and_upstream_messages(env):
    task = by_task(env, "iris")
    env.reset(options={"task_id": "iris"})
    first = env.observe("data_engineer")["messages"][1]["content"]
    assert "train.csv" in first
    assert "test_answer" not in first
    env.step(engineer_action(task))
    env.step("Saved the three pickles.")
    modeler_prompt = env.observe("modeler")["messages"][1]["content"]
    assert "X_train.pkl" in modeler_prompt
    assert "Saved the three pickles." in modeler_prompt
    info = env.infos["data_engineer"]
    assert {f["name"] for f in info["files"]} >= {"X_train.pkl", "y_train.pkl", "X_test.pkl"}
    assert info["artifacts"]["X_train.pkl"]["loads"] is True


def test_hidden_answers_never_reach_the_workspace(env):
    env.reset(options={"task_id": "iris"})
    names = {p.name for p in env.workdir.rglob("*")}
    assert names == {"train.csv", "test.csv", "sample_submission.csv"}
    test = pd.read_csv(env.workdir / "test.csv")
    assert "species" not in test.columns
    # Built-in answers are held in memory only: no file an agent could find holds them.
    task = by_task(env, "iris")
    assert not Path(task.answers_path).exists()
    assert not list(Path(task.train_path).parents[2].rglob("test_answer.csv"))


def test_zero_padded_ids_and_na_labels_join_correctly(tmp_path):
    """Answers read once and kept in memory join like answers read from disk."""
    task = csv_task(
        tmp_path,
        "padded",
        {
            "train": "id,x,label\n001,1,NA\n002,2,yes\n003,3,NA\n004,4,yes\n",
            "test": "id,x\n007,1\n008,2\n",
            "answers": "id,label\n007,NA\n008,yes\n",
        },
    )
    env = mappa_env.make("DSBench-v0", tasks=[task], sandbox=InProcessSandbox)
    env.reset(options={"task": task})
    env.step(code("open('submission.csv', 'w').write('id,label\\n007,NA\\n008,yes\\n')"))
    env.step("done")
    env.step("x")
    env.step("y")
    outcome = env.state()["outcome"]
    assert outcome["success"] is True, outcome
    assert outcome["value"] == 1.0
    env.close()


def test_a_builtin_task_set_is_shared_by_environments():
    from mappa_env.dsbench import BuiltinTaskSet

    shared = BuiltinTaskSet(names=["iris", "wine"])
    envs = [make_env(tasks=shared, task_ids=["iris"]) for _ in range(2)]
    assert [t.id for t in envs[0].tasks] == ["iris"]
    assert envs[0].tasks[0].train_path == envs[1].tasks[0].train_path  # one copy of the data
    assert not list(shared.root.rglob("test_answer.csv"))  # answers only in memory
    task = envs[0].tasks[0]
    play(envs[0], good_script(task), "iris")
    assert envs[0].state()["outcome"]["success"] is True
    for env in envs:
        env.close()
    assert shared.root.exists()  # environments do not remove a set they were given
    shared.close()
    assert not shared.root.exists()


# ---------------------------------------------------------------- blame and failures


def test_missing_upstream_artifact_blames_upstream(env):
    task = by_task(env, "iris")
    script = {
        "data_engineer": ["I looked at the data; nothing saved."],
        "modeler": [modeler(task), "Could not train."],
        "analyst": [analyst(task), "No model."],
    }
    play(env, script, "iris")
    rewards = {(r.agent, r.turn): r.reward for r in env.transcript}
    assert rewards[("data_engineer", 0)] == 0.1
    assert rewards[("modeler", 0)] == 0.5  # FileNotFoundError caused upstream
    assert rewards[("analyst", 0)] == 0.5
    outcome = env.state()["outcome"]
    assert outcome["success"] is False
    assert outcome["reward"] == 0.0
    assert outcome["fair_value"] == 0.5  # a failed run counts as accuracy 0.5


BAD_ANALYSTS = {
    "extra_rows": "sub = pd.concat([sub, sub.head(3).assign(id=-1)])",
    "missing_ids": "sub = sub.head(5)",
    "nan_values": "sub['species'] = None",
    "wrong_column": "sub = sub.rename(columns={'species': 'label'})",
}


@pytest.mark.parametrize("damage", sorted(BAD_ANALYSTS))
def test_bad_submissions_fail_clearly(env, damage):
    task = by_task(env, "iris")
    script = good_script(task)
    script["analyst"][0] = script["analyst"][0].replace(
        "sub.to_csv", BAD_ANALYSTS[damage] + "\nsub.to_csv"
    )
    play(env, script, "iris")
    outcome = env.state()["outcome"]
    assert outcome["success"] is False
    assert outcome["reason"]
    assert env.transcript[-2].reward <= 0.2


def test_garbage_files_and_deleted_inputs_do_not_crash(env, monkeypatch):
    task = by_task(env, "iris")
    script = {
        "data_engineer": [
            code(
                "import os, pickle\n"
                "pickle.dump('not a frame', open('X_train.pkl', 'wb'))\n"
                "open('y_train.pkl', 'wb').write(b'\\x80\\x04garbage')\n"
                "os.remove('train.csv')"
            ),
            "Done.",
        ],
        "modeler": [modeler(task), "Failed."],
        "analyst": [code("open('submission.csv', 'wb').write(b'\\xff\\xfe\\x00 not csv')"), "x"],
    }
    play(env, script, "iris")
    info = env.transcript[0].tool.extra["artifacts"]
    assert info["y_train.pkl"]["loads"] is False
    assert env.state()["outcome"]["success"] is False
    monkeypatch.setattr(dsbench_env, "MAX_SUBMISSION_BYTES", 10)
    play(env, good_script(task), "iris")
    assert "limit" in env.state()["outcome"]["reason"]


def test_turn_limit_and_code_free_handover(env):
    task = by_task(env, "iris")
    env.reset(options={"task_id": "iris"})
    for _ in range(4):
        assert env.agent_selection == "data_engineer"
        env.step(code("x = 1"))
    assert env.agent_selection == "modeler"
    env.step("nothing to do")
    assert env.agent_selection == "analyst"
    assert task.id == "iris"


# ---------------------------------------------------------------- PettingZoo conformance


def test_pettingzoo_api_and_seed_tests():
    env = make_env(sandbox=None)
    api_test(env, num_cycles=60)
    env.close()
    seed_test(lambda: make_env(sandbox=None), num_cycles=10)
    par = mappa_env.make_parallel("DSBench-v0", sandbox=None, task_ids=["iris"])
    parallel_api_test(par, num_cycles=30)
    par.close()


def test_invalid_reward_is_nan_only_with_a_failing_coach():
    env = make_env(sandbox=None, credit_mode="outcome", coach=None)
    env.reset(options={"task_id": "iris"})
    env.step("hello")
    assert env.rewards["data_engineer"] == 0.0
    assert not math.isnan(env.rewards["data_engineer"])
    env.close()


@pytest.mark.slow
def test_real_jupyter_episode(tmp_path):
    env = mappa_env.make("DSBench-v0", task_ids=["iris"], sandbox="jupyter")
    task = env.tasks[0]
    play(env, good_script(task), "iris")
    assert env.state()["outcome"]["success"] is True
    env.close()


def test_agent_deleting_the_workspace_or_writing_odd_names_does_not_crash(env, tmp_path):
    from mappa_agents.trajectory import ActionSample, save_jsonl

    env.reset(options={"task_id": "iris"})
    env.step(code("open(b'odd\\xff.pkl', 'w').write('x')"))
    names = [f["name"] for f in env.infos["data_engineer"]["files"]]
    assert "odd?.pkl" in names
    env.step(code("import os, shutil; shutil.rmtree(os.getcwd())"))
    env.step(code("print(1)"))  # the workspace is back for the next run
    assert env.infos["data_engineer"]["tool"]["stdout"].strip() == "1"
    row = ActionSample(
        episode_id="e", task_id="t", env_id="DSBench-v0", agent="a", turn=0, step=0,
        policy="p", messages=[], text="x\udcff", reasoning=None, prompt_ids=[],
        response_ids=[], logprobs=[], finish_reason="stop", reward=0.0, reward_valid=True,
    )  # fmt: skip
    save_jsonl(tmp_path / "rows.jsonl", [row])  # a stray surrogate does not lose the file


def test_a_shared_task_set_rejects_unknown_ids_and_lives_with_its_env():
    import gc

    from mappa_env.dsbench import BuiltinTaskSet

    with pytest.raises(ValueError, match="not in the task set"):
        make_env(tasks=BuiltinTaskSet(names=["iris"]), task_ids=["nope"])
    env = make_env(tasks=BuiltinTaskSet(names=["iris"]), task_ids=None)
    gc.collect()  # only the environment holds the set now
    env.reset(options={"task_id": "iris"})
    assert (env.workdir / "train.csv").exists()
    env.close()


@pytest.mark.parametrize(
    ("option", "value"), [("max_new_tokens", 0), ("code_timeout_s", 0.0), ("code_timeout_s", -1)]
)
def test_bad_limits_are_refused_by_name(option, value):
    with pytest.raises(ValueError, match=f"{option}=.* is out of range: {option} must be"):
        DSBenchEnv(sandbox=None, **{option: value})


# ---------------------------------------------------------------- progress, not padding


def slot_scores(env: DSBenchEnv, turns: list[str]) -> list[float]:
    """The data engineer's scores on iris for ``turns`` (its slot ends after them)."""
    env.reset(options={"task_id": "iris"})
    scores = []
    for turn in turns:
        assert env.agent_selection == "data_engineer"
        env.step(turn)
        scores.append(env.infos["data_engineer"]["coach"]["score"])
    return scores


def test_padding_split_cells_and_reruns_never_out_earn_handing_over(env):
    task = by_task(env, "iris")
    honest = engineer_action(task)
    handed = slot_scores(env, [honest, "Saved the three files."])
    padded = slot_scores(env, [honest, *(code(f"print({i})") for i in range(3))])
    rerun = slot_scores(env, [honest, honest, "Saved the three files."])
    explore = "import pandas as pd\ntrain = pd.read_csv('train.csv')\nprint(train.shape)"
    split = slot_scores(
        env, [code(explore), code(explore + "\nprint(train.columns)"), honest, "Saved."]
    )
    assert handed == [9.0, 8.0]
    assert padded == [9.0, 0.0, 0.0, 0.0]
    assert rerun == [9.0, 0.0, 8.0]
    # Split into cells, the work earns over the slot what it earns in one.
    assert split[0] == 4.0
    assert split[1] == 0.0
    assert sum(split) <= sum(handed)
    assert max(map(sum, (padded, rerun, split))) <= sum(handed)
