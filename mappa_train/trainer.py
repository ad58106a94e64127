"""The MAPPA trainer: rollouts with the batched runner, one REINFORCE++ update per agent.

Each agent has its own trainable model, optimizer, learning-rate schedule and frozen
reference model (its initial weights). A step:

1. **Rollouts.** ``prompts_per_step x samples_per_prompt`` episodes run through
   :class:`~mappa_agents.runner.RolloutRunner` with the agents' current weights (the
   policies wrap the very modules being trained, so updated weights are used at once;
   with ``rollout_engine="vllm"``, in-process vLLM engines get them after each update).
2. **Credit.** Each action is trained on the reward its environment gave it under the
   configured credit mode (:mod:`mappa_env.credit`: the environment is the reward's one
   owner, so the rollouts saved, ``env.rewards`` and the loss hold the same number).
   Actions cut by the length limit and actions whose reward is invalid (an invalid coach
   verdict, an aborted episode) are masked out and counted.
3. **Update.** Per trained agent, on its own actions: old and reference log-probs of
   the exact sampled ids, advantages from the configured estimator (REINFORCE++ by
   default, :mod:`mappa_train.algorithms.reinforce_pp`; any registered one, see
   :mod:`mappa_train.algorithms.registry`, all agents at once), then one pass of
   PPO-clipped mini-batch updates. Agents left out of ``train_agents`` are frozen: they
   act, and are scored and logged, but are never updated.
4. Metrics (JSONL, TensorBoard), periodic held-out evaluation, atomic checkpoints.

Seams for other rollout engines (e.g. vLLM actors on Ray): a subclass overrides
:meth:`Trainer.rollout` to return episodes whose actions carry the exact prompt and
response ids, and :meth:`Trainer.after_update` to push each agent's new weights to those
engines; :meth:`Trainer.learn` is the update half of a step on any such episodes. The
schedule, logging, evaluation and checkpoints of :meth:`Trainer.train` stay as they are.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mappa_agents.hf import resolve_device, resolve_dtype
from mappa_agents.policy import SamplingParams
from mappa_agents.report import isolation_of, summarize
from mappa_agents.runner import RolloutRunner, derive_seed
from mappa_agents.system import AgentSystem, parse_system_spec
from mappa_agents.trajectory import ActionSample, EpisodeResult, save_jsonl
from mappa_train import checkpoint as ckpt
from mappa_train.algorithms.registry import AgentBatch, get_estimator
from mappa_train.algorithms.reinforce_pp import kl_penalty
from mappa_train.config import TrainConfig
from mappa_train.logprobs import response_logprobs
from mappa_train.memory import (
    GIB,
    activation_bytes,
    check_fits,
    count_parameters,
    free_memory_bytes,
    needs_checkpointing,
    static_memory_bytes,
)
from mappa_train.precision import MasterWeightAdamW
from mappa_train.resume import checkpoint_to_resume
from mappa_train.stop_rules import UnscoredStopRule
from mappa_train.update import (
    PreparedRows,
    largest_micro_batch_tokens,
    shard_logprobs,
    update_agent,
)

logger = logging.getLogger(__name__)

EnvFactory = Callable[[], Any]


@dataclass
class AgentLearner:
    """Everything that trains one agent."""

    agent: str
    model: Any
    ref_model: Any
    tokenizer: Any
    optimizer: torch.optim.Optimizer | MasterWeightAdamW
    policy: Any
    source: str
    adapter: str | None = None
    """Name of the agent's LoRA adapter when agents share one base model."""
    engine: Any = None
    """The policy the agent acts through when it is not ``policy`` (``rollout_engine="vllm"``:
    an in-process vLLM engine that gets the new weights after each update)."""
    checkpointing: bool | None = None
    """Whether ``gradient_checkpointing="auto"`` last chose to recompute activations
    (``None``: not chosen yet; the model is loaded without)."""


def warmup_cosine(total_steps: int, warmup_ratio: float) -> Callable[[int], float]:
    """Learning-rate multiplier: linear warm-up, then cosine decay to 0 over ``total_steps``.

    ``f(s) = (s + 1) / w`` for ``s < w = ceil(warmup_ratio * total)``, else
    ``0.5 * (1 + cos(pi * (s - w) / (total - w)))``.
    """
    warmup = max(1, math.ceil(warmup_ratio * total_steps)) if warmup_ratio > 0 else 0

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        span = max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup) / span)))

    return factor


def make_trainer(
    config: TrainConfig,
    env_factory: EnvFactory | None = None,
    eval_env_factory: EnvFactory | None = None,
) -> Trainer:
    """The trainer that runs ``config.distributed``, built with these arguments.

    :class:`Trainer` for ``none``, :class:`~mappa_train.ray_trainer.RayTrainer` for ``ray``.
    """
    if config.distributed == "ray":
        from mappa_train.ray_trainer import RayTrainer

        return RayTrainer(config, env_factory, eval_env_factory)
    return Trainer(config, env_factory, eval_env_factory)


class Trainer:
    """Trains a multiagent system on a pipeline environment with per-action rewards.

    Args:
        config: The run's settings.
        env_factory: Makes a training environment; default ``mappa_env.make(config.env,
            coach=config.coach, **config.env_options)``.
        eval_env_factory: Makes a held-out evaluation environment; default as above with
            ``config.eval_env_options``.
    """

    distributed = "none"
    """The ``TrainConfig.distributed`` mode this class runs (see :func:`make_trainer`)."""

    def __init__(
        self,
        config: TrainConfig,
        env_factory: EnvFactory | None = None,
        eval_env_factory: EnvFactory | None = None,
    ) -> None:
        import mappa_env

        if config.distributed != self.distributed:
            raise ValueError(
                f"{type(self).__name__} runs distributed: {self.distributed!r}, but the "
                f"config asks for {config.distributed!r}: build the trainer with "
                "mappa_train.trainer.make_trainer(config), which picks the class"
            )
        self.config = config
        self.out = Path(config.output_dir)
        self.checkpoint_root = self.out / "checkpoints"
        # One coach object for every environment: its concurrency and rate limits, cache
        # and cost ledger are then shared by the whole run.
        self.coach: Any = None
        if env_factory is None or eval_env_factory is None:
            from mappa_env.coach import make_coach

            self.coach = make_coach(config.coach)
        # Only a non-default isolation is passed: an environment of the user's own may
        # not take the option, and "auto" is every pipeline environment's default.
        isolation = {} if config.isolation == "auto" else {"isolation": config.isolation}
        for options in (config.env_options, config.eval_env_options or {}):
            given = options.get("isolation", config.isolation)
            if isolation and given != config.isolation:
                raise ValueError(
                    f"isolation={config.isolation!r} and env options with isolation="
                    f"{given!r} disagree: set one of them"
                )
        # The environment owns each action's reward: it is asked for the config's credit.
        credit = {
            "credit_mode": config.credit_mode,
            "outcome_weight": config.outcome_weight,
            "backprop_decay": config.backprop_decay,
        }
        given = (config.env_options, config.eval_env_options or {}, *config.eval_sets.values())
        for options in given:
            clash = {k: v for k, v in options.items() if k in credit and v != credit[k]}
            if clash:
                raise ValueError(
                    f"env options {clash} disagree with the config's "
                    f"{ {k: credit[k] for k in clash} }: set credit in the config's "
                    "credit_mode / outcome_weight / backprop_decay only"
                )
        isolation = {**credit, **isolation}
        train_options = {**isolation, **config.env_options}
        self.env_factory = env_factory or (
            lambda: mappa_env.make(config.env, coach=self.coach, **train_options)
        )
        eval_options = {
            **isolation,
            **(config.env_options if config.eval_env_options is None else config.eval_env_options),
        }
        self.eval_env_factory = eval_env_factory or (
            lambda: mappa_env.make(config.env, coach=self.coach, **eval_options)
        )
        if config.eval_sets and eval_env_factory is not None:
            raise ValueError(
                "eval_sets are made from the config's environment and options; with an "
                "eval_env_factory of your own, evaluate further sets yourself (or drop "
                "eval_env_factory and give their options in eval_sets)"
            )
        self.eval_set_factories: dict[str, EnvFactory] = {
            name: functools.partial(
                mappa_env.make, config.env, coach=self.coach, **{**eval_options, **options}
            )
            for name, options in config.eval_sets.items()
        }
        """The further held-out sets (``config.eval_sets``), by name."""
        self._runners: dict[str, RolloutRunner] = {}
        probe = self.env_factory()
        self.agents: list[str] = list(probe.possible_agents)
        self.task_ids: list[str] = [t.id for t in getattr(probe, "tasks", [])]
        self.isolation: dict[str, Any] = isolation_of(probe)
        """What agents' code runs under (``config.json``, metrics, the summary)."""
        probe.close()
        if not self.task_ids:
            raise ValueError("the training environment exposes no tasks to sample from")
        probe = self.eval_env_factory()
        self.eval_task_ids: list[str] = [t.id for t in getattr(probe, "tasks", [])]
        probe.close()
        self.eval_set_task_ids: dict[str, list[str]] = {}
        for name, factory in self.eval_set_factories.items():
            probe = factory()
            self.eval_set_task_ids[name] = [t.id for t in getattr(probe, "tasks", [])]
            probe.close()
        self.specs: dict[str, str] = parse_system_spec(config.system, self.agents)
        self.trained_agents: list[str] = self._select_trained_agents()
        self.estimator = get_estimator(config.advantage_estimator)
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        if self.dtype == torch.float16:
            raise ValueError(
                "dtype float16 needs loss scaling, which this trainer does not do: "
                "use bfloat16 (or float32)"
            )
        # Full fine-tuning in bf16 keeps float32 master weights in the optimizer; LoRA
        # adapters are float32 already (peft), over a frozen bf16 base.
        self.master_weights = (
            config.mixed_precision and self.dtype == torch.bfloat16 and config.lora_rank == 0
        )
        self.learners: dict[str, AgentLearner] = {}
        """The trained agents' models, optimizers and policies."""
        self.frozen_policies: dict[str, Any] = {}
        """Policies of the agents left out of ``train_agents`` (acting, never updated)."""
        # The learning rate is a function of the rollout step (no scheduler state to save).
        self.lr_factor = warmup_cosine(config.steps, config.warmup_ratio)
        # Stops a run whose coach scores none of its actions (mappa_train.stop_rules).
        self.stop_rule = UnscoredStopRule(config.stop_unscored_rate, config.stop_unscored_steps)
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self._tb: Any = None
        self._wandb: Any = None

    # ------------------------------------------------------------------ setup

    def _select_trained_agents(self) -> list[str]:
        """``config.train_agents`` checked against the environment and the system spec.

        Returns:
            The agents to train, in the environment's order.

        Raises:
            ValueError: For names the environment does not have, or agents whose model
                has no local weights to train (``api:``, ``vllm:``).
        """
        wanted = self.config.train_agents
        if wanted is None:
            trained = list(self.agents)
        else:
            unknown = [a for a in wanted if a not in self.agents]
            if unknown:
                raise ValueError(
                    f"train_agents names {unknown}, which environment {self.config.env!r} "
                    f"does not have; its agents: {self.agents}"
                )
            trained = [a for a in self.agents if a in wanted]
        remote = {a: self.specs[a] for a in trained if _is_remote_spec(self.specs[a])}
        if remote:
            frozen_hint = [a for a in trained if a not in remote]
            raise ValueError(
                f"cannot train {remote}: a model behind an API or a vLLM server has no "
                "local weights to update. Give these agents a local model (an HF id or "
                "path) in `system`, or train only the others "
                f"(train_agents={frozen_hint or '[...]'}): frozen agents may use any model"
            )
        return trained

    @property
    def policies(self) -> dict[str, Any]:
        """The policy acting for each agent (trained or frozen), in environment order."""
        return {
            a: (self.learners[a].engine or self.learners[a].policy)
            if a in self.learners
            else self.frozen_policies[a]
            for a in self.agents
        }

    def _load_model(self, source: str, dtype: torch.dtype) -> Any:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        return model.to(self.device)

    def setup(self) -> None:
        """Load models (or resume from the latest complete checkpoint) and optimizers."""
        from transformers import AutoTokenizer

        from mappa_agents.hf import HFPolicy
        from mappa_agents.models import resolve_model

        config = self.config
        self.check_sandboxes()
        torch.manual_seed(config.seed)
        np.random.seed(config.seed % (2**32))
        specs = self.specs
        # Resume only a whole checkpoint of this run's settings (mappa_train.resume).
        resume_from = checkpoint_to_resume(
            self.checkpoint_root, config, self.specs, self.trained_agents
        )
        if self.device.startswith("cuda"):
            free, total = torch.cuda.mem_get_info(torch.device(self.device))
            if config.rollout_engine == "vllm":
                # The engines, built after the models, take their share of the GPU too.
                share = self._vllm_options()["gpu_memory_utilization"]
                free -= int(share * len(self.trained_agents) * total)
            # Frozen agents hold weights only; the estimate covers the trained ones.
            self.check_memory([str(resolve_model(specs[a])) for a in self.trained_agents], free)
        if config.lora_rank > 0:
            self._setup_lora(specs, resume_from)
        for agent in self.trained_agents if config.lora_rank == 0 else ():
            source = str(resolve_model(specs[agent]))
            weights = str(resume_from / "agents" / agent) if resume_from else source
            # Under mixed precision the optimizer state holds the float32 masters.
            model = self._load_model(weights, self.dtype)
            if config.gradient_checkpointing is True:
                _enable_checkpointing(model)
            model.config.use_cache = True  # generation needs the cache; training ignores it
            ref = self._load_model(source, self.dtype)  # the initial weights, frozen
            ref.eval()
            ref.requires_grad_(False)
            tokenizer = AutoTokenizer.from_pretrained(source)
            optimizer = self._optimizer(model.parameters())
            policy = HFPolicy(
                model,
                tokenizer,
                name=f"{agent}:{Path(source).name}",
                max_batch_size=config.rollout_batch_size,
                compile_decode=self.compiles_decoding,
            )
            self.learners[agent] = AgentLearner(
                agent, model, ref, tokenizer, optimizer, policy, source
            )
        self._setup_frozen(specs)
        if resume_from is not None:
            ckpt.load_optimizer_states(resume_from, self.learners)
        if config.rollout_engine == "vllm":
            self._setup_vllm_engines()
        self._start_run(resume_from)

    def _setup_vllm_engines(self) -> None:
        """``rollout_engine="vllm"``: an in-process vLLM engine per trained agent.

        Built from the agent's source model (its architecture and tokenizer), then given
        the learner's current weights (a resumed run's too), as after every update.
        """
        # In this process (not vLLM's engine-core subprocess): new weights then reach
        # the engine as tensors of this process, without a copy between processes.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from mappa_agents.vllm_policy import VLLMPolicy

        options = self._vllm_options()
        for agent, learner in self.learners.items():
            learner.engine = VLLMPolicy(
                learner.source, name=f"{agent}:vllm:{Path(learner.source).name}", **options
            )
            logger.info("%s acts through vLLM (%s)", agent, options)
        self.sync_engines()

    def _vllm_options(self) -> dict[str, Any]:
        """The ``vllm.LLM`` arguments of every engine.

        The run's dtype and seed, an equal share of 45% of the GPU per trained agent,
        then ``vllm_options`` over them.
        """
        return {
            "dtype": str(self.dtype).removeprefix("torch."),
            "gpu_memory_utilization": 0.45 / len(self.trained_agents),
            "seed": self.config.seed,
            **self.config.vllm_options,
        }

    def sync_engines(self) -> None:
        """Load each trained agent's current weights into its rollout engine, if it has one."""
        for learner in self.learners.values():
            if learner.engine is not None:
                learner.engine.load_weights(
                    (name, param.detach()) for name, param in learner.model.named_parameters()
                )

    def _start_run(self, resume_from: Path | None) -> None:
        """The end of :meth:`setup`: the step to resume at, the metrics, ``config.json``.

        Optimizers and generators are restored before this (each trainer holds its
        optimizers its own way).
        """
        config = self.config
        if resume_from is not None:
            state = ckpt.load_trainer_state(resume_from)
            self.step = int(state["step"])
            logger.info("resumed from %s at step %d", resume_from, self.step)
            saved = state.get("config", {})
            changed = sorted(k for k, v in config.to_dict().items() if k in saved and saved[k] != v)
            if changed:
                # e.g. a different `steps` reshapes the learning-rate schedule mid-run.
                logger.warning(
                    "resuming with settings that differ from the checkpoint: %s", changed
                )
        self._truncate_metrics(self.step)
        self.out.mkdir(parents=True, exist_ok=True)
        # What isolation resolved to, beside what was asked for: a run that could not
        # confine agents' code says so where its settings are read.
        written = {**config.to_dict(), "isolation_resolved": self.isolation}
        (self.out / "config.json").write_text(json.dumps(written, indent=2, default=str) + "\n")

    def check_sandboxes(self) -> None:
        """Stop before loading anything when the environments' sandboxes cannot run code.

        Raises:
            SandboxUnavailableError: With the cause and the fix (see
                :func:`mappa_env.sandbox.check_sandbox`).
        """
        for factory in {self.env_factory, self.eval_env_factory}:
            env = factory()
            try:
                check = getattr(env, "check_sandbox", None)
                if callable(check):
                    check()
            finally:
                env.close()

    @property
    def compiles_decoding(self) -> bool:
        """Whether the agents' policies decode with CUDA graphs (``compile_decode``).

        Only full fine-tuning on CUDA does: transformers compiles decoding on
        accelerators, and LoRA policies switch adapters at every call.
        """
        return (
            self.config.compile_decode
            and self.config.lora_rank == 0
            and self.config.rollout_engine == "hf"
            and self.device.startswith("cuda")
        )

    def _optimizer(self, params: Any) -> Any:
        config = self.config
        settings = {
            "lr": config.lr,
            "betas": tuple(config.adam_betas),
            "weight_decay": config.weight_decay,
            # One kernel for all parameters instead of a few per tensor.
            "fused": self.device.startswith("cuda"),
        }
        if self.master_weights:
            return MasterWeightAdamW(params, **settings)
        return torch.optim.AdamW(params, **settings)

    def check_memory(self, sources: Sequence[str], available: int) -> str | None:
        """Warn when weights, optimizer states and references would fill most of memory.

        Args:
            sources: Each agent's model directory or id (counted without loading).
            available: Free device memory in bytes.

        Returns:
            The warning text (also logged), or ``None`` when the run looks like it fits.
            See :func:`mappa_train.memory.static_memory_bytes` for the estimate.
        """
        counts: dict[str, int] = {}
        for source in sources:
            if source not in counts:
                try:
                    counts[source] = count_parameters(source)
                except (OSError, ValueError, ImportError) as error:
                    # Only a pre-flight check: the load itself reports real problems.
                    logger.info("memory check skipped: cannot size %s (%s)", source, error)
                    return None
        estimate = static_memory_bytes(
            [counts[s] for s in sources],
            weight_bytes=torch.finfo(self.dtype).bits // 8,
            master_weights=self.master_weights,
            shared_base=self.config.lora_rank > 0,
        )
        return check_fits(
            estimate,
            available,
            lora=self.config.lora_rank > 0,
            master_weights=self.master_weights,
        )

    def _setup_lora(self, specs: dict[str, str], resume_from: Path | None) -> None:
        """One frozen base shared by all agents, one trainable LoRA adapter per agent."""
        from transformers import AutoTokenizer

        from mappa_agents.hf import HFPolicy
        from mappa_agents.lora import LoRASettings, adapter_parameters, shared_lora_model
        from mappa_agents.models import resolve_model

        config = self.config
        sources = {str(resolve_model(specs[a])) for a in self.trained_agents}
        if len(sources) != 1:
            raise ValueError(
                f"lora_rank > 0 shares one base model, but the system names {sorted(sources)}"
            )
        source = sources.pop()
        # A frozen agent of the same base acts through an adapter that is never trained:
        # LoRA's B matrix starts at 0, so that adapter is the base itself, and the base
        # is not loaded twice.
        adapters = [
            a
            for a in self.agents
            if a in self.trained_agents
            or (not _is_remote_spec(specs[a]) and str(resolve_model(specs[a])) == source)
        ]
        # The base is frozen: it stays in the compute dtype; peft keeps adapters float32.
        base = self._load_model(source, self.dtype)
        if config.gradient_checkpointing is True:
            _enable_checkpointing(base)
        base.config.use_cache = True
        settings = LoRASettings(
            rank=config.lora_rank,
            alpha=config.lora_alpha,
            target_modules=config.lora_target_modules,
        )
        saved = (
            {a: resume_from / "agents" / a for a in self.trained_agents} if resume_from else None
        )
        model = shared_lora_model(base, adapters, settings, saved)
        tokenizer = AutoTokenizer.from_pretrained(source)
        for agent in adapters:
            if agent not in self.trained_agents:
                self.frozen_policies[agent] = HFPolicy(
                    model,
                    tokenizer,
                    adapter=agent,
                    name=f"{agent}:lora (frozen)",
                    max_batch_size=config.rollout_batch_size,
                )
        for agent in self.trained_agents:
            # The reference is the base with adapters disabled: every agent's start.
            self.learners[agent] = AgentLearner(
                agent,
                model,
                None,
                tokenizer,
                self._optimizer(adapter_parameters(model, agent)),
                HFPolicy(
                    model,
                    tokenizer,
                    adapter=agent,
                    name=f"{agent}:lora",
                    max_batch_size=config.rollout_batch_size,
                ),
                source,
                adapter=agent,
            )

    def _setup_frozen(self, specs: dict[str, str]) -> None:
        """Policies of the agents not trained; agents with the same spec share one."""
        shared: dict[str, Any] = {}
        for agent in self.agents:
            if agent in self.learners or agent in self.frozen_policies:
                continue
            spec = specs[agent]
            if spec not in shared:
                shared[spec] = self._frozen_policy(spec)
            self.frozen_policies[agent] = shared[spec]
            logger.info("agent %s is frozen: it acts with %s and is not trained", agent, spec)

    def _frozen_policy(self, spec: str) -> Any:
        """A frozen agent's policy: as is for API/vLLM, else loaded with no gradients."""
        from transformers import AutoTokenizer

        from mappa_agents.hf import HFPolicy
        from mappa_agents.models import load_policy, resolve_model

        if _is_remote_spec(spec):
            return load_policy(spec)
        source = str(resolve_model(spec))
        model = self._load_model(source, self.dtype)
        model.requires_grad_(False)
        model.eval()
        model.config.use_cache = True
        return HFPolicy(
            model,
            AutoTokenizer.from_pretrained(source),
            name=f"{Path(source).name} (frozen)",
            max_batch_size=self.config.rollout_batch_size,
            compile_decode=self.compiles_decoding,
        )

    # ------------------------------------------------------------------ the loop

    def train(self, until: int | None = None) -> list[dict[str, Any]]:
        """Run (or resume) training to ``config.steps``; returns the metric history.

        Args:
            until: Stop after this step instead (the schedule still spans
                ``config.steps``), e.g. to train in stages; a later call resumes.
        """
        config = self.config
        last = config.steps if until is None else min(until, config.steps)
        if not self.learners:
            self.setup()
        self._open_loggers()
        bar = self._progress(config.steps, self.step)
        try:
            if (
                config.eval_at_start
                and self.step == 0
                and not any(m.get("step") == 0 for m in self.history)
            ):
                self._log({"step": 0, **self.evaluate()})
            while self.step < last:
                metrics = self.train_step()
                if config.eval_every and (
                    self.step % config.eval_every == 0 or self.step == config.steps
                ):
                    metrics.update(self.evaluate())
                self._log(metrics)
                self.stop_rule.stop_if_due()  # raises RunStoppedError: nothing to learn from
                if (config.save_every and self.step % config.save_every == 0) or (
                    self.step == last
                ):
                    self.save()
                if bar is not None:
                    bar.set_postfix(
                        reward=f"{metrics.get('rollout/mean_reward', float('nan')):.3f}",
                        success=f"{metrics.get('rollout/success_rate', 0.0):.2f}",
                        refresh=False,
                    )
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
            self._close_loggers()
            # A staged run (``until``) keeps its coach for the next call; the runners'
            # environments (and their kernels) are released either way.
            if self.step >= config.steps:
                self.close()
            else:
                self._close_runners()
        self._plot()
        return self.history

    def _close_runners(self) -> None:
        runners, self._runners = self._runners, {}
        for runner in runners.values():
            runner.close()

    def close(self) -> None:
        """Close the rollout environments, frozen agents' API clients and the coach."""
        self._close_runners()
        for learner in self.learners.values():
            if learner.engine is not None:
                learner.engine.close()
        for policy in {id(p): p for p in self.frozen_policies.values()}.values():
            # Local frozen models are kept (like the trained ones); API and vLLM policies
            # hold threads or engines to stop.
            if not isinstance(getattr(policy, "model", None), torch.nn.Module):
                policy.close()
        close_coach = getattr(self.coach, "close", None)
        if callable(close_coach):
            close_coach()

    def _run_episodes(
        self,
        kind: str,
        options: list[dict[str, Any]],
        temperature: float,
        seed: int,
    ) -> list[EpisodeResult]:
        """Episodes with the current weights.

        ``kind``: ``"train"``, ``"eval"`` (the main held-out set) or ``"eval/<name>"``
        (a set of ``config.eval_sets``).
        """
        config = self.config
        for learner in self.learners.values():
            if learner.model is not None:  # None: the agent acts on engines elsewhere
                learner.model.eval()
        runner = self._runners.get(kind)
        if runner is None:
            system = AgentSystem(self.policies)
            factories = {
                "train": self.env_factory,
                "eval": self.eval_env_factory,
                **{f"eval/{name}": f for name, f in self.eval_set_factories.items()},
            }
            runner = RolloutRunner(
                factories[kind],
                system,
                concurrency=config.concurrency,
                progress=False,
                keep_envs=True,  # environments live across steps; closed by close()
                schedule=config.rollout_schedule,  # type: ignore[arg-type]
            )
            self._runners[kind] = runner
        runner.sampling = SamplingParams(
            max_new_tokens=config.max_new_tokens, temperature=temperature, top_p=config.top_p
        )
        return runner.run(len(options), options, seed=seed)

    def sample_task_ids(self, step: int) -> list[str]:
        """Tasks of ``step``: passes over the task list, each pass in a seeded order."""
        n = len(self.task_ids)
        chosen = []
        for j in range(self.config.prompts_per_step):
            index = step * self.config.prompts_per_step + j
            epoch, offset = divmod(index, n)
            order = np.random.default_rng(
                derive_seed(self.config.seed, "epoch", epoch)
            ).permutation(n)
            chosen.append(self.task_ids[int(order[offset])])
        return chosen

    def rollout(self, step: int) -> list[EpisodeResult]:
        """Run the step's episodes with the current weights."""
        options = [
            {"task_id": task_id}
            for task_id in self.sample_task_ids(step)
            for _ in range(self.config.samples_per_prompt)
        ]
        return self._run_episodes(
            "train",
            options,
            self.config.temperature,
            derive_seed(self.config.seed, "rollout", step),
        )

    def train_step(self) -> dict[str, Any]:
        """One rollout + update step; returns its metrics."""
        started = time.perf_counter()
        episodes = self.rollout(self.step)
        rollout_s = time.perf_counter() - started
        samples = [a for e in episodes for a in e.actions]
        save_jsonl(self.out / "rollouts" / f"step-{self.step:06d}.jsonl", samples)
        if episodes and all(e.aborted for e in episodes):
            # Nothing to learn from, and the next step would most likely fail the same way.
            raise RuntimeError(
                f"every episode of step {self.step} failed, so there is nothing to train on; "
                f"the first error: {episodes[0].outcome.get('error')}"
            )
        metrics = self.learn(episodes)
        metrics.update(self.stop_rule.observe(s for s in samples if s.agent in self.learners))
        self.after_update()
        response_tokens = metrics["rollout/response_tokens"]
        metrics["rollout/seconds"] = rollout_s
        metrics["rollout/tokens_per_s"] = response_tokens / rollout_s if rollout_s > 0 else None
        self.step += 1
        return metrics

    def after_update(self) -> None:
        """Called after each step's update, before the next rollout.

        With ``rollout_engine="hf"`` rollouts run on the very modules being trained, so
        nothing needs syncing; with ``"vllm"`` the engines get the new weights
        (:meth:`sync_engines`). A subclass whose :meth:`rollout` uses other engines sends
        them the new weights here (calling this one too), e.g. from
        ``self.learners[agent].model.state_dict()``.
        """
        self.sync_engines()

    def learn(self, episodes: Sequence[EpisodeResult]) -> dict[str, Any]:
        """Update every trained agent once on ``episodes``; returns the step's metrics.

        Credit, old and reference log-probs, advantages, then one PPO-clipped pass per
        agent, at the learning rate of the current step (``step`` is not advanced:
        :meth:`train_step` does that). Episodes made elsewhere train the same way, as
        long as their actions carry the exact prompt and response ids of the agents'
        tokenizers: a rollout engine outside this process, or a saved run's
        trajectories. The rollout engines of ``rollout_engine="vllm"`` get the new
        weights in :meth:`after_update`, not here.

        Args:
            episodes: Finished episodes of this trainer's environment.

        Returns:
            Metrics: per-agent statistics (frozen agents: ``actions``, ``mean_reward``,
            tool use and lengths), rewards, success rate and timings.
        """
        samples = [a for e in episodes for a in e.actions]
        self._check_credit(episodes)

        train_started = time.perf_counter()
        prepared = self._prepare(samples)
        self._advantages(prepared)
        _sync_device(self.device)
        logprob_s = time.perf_counter() - train_started
        metrics: dict[str, Any] = {"step": self.step + 1}
        lr = self.config.lr * self.lr_factor(self.step)
        tokens_trained = response_tokens_trained = 0
        for agent, stats in self._update(prepared, lr).items():
            tokens_trained += int(stats.pop("tokens", 0))
            response_tokens_trained += int(stats.pop("response_tokens", 0))
            for key, value in stats.items():
                metrics[f"{agent}/{key}"] = value
        for agent in self.agents:
            if agent not in self.learners:
                # Frozen: scored like the others, so its rewards are logged too.
                own = [s.trainable_reward for s in samples if s.agent == agent]
                valid = [r for r in own if r is not None]
                metrics[f"{agent}/actions"] = float(len(own))
                metrics[f"{agent}/mean_reward"] = float(np.mean(valid)) if valid else None
        _sync_device(self.device)
        train_s = time.perf_counter() - train_started
        report = summarize(episodes)
        valid_rewards = [s.trainable_reward for s in samples if s.trainable_reward is not None]
        metrics.update(
            {
                "rollout/episodes": len(episodes),
                "rollout/success_rate": report["success_rate"],
                "rollout/mean_reward": float(np.mean(valid_rewards)) if valid_rewards else None,
                "rollout/invalid_coach_rate": report["invalid_coach_rate"],
                "rollout/response_tokens": sum(len(s.response_ids) for s in samples),
                "train/seconds": train_s,
                "train/tokens": tokens_trained,
                "train/response_tokens": response_tokens_trained,
                "train/tokens_per_s": tokens_trained / train_s if train_s > 0 else None,
                "train/logprob_seconds": logprob_s,
                "train/update_seconds": train_s - logprob_s,
                "lr": lr,
            }
        )
        for agent, stats in report["per_agent"].items():
            metrics[f"{agent}/tool_call_rate"] = stats["tool_call_rate"]
            metrics[f"{agent}/mean_response_tokens"] = stats["mean_response_tokens"]
        return metrics

    # ------------------------------------------------------------------ pieces of a step

    def _check_credit(self, episodes: Sequence[EpisodeResult]) -> None:
        """Refuse to train on rewards paid under other credit settings than the config's.

        The environment owns each action's reward; the config only names the credit it
        asks its environments for. Episodes from an environment made otherwise (an
        ``env_factory`` of the user's, saved trajectories) must agree with it.

        Raises:
            ValueError: Naming the settings that differ and how to make them agree.
        """
        config = self.config
        wanted = {
            "mode": config.credit_mode,
            "outcome_weight": config.outcome_weight,
            "backprop_decay": config.backprop_decay,
        }
        # The weight a mode does not use cannot disagree.
        used = {"mixed": ("outcome_weight",), "backprop": ("backprop_decay",)}
        for episode in episodes:
            for sample in episode.actions:
                credit = sample.credit
                if credit is None:
                    if config.credit_mode == "process":
                        continue  # rows from before credit was recorded held process rewards
                    raise ValueError(
                        f"an action of episode {episode.episode_id} does not say under which "
                        f"credit its reward was paid, and credit_mode={config.credit_mode!r} "
                        "cannot be taken on trust: roll it out again with this version"
                    )
                keys = ("mode", *used.get(config.credit_mode, ()))
                differ = {k: credit.get(k) for k in keys if credit.get(k) != wanted[k]}
                if differ:
                    raise ValueError(
                        f"episode {episode.episode_id} was paid under credit {differ}, but the "
                        f"config asks for { ({k: wanted[k] for k in differ}) }: the environment "
                        "owns the reward, so make the env_factory's environments with "
                        f"credit_mode={config.credit_mode!r} (and its weights), or change "
                        "the config"
                    )

    def _logprobs(self, model: Any, rows: Sequence[ActionSample], pad_id: int) -> torch.Tensor:
        config = self.config

        def score(batch: Any) -> torch.Tensor:
            return response_logprobs(
                model, batch, chunk_size=config.logprob_chunk_size, temperature=config.temperature
            )

        return shard_logprobs(score, rows, config, pad_id=pad_id, device=self.device)

    def _prepare(self, samples: list[ActionSample]) -> dict[str, PreparedRows]:
        """Every trained agent's usable actions with their old and reference log-probs."""
        usable: dict[str, list[ActionSample]] = {}
        skipped: dict[str, tuple[int, int]] = {}
        for agent in self.agents:
            if agent not in self.learners:
                continue
            kept, cut, invalid = [], 0, 0
            for sample in samples:
                if sample.agent != agent:
                    continue
                if not sample.response_ids or len(sample.logprobs) != len(sample.response_ids):
                    invalid += 1  # an untrainable generation (no exact ids)
                elif sample.finish_reason == "length" and self.config.mask_truncated:
                    cut += 1
                elif sample.trainable_reward is None:
                    invalid += 1
                else:
                    kept.append(sample)
            usable[agent] = kept
            skipped[agent] = (cut, invalid)
        scored = self.score_agents({a: (self.learners[a], s) for a, s in usable.items() if s})
        prepared: dict[str, PreparedRows] = {}
        for agent, kept in usable.items():
            cut, invalid = skipped[agent]
            if not kept:
                empty = torch.zeros((0, 1))
                prepared[agent] = PreparedRows(
                    [], torch.zeros(0), empty, empty, empty, cut, invalid
                )
                continue
            old, ref = scored[agent]
            mask = torch.zeros_like(old)
            for i, sample in enumerate(kept):
                mask[i, : len(sample.response_ids)] = 1.0
            values = torch.tensor([s.trainable_reward for s in kept])
            prepared[agent] = PreparedRows(kept, values, old, ref, mask, cut, invalid)
        return prepared

    def score_agents(
        self, work: dict[str, tuple[AgentLearner, list[ActionSample]]]
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Old and reference log-probs of each agent's usable actions (see :meth:`score_actions`).

        One agent after another here; a subclass whose agents' learners can work at
        once (separate processes) overrides this.

        Args:
            work: Per agent with usable actions, its learner and those actions.
        """
        return {agent: self.score_actions(learner, rows) for agent, (learner, rows) in work.items()}

    def score_actions(
        self, learner: AgentLearner, samples: Sequence[ActionSample]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Old and reference log-probs ``[N, T]`` (CPU) of one agent's usable actions.

        The learner-side half of a step, with :meth:`update_agent`: a subclass whose
        learners live elsewhere (other processes, other machines) overrides both.
        """
        pad_id = learner.policy.pad_token_id
        learner.model.eval()
        if learner.adapter is None:
            old = self._logprobs(learner.model, samples, pad_id)
            ref = self._logprobs(learner.ref_model, samples, pad_id)
        else:
            learner.model.set_adapter(learner.adapter)
            old = self._logprobs(learner.model, samples, pad_id)
            with learner.model.disable_adapter():
                ref = self._logprobs(learner.model, samples, pad_id)
        return old, ref

    def _advantages(self, prepared: dict[str, PreparedRows]) -> None:
        """Fill ``advantages`` of every agent with actions, by the configured estimator.

        All agents go to the estimator at once (REINFORCE++ may whiten across agents).

        Raises:
            ValueError: When the estimator leaves an agent out or answers in a wrong shape.
        """
        config = self.config
        batches: dict[str, AgentBatch] = {}
        for agent, prep in prepared.items():
            if not prep.samples:
                continue
            kl = kl_penalty(prep.old_logprobs, prep.ref_logprobs, config.kl_estimator)
            prep.stats["kl"] = float((kl * prep.mask).sum() / prep.mask.sum())
            batches[agent] = AgentBatch(
                rewards=prep.rewards,
                old_logprobs=prep.old_logprobs,
                ref_logprobs=prep.ref_logprobs,
                mask=prep.mask,
                group_keys=[tuple(s.prompt_ids) for s in prep.samples],
            )
        if not batches:
            return  # nothing usable this step: every agent's update is skipped
        results = self.estimator(batches, config)
        for agent, batch in batches.items():
            result = results.get(agent)
            if result is None:
                raise ValueError(
                    f"advantage estimator {config.advantage_estimator!r} returned no "
                    f"advantages for agent {agent!r} (it got {list(batches)})"
                )
            if tuple(result.advantages.shape) != tuple(batch.mask.shape):
                raise ValueError(
                    f"advantage estimator {config.advantage_estimator!r} returned advantages "
                    f"of shape {tuple(result.advantages.shape)} for agent {agent!r}; "
                    f"expected its mask's {tuple(batch.mask.shape)}"
                )
            prepared[agent].advantages = result.advantages.detach().to("cpu", torch.float32)
            prepared[agent].stats.update(result.stats)

    def _update(self, prepared: dict[str, PreparedRows], lr: float) -> dict[str, dict[str, float]]:
        """Every trained agent's update statistics (agents without actions are skipped)."""
        stats: dict[str, dict[str, float]] = {}
        for agent, prep in prepared.items():
            stats[agent] = {
                "actions": float(len(prep.samples)),
                "masked_length": float(prep.masked_length),
                "masked_invalid": float(prep.masked_invalid),
                **prep.stats,
            }
            if prep.samples:
                stats[agent]["mean_reward"] = float(prep.rewards.mean())
        work = {a: (self.learners[a], p) for a, p in prepared.items() if p.samples}
        for agent, update_stats in self.update_agents(work, lr).items():
            stats[agent].update(update_stats)
        return stats

    def update_agents(
        self, work: dict[str, tuple[AgentLearner, PreparedRows]], lr: float
    ) -> dict[str, dict[str, float]]:
        """Each agent's PPO-clipped pass (see :meth:`update_agent`); their statistics.

        One agent after another here; a subclass whose agents' learners can work at
        once overrides this.

        Args:
            work: Per agent with usable actions, its learner and prepared rows.
            lr: The step's learning rate.
        """
        return {
            agent: self.update_agent(learner, prep, lr) for agent, (learner, prep) in work.items()
        }

    def update_agent(
        self, learner: AgentLearner, prep: PreparedRows, lr: float
    ) -> dict[str, float]:
        """One PPO-clipped pass of one agent at learning rate ``lr``; its statistics.

        See :func:`mappa_train.update.update_agent`; a subclass whose learners live
        elsewhere overrides this and :meth:`score_actions`.
        """
        config = self.config
        for group in learner.optimizer.param_groups:
            group["lr"] = lr
        model = learner.model
        model.train()
        if learner.adapter is not None:
            model.set_adapter(learner.adapter)  # also makes only this adapter trainable
        if config.gradient_checkpointing == "auto":
            self._choose_checkpointing(learner, prep)

        def score(batch: Any) -> torch.Tensor:
            return response_logprobs(
                model,
                batch,
                chunk_size=config.logprob_chunk_size,
                temperature=config.temperature,
                recompute_logits=config.recompute_logits,
            )

        try:
            return update_agent(
                score,
                learner.optimizer,
                prep,
                config,
                step=self.step,
                agent=learner.agent,
                pad_id=learner.policy.pad_token_id,
                device=self.device,
                kl_in_loss=not self.estimator.kl_in_reward,
            )
        finally:
            model.eval()

    def _choose_checkpointing(self, learner: AgentLearner, prep: PreparedRows) -> None:
        """Choose activation checkpointing for one update (``gradient_checkpointing="auto"``).

        On only where the largest micro-batch's activations would not fit
        (:func:`mappa_train.memory.needs_checkpointing`); logged when the choice changes.
        """
        model = learner.model
        tokens = largest_micro_batch_tokens(prep.samples, self.config)
        value_bytes = torch.finfo(next(model.parameters()).dtype).bits // 8
        activations = activation_bytes(tokens, model.config, value_bytes)
        free = free_memory_bytes(self.device)
        wanted = needs_checkpointing(activations, free)
        if learner.checkpointing and not wanted and self.compiles_decoding:
            # Decoder layers read the flag at every call, so compiled decoding would
            # compile its graphs again at each switch: once on, it stays on.
            wanted = True
        # Asked of the model: agents on one LoRA base share its setting.
        if wanted != _is_checkpointing(model):
            (_enable_checkpointing if wanted else _disable_checkpointing)(model)
        if wanted == learner.checkpointing:
            return
        learner.checkpointing = wanted
        logger.info(
            "%s: activation checkpointing %s: micro-batches of up to %d tokens keep about "
            "%.1f GiB of activations without it, %.1f GiB free",
            learner.agent,
            "on" if wanted else "off",
            tokens,
            activations / GIB,
            free / GIB,
        )

    # ------------------------------------------------------------------ evaluation

    def evaluate(self) -> dict[str, Any]:
        """Held-out evaluation: success rate (rule-graded), tool use and lengths per agent.

        The main set logs ``eval/...``; each set of ``config.eval_sets`` logs
        ``eval/<name>/...``. Every episode is saved (``eval/step-N.jsonl``,
        ``eval/<name>/step-N.jsonl``), so results can be analysed per problem.
        """
        metrics: dict[str, Any] = {}
        sets = [("eval", self.eval_task_ids)] + [
            (f"eval/{name}", ids) for name, ids in self.eval_set_task_ids.items()
        ]
        for kind, task_ids in sets:
            if task_ids:
                metrics.update(self._evaluate_set(kind, task_ids))
        return metrics

    def _evaluate_set(self, kind: str, task_ids: Sequence[str]) -> dict[str, Any]:
        """One held-out set's episodes (saved) and metrics, keyed ``<kind>/...``."""
        config = self.config
        options = [{"task_id": task_ids[i % len(task_ids)]} for i in range(config.eval_episodes)]
        # The main set keeps the seeds it always had; another set's depend on its name.
        salt = () if kind == "eval" else (kind,)
        started = time.perf_counter()
        episodes = self._run_episodes(
            kind,
            options,
            config.eval_temperature,
            derive_seed(config.seed, "eval", *salt, self.step),
        )
        elapsed = time.perf_counter() - started
        # Kept beside the training rollouts (not among them: a directory of rollouts is
        # training data), so a held-out success can be read, not only counted.
        save_jsonl(
            self.out / kind / f"step-{self.step:06d}.jsonl",
            [a for e in episodes for a in e.actions],
        )
        report = summarize(episodes, wall_time_s=elapsed)
        metrics: dict[str, Any] = {
            f"{kind}/seconds": elapsed,
            f"{kind}/success_rate": report["success_rate"],
            f"{kind}/mean_outcome_reward": report["mean_outcome_reward"],
        }
        for agent, stats in report["per_agent"].items():
            metrics[f"{kind}/{agent}/tool_call_rate"] = stats["tool_call_rate"]
            metrics[f"{kind}/{agent}/mean_response_tokens"] = stats["mean_response_tokens"]
            metrics[f"{kind}/{agent}/mean_coach_score"] = stats["mean_coach_score"]
        return metrics

    # ------------------------------------------------------------------ persistence, logs

    def save(self) -> Path:
        """Write a complete checkpoint of the current step."""
        return ckpt.save_checkpoint(
            self.checkpoint_root,
            self.step,
            self.learners,
            {"step": self.step, "config": self.config.to_dict()},
            keep=self.config.keep_checkpoints,
        )

    @property
    def metrics_path(self) -> Path:
        """The JSONL file of per-step metrics."""
        return self.out / "metrics.jsonl"

    def _truncate_metrics(self, step: int) -> None:
        # Steps after the checkpoint will be redone: drop their lines so none is doubled.
        # A line torn by a kill mid-write is dropped too.
        if not self.metrics_path.exists():
            return
        kept = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and record.get("step", 0) <= step:
                kept.append(record)
        self.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self.history = kept

    def _log(self, metrics: dict[str, Any]) -> None:
        clean = {k: _plain(v) for k, v in metrics.items()}
        # 1 when agents' code ran in namespaces, 0 when it ran unconfined, on every step.
        mode = self.isolation.get("isolation")
        clean["isolation/namespaces"] = None if mode == "unknown" else float(mode == "namespaces")
        self.history.append(clean)
        with self.metrics_path.open("a") as handle:
            handle.write(json.dumps(clean) + "\n")
        if self._tb is not None:
            for key, value in clean.items():
                if isinstance(value, (int, float)) and value is not None and key != "step":
                    self._tb.add_scalar(key, value, clean["step"])
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(clean, step=clean["step"])
        logger.info("step %s: %s", clean["step"], {k: clean[k] for k in list(clean)[:8]})

    def _open_loggers(self) -> None:
        if self.config.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                logger.warning("tensorboard is not installed: metrics go to metrics.jsonl only")
            else:
                self._tb = SummaryWriter(log_dir=str(self.out / "tensorboard"))
        if self.config.wandb_project:
            from mappa_env._optional import require

            wandb = require("wandb", "wandb", purpose="Weights & Biases logging")
            self._wandb = wandb.init(
                project=self.config.wandb_project, config=self.config.to_dict(), resume="allow"
            )

    def _close_loggers(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def _progress(self, total: int, initial: int) -> Any:
        if not self.config.progress:
            return None
        from tqdm.auto import tqdm

        return tqdm(
            total=total, initial=initial, desc="train steps", unit="step", dynamic_ncols=True
        )

    def _plot(self) -> Path | None:
        """Training curves: rewards per agent, success, tool use, response lengths."""
        if not self.history:
            return None
        # Drawn outside pyplot: a notebook user's matplotlib backend stays as it is.
        from mappa_env.plotting import new_figure

        steps = [m["step"] for m in self.history]
        fig, axes = new_figure(2, 2, figsize=(11, 7), purpose="training plots")
        panels = [
            (axes[0, 0], "mean_reward", "mean action reward"),
            (axes[0, 1], "tool_call_rate", "tool-call rate"),
            (axes[1, 0], "mean_response_tokens", "response tokens"),
        ]
        for ax, key, title in panels:
            for agent in self.agents:
                ys = [m.get(f"{agent}/{key}") for m in self.history]
                ax.plot(steps, [math.nan if y is None else y for y in ys], label=agent)
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.legend(fontsize=8)
        ax = axes[1, 1]
        rollout = [m.get("rollout/success_rate") for m in self.history]
        ax.plot(steps, [math.nan if y is None else y for y in rollout], label="rollout")
        evals = [
            (m["step"], m["eval/success_rate"]) for m in self.history if "eval/success_rate" in m
        ]
        if evals:
            ax.plot(*zip(*evals), marker="o", label="held-out eval")
        ax.set_title("success rate")
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = self.out / "training.png"
        fig.savefig(path, dpi=110)
        return path


def _enable_checkpointing(model: Any) -> None:
    """Activation checkpointing, by its new transformers name where the old one is deprecated."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _is_checkpointing(model: Any) -> bool:
    """Whether ``model`` recomputes activations, by transformers' new name where it has it."""
    if hasattr(model, "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


def _disable_checkpointing(model: Any) -> None:
    """The counterpart of :func:`_enable_checkpointing`."""
    if hasattr(model, "activation_checkpointing_disable"):
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()


def _sync_device(device: str) -> None:
    """Wait for queued GPU work, so wall-clock phases are measured honestly."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _is_remote_spec(spec: str) -> bool:
    """Whether a model spec names a model outside this process (no weights to train)."""
    return spec.strip().startswith(("api:", "vllm:"))


def _plain(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
