"""``mappa train`` with an LLM coach over real HTTP: a judge on 127.0.0.1 scores every action.

The run's rewards must be the judge's verdicts / 10; verdicts it cannot give must be
masked out of the update and counted; and an outage of the judge in the middle of the
run must cost the actions of that step their rewards (bounded retries, then invalid
verdicts, masked and counted), not the run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before litellm is imported
pytest.importorskip("litellm")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from mappa_agents.tiny_models import tiny_model_dir
from mappa_agents.trajectory import load_jsonl
from mappa_train.command import main
from tests.openai_stub_server import StubReply, run_stub_server
from tests.toy_env import toy_train_config

_ACTION = re.compile(
    r"## What the agent produced \(its action\)\n(?:<<<agent text (\w+)>>>\n(.*?)\n<<<end \1>>>"
    r"|\(empty output\))",
    re.DOTALL,
)


class ScriptedJudge:
    """Scores each distinct action ``sha256(action) % 11``; every third new action gets a
    reply with no score (and again when asked to correct it); down while ``down()``."""

    def __init__(self, down) -> None:
        self.down = down
        self.verdicts: dict[str, float | None] = {}
        self.lock = threading.Lock()

    def __call__(self, request):
        if self.down():
            return StubReply(status=503, error_message="the judge is down")
        prompt = next(m["content"] for m in request.messages if m["role"] == "user")
        match = _ACTION.search(prompt)
        action = (match.group(2) or "") if match else ""
        with self.lock:
            if action not in self.verdicts:
                unusable = len(self.verdicts) % 3 == 1
                digest = int(hashlib.sha256(action.encode()).hexdigest(), 16)
                self.verdicts[action] = None if unusable else float(digest % 11)
            score = self.verdicts[action]
        if score is None:
            return "I would rather not say."
        return f"The writer wrote {len(action)} characters.\nPROCESS_SCORE: {score:g}"


def test_mappa_train_with_an_llm_coach_over_http(tmp_path):
    rollouts = tmp_path / "run" / "rollouts"
    # Down while the second step rolls out: the first step's rollouts are saved, the
    # second's not yet.
    judge = ScriptedJudge(
        down=lambda: (
            (rollouts / "step-000000.jsonl").exists()
            and not (rollouts / "step-000001.jsonl").exists()
        )
    )
    with run_stub_server(judge) as server:
        coach = (
            f"llm:openai/judge?api_base={server.base_url}&api_key=x&structured_output=text"
            "&max_retries=2&backoff_initial_s=0.01&backoff_max_s=0.05&timeout=10"
        )
        config = toy_train_config(
            tmp_path,
            tiny_model_dir(tmp_path / "model"),
            env="tests.toy_env:LetterEnv",
            coach=coach,
            steps=3,
            prompts_per_step=2,
            samples_per_prompt=2,
            concurrency=4,
        )
        path = tmp_path / "config.json"
        path.write_text(json.dumps(config.to_dict()))
        assert main(["train", "--config", str(path)]) == 0

    steps = [load_jsonl(rollouts / f"step-{i:06d}.jsonl") for i in range(3)]
    metrics = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for step, samples, stats in zip(range(3), steps, metrics):
        assert len(samples) == 4
        invalid = [s for s in samples if not s.reward_valid]
        for sample in samples:
            verdict = judge.verdicts.get(sample.text) if step != 1 else None
            if verdict is None:
                # No score: flagged, never a reward; masked out of the update.
                assert not sample.reward_valid
                assert sample.coach["valid"] is False
                assert sample.coach["score"] is None
                assert sample.trainable_reward is None
            else:
                assert sample.reward_valid
                assert sample.reward == pytest.approx(verdict / 10)
                assert sample.coach["score"] == verdict
        assert stats["writer/masked_invalid"] == len(invalid)
        assert stats["writer/actions"] == len(samples) - len(invalid)
        assert stats["rollout/invalid_coach_rate"] == pytest.approx(len(invalid) / 4)
    # The first step had unusable replies (one format correction each, then invalid);
    # the outage made every verdict of the second invalid after bounded retries; the
    # third was scored again.
    assert 0 < sum(not s.reward_valid for s in steps[0]) < 4
    assert all(s.coach["attempts"] == 2 for s in steps[0] if not s.reward_valid)
    assert all("the judge is down" in s.coach["error"] for s in steps[1])
    assert all(s.coach["attempts"] == 3 for s in steps[1])  # 1 call + max_retries=2
    assert any(s.reward_valid for s in steps[2])
