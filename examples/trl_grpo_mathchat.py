"""Train MathChat's verifier with TRL's GRPOTrainer, through mappa's OpenEnv server.

The problem solver and the code executor stay rule-based (``mathchat_scripts.py``) and
are played inside the server (ego mode); the verifier is the model TRL trains. Each
GRPO rollout is one episode: ``reset`` (the server plays the other two agents: the code
executor runs Python in the episode's sandbox), the model writes the verifier's reply
from the exact chat the environment gives it, ``step`` returns the verifier's reward
as the environment paid it, scored by the coach. TRL keeps that one reward per rollout.

Run (``pip install "mappa-rl[trl]"``; a server is started in this process unless
``--url`` names a running ``mappa serve --env MathChat-v0 --ego verifier ...``)::

    python examples/trl_grpo_mathchat.py --model smollm2-135m --steps 20
    python examples/trl_grpo_mathchat.py --tiny --steps 1   # a tiny random model, on CPU

The problems are "What is A times B?", which the rule-based code executor computes, so
a verifier that copies the code's boxed output into its own ``\\boxed{}`` earns the
coach's full score.

The last line printed says whether the run learned anything. GRPO learns only from a
group of completions of one prompt whose rewards differ: when all of them earn the same
reward, every advantage (a reward minus its group's mean) is 0, and so are the loss and
the gradient. A random model boxes no answer, so ``--tiny`` first teaches it the reply's
form on its one task (a few supervised steps), and its completions then differ.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from typing import Any

from mathchat_scripts import code_executor, problem_solver

from mappa_agents.hf import HFPolicy
from mappa_agents.openenv_server import (
    MappaAction,
    MappaEnvClient,
    ServeConfig,
    running_server,
)
from mappa_agents.policy import SamplingParams
from mappa_agents.scripted import ScriptedPolicy
from mappa_env.tasks import MathTask


def product_tasks(count: int, seed: int = 0) -> list[MathTask]:
    """``count`` problems "What is A times B?" with their answers."""
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        a, b = rng.randint(100, 9999), rng.randint(100, 9999)
        tasks.append(MathTask(f"product-{index}", f"What is {a} times {b}?", str(a * b)))
    return tasks


def serve_config(tasks: Sequence[MathTask]) -> ServeConfig:
    """MathChat-v0 with the verifier as the ego and rule-based agents before it."""
    return ServeConfig(
        "MathChat-v0",
        {"tasks": list(tasks), "coach": "rules", "max_new_tokens": 64},
        mode="ego",
        ego_agent="verifier",
        others={
            "problem_solver": ScriptedPolicy(problem_solver, name="script:problem_solver"),
            "code_executor": ScriptedPolicy(code_executor, name="script:code_executor"),
        },
        # Each rollout names the prompt's task: a server for this process only.
        allow_task_ids=True,
    )


def teach_the_reply(
    model: Any, tokenizer: Any, config: ServeConfig, task: MathTask, steps: int = 8
) -> None:
    """A few supervised steps toward the verifier's right reply to ``task``.

    A random model boxes no answer, so every rollout would earn the same reward and
    GRPO's advantages would all be zero; after these steps its sampled replies differ.
    """
    import torch

    from mappa_agents.openenv_server import MappaOpenEnv

    probe = MappaOpenEnv(config)
    try:
        messages = probe.reset(task_id=task.id).messages  # the verifier's chat
    finally:
        probe.close()
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    reply = f"Final answer: \\boxed{{{task.answer}}}"
    answer = tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ids = torch.tensor([prompt + answer])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100  # learn the reply, not the prompt
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    torch.manual_seed(0)
    for _ in range(steps):
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def make_rollout_func(base_url: str, tokenizer: Any, log: list[dict[str, Any]]) -> Any:
    """TRL's ``rollout_func``: one MathChat episode per prompt, the verifier sampled.

    Each prompt of the dataset is a task id. The reply is generated with the trainer's
    own model through :class:`~mappa_agents.hf.HFPolicy`, which keeps the exact prompt
    ids, the sampled ids and their log-probabilities; ``env_reward`` (the environment's
    reward for the verifier's action) goes to the reward function.
    """

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list]:
        training = trainer.model.training
        policy = HFPolicy(trainer.model, tokenizer, device=str(trainer.model.device))
        sampling = SamplingParams(
            max_new_tokens=trainer.args.max_completion_length,
            temperature=trainer.args.temperature,
        )
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        out["env_reward"] = []
        try:
            _play(prompts, policy, sampling, out)
        finally:
            trainer.model.train(training)  # HFPolicy switched it to eval mode
        return out

    def _play(prompts: list[Any], policy: HFPolicy, sampling: SamplingParams, out: dict) -> None:
        with MappaEnvClient(base_url).sync() as env:
            for task_id in prompts:
                result = env.reset(task_id=task_id)
                observation = result.observation
                (generation,) = policy.generate([observation.messages], sampling)
                action = MappaAction(text=generation.text, agent=observation.agent)
                result = env.step(action)
                if not result.done:
                    raise RuntimeError(
                        "the verifier has one turn in MathChat-v0: the episode should be over"
                    )
                info = result.observation.info
                out["prompt_ids"].append(generation.prompt_ids)
                out["completion_ids"].append(generation.response_ids)
                out["logprobs"].append(generation.logprobs)
                out["env_reward"].append(result.reward)  # None: an invalid coach verdict
                log.append(
                    {
                        "task_id": task_id,
                        "reply": generation.text,
                        "reward": result.reward,
                        "coach": info["action"]["coach"],
                        "correct": info["outcome"]["correct"],
                    }
                )

    return rollout_func


def env_reward(completions: list[Any], env_reward: list[float | None], **_: Any) -> list:
    """The environment's reward for each rollout (a TRL reward function)."""
    return list(env_reward)


def train(
    model: Any,
    tokenizer: Any,
    base_url: str,
    task_ids: Sequence[str],
    *,
    steps: int,
    output_dir: str,
    generations: int = 4,
    max_completion_length: int = 32,
    learning_rate: float = 1e-5,
    seed: int = 0,
) -> dict[str, Any]:
    """Run ``steps`` GRPO steps of TRL on the verifier; returns the trainer and the rollouts."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    log: list[dict[str, Any]] = []
    config = GRPOConfig(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=generations,
        num_generations=generations,
        max_completion_length=max_completion_length,
        temperature=1.0,  # the logprobs HFPolicy reports are those of temperature 1
        learning_rate=learning_rate,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=not _cuda(),
        seed=seed,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=[env_reward],
        args=config,
        train_dataset=Dataset.from_dict({"prompt": list(task_ids)}),
        rollout_func=make_rollout_func(base_url, tokenizer, log),
    )
    trainer.train()
    return {"trainer": trainer, "rollouts": log, "generations": generations}


def summary(result: dict[str, Any]) -> str:
    """One line: did the run learn anything, and if not, why not.

    Args:
        result: What :func:`train` returns.
    """
    rollouts, size = result["rollouts"], result["generations"]
    groups = [rollouts[i : i + size] for i in range(0, len(rollouts), size)]
    spread = [
        max(rewards) - min(rewards) if rewards else 0.0
        for rewards in ([r["reward"] for r in g if r["reward"] is not None] for g in groups)
    ]
    logged = [e for e in result["trainer"].state.log_history if "reward" in e]
    loss = max((abs(e.get("loss", 0.0)) for e in logged), default=0.0)
    grad = max((e.get("grad_norm", 0.0) for e in logged), default=0.0)
    rewards = [r["reward"] for r in rollouts if r["reward"] is not None]
    mean = sum(rewards) / len(rewards) if rewards else float("nan")
    head = (
        f"{len(logged)} GRPO steps, {len(rollouts)} rollouts, mean reward {mean:.3f}; "
        f"{sum(s > 0 for s in spread)} of {len(groups)} groups of {size} had different "
        f"rewards (largest spread {max(spread, default=0.0):.3f}); "
        f"loss {loss:.4f}, grad norm {grad:.4f}"
    )
    if grad > 0:
        return f"learned: {head}: the groups with different rewards updated the model"
    return (
        f"learned nothing: {head}: every completion of a prompt earned the same reward, so "
        "GRPO's advantages (a reward minus its group's mean) were all 0, and so were the "
        "loss and the gradient; give it completions that differ (more --generations or "
        "--steps, a model that sometimes boxes the right answer)"
    )


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse the flags, start (or reach) the server, train; returns what ``train`` does."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="a model spec (HF id or path)")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model (CPU test)")
    parser.add_argument("--steps", type=int, default=20, help="GRPO steps")
    parser.add_argument("--generations", type=int, default=4, help="rollouts per task")
    parser.add_argument("--max-completion-length", type=int, default=32)
    parser.add_argument(
        "--num-tasks", type=int, default=None, help="problems (default 16; 1 with --tiny)"
    )
    parser.add_argument("--url", default=None, help="a running mappa serve (default: start one)")
    parser.add_argument("--output-dir", default="runs/trl-grpo-mathchat")
    args = parser.parse_args(argv)

    num_tasks = args.num_tasks or (1 if args.tiny else 16)
    tasks = product_tasks(num_tasks)
    config = serve_config(tasks)
    if args.tiny:
        from mappa_agents.tiny_models import tiny_model_and_tokenizer

        model, tokenizer = tiny_model_and_tokenizer()
        teach_the_reply(model, tokenizer, config, tasks[0])
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from mappa_agents.models import resolve_model

        path = resolve_model(args.model)
        model = AutoModelForCausalLM.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    options = {
        "steps": args.steps,
        "output_dir": args.output_dir,
        "generations": args.generations,
        "max_completion_length": args.max_completion_length,
    }
    task_ids = [t.id for t in tasks]
    if args.url:
        result = train(model, tokenizer, args.url, task_ids, **options)
    else:
        with running_server(config) as url:
            result = train(model, tokenizer, url, task_ids, **options)
    for entry in result["trainer"].state.log_history:
        if "reward" in entry:
            step, reward, loss = entry.get("step"), entry["reward"], entry["loss"]
            print(f"step {step}: mean reward {reward:.3f}, loss {loss:.4f}")
    print(summary(result))
    return result


if __name__ == "__main__":
    main()
