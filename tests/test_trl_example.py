"""TRL's GRPOTrainer takes a step on MathChat-v0 through the OpenEnv server (CPU, tiny model).

examples/trl_grpo_mathchat.py as a user runs it, with a tiny model built in-process and
a server on 127.0.0.1 that the test starts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("openenv")
torch = pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def example(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    import trl_grpo_mathchat

    yield trl_grpo_mathchat
    sys.modules.pop("trl_grpo_mathchat", None)


def _warm_start(model, tokenizer, messages, reply: str, steps: int) -> None:
    """A few supervised steps toward ``reply``: a random model boxes no answer, so every
    rollout would earn the same reward and GRPO's advantages would all be zero."""
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    answer = tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ids = torch.tensor([prompt + answer])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    torch.manual_seed(0)
    for _ in range(steps):
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.slow
def test_grpo_takes_a_step_on_the_verifier_with_the_environments_rewards(example, tmp_path):
    from mappa_agents.openenv_server import MappaOpenEnv, running_server
    from mappa_agents.tiny_models import tiny_model_and_tokenizer

    tasks = example.product_tasks(1)
    config = example.serve_config(tasks)
    probe = MappaOpenEnv(config)
    try:
        messages = probe.reset(task_id=tasks[0].id).messages  # the verifier's chat
    finally:
        probe.close()
    model, tokenizer = tiny_model_and_tokenizer()
    _warm_start(model, tokenizer, messages, f"Final answer: \\boxed{{{tasks[0].answer}}}", 8)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}

    with running_server(config) as url:
        result = example.train(
            model,
            tokenizer,
            url,
            [tasks[0].id],
            steps=1,
            output_dir=str(tmp_path / "out"),
            generations=4,
            max_completion_length=24,
        )

    trainer, rollouts = result["trainer"], result["rollouts"]
    assert trainer.state.global_step == 1
    assert len(rollouts) == 4  # one episode per generation, each through the server
    rewards = [r["reward"] for r in rollouts]
    for rollout in rollouts:  # the verifier's reward is its coach score (process credit)
        assert rollout["reward"] == pytest.approx(rollout["coach"]["score"] / 10)
    assert len(set(rewards)) > 1, rewards  # a group with different rewards: a real update
    (logged,) = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert logged["reward"] == pytest.approx(sum(rewards) / len(rewards))
    assert logged["grad_norm"] > 0
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, "the GRPO step changed no weight"
