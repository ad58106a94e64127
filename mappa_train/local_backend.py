"""The in-process backend: every trained agent's learner in the trainer's own process.

Full fine-tuning loads per agent its model (from the checkpoint when resuming), a frozen
reference (the source weights) and AdamW (with float32 master weights under mixed
precision). With ``lora_rank > 0`` one frozen base is shared by all agents, each training
its own adapter. With ``rollout_engine="vllm"`` each trained agent acts through an
in-process vLLM engine that gets the new weights after each update.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from mappa_train import checkpoint as ckpt
from mappa_train.activations import enable_checkpointing
from mappa_train.frozen import is_remote_spec, load_causal_lm
from mappa_train.learner import RunSpec, Started
from mappa_train.local_learner import LocalLearner
from mappa_train.memory import check_memory
from mappa_train.precision import MasterWeightAdamW

logger = logging.getLogger(__name__)

__all__ = ["LocalBackend", "make_optimizer", "vllm_options"]


def make_optimizer(params: Any, run: RunSpec) -> torch.optim.Optimizer | MasterWeightAdamW:
    """AdamW with the run's settings (over float32 masters under mixed precision)."""
    config = run.config
    settings = {
        "lr": config.lr,
        "betas": tuple(config.adam_betas),
        "weight_decay": config.weight_decay,
        # One kernel for all parameters instead of a few per tensor.
        "fused": run.device.startswith("cuda"),
    }
    if run.master_weights:
        return MasterWeightAdamW(params, **settings)
    return torch.optim.AdamW(params, **settings)


def vllm_options(run: RunSpec) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments of every in-process engine.

    The run's dtype and seed, an equal share of 45% of the GPU per trained agent, then
    ``vllm_options`` over them.
    """
    return {
        "dtype": str(run.dtype).removeprefix("torch."),
        "gpu_memory_utilization": 0.45 / len(run.trained_agents),
        "seed": run.config.seed,
        **run.config.vllm_options,
    }


class LocalBackend:
    """Builds in-process learners (a :class:`~mappa_train.learner.Backend`)."""

    def __init__(self) -> None:
        self.run: RunSpec | None = None
        self.learners: dict[str, LocalLearner] = {}

    def start(self, run: RunSpec) -> Started:
        """Load every trained agent's model, reference and optimizer (or its adapter)."""
        from mappa_agents.models import resolve_model

        self.run = run
        config = run.config
        if run.device.startswith("cuda"):
            free, total = torch.cuda.mem_get_info(torch.device(run.device))
            if config.rollout_engine == "vllm":
                # The engines, built after the models, take their share of the GPU too.
                share = vllm_options(run)["gpu_memory_utilization"]
                free -= int(share * len(run.trained_agents) * total)
            # Frozen agents hold weights only; the estimate covers the trained ones.
            check_memory(
                [str(resolve_model(run.specs[a])) for a in run.trained_agents],
                free,
                weight_bytes=torch.finfo(run.dtype).bits // 8,
                master_weights=run.master_weights,
                lora=config.lora_rank > 0,
            )
        frozen: dict[str, Any] = {}
        if config.lora_rank > 0:
            frozen = self._start_lora(run)
        else:
            for agent in run.trained_agents:
                self.learners[agent] = self._full_learner(agent, run)
        if run.resume_from is not None:
            for agent, learner in self.learners.items():
                ckpt.load_optimizer_state(
                    run.resume_from / "agents" / agent, learner.model, learner.optimizer
                )
        return Started(dict(self.learners), frozen)

    def _full_learner(self, agent: str, run: RunSpec) -> LocalLearner:
        """One agent's model, frozen reference, tokenizer, optimizer and policy."""
        from transformers import AutoTokenizer

        from mappa_agents.hf import HFPolicy
        from mappa_agents.models import resolve_model

        config = run.config
        source = str(resolve_model(run.specs[agent]))
        weights = str(run.resume_from / "agents" / agent) if run.resume_from else source
        # Under mixed precision the optimizer state holds the float32 masters.
        model = load_causal_lm(weights, run.dtype, run.device)
        if config.gradient_checkpointing is True:
            enable_checkpointing(model)
        model.config.use_cache = True  # generation needs the cache; training ignores it
        ref = load_causal_lm(source, run.dtype, run.device)  # the initial weights, frozen
        ref.eval()
        ref.requires_grad_(False)
        tokenizer = AutoTokenizer.from_pretrained(source)
        optimizer = make_optimizer(model.parameters(), run)
        policy = HFPolicy(
            model,
            tokenizer,
            name=f"{agent}:{Path(source).name}",
            max_batch_size=config.rollout_batch_size,
            compile_decode=run.compiles_decoding,
        )
        return LocalLearner(
            agent,
            model,
            ref,
            tokenizer,
            optimizer,
            policy,
            source,
            config,
            device=run.device,
        )

    def _start_lora(self, run: RunSpec) -> dict[str, Any]:
        """One frozen base shared by all agents, one trainable LoRA adapter per agent.

        Returns:
            The policies of frozen agents of the same base (an adapter never trained).
        """
        from transformers import AutoTokenizer

        from mappa_agents.hf import HFPolicy
        from mappa_agents.lora import LoRASettings, adapter_parameters, shared_lora_model
        from mappa_agents.models import resolve_model

        config, specs, trained = run.config, run.specs, run.trained_agents
        sources = {str(resolve_model(specs[a])) for a in trained}
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
            for a in run.agents
            if a in trained
            or (not is_remote_spec(specs[a]) and str(resolve_model(specs[a])) == source)
        ]
        # The base is frozen: it stays in the compute dtype; peft keeps adapters float32.
        base = load_causal_lm(source, run.dtype, run.device)
        if config.gradient_checkpointing is True:
            enable_checkpointing(base)
        base.config.use_cache = True
        settings = LoRASettings(
            rank=config.lora_rank,
            alpha=config.lora_alpha,
            target_modules=config.lora_target_modules,
        )
        resume = run.resume_from
        saved = {a: resume / "agents" / a for a in trained} if resume else None
        model = shared_lora_model(base, adapters, settings, saved)
        tokenizer = AutoTokenizer.from_pretrained(source)
        frozen = {
            agent: HFPolicy(
                model,
                tokenizer,
                adapter=agent,
                name=f"{agent}:lora (frozen)",
                max_batch_size=config.rollout_batch_size,
            )
            for agent in adapters
            if agent not in trained
        }
        for agent in trained:
            # The reference is the base with adapters disabled: every agent's start.
            self.learners[agent] = LocalLearner(
                agent,
                model,
                None,
                tokenizer,
                make_optimizer(adapter_parameters(model, agent), run),
                HFPolicy(
                    model,
                    tokenizer,
                    adapter=agent,
                    name=f"{agent}:lora",
                    max_batch_size=config.rollout_batch_size,
                ),
                source,
                config,
                device=run.device,
                adapter=agent,
            )
        return frozen

    def open_engines(self) -> None:
        """``rollout_engine="vllm"``: an in-process vLLM engine per trained agent.

        Built from the agent's source model (its architecture and tokenizer), then given
        the learner's current weights (a resumed run's too), as after every update.
        """
        if self.run is None or self.run.config.rollout_engine != "vllm":
            return
        # In this process (not vLLM's engine-core subprocess): new weights then reach
        # the engine as tensors of this process, without a copy between processes.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from mappa_agents import vllm_policy

        options = vllm_options(self.run)
        for agent, learner in self.learners.items():
            learner.engine = vllm_policy.VLLMPolicy(
                learner.source, name=f"{agent}:vllm:{Path(learner.source).name}", **options
            )
            logger.info("%s acts through vLLM (%s)", agent, options)
        for learner in self.learners.values():
            learner.start_sync().result()

    def close(self) -> None:
        """Nothing is shared between in-process learners beyond what they close."""
