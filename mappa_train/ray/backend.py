"""The Ray backend: every trained agent's learner is a group of FSDP2 ranks on Ray.

What stays in the driver is everything that looks at more than one agent or at the
episodes: the loop, rollouts (environments, coach, sandboxes, the agents' rollout
copies), credit, advantages (so ``normalize_scope: all`` whitens across agents as
before), evaluation, logging and checkpoints. Per agent, a
:class:`~mappa_train.ray.learner.LearnerGroup` of ``ranks_per_agent`` actors scores the
actions and runs the PPO pass (the same functions as in one process,
:mod:`mappa_train.update`); its rollout copy is a model in the driver or
``engines_per_agent`` engine actors (:mod:`mappa_train.ray.rollout_engines`), which get new
weights as ``weight_sync`` says (:mod:`mappa_train.ray.sync_modes`). Actors are placed on the
cluster's GPUs by :mod:`mappa_train.ray.placement`.

Needs the ``distributed`` extra (``pip install 'mappa-rl[distributed]'``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from mappa_train.frozen import load_causal_lm
from mappa_train.learner import RunSpec, Started
from mappa_train.ray import sync_modes
from mappa_train.ray.learner import LearnerGroup, RayLearner
from mappa_train.ray.placement import agents_at_once, reserve_gpus
from mappa_train.ray.rollout_engines import start_engines
from mappa_train.ray.support import import_ray

logger = logging.getLogger(__name__)

__all__ = ["RayBackend"]


class RayBackend:
    """Starts (or joins) Ray and every trained agent's learner group and rollout copy.

    ``config.ranks_per_agent``, ``gpus_per_rank``, ``engines_per_agent`` and
    ``ray_address`` say where; a :class:`~mappa_train.learner.Backend`.
    """

    def __init__(self) -> None:
        self.config: Any = None
        self.placement: Any = None
        """The run's placement group (``None`` on CPU)."""
        self.learners: dict[str, RayLearner] = {}
        self._started: list[Any] = []  # groups and engine policies, stopped if start fails
        self._at_once: bool | None = None  # agents_in_parallel, once decided

    def start(self, run: RunSpec) -> Started:
        """Start or join Ray, start each trained agent's group, load the rollout copies.

        Raises:
            ValueError: With LoRA (the groups train full weights), or when the cluster
                lacks the GPUs the placement needs.
        """
        config = self.config = run.config
        if config.lora_rank > 0:
            raise ValueError("the Ray backend trains full weights: set lora_rank: 0")
        ray = import_ray()
        if not ray.is_initialized():
            ray.init(address=config.ray_address, include_dashboard=False, log_to_driver=True)
        try:
            self.placement = reserve_gpus(ray, config, len(run.trained_agents))
            for agent in run.trained_agents:
                self.learners[agent] = self._start_agent(agent, run)
            for learner in self.learners.values():
                learner.sync = sync_modes.connect(
                    learner.group, learner.policy, learner.model, config
                )
        except BaseException:
            self._stop_started()  # nothing started is left holding GPUs
            raise
        return Started(dict(self.learners))

    def _start_agent(self, agent: str, run: RunSpec) -> RayLearner:
        """One agent's group and rollout copy (its sync is connected after all start)."""
        from transformers import AutoTokenizer

        from mappa_agents.hf import HFPolicy
        from mappa_agents.models import resolve_model

        config = run.config
        source = str(resolve_model(run.specs[agent]))
        saved = run.resume_from / "agents" / agent if run.resume_from else None
        weights = str(saved) if saved else source
        started = time.perf_counter()
        group = LearnerGroup(
            agent,
            weights,
            source,
            config,
            optimizer_state=str(saved / "optimizer.pt") if saved else None,
            placement=self.placement,
        )
        self._started.append(group)
        logger.info(
            "agent %s: %d learner ranks ready in %.1f s",
            agent,
            group.world,
            time.perf_counter() - started,
        )
        tokenizer = AutoTokenizer.from_pretrained(source)
        name = f"{agent}:{Path(source).name}"
        model: Any = None
        if config.engines_per_agent > 0:
            policy: Any = start_engines(weights, source, name, tokenizer, config, self.placement)
            self._started.append(policy)
        else:
            model = load_causal_lm(weights, run.dtype, run.device)
            model.eval()
            model.requires_grad_(False)  # trained by the group; the driver only acts
            model.config.use_cache = True
            policy = HFPolicy(
                model,
                tokenizer,
                name=name,
                max_batch_size=config.rollout_batch_size,
                compile_decode=run.compiles_decoding,
            )
        return RayLearner(
            agent,
            model,
            tokenizer,
            policy,
            source,
            group,
            sync=sync_modes.DriverCopySync(group, model),
            at_once=self.agents_at_once,
        )

    def agents_at_once(self) -> bool:
        """Whether the groups work at once (:func:`~mappa_train.ray.placement.agents_at_once`).

        Decided once per run, from where the groups' ranks are.
        """
        if self._at_once is None:
            groups = [learner.group for learner in self.learners.values()]
            gpus = [group.gpus() if group.world > 1 else [] for group in groups]
            self._at_once = agents_at_once(self.config.agents_in_parallel, gpus)
            logger.info(
                "agents' log-prob passes and updates: %s",
                "at once" if self._at_once else "one agent after another",
            )
        return self._at_once

    def open_engines(self) -> None:
        """Nothing: the engines started with the groups."""

    def _stop_started(self) -> None:
        """End every group and engine started so far, each on its own."""
        started, self._started = self._started, []
        for actors in started:
            try:
                actors.close()
            except Exception:  # the others must be stopped all the same
                logger.exception("stopping %s failed; its actors were killed", actors)
                if isinstance(actors, LearnerGroup):
                    actors.kill()
        self._release_placement()

    def _release_placement(self) -> None:
        if self.placement is not None:
            import_ray().util.remove_placement_group(self.placement)
            self.placement = None

    def close(self) -> None:
        """Release the GPUs reserved for the run (the learners closed their actors)."""
        self._started = []
        self._release_placement()
