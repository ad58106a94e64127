"""mappa's trainer and TRL's ``GRPOTrainer`` side by side: the same work, one command.

One single-agent, single-turn task that both trainers can run: ``CharShare-v0``, a
one-role environment of ours whose rules coach pays the share of the reply's characters
that are one target character (``a`` for English prompts, ``7`` for the random-weight
shapes, whose word-level tokenizer writes ``w<id>`` words). TRL gets the very chat
prompts the environment gives (read from its observations) and the same rule
(:func:`char_share`) as its reward function, with the prompts of each step in the order
mappa's trainer samples them, so step ``s`` of both trainers sees the same prompts.

Every reply is exactly ``--max-new-tokens`` long on both sides (EOS masked until then:
transformers' ``min_new_tokens``, vLLM's ``min_tokens``), so both generate the same
tokens; the JSON records every step's generated tokens for both
(``reply_tokens_per_step``), and the run fails after writing it when they differ.

At each ``--samples`` size the trainers run in the order mappa, TRL, TRL, mappa: two
blocks each, each block after its own ``--warmup-steps`` untimed steps, ``--steps``
timed steps per trainer over its two blocks. mappa's trainer pauses between its blocks
(its GPU memory kept, not counted as TRL's); TRL's two blocks are one ``train()`` call.
The headline figure is whole-step seconds: the median of the timed steps, with the
fastest, the slowest and each block's median. Secondary: generation seconds (mappa: its
rollouts, environment steps and the rules coach included; TRL: its ``_generate``, which
includes loading the new weights into its vLLM engine), update seconds (the rest of the
step: for both, the no-grad log-prob passes, the loss, backward and optimizer step, and
their own bookkeeping; the two trainers split a step differently), generated
tokens/s (completion tokens / generation seconds), update tokens/s (prompt + completion
tokens of the step's rows / update seconds), peak GPU memory
(``torch.cuda.max_memory_allocated`` from set-up on, less the other trainer's; ``None``
on CPU), and the mean reward of the first and the last step. The table gives each
figure for both and the ratio mappa / TRL (below 1 for seconds and above 1 for
tokens/s: mappa is faster).

The pairing (the JSON holds both configurations):

- samples per step: mappa ``prompts_per_step x samples_per_prompt``; TRL
  ``generation_batch_size`` with ``num_generations`` = ``samples_per_prompt``;
- one optimizer step per step: mappa ``train_batch_size`` = the samples per step; TRL
  ``gradient_accumulation_steps`` = samples per step / micro-batch, ``num_iterations: 1``;
- micro-batches: ``micro_batch_size`` = ``per_device_train_batch_size`` rows (``--micro-batch``);
- advantages: mappa ``advantage_estimator: grpo``; TRL ``scale_rewards: group``;
- KL: mappa ``kl_coef`` = TRL ``beta``, both the k3 estimator in the loss (mappa
  ``kl_estimator: k3``; TRL ``use_bias_correction_kl: False``, which would weight it by
  the ratio);
- clipping: mappa ``clip_eps`` = TRL ``epsilon``; the loss is the token mean over the
  optimizer batch in both (TRL ``loss_type: dapo``);
- learning rate: the same peak, cosine decay over the run's steps, no warm-up; AdamW with
  betas (0.9, 0.95) (TRL ``adam_beta2: 0.95``), no weight decay, gradient norm clipped at 1;
- replies cut by the length limit are trained on in both (``mask_truncated: False``,
  ``mask_truncated_completions: False``): every reply reaches it;
- vLLM: mappa ``rollout_engine: vllm``; TRL ``use_vllm: True, vllm_mode: colocate``, both
  at ``--vllm-gpu-memory-utilization`` (TRL's default, 0.3).

Where they differ, and why:

- Advantages. REINFORCE++'s batch whitening (mappa's default) has no TRL counterpart
  (TRL's ``scale_rewards: batch`` still subtracts each group's mean), so both use
  group-normalised rewards: mappa ``(r - mean_g) / (std_g + 1e-6)`` with the population
  std, TRL ``/ (std_g + 1e-4)`` with the sample std. mappa groups rows by their prompt
  ids, TRL by position; every prompt of a step is distinct, so the groups are the same.
- Old log-probs. mappa, with ``advantage_estimator: grpo`` and one optimizer step,
  skips the no-grad pass for the old log-probs (``old_logprob_pass: auto``) and uses the
  loss pass's detached log-probs; it still runs the reference pass. TRL, with one
  optimizer step per generation batch and without its vLLM importance-sampling
  correction, does the same: its fastest valid setting, and the same loss at ratio 1. With
  ``--trl-importance-sampling`` it runs the pass and reweights by vLLM's log-probs
  (TRL's default with vLLM; mappa has no such correction).
- TRL's loss pass also computes every token's entropy (for its logs); mappa's does not.
- Precision on CUDA. mappa keeps bf16 weights and float32 master weights and Adam
  states in its optimizer (``mixed_precision``); TRL keeps float32 weights under bf16
  autocast (its default, ``bf16: True`` with the model loaded in float32).
  ``--trl-dtype bfloat16`` loads TRL's model in bf16 (Adam on bf16 weights, no masters).
  On CPU both train in float32.
- Micro-batches. mappa sorts an optimizer batch's rows by length before cutting it;
  TRL pads the whole generation batch to its longest row and shuffles it. With
  random weights every reply runs to ``--max-new-tokens``, so the rows are alike.
- Rollouts. mappa's go through its runner: environment reset and step, the rules coach,
  the rollouts written to JSONL; TRL calls the reward function on decoded completions.
- vLLM. Both engines run in the trainer's process with the same
  ``gpu_memory_utilization``, in bf16 (:func:`half_precision_copy`); mappa loads the
  new weights after each update, TRL before each generation. TRL fixes
  ``max_num_batched_tokens`` at 4096; mappa leaves vLLM's default. Each trainer runs
  in a fresh child process with ``--processes each`` (the default with vLLM): two vLLM
  engines and their GPU memory never share one process.
- Gradient checkpointing is off for both (TRL's default is on; ``--gradient-checkpointing``
  turns it on for both).

Run (GPU; ``VLLM_USE_FLASHINFER_SAMPLER=0`` where flashinfer is not installed)::

    python -m benchmarks.bench_vs_trl --model smollm2-135m --engine vllm --samples 64,256
    python -m benchmarks.bench_vs_trl --model 0.5b --engine vllm --samples 64,256
    python -m benchmarks.bench_vs_trl --model 135m --engine hf --samples 64,256
    python -m benchmarks.bench_vs_trl --model tiny --engine hf --samples 8 \\
        --samples-per-prompt 4 --max-new-tokens 8 --warmup-steps 1 --steps 2 --out runs/vs-trl

``135m`` and ``0.5b`` are random-weight shapes (``bench_train_gpu.SHAPES``), built
without downloads. The last line is the CPU smoke (a tiny random model built
in-process, HF generation).
TRL is an optional extra of the benchmarks only (``pip install "mappa-rl[trl]"``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from benchmarks._common import cuda_synchronize, parse_sizes, print_table, write_results
from mappa_env.coach.base import SCORE_MAX, CoachRequest
from mappa_env.envs.pipeline import AgentSpec, PipelineEnv, ToolOutcome

PromptStyle = Literal["english", "words"]
TRAINERS = ("mappa", "trl")

# ------------------------------------------------------------------ the task

_TOPICS = (
    "a cat", "the sea", "a train", "bananas", "a garden", "the weather", "a library",
    "a mountain", "coffee", "a market", "the moon", "a bicycle", "an apple", "a castle",
    "the rain", "a map",
)  # fmt: skip
_STYLES = ("happy", "calm", "short", "plain", "grand", "small", "warm", "salty")


def char_share(text: str, target: str) -> float:
    """Share of the characters of ``text`` that are ``target`` (0 for an empty text).

    The task's one rule: the environment's coach pays it (scaled to a 0-10 score) and
    TRL gets it as its reward function, so both trainers are paid the same number.
    """
    return text.count(target) / len(text) if text else 0.0


def char_share_rubric(request: CoachRequest) -> tuple[float, str]:
    """The rules coach's rubric of ``CharShare-v0``: the share of the target, out of 10."""
    target = str(request.metadata["target"])
    share = char_share(request.action, target)
    return SCORE_MAX * share, f"{share:.1%} of the characters are {target!r}"


@dataclass(frozen=True)
class WriteTask:
    """One prompt of ``CharShare-v0``.

    Attributes:
        id: The task id.
        prompt: The user message.
        target: The character whose share of the reply is paid.
    """

    id: str
    prompt: str
    target: str


def default_target(prompt_style: PromptStyle) -> str:
    """``a`` for English prompts; ``7`` for word-level vocabularies (``w<id>`` words)."""
    return "a" if prompt_style == "english" else "7"


def make_tasks(
    count: int, prompt_style: PromptStyle = "english", target: str | None = None, seed: int = 0
) -> list[WriteTask]:
    """``count`` distinct prompts, the same for a given seed.

    Args:
        count: Number of tasks.
        prompt_style: ``"english"`` (a request to write about a topic, using the target
            often) or ``"words"`` (32 random ``w<id>`` words: the random-weight shapes'
            tokenizer reads every English word as one unknown token, which would give
            every prompt the same ids).
        target: The paid character (default :func:`default_target`).
        seed: Seeds the ``words`` prompts.

    Returns:
        The tasks, ids ``write-<index>``.
    """
    target = target or default_target(prompt_style)
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        if prompt_style == "english":
            topic = _TOPICS[index % len(_TOPICS)]
            style = _STYLES[(index // len(_TOPICS)) % len(_STYLES)]
            prompt = (
                f"Request {index}: write one {style} sentence about {topic}, using the "
                f"letter '{target}' as often as you can."
            )
        elif prompt_style == "words":
            # Ids past the specials (6) and below the smallest vocabulary of the shapes.
            prompt = " ".join(f"w{rng.randrange(6, 32_000)}" for _ in range(32))
        else:
            raise ValueError(f"prompt_style must be 'english' or 'words', got {prompt_style!r}")
        tasks.append(WriteTask(f"write-{index}", prompt, target))
    return tasks


class CharShareEnv(PipelineEnv):
    """One writer, one turn: the reward is the share of the target character.

    Args:
        num_tasks: Number of prompts (:func:`make_tasks`).
        prompt_style: ``"english"`` or ``"words"``.
        target: The paid character (default by ``prompt_style``).
        **options: :class:`~mappa_env.envs.pipeline.PipelineEnv`'s options (the coach
            defaults to ``"rules"``; no sandbox: the writer runs no code).
    """

    env_id = "CharShare-v0"
    roles = (AgentSpec("writer", "writer", 1),)
    task_class = WriteTask
    rules_rubric = staticmethod(char_share_rubric)

    def __init__(
        self,
        num_tasks: int = 64,
        prompt_style: PromptStyle = "english",
        target: str | None = None,
        **options: Any,
    ) -> None:
        self.tasks = make_tasks(num_tasks, prompt_style, target)
        self.task = self.tasks[0]
        options.setdefault("coach", "rules")
        options.setdefault("sandbox", None)
        super().__init__(**options)

    @property
    def system_description(self) -> str:
        """One writer answers one request."""
        return "One writer answers one request."

    def role_description(self, agent: str) -> str:
        """The writer's job."""
        return "Write a reply to the request."

    def agent_messages(self, agent: str) -> list[dict[str, str]]:
        """The request alone, as a user message (the model's chat template adds the rest)."""
        return [{"role": "user", "content": self.task.prompt}]

    async def run_action(self, agent: str, action: str) -> ToolOutcome:
        """Nothing runs: the reply is the action."""
        return ToolOutcome()

    async def episode_outcome(self) -> dict[str, Any]:
        """The reply's share of the target (a success above one half)."""
        record = self.last_record("writer")
        share = char_share(record.action, self.task.target) if record else 0.0
        return {"success": share > 0.5, "reward": share}

    def task_facts(self) -> tuple[str, str, str | None]:
        """Id, prompt, and no ground truth (the rubric needs only the target)."""
        return self.task.id, self.task.prompt, None

    def coach_metadata(self, record: Any) -> dict[str, Any]:
        """The target character, for the rubric."""
        return {"target": self.task.target}


#: How mappa's trainer makes the environment (an import path: ``mappa_env.make`` takes one).
ENV_ENTRY = "benchmarks.bench_vs_trl:CharShareEnv"


def task_messages(env_options: Mapping[str, Any], task_ids: Sequence[str]) -> dict[str, Any]:
    """The chat messages the environment prompts each task with, read from its observations.

    Returns:
        Task id -> ``(messages, target)``.
    """
    env = CharShareEnv(**env_options)
    try:
        by_id = {t.id: t for t in env.tasks}
        out = {}
        for task_id in dict.fromkeys(task_ids):
            env.reset(options={"task_id": task_id})
            messages = [dict(m) for m in env.observe("writer")["messages"]]
            out[task_id] = (messages, by_id[task_id].target)
        return out
    finally:
        env.close()


# ------------------------------------------------------------------ the workload


@dataclass(frozen=True)
class Workload:
    """What both trainers are asked to do (one ``--samples`` size).

    Attributes:
        model: The model's name in reports (``tiny``, ``smollm2-135m``, ``0.5b``, ...).
        model_dir: The model's directory (weights and tokenizer).
        prompt_style: ``"english"`` or ``"words"`` (random-weight shapes).
        target: The paid character.
        prompts_per_step: Prompts per step.
        samples_per_prompt: Samples per prompt (the group size).
        max_new_tokens: Tokens per reply.
        temperature: Sampling temperature.
        lr: Peak learning rate (cosine decay over the run's steps, no warm-up).
        beta: KL coefficient (k3 estimator, in the loss).
        clip_eps: PPO clip range.
        micro_batch: Rows per forward/backward pass.
        engine: ``"hf"`` (transformers generation) or ``"vllm"``.
        vllm_gpu_memory_utilization: Share of the GPU each vLLM engine takes.
        warmup_steps: Untimed steps run before each timed block.
        steps: Timed steps per trainer, split over its two blocks (the first gets the
            odd one).
        gradient_checkpointing: Recompute activations in the backward pass (both).
        trl_importance_sampling: TRL's vLLM importance-sampling correction.
        trl_dtype: The dtype TRL loads its model in (``float32``: its default).
        compile_decode: mappa's compiled HF decoding (TRL's HF generation is eager).
        seed: Seeds both trainers.
    """

    model: str
    model_dir: str
    prompt_style: PromptStyle
    target: str
    prompts_per_step: int
    samples_per_prompt: int
    max_new_tokens: int
    temperature: float
    lr: float
    beta: float
    clip_eps: float
    micro_batch: int
    engine: str
    vllm_gpu_memory_utilization: float
    warmup_steps: int
    steps: int
    gradient_checkpointing: bool
    trl_importance_sampling: bool
    trl_dtype: str
    compile_decode: bool
    seed: int

    def __post_init__(self) -> None:
        if self.samples_per_prompt < 2:
            raise ValueError("group-normalised advantages need samples_per_prompt >= 2")
        if self.samples_per_step % self.micro_batch:
            raise ValueError(
                f"micro_batch ({self.micro_batch}) must divide the samples per step "
                f"({self.samples_per_step}): TRL accumulates whole micro-batches"
            )
        if self.steps < 2 or self.warmup_steps < 0:
            raise ValueError("steps must be >= 2 (two timed blocks) and warmup_steps >= 0")

    @property
    def samples_per_step(self) -> int:
        """Rollouts (and trained rows) per step."""
        return self.prompts_per_step * self.samples_per_prompt

    @property
    def block_steps(self) -> tuple[int, int]:
        """Timed steps of each trainer's first and second block."""
        return (self.steps + 1) // 2, self.steps // 2

    @property
    def total_steps(self) -> int:
        """Each block's warm-up plus timed steps, both blocks."""
        return 2 * self.warmup_steps + self.steps

    @property
    def step_plan(self) -> list[tuple[int, bool]]:
        """``(block, timed)`` of every step, in order: each block's warm-up first."""
        return [
            (block, index >= self.warmup_steps)
            for block, timed in enumerate(self.block_steps, 1)
            for index in range(self.warmup_steps + timed)
        ]

    @property
    def reply_tokens_per_step(self) -> int:
        """Generated tokens of every step: each reply is ``max_new_tokens`` long."""
        return self.samples_per_step * self.max_new_tokens

    @property
    def env_options(self) -> dict[str, Any]:
        """``CharShare-v0``'s options: one distinct prompt per rollout group of the run."""
        return {
            "num_tasks": self.prompts_per_step * self.total_steps,
            "prompt_style": self.prompt_style,
            "target": self.target,
        }


def mappa_config(work: Workload, output_dir: str | Path) -> Any:
    """mappa's ``TrainConfig`` for ``work`` (see the module docstring for the pairing)."""
    import torch

    from mappa_train.config import TrainConfig

    vllm_options = {}
    if work.engine == "vllm":
        vllm_options = {"gpu_memory_utilization": work.vllm_gpu_memory_utilization}
    return TrainConfig(
        env=ENV_ENTRY,
        env_options=work.env_options,
        system=work.model_dir,
        coach="rules",
        credit_mode="process",
        isolation="none",  # the writer runs no code
        steps=work.total_steps,
        prompts_per_step=work.prompts_per_step,
        samples_per_prompt=work.samples_per_prompt,
        concurrency=work.samples_per_step,
        rollout_batch_size=work.samples_per_step,
        max_new_tokens=work.max_new_tokens,
        temperature=work.temperature,
        top_p=1.0,
        advantage_estimator="grpo",
        kl_coef=work.beta,
        kl_estimator="k3",
        clip_eps=work.clip_eps,
        mask_truncated=False,  # random weights never emit EOS; TRL trains on cut replies too
        lr=work.lr,
        adam_betas=(0.9, 0.95),
        weight_decay=0.0,
        grad_clip=1.0,
        warmup_ratio=0.0,
        train_batch_size=work.samples_per_step,
        micro_batch_size=work.micro_batch,
        gradient_checkpointing=work.gradient_checkpointing,
        rollout_engine=work.engine,
        vllm_options=vllm_options,
        compile_decode=work.compile_decode and torch.cuda.is_available(),
        save_every=0,
        tensorboard=False,
        progress=False,
        output_dir=str(output_dir),
        seed=work.seed,
    )


def trl_config(work: Workload, output_dir: str | Path) -> Any:
    """TRL's ``GRPOConfig`` for ``work`` (see the module docstring for the pairing)."""
    import torch

    trl = import_trl()
    cuda = torch.cuda.is_available()
    vllm: dict[str, Any] = {}
    # Fixed-length replies: EOS is masked until the last token, as mappa's side does it
    # (fix_reply_length), so both generate the same tokens.
    fixed = {"min_tokens" if work.engine == "vllm" else "min_new_tokens": work.max_new_tokens}
    if work.engine == "vllm":
        vllm = {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": work.vllm_gpu_memory_utilization,
            "vllm_importance_sampling_correction": work.trl_importance_sampling,
        }
    return trl.GRPOConfig(
        output_dir=str(output_dir),
        max_steps=work.total_steps,
        num_generations=work.samples_per_prompt,
        generation_batch_size=work.samples_per_step,
        per_device_train_batch_size=work.micro_batch,
        gradient_accumulation_steps=work.samples_per_step // work.micro_batch,
        num_iterations=1,
        max_completion_length=work.max_new_tokens,
        temperature=work.temperature,
        top_p=1.0,
        top_k=0,
        generation_kwargs=fixed,
        scale_rewards="group",
        beta=work.beta,
        use_bias_correction_kl=False,
        epsilon=work.clip_eps,
        loss_type="dapo",
        mask_truncated_completions=False,
        learning_rate=work.lr,
        lr_scheduler_type="cosine",
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.95,
        weight_decay=0.0,
        max_grad_norm=1.0,
        gradient_checkpointing=work.gradient_checkpointing,
        bf16=cuda,
        use_cpu=not cuda,
        model_init_kwargs={"dtype": work.trl_dtype},
        shuffle_dataset=False,  # the prompts come in mappa's order (see run_trl)
        remove_unused_columns=False,  # the reward function reads the "target" column
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=work.seed,
        **vllm,
    )


#: The ``GRPOConfig`` fields :func:`trl_config` sets, recorded in the JSON.
TRL_FIELDS = (
    "max_steps", "num_generations", "generation_batch_size", "per_device_train_batch_size",
    "gradient_accumulation_steps", "num_iterations", "max_completion_length", "temperature",
    "top_p", "top_k", "generation_kwargs", "scale_rewards", "beta", "use_bias_correction_kl",
    "epsilon", "loss_type", "mask_truncated_completions", "learning_rate", "lr_scheduler_type",
    "warmup_steps", "adam_beta1", "adam_beta2", "weight_decay", "max_grad_norm",
    "gradient_checkpointing", "bf16", "use_cpu", "model_init_kwargs", "shuffle_dataset",
    "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization",
    "vllm_importance_sampling_correction", "seed",
)  # fmt: skip


def import_trl() -> Any:
    """TRL, or an error naming the extra that installs it."""
    from mappa_env._optional import require

    return require("trl", "trl", purpose="the TRL side of benchmarks.bench_vs_trl")


# ------------------------------------------------------------------ measuring


class PeakMemory:
    """One trainer's peak GPU memory, less what the other trainer holds meanwhile.

    Both trainers share the process with ``--processes one``: mappa's model and optimizer
    stay on the GPU while TRL runs between mappa's blocks, and are not TRL's.
    """

    def __init__(self) -> None:
        self.gib: float | None = None
        self._foreign = 0

    def begin(self, own_bytes: int = 0) -> None:
        """Start measuring; ``own_bytes`` of what is allocated now is this trainer's."""
        import torch

        if torch.cuda.is_available():
            self._foreign = torch.cuda.memory_allocated() - own_bytes
            torch.cuda.reset_peak_memory_stats()

    def end(self) -> int:
        """Stop measuring; returns the bytes this trainer still holds."""
        import torch

        if not torch.cuda.is_available():
            return 0
        peak = round((torch.cuda.max_memory_allocated() - self._foreign) / 2**30, 2)
        self.gib = max(self.gib or 0.0, peak)
        return torch.cuda.memory_allocated() - self._foreign


def changed_elements(model: Any, reference: Mapping[str, Any]) -> int:
    """How many weight elements of ``model`` differ from ``reference`` (name -> tensor)."""
    import torch

    with torch.no_grad():
        return sum(
            int((param.detach().float().cpu() != reference[name].float().cpu()).sum())
            for name, param in model.named_parameters()
        )


def summarize(steps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The timed steps' figures: whole-step seconds first, the split second.

    Args:
        steps: Every step's ``step_s``, ``generation_s``, ``prompt_tokens``,
            ``completion_tokens``, ``mean_reward``, ``block`` and ``timed`` (warm-up steps
            are not), in order.

    Returns:
        ``step_s`` (median), ``step_s_min``, ``step_s_max`` and ``step_s_blocks`` (each
        block's median) of the timed steps; ``generation_s`` and ``update_s``
        (``step_s - generation_s``) as medians; ``generated_tok_s`` and ``update_tok_s``
        as totals over the timed steps; the mean reward of the first step and of the last.
    """
    timed = [s for s in steps if s["timed"]]
    if not timed:
        raise ValueError(f"no timed steps among {len(steps)} steps")
    seconds = [s["step_s"] for s in timed]
    blocks = sorted({s["block"] for s in timed})
    update = [s["step_s"] - s["generation_s"] for s in timed]
    generation_total = sum(s["generation_s"] for s in timed)
    update_total = sum(update)
    completion = sum(s["completion_tokens"] for s in timed)
    rows = completion + sum(s["prompt_tokens"] for s in timed)
    return {
        "step_s": round(statistics.median(seconds), 4),
        "step_s_min": round(min(seconds), 4),
        "step_s_max": round(max(seconds), 4),
        "step_s_blocks": [
            round(statistics.median(s["step_s"] for s in timed if s["block"] == b), 4)
            for b in blocks
        ],
        "timed_steps": len(timed),
        "generation_s": round(statistics.median(s["generation_s"] for s in timed), 4),
        "update_s": round(statistics.median(update), 4),
        "generated_tok_s": round(completion / generation_total, 1) if generation_total else None,
        "update_tok_s": round(rows / update_total, 1) if update_total > 0 else None,
        "reward_first_step": steps[0]["mean_reward"],
        "reward_last_step": steps[-1]["mean_reward"],
    }


def fix_reply_length(policy: Any, engine: str) -> None:
    """Make mappa's rollout engine write replies of exactly ``max_new_tokens`` tokens.

    EOS is masked until the length limit, the way TRL's side gets it through
    ``generation_kwargs`` (transformers' ``min_new_tokens``; vLLM's ``min_tokens``), so
    both trainers generate the same tokens whatever the weights sample.

    Raises:
        TypeError: When the HF policy has no generation config to extend.
    """
    if engine == "vllm":
        from mappa_agents import vllm_policy

        original_kwargs = vllm_policy.sampling_kwargs

        def fixed_kwargs(params: Any, index: int = 0) -> dict[str, Any]:
            return {**original_kwargs(params, index), "min_tokens": params.max_new_tokens}

        vllm_policy.sampling_kwargs = fixed_kwargs
        return
    original_config = getattr(policy, "_generation_config", None)
    if original_config is None:
        raise TypeError(f"{type(policy).__name__} has no generation config to fix the length of")

    def fixed_config(params: Any, *rest: Any) -> Any:
        config = original_config(params, *rest)
        config.min_new_tokens = params.max_new_tokens
        return config

    policy._generation_config = fixed_config
    # Decoding through recorded graphs (compile_decode) picks ids between replays, not
    # through generate's config: EOS is masked there (log-probs stay the raw model's,
    # taken before the pick, as generate's recorder takes them).
    original_pick = getattr(policy, "pick", None)
    if original_pick is not None:
        eos = list(policy.eos_token_ids)

        def fixed_pick(scores: Any, params: Any, generator: Any = None) -> Any:
            scores = scores.clone()
            scores[:, eos] = float("-inf")
            if generator is None:
                return original_pick(scores, params)
            return original_pick(scores, params, generator=generator)

        policy.pick = fixed_pick


def run_mappa(work: Workload, directory: Path) -> Generator[None, None, dict[str, Any]]:
    """Set mappa's trainer up and run its two blocks, pausing between them.

    A generator: the first ``next`` sets up and runs block 1 (its warm-up, then its
    timed steps); the second runs block 2 and returns the result (``StopIteration``'s
    value; :func:`finish`). TRL runs in the pause: the order is mappa, TRL, TRL, mappa.

    Returns:
        ``setup_s``, each step's figures (``steps``: seconds, tokens, mean reward, the
        task ids it trained on, its block and whether it was timed), the summary of the
        timed steps, the peak GPU memory, how many weight elements training changed, and
        the largest difference between a reward the environment paid and
        :func:`char_share` of its reply.
    """
    from benchmarks.bench_train_gpu import free_trainer
    from mappa_train.trainer import Trainer

    config = mappa_config(work, directory / "mappa")
    peak = PeakMemory()
    peak.begin()
    started = time.perf_counter()
    trainer = Trainer(config)
    trainer.setup()
    setup_s = time.perf_counter() - started
    fix_reply_length(trainer.learners["writer"].rollout_policy, work.engine)
    rollout = trainer.rollout
    episodes_of_step: list[Any] = []

    def recorded_rollout(step: int) -> Any:
        episodes = rollout(step)
        episodes_of_step.append(episodes)
        return episodes

    trainer.rollout = recorded_rollout
    steps: list[dict[str, Any]] = []
    rule_error = 0.0
    plan = work.step_plan
    for index, (block, timed) in enumerate(plan):
        if index and block != plan[index - 1][0]:  # between the blocks: TRL's turn
            own = peak.end()
            yield
            peak.begin(own)
        cuda_synchronize()
        started = time.perf_counter()
        metrics = trainer.train_step()
        cuda_synchronize()
        wall = time.perf_counter() - started
        samples = [a for e in episodes_of_step[-1] for a in e.actions]
        for sample in samples:
            paid = sample.trainable_reward
            rule = char_share(sample.text, work.target)
            rule_error = max(rule_error, math.inf if paid is None else abs(paid - rule))
        steps.append(
            {
                "step_s": round(wall, 4),
                "generation_s": round(float(metrics["rollout/seconds"]), 4),
                "prompt_tokens": sum(len(s.prompt_ids) for s in samples),
                "completion_tokens": sum(len(s.response_ids) for s in samples),
                "mean_reward": metrics["rollout/mean_reward"],
                "task_ids": sorted({s.task_id for s in samples}),
                "block": block,
                "timed": timed,
            }
        )
        print(f"mappa step {len(steps)}: {_brief(steps[-1])}", flush=True)
    peak.end()
    learner = trainer.learners["writer"]
    reference = dict(learner.ref_model.named_parameters())
    changed = changed_elements(learner.model, reference)
    del reference, learner
    free_trainer(trainer)
    return {
        "config": config.to_dict(),
        "device": _device_name(),
        "setup_s": round(setup_s, 2),
        "steps": steps,
        **summarize(steps),
        "peak_gpu_gib": peak.gib,
        "weight_elements_changed": changed,
        "reward_rule_max_error": rule_error,
    }


def finish(session: Generator[None, None, dict[str, Any]]) -> dict[str, Any]:
    """Run a paused trainer (:func:`run_mappa`) to its end; returns its result."""
    while True:
        try:
            next(session)
        except StopIteration as done:
            return done.value


def run_trl(work: Workload, directory: Path) -> dict[str, Any]:
    """Set TRL's ``GRPOTrainer`` up, run ``work.total_steps`` steps, and measure them.

    The dataset holds the prompts of mappa's steps in mappa's order (the environment's
    own chat messages, from :func:`task_messages`), one row per prompt, read without
    shuffling, so TRL's step ``s`` generates for the prompts of mappa's step ``s``.

    Returns:
        The same keys as :func:`run_mappa` (the rule's error is 0 by construction and
        left out).

    Raises:
        RuntimeError: When TRL did not generate once per optimizer step (the pairing
            assumes it does).
    """
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback

    from mappa_train.trainer import Trainer

    trl = import_trl()
    # mappa's task order, without loading a model: sample_task_ids needs only the config.
    planner = Trainer(mappa_config(work, directory / "plan"))
    order = [planner.sample_task_ids(step) for step in range(work.total_steps)]
    planner.close()
    prompts = task_messages(work.env_options, [t for ids in order for t in ids])
    rows = [
        {"prompt": prompts[task_id][0], "target": prompts[task_id][1], "task_id": task_id}
        for ids in order
        for task_id in ids
    ]
    paid: list[tuple[str, float]] = []

    def char_share_reward(completions: list[Any], target: list[str], task_id: list[str], **_):
        """:func:`char_share` of each completion: the environment's rule."""
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        rewards = [char_share(text, t) for text, t in zip(texts, target)]
        paid.extend(zip(task_id, rewards))
        return rewards

    tokenizer = AutoTokenizer.from_pretrained(work.model_dir, padding_side="left")
    config = trl_config(work, directory / "trl")
    peak = PeakMemory()  # what mappa holds in its pause is not TRL's
    peak.begin()
    started = time.perf_counter()
    trainer = trl.GRPOTrainer(
        model=work.model_dir,
        reward_funcs=[char_share_reward],
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    setup_s = time.perf_counter() - started
    initial = {n: p.detach().to("cpu", copy=True) for n, p in trainer.model.named_parameters()}

    generations: list[dict[str, float]] = []
    generate = trainer._generate  # one call per generation batch (TRL 1.x)

    def timed_generate(prompts_of_batch: list[Any]) -> Any:
        cuda_synchronize()
        begun = time.perf_counter()
        out = generate(prompts_of_batch)
        cuda_synchronize()
        prompt_ids, completion_ids = out[0], out[1]
        generations.append(
            {
                "generation_s": time.perf_counter() - begun,
                "prompt_tokens": sum(len(ids) for ids in prompt_ids),
                "completion_tokens": sum(len(ids) for ids in completion_ids),
            }
        )
        return out

    trainer._generate = timed_generate
    ends: list[float] = []

    class StepClock(TrainerCallback):
        """Wall-clock times at the start of training and at the end of every step."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            cuda_synchronize()
            ends.append(time.perf_counter())

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            cuda_synchronize()
            ends.append(time.perf_counter())

    trainer.add_callback(StepClock())
    trainer.train()
    peak.end()
    if len(generations) != work.total_steps or len(ends) != work.total_steps + 1:
        raise RuntimeError(
            f"TRL generated {len(generations)} times in {len(ends) - 1} steps; the pairing "
            f"expects one generation per optimizer step ({work.total_steps} steps)"
        )
    per_step = work.samples_per_step
    steps = []
    for index, (generation, (block, timed)) in enumerate(zip(generations, work.step_plan)):
        mine = paid[index * per_step : (index + 1) * per_step]
        steps.append(
            {
                "step_s": round(ends[index + 1] - ends[index], 4),
                "generation_s": round(generation["generation_s"], 4),
                "prompt_tokens": generation["prompt_tokens"],
                "completion_tokens": generation["completion_tokens"],
                "mean_reward": sum(r for _, r in mine) / len(mine),
                "task_ids": sorted({t for t, _ in mine}),
                "block": block,
                "timed": timed,
            }
        )
        print(f"TRL step {index + 1}: {_brief(steps[-1])}", flush=True)
    changed = changed_elements(trainer.model, initial)
    del initial
    # The accelerator holds the model and optimizer too: let go of them for what runs next.
    trainer.accelerator.free_memory()
    trainer.model = trainer.model_wrapped = trainer.ref_model = trainer.optimizer = None
    del trainer
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {
        # The fields this benchmark sets (the rest are TRL's defaults).
        "config": {key: getattr(config, key) for key in TRL_FIELDS},
        "device": _device_name(),
        "setup_s": round(setup_s, 2),
        "steps": steps,
        **summarize(steps),
        "peak_gpu_gib": peak.gib,
        "weight_elements_changed": changed,
    }


def _brief(step: Mapping[str, Any]) -> str:
    return ", ".join(
        f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
        for k, v in step.items()
        if k != "task_ids"
    )


#: Each trainer's runner: mappa's pauses between its blocks (a generator), TRL's does not.
RUNNERS: dict[str, Callable[[Workload, Path], Any]] = {
    "mappa": run_mappa,
    "trl": run_trl,
}

# ------------------------------------------------------------------ the report

#: (label, key, unit) of each table row; the ratio is mappa / TRL.
FIGURES = (
    ("step s", "step_s"),
    ("step s, fastest", "step_s_min"),
    ("step s, slowest", "step_s_max"),
    ("generation s", "generation_s"),
    ("update s", "update_s"),
    ("generated tok/s", "generated_tok_s"),
    ("update tok/s", "update_tok_s"),
    ("peak GPU GiB", "peak_gpu_gib"),
    ("setup s", "setup_s"),
    ("timed steps", "timed_steps"),
    ("reward, first step", "reward_first_step"),
    ("reward, last step", "reward_last_step"),
)


def ratio(mine: Any, theirs: Any) -> float | None:
    """``mine / theirs``, or ``None`` when either is missing or ``theirs`` is 0."""
    if not isinstance(mine, (int, float)) or not isinstance(theirs, (int, float)) or not theirs:
        return None
    return round(mine / theirs, 3)


def comparison_rows(samples: int, mappa: Mapping[str, Any], trl: Mapping[str, Any]) -> list:
    """One table row per figure: both trainers' values and mappa / TRL."""
    return [
        {
            "samples": samples,
            "what": label,
            "mappa": mappa.get(key),
            "trl": trl.get(key),
            "mappa/trl": ratio(mappa.get(key), trl.get(key)),
        }
        for label, key in FIGURES
    ]


def reply_tokens(
    work: Workload, mappa: Mapping[str, Any], trl: Mapping[str, Any]
) -> dict[str, Any]:
    """Both trainers' generated tokens per step, and whether each is the fixed length's.

    Returns:
        ``expected`` (:attr:`Workload.reply_tokens_per_step`), ``mappa`` and ``trl``
        (every step's ``completion_tokens``, warm-up included) and ``same`` (every step of
        both at ``expected``).
    """
    mine = [s["completion_tokens"] for s in mappa.get("steps", [])]
    theirs = [s["completion_tokens"] for s in trl.get("steps", [])]
    expected = work.reply_tokens_per_step
    same = len(mine) == len(theirs) == work.total_steps and set(mine + theirs) == {expected}
    return {"expected": expected, "mappa": mine, "trl": theirs, "same": same}


DIFFERENCES = [
    "advantages: both group-normalised (mappa advantage_estimator=grpo, population std + "
    "1e-6; TRL scale_rewards=group, sample std + 1e-4); REINFORCE++'s batch whitening has "
    "no TRL counterpart",
    "old log-probs: both reuse the loss pass's detached log-probs (mappa old_logprob_pass="
    "auto with grpo in one optimizer step; TRL one optimizer step per generation, no vLLM "
    "importance sampling)",
    "TRL's loss pass also computes per-token entropies for its logs",
    "precision on CUDA: mappa bf16 weights + float32 master weights in the optimizer; TRL "
    "its default float32 weights under bf16 autocast (or --trl-dtype); float32 on CPU",
    "micro-batches: mappa sorts rows by length; TRL pads the generation batch to its longest row",
    "rollouts: mappa's runner (env steps, rules coach, rollouts written to JSONL) against "
    "TRL's reward function on decoded completions",
    "HF generation: mappa's compiled decoding (static cache, CUDA graphs) unless "
    "--no-compile-decode; TRL's generate() is eager (disable_compile=True)",
    "vLLM: both in process at the same gpu_memory_utilization; TRL fixes "
    "max_num_batched_tokens=4096; mappa syncs weights after each update, TRL before each "
    "generation",
]


# ------------------------------------------------------------------ the command


def build_model(model: str, directory: Path) -> tuple[str, PromptStyle]:
    """The model's directory and the prompt style its tokenizer reads.

    ``tiny``: a tiny random Llama with a BPE tokenizer, built here; a shape of
    ``benchmarks.bench_train_gpu.SHAPES`` (``0.5b``, ``1.5b``, ``4b``): random weights
    (bf16) with a word-level tokenizer; anything else: ``mappa_agents.models.resolve_model``
    (``smollm2-135m``, an HF id or a directory; see :func:`half_precision_copy`).
    """
    if model == "tiny":
        from mappa_agents.tiny_models import tiny_model_dir

        return str(tiny_model_dir(directory / "tiny")), "english"
    from benchmarks.bench_train_gpu import SHAPES, random_model_dir

    if model in SHAPES:
        return str(random_model_dir(model, directory / model)), "words"
    from mappa_agents.models import resolve_model

    return half_precision_copy(str(resolve_model(model)), directory / "bf16"), "english"


def half_precision_copy(source: str, directory: Path) -> str:
    """``source``, or on CUDA a bf16 copy of it when its config says float32.

    TRL passes no dtype to its colocated vLLM engine, so the engine takes the config's;
    mappa's engines run in the run's dtype (bf16 on CUDA). SmolLM2's directory,
    converted from GGUF, says float32 (its hub config says bfloat16): both trainers load
    this copy, so both engines decode in bf16. The trainers choose their own training
    dtypes as before (mappa bf16, TRL ``--trl-dtype``).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if not torch.cuda.is_available():
        return source
    config = AutoConfig.from_pretrained(source)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if str(dtype).removeprefix("torch.") != "float32":
        return source
    AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16).save_pretrained(directory)
    AutoTokenizer.from_pretrained(source).save_pretrained(directory)
    return str(directory)


def model_label(model: str) -> str:
    """The model's name in file names: ``smollm2`` for SmolLM2-135M, else its last part."""
    name = Path(model).name
    return "smollm2" if name.lower().startswith("smollm2") else name


def make_parser() -> argparse.ArgumentParser:
    """The command's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--model", default="smollm2-135m", help="tiny, smollm2-135m, 0.5b, 1.5b, an id or a path")
    add("--samples", default="64,256", help="samples per step, comma-separated sizes")
    add("--samples-per-prompt", type=int, default=8, help="the group size (TRL's default: 8)")
    add("--max-new-tokens", type=int, default=256)
    add("--temperature", type=float, default=1.0)
    add("--lr", type=float, default=1e-6)
    add("--beta", type=float, default=0.01, help="KL coefficient (k3, in the loss)")
    add("--clip-eps", type=float, default=0.2)
    add("--micro-batch", type=int, default=32, help="rows per forward/backward pass")
    add("--engine", choices=("hf", "vllm"), default="vllm", help="rollouts: HF or vLLM")
    add("--vllm-gpu-memory-utilization", type=float, default=0.3, help="TRL's default")
    add("--warmup-steps", type=int, default=1, help="untimed steps before each timed block")
    add("--steps", type=int, default=10, help="timed steps per trainer, over its two blocks")
    add(
        "--no-compile-decode",
        dest="compile_decode",
        action="store_false",
        help="mappa's HF decoding eager, like TRL's (no compile in the warm-up)",
    )
    add("--gradient-checkpointing", action="store_true", help="for both trainers")
    add("--trl-importance-sampling", action="store_true", help="TRL's vLLM IS correction")
    add("--trl-dtype", choices=("float32", "bfloat16"), default="float32")
    add("--target", default=None, help="the paid character (default: a, or 7 for shapes)")
    add("--seed", type=int, default=0)
    add(
        "--processes",
        choices=("one", "each"),
        default=None,
        help="both trainers in this process, or each in a child (default: each with vLLM)",
    )
    add("--name", default=None, help="results file name (default vs_trl_<model>)")
    add("--out", default=os.environ.get("OUT", str(Path("benchmarks") / "results" / "gpu")))
    # Set by the parent of a child process (--processes each).
    add("--only", choices=TRAINERS, default=None, help=argparse.SUPPRESS)
    add("--model-dir", default=None, help=argparse.SUPPRESS)
    add("--prompt-style", choices=("english", "words"), default=None, help=argparse.SUPPRESS)
    add("--result-file", default=None, help=argparse.SUPPRESS)
    return parser


def workload(args: argparse.Namespace, samples: int, model_dir: str, style: str) -> Workload:
    """The :class:`Workload` of one size."""
    if samples % args.samples_per_prompt:
        raise ValueError(
            f"{samples} samples per step is not a whole number of groups of "
            f"{args.samples_per_prompt} (--samples-per-prompt)"
        )
    return Workload(
        model=args.model,
        model_dir=model_dir,
        prompt_style=style,  # type: ignore[arg-type]
        target=args.target or default_target(style),  # type: ignore[arg-type]
        prompts_per_step=samples // args.samples_per_prompt,
        samples_per_prompt=args.samples_per_prompt,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        lr=args.lr,
        beta=args.beta,
        clip_eps=args.clip_eps,
        micro_batch=min(args.micro_batch, samples),
        engine=args.engine,
        vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        warmup_steps=args.warmup_steps,
        steps=args.steps,
        gradient_checkpointing=args.gradient_checkpointing,
        trl_importance_sampling=args.trl_importance_sampling,
        trl_dtype=args.trl_dtype,
        compile_decode=args.compile_decode,
        seed=args.seed,
    )


def child_command(
    argv: Sequence[str], trainer: str, samples: int, model_dir: str, style: str, result: Path
) -> list[str]:
    """The command line of a child that runs one trainer at one size (``--processes each``)."""
    return [
        sys.executable, "-m", "benchmarks.bench_vs_trl", *argv,
        "--only", trainer, "--samples", str(samples), "--model-dir", model_dir,
        "--prompt-style", style, "--result-file", str(result),
    ]  # fmt: skip


class Child:
    """A child process running one trainer; mappa's pauses between its blocks.

    The child writes ``<result>.paused`` after its first block and waits for
    ``<result>.resume`` (:func:`pause_between_blocks`): files, so that the child's
    standard streams stay the terminal's.
    """

    def __init__(self, command: Sequence[str], result: Path) -> None:
        self.result = result
        self.process = subprocess.Popen(list(command))

    def _check(self) -> None:
        code = self.process.poll()
        if code:
            raise subprocess.CalledProcessError(code, self.process.args)

    def wait_paused(self) -> None:
        """Wait until the child has run its first block (or failed)."""
        paused = self.result.with_name(self.result.name + ".paused")
        while not paused.exists():
            self._check()
            if self.process.returncode == 0:
                raise RuntimeError(f"{self.process.args} ended without pausing between blocks")
            time.sleep(0.2)

    def finish(self) -> dict[str, Any]:
        """Let the child run its last block; returns its result."""
        self.result.with_name(self.result.name + ".resume").touch()
        code = self.process.wait()
        if code:
            raise subprocess.CalledProcessError(code, self.process.args)
        return json.loads(self.result.read_text())


def pause_between_blocks(result_file: Path) -> None:
    """In a child: say that the first block is done, and wait for the parent's go."""
    result_file.with_name(result_file.name + ".paused").touch()
    resume = result_file.with_name(result_file.name + ".resume")
    while not resume.exists():
        time.sleep(0.2)


def run_size(
    argv: Sequence[str], work: Workload, processes: str, directory: Path, style: str
) -> dict[str, Any]:
    """Both trainers at one size, in the order mappa, TRL, TRL, mappa (blocks of steps).

    mappa's trainer pauses after its first block, keeping its GPU memory (in this
    process or its child), while TRL runs both of its blocks; then mappa runs its second.
    """
    samples = work.samples_per_step
    if processes == "one":
        print(f"--- mappa block 1, {samples} samples per step", flush=True)
        session = RUNNERS["mappa"](work, directory / f"mappa-{samples}")
        next(session)
        print(f"--- TRL blocks 1 and 2, {samples} samples per step", flush=True)
        trl = RUNNERS["trl"](work, directory / f"trl-{samples}")
        print(f"--- mappa block 2, {samples} samples per step", flush=True)
        return {"mappa": finish(session), "trl": trl}
    files = Path(tempfile.mkdtemp(prefix="mappa-vs-trl-child-", dir=directory))
    results = {t: files / f"{t}.json" for t in TRAINERS}
    commands = {
        t: child_command(argv, t, samples, work.model_dir, style, results[t]) for t in TRAINERS
    }
    print(f"--- mappa block 1, {samples} samples per step", flush=True)
    mappa = spawn(commands["mappa"], results["mappa"])
    mappa.wait_paused()
    print(f"--- TRL blocks 1 and 2, {samples} samples per step", flush=True)
    trl = spawn(commands["trl"], results["trl"]).finish()
    print(f"--- mappa block 2, {samples} samples per step", flush=True)
    return {"mappa": mappa.finish(), "trl": trl}


def spawn(command: Sequence[str], result: Path) -> Child:
    """Start a child trainer (a seam for tests)."""
    return Child(command, result)


class RepliesDiffer(RuntimeError):
    """The two trainers generated different numbers of tokens in some step."""


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run both trainers at every size, print the table and write the JSON; returns it.

    Raises:
        RepliesDiffer: After writing the JSON, when a step of either trainer generated
            other than ``samples x max_new_tokens`` tokens.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = make_parser()
    args = parser.parse_args(argv)
    sizes = parse_sizes(parser, args.samples)
    processes = args.processes or ("each" if args.engine == "vllm" else "one")
    scratch = Path(tempfile.mkdtemp(prefix="mappa-vs-trl-"))
    try:
        if args.model_dir:
            model_dir, style = args.model_dir, args.prompt_style or "english"
        else:
            model_dir, style = build_model(args.model, scratch / "model")
        if args.only:  # a child: one trainer, one size
            work = workload(args, sizes[0], model_dir, style)
            result_file = Path(args.result_file)
            session = RUNNERS[args.only](work, scratch)
            if args.only == "mappa":
                next(session)
                pause_between_blocks(result_file)
                result = finish(session)
            else:
                result = session
            result_file.write_text(json.dumps(result, default=str))
            return result
        runs, rows, differ = [], [], []
        for samples in sizes:
            work = workload(args, samples, model_dir, style)
            results = run_size(argv, work, processes, scratch, style)
            run_rows = comparison_rows(samples, results["mappa"], results["trl"])
            rows += run_rows
            tokens = reply_tokens(work, results["mappa"], results["trl"])
            if not tokens["same"]:
                differ.append(samples)
            runs.append(
                {
                    "samples_per_step": samples,
                    "workload": dataclasses.asdict(work),
                    "order": ["mappa block 1", "trl block 1", "trl block 2", "mappa block 2"],
                    "reply_tokens_per_step": tokens,
                    "mappa_config": results["mappa"].pop("config"),
                    "trl_config": results["trl"].pop("config"),
                    "mappa": results["mappa"],
                    "trl": results["trl"],
                    "ratios": {r["what"]: r["mappa/trl"] for r in run_rows},
                }
            )
        # Facts from the runs and the installed packages: this process (the parent of
        # the children with --processes each) never touches the GPU itself.
        summary = {
            "model": args.model,
            "device": runs[0]["mappa"]["device"],
            "versions": {name: _version(name) for name in ("torch", "transformers", "trl", "vllm")},
            "settings": {k: v for k, v in vars(args).items() if k != "out"},
            "processes": processes,
            "headline": "step s: median seconds of a whole step over the timed steps",
            "ratio": "mappa / TRL: below 1 for seconds, above 1 for tokens/s means mappa is faster",
            "differences": DIFFERENCES,
            "runs": runs,
            "rows": rows,
        }
        name = args.name or f"vs_trl_{model_label(args.model)}"
        write_results(name, summary, Path(args.out))
        print_table(rows, title=f"mappa vs TRL GRPO, {args.model}, {args.engine} rollouts")
        if differ:
            raise RepliesDiffer(
                f"the trainers generated other than samples x --max-new-tokens tokens in a "
                f"step at {differ} samples (reply_tokens_per_step in the JSON): the "
                f"comparison is not of the same work"
            )
        return summary
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def _version(module: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    try:
        main()
    except RepliesDiffer as error:
        sys.exit(f"bench_vs_trl: {error}")
