"""CPU smoke check of the reproduction: every arm trains on its own reward, the void
rule tells an arm with a learning signal from one without, and process credit moves a
real MathChat behaviour.

A tiny model (built in-process, see :mod:`mappa_agents.tiny_models`) is warm-started to
answer every MathChat agent's prompt with a fenced Python block some of the time and with
a plain sentence otherwise, then trained in the real ``MathChat-v0`` (real Jupyter
kernels, the rules coach) once per arm from the same weights and seeds: the decided pair
``process_blind`` (process credit, the reference answer shown only to the final agent's
coach) and ``outcome``, and ``process`` (the coach sees the answer at every agent).
Every action saved in each arm's rollouts is checked against the reward that arm must
pay it, worked out from the record alone (the outcome, the agent's own correctness, the
coach's score). The tiny model never writes a right answer, so no episode succeeds and
every outcome reward is 0: the outcome arm has no learning signal and the void rule of
:mod:`benchmarks.repro_stats` must say so, while ``process_blind``, paid by coach scores
that vary, must be found to have one. The oracle coach pays the code executor more for
a turn whose code ran (4) than for a turn without code (1-2): under ``process`` the code
executor's rate of code turns must rise. (The answer-blind rubric pays the tiny model's
``print(NN)`` as a copy, 4 against 3 for a sentence: too small a gap to move it in a
few steps, 0.2 -> 0.24-0.35 over 6 steps, measured.)

    python -m benchmarks.repro_mathchat --smoke
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import RESULTS_DIR, print_table, write_results

AGENTS = ("problem_solver", "code_executor", "verifier")
CODE_AGENT = "code_executor"
# The secret pins the problems (each machine would otherwise mix in its own user secret):
# every run of the smoke check draws the same ones, and on one machine the run is
# deterministic (another CPU's rounding takes another trajectory, which is why the check
# reads the policy's probabilities, not a few dozen sampled turns). A tiny model that
# never answers gains nothing from problems that can be rebuilt from their seed, and an
# expression problem keeps the warm start's prompts short.
TASKS = {
    "n": 64,
    "seed": 11,
    "kinds": ["expression"],
    "difficulty": "medium",
    "secret": "",
}
#: One turn for the code executor: the rules rubric pays a later code turn only what it
#: adds over the slot's earlier ones (a rerun earns 0), so with two turns a second code
#: block is paid less than a sentence and the rate of code turns is no measure of what
#: process credit pays; with one, a code block that runs (4) beats a sentence (1-2).
TURNS = {"code_executor": 1}
#: Share of warm-start replies that are a code block (the base rate of the behaviour).
CODE_SHARE = 0.25
#: The smoke passes when process credit raises the policy's probability of opening a code
#: block (:func:`code_probability`, over the code executor's prompts of PROBE_TURNS
#: scripted turns) by this much from the warm-started model to the arm's last weights.
#: Measured rises are under :data:`STEPS`; another CPU's rounding (torch's and MKL's AVX2
#: kernels) takes another trajectory. The sampled rate of code turns, checked before,
#: rose 0.25 on one machine and 0.06 on another: 32 turns a step are too few to measure it.
PROCESS_MIN_RISE = 0.05
PROBE_TURNS = 150
#: Optimizer steps of the warm start (batches of 16 replies).
WARM_START_STEPS = 200
#: Steps per arm. With one torch thread (as in the test suite) the process arm's P(code)
#: rose 0.178 -> 0.322 in 4 steps here and 0.177 -> 0.359 with AVX2 kernels, 0.178 ->
#: 0.263 in 3 (the outcome arm's stayed at 0.178); 3 steps check what the decided pair
#: trains on and what the void rule finds in it. (300 warm-start steps and 6 process
#: steps took the rise to 0.6, at 1.5 times the smoke's CPU time.)
STEPS = {"process_blind": 3, "outcome": 3, "process": 4}
ARMS = tuple(STEPS)
#: Each arm's credit mode and environment options (as the decided test file gives them).
ARM_SETTINGS: dict[str, tuple[str, dict[str, Any]]] = {
    "process_blind": ("process", {"reveal": "last_agent"}),
    "outcome": ("outcome", {}),
    "process": ("process", {}),
}
#: The void rule read over each smoke run's own steps: the KL is 0 at step 1 (the policy
#: is the reference), so 2 of an arm's steps must show each signal.
SMOKE_MIN_STEPS = 2
#: The smoke's floor of an agent's reward spread: the tiny model's answer-blind rewards
#: spread by 0.04-0.05 a step (4 against 3 out of 10), the decided floor's edge, where a
#: CPU's rounding decides; the outcome arm's spread is exactly 0. The smoke checks that
#: the rule tells a signal from none, not the decided floor.
SMOKE_MIN_REWARD_STD = 0.01


def warm_start_reply(rng: random.Random) -> str:
    """A reply of the warm-start mixture: a code block or a plain answer sentence."""
    number = rng.randint(10, 99)
    if rng.random() < CODE_SHARE:
        return f"```python\nprint({number})\n```"
    return f"The answer is {number}."


def scripted_turns(count: int, rng: random.Random) -> list[tuple[str, list[dict], str]]:
    """``(agent, messages, reply)`` from real MathChat-v0 episodes of warm-start replies."""
    import mappa_env

    env = mappa_env.make(
        "MathChat-v0",
        tasks=TASKS,
        turns=TURNS,
        sandbox=None,
        coach=None,
        credit_mode="outcome",
        max_new_tokens=32,
        seed=0,
    )
    turns: list[tuple[str, list[dict], str]] = []
    try:
        while len(turns) < count:
            env.reset()
            for agent in env.agent_iter():
                *_, terminated, truncated, _ = env.last()
                if terminated or truncated:
                    env.step(None)
                    continue
                reply = warm_start_reply(rng)
                turns.append((agent, list(env.observe(agent)["messages"]), reply))
                env.step(reply)
    finally:
        env.close()
    return turns[:count]


def warm_start_examples(count: int, rng: random.Random) -> list[tuple[list[dict], str]]:
    """``(messages, reply)`` pairs from real MathChat-v0 episodes, every agent's turns."""
    return [(messages, reply) for _, messages, reply in scripted_turns(count, rng)]


def code_probability(model_dir: Path, tokenizer_dir: Path, prompts: list[list[dict]]) -> float:
    """The policy's mean probability of opening a code block, over ``prompts``.

    ``P(first reply token = the first token of a code fence | prompt)``, averaged: the
    rate of code turns the policy would have, without the sampling noise of a few dozen
    rollouts (a rate measured on 32 turns moves by about 0.09 from one draw to the next).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mappa_agents.policy import chat_prompt_ids

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    fence = tokenizer("```python", add_special_tokens=False)["input_ids"][0]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    chances = []
    with torch.no_grad():
        for messages in prompts:
            ids = torch.tensor([chat_prompt_ids(tokenizer, messages)])
            logits = model(input_ids=ids).logits[0, -1]
            chances.append(float(torch.softmax(logits.float(), dim=-1)[fence]))
    return statistics.fmean(chances)


def build_smoke_model(directory: Path, seed: int = 0) -> Path:
    """A tiny model that answers MathChat prompts with code about CODE_SHARE of the time.

    The tokenizer is trained on MathChat's own prompts (so they take few tokens), the
    model is fitted for :data:`WARM_START_STEPS` steps on warm-start replies, then saved.
    """
    import torch

    from mappa_agents.policy import chat_prompt_ids
    from mappa_agents.tiny_models import build_tiny_model, build_tiny_tokenizer

    rng = random.Random(seed)
    examples = warm_start_examples(96, rng)
    corpus = [m["content"] for messages, _ in examples[:24] for m in messages]
    corpus += [reply for _, reply in examples]
    tokenizer = build_tiny_tokenizer(vocab_size=1024, extra_corpus=corpus)
    model = build_tiny_model(tokenizer, seed=seed, hidden_size=64, max_positions=2048)
    rows = []
    for messages, reply in examples:
        prompt = chat_prompt_ids(tokenizer, messages)
        response = tokenizer(reply, add_special_tokens=False)["input_ids"]
        rows.append((prompt, [*response, tokenizer.eos_token_id]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = random.Random(seed + 1)
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _ in range(WARM_START_STEPS):
            batch = generator.sample(rows, 16)
            width = max(len(p) + len(r) for p, r in batch)
            ids = torch.full((len(batch), width), tokenizer.pad_token_id)
            labels = torch.full((len(batch), width), -100)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for i, (prompt, response) in enumerate(batch):
                sequence = prompt + response
                ids[i, : len(sequence)] = torch.tensor(sequence)
                labels[i, len(prompt) : len(sequence)] = torch.tensor(response)
                mask[i, : len(sequence)] = 1
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def smoke_config(model_dir: Path, out: Path, arm: str) -> Any:
    """The training settings of one smoke run (the same for every arm but its credit)."""
    from mappa_train.config import TrainConfig

    credit_mode, options = ARM_SETTINGS[arm]
    return TrainConfig(
        env="MathChat-v0",
        env_options={
            "tasks": TASKS,
            "turns": TURNS,
            "max_new_tokens": 32,
            "code_timeout_s": 10.0,
            **options,
        },
        system=str(model_dir),
        coach="rules",
        credit_mode=credit_mode,
        steps=STEPS[arm],
        prompts_per_step=16,
        samples_per_prompt=2,
        concurrency=32,
        max_new_tokens=32,
        lr=1e-3,
        warmup_ratio=0.0,
        mask_truncated=False,
        train_batch_size=16,
        micro_batch_size=16,
        gradient_checkpointing=False,
        dtype="float32",
        device="cpu",
        save_every=0,
        keep_checkpoints=1,
        tensorboard=False,
        progress=False,
        output_dir=str(out / arm),
        seed=0,
    )


def code_turn_rates(history: list[dict[str, Any]]) -> list[float]:
    """The code executor's share of turns that ran code, per training step."""
    return [float(m.get(f"{CODE_AGENT}/tool_call_rate") or 0.0) for m in history]


def rise(rates: list[float]) -> float:
    """Mean of the last 3 steps minus the first step's rate (rolled out before any update)."""
    return statistics.fmean(rates[-3:]) - rates[0]


def expected_reward(credit_mode: str, row: dict[str, Any]) -> float | None:
    """The reward a credit mode must pay one saved action, worked out from its record alone.

    ``outcome``: the episode's outcome reward; ``agent_oracle``: 1 when the acting
    agent's own final number was right (the outcome's ``agent_correct``), else 0;
    ``process``: the coach's score / 10, ``None`` (masked) for an invalid verdict.
    """
    outcome = row.get("outcome") or {}
    if outcome.get("aborted"):
        return None
    if credit_mode == "outcome":
        return float(outcome["reward"])
    if credit_mode == "agent_oracle":
        return float(bool(outcome["agent_correct"][row["agent"]]))
    coach = row.get("coach") or {}
    return float(coach["score"]) / 10.0 if coach.get("valid") else None


def reward_mismatches(arm: str, rollouts: Path) -> tuple[int, list[str]]:
    """Every saved training action checked against :func:`expected_reward`.

    Returns:
        ``(actions checked, descriptions of the actions whose saved reward differs)``.
    """
    from mappa_agents.trajectory import load_jsonl

    checked, wrong = 0, []
    for path in sorted(rollouts.glob("step-*.jsonl")):
        for sample in load_jsonl(path):
            row = sample.to_row()
            want, got = expected_reward(ARM_SETTINGS[arm][0], row), sample.trainable_reward
            checked += 1
            if want != got:
                wrong.append(f"{path.name} {sample.episode_id} {sample.agent}: {got} != {want}")
    return checked, wrong


def run_smoke(out_dir: Path | None = None) -> int:
    """Run the smoke check; 0 when every arm trained on its own reward, process_blind
    credit raised the behaviour, and the void rule told the arm with a signal apart."""
    from benchmarks.repro_stats import VoidRule, void_reasons
    from mappa_train.checkpoint import checkpoint_dir
    from mappa_train.trainer import Trainer

    started = time.perf_counter()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mappa-repro-smoke-") as tmp:
        root = Path(tmp)
        model_dir = build_smoke_model(root / "model")
        prompts = [m for agent, m, _ in scripted_turns(PROBE_TURNS, random.Random(7))
                   if agent == CODE_AGENT]  # fmt: skip
        start_chance = code_probability(model_dir, model_dir, prompts)
        for arm in ARMS:
            trainer = Trainer(smoke_config(model_dir, root, arm))
            history = trainer.train()
            rates = code_turn_rates(history)
            final = checkpoint_dir(root / arm / "checkpoints", STEPS[arm]) / "agents" / CODE_AGENT
            chance = code_probability(final, model_dir, prompts)
            checked, wrong = reward_mismatches(arm, root / arm / "rollouts")
            results[arm] = {
                "code_turn_rate": rates,
                "rise": rise(rates),
                "code_probability": [start_chance, chance],
                "code_probability_rise": chance - start_chance,
                "successes": sum(
                    round(float(m.get("rollout/success_rate") or 0.0) * m["rollout/episodes"])
                    for m in history
                ),
                "rewards_checked": checked,
                "rewards_wrong": wrong[:10],
                "code_executor_kl": [m.get(f"{CODE_AGENT}/kl") for m in history],
                "code_executor_reward": [m.get(f"{CODE_AGENT}/mean_reward") for m in history],
                "code_executor_reward_std": [m.get(f"{CODE_AGENT}/reward_std") for m in history],
                "void_reasons": void_reasons(
                    {arm: {0: history}},
                    rule=VoidRule(
                        through_step=STEPS[arm],
                        min_steps=SMOKE_MIN_STEPS,
                        reward_std=SMOKE_MIN_REWARD_STD,
                    ),
                )[arm],
            }
    checks = {
        "every_arm_trained_on_its_own_reward": all(
            r["rewards_checked"] > 0 and not r["rewards_wrong"] for r in results.values()
        ),
        "process_raised_code_turns": (
            results["process"]["code_probability_rise"] >= PROCESS_MIN_RISE
        ),
        # The tiny model never answers: every outcome reward is 0, so the outcome arm has
        # nothing to learn from and must be declared void, not reported as a loser...
        "outcome_arm_declared_void": bool(results["outcome"]["void_reasons"]),
        # ...while the treatment, which learnt from coach scores without a success, is not.
        "process_blind_has_a_signal": not results["process_blind"]["void_reasons"],
    }
    rows = [
        {
            "arm": arm,
            "code turns, step 1": r["code_turn_rate"][0],
            "last 3 steps": statistics.fmean(r["code_turn_rate"][-3:]),
            "rise": r["rise"],
            "P(code), start": r["code_probability"][0],
            "P(code), end": r["code_probability"][1],
            "successes": r["successes"],
            "rewards checked": r["rewards_checked"],
            "wrong": len(r["rewards_wrong"]),
            "void": "yes" if r["void_reasons"] else "no",
        }
        for arm, r in results.items()
    ]
    seconds = time.perf_counter() - started
    print_table(
        rows, title=f"repro smoke: MathChat-v0, tiny model, steps {STEPS} ({seconds:.0f} s)"
    )
    for name, passed in checks.items():
        print(f"  {name}: {'yes' if passed else 'NO'}")
    write_results(
        "mathchat_smoke",
        {
            "steps": STEPS,
            "arms": list(ARMS),
            "tasks": TASKS,
            "code_share_of_warm_start": CODE_SHARE,
            "arm_settings": ARM_SETTINGS,
            "thresholds": {"process_min_rise": PROCESS_MIN_RISE, "void_min_steps": SMOKE_MIN_STEPS},
            "results": results,
            "checks": checks,
            "seconds": seconds,
        },
        out_dir or RESULTS_DIR / "repro",
    )
    return 0 if all(checks.values()) else 1
