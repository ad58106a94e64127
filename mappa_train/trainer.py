"""The MAPPA training loop: rollouts, rewards, advantages, updates through learners, logs.

Each trained agent has a :class:`~mappa_train.learner.Learner`: its own weights,
optimizer, learning-rate schedule and frozen reference, wherever they live. A step:

1. **Rollouts.** ``prompts_per_step x samples_per_prompt`` episodes run through
   :class:`~mappa_agents.runner.RolloutRunner` with each agent's rollout policy
   (:attr:`Learner.rollout_policy <mappa_train.learner.Learner.rollout_policy>`).
2. **Credit.** Each action is trained on the reward its environment gave it under the
   configured credit mode (:mod:`mappa_env.credit`: the environment is the reward's one
   owner, so the rollouts saved, ``env.rewards`` and the loss hold the same number).
   Actions cut by the length limit and actions whose reward is invalid (an invalid coach
   verdict, an aborted episode) are masked out and counted.
3. **Update.** Per trained agent, on its own actions: old and reference log-probs of
   the exact sampled ids (from its learner), advantages from the configured estimator
   (REINFORCE++ by default, :mod:`mappa_train.algorithms.reinforce_pp`; any registered
   one, see :mod:`mappa_train.algorithms.registry`, all agents at once), then one pass of
   PPO-clipped mini-batch updates by its learner, and its rollout engines get the new
   weights. Agents left out of ``train_agents`` are frozen: they act, and are scored and
   logged, but are never updated.
4. Metrics (JSONL, TensorBoard), periodic held-out evaluation, atomic checkpoints.

Where learners live is the backend's choice (:mod:`mappa_train.learner`): in this process
(:class:`~mappa_train.local_backend.LocalBackend`), on Ray
(:class:`~mappa_train.ray.backend.RayBackend`), or one of your own, given as ``backend``.
Rollouts made elsewhere train through :meth:`Trainer.learn`, or replace the trainer's own
by a ``rollout`` function (the documentation's *Trainer seams* page shows both).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mappa_agents.hf import resolve_device, resolve_dtype
from mappa_agents.policy import SamplingParams
from mappa_agents.report import summarize
from mappa_agents.runner import RolloutRunner
from mappa_agents.seeds import derive_seed
from mappa_agents.system import AgentSystem, parse_system_spec
from mappa_agents.trajectory import ActionSample, EpisodeResult, save_jsonl
from mappa_env.errors import SettingsError
from mappa_train import checkpoint as ckpt
from mappa_train.advantages import fill_advantages, prepared_rows, usable_actions
from mappa_train.algorithms.registry import get_estimator
from mappa_train.config import TrainConfig
from mappa_train.environments import (
    EnvFactory,
    check_credit,
    check_sandboxes,
    make_env_factories,
    read_env,
)
from mappa_train.frozen import frozen_policies, select_trained_agents
from mappa_train.interrupts import raise_if_interrupted
from mappa_train.learner import Backend, Learner, RunSpec
from mappa_train.local_learner import LocalLearner
from mappa_train.memory import check_memory
from mappa_train.metrics_log import MetricsLog, plain
from mappa_train.plots import plot_history
from mappa_train.resume import checkpoint_to_resume
from mappa_train.reward_parts import reward_part_means
from mappa_train.schedule import warmup_cosine
from mappa_train.stop_rules import UnscoredStopRule
from mappa_train.update import PreparedRows, needs_old_logprobs

logger = logging.getLogger(__name__)

__all__ = [
    "AgentLearner",
    "EnvFactory",
    "Rollout",
    "StepRollouts",
    "Trainer",
    "make_trainer",
    "warmup_cosine",
]

AgentLearner = LocalLearner
"""The in-process learner under its former name."""

Rollout = Callable[["Trainer", int], Sequence[EpisodeResult]]
"""Makes step ``step``'s episodes in place of :meth:`Trainer.rollout`: ``f(trainer, step)``.

Its actions must carry the exact prompt and response ids of the agents' tokenizers."""


@dataclass(frozen=True)
class StepRollouts:
    """One step's episodes, made by :meth:`Trainer.rollout_step` for its update."""

    step: int
    """The step they were made in (with the weights of that step)."""
    episodes: list[EpisodeResult]
    """The episodes."""
    seconds: float
    """Wall-clock seconds the rollouts took."""


def make_backend(config: TrainConfig) -> Backend:
    """The backend of ``config.distributed``: in process (``none``) or on Ray (``ray``)."""
    if config.distributed == "ray":
        from mappa_train.ray.backend import RayBackend

        return RayBackend()
    from mappa_train.local_backend import LocalBackend

    return LocalBackend()


def make_trainer(
    config: TrainConfig,
    env_factory: EnvFactory | None = None,
    eval_env_factory: EnvFactory | None = None,
) -> Trainer:
    """The trainer of ``config``, its learners where ``config.distributed`` puts them."""
    return Trainer(config, env_factory, eval_env_factory)


class Trainer:
    """Trains a multiagent system on a pipeline environment with per-action rewards.

    Args:
        config: The run's settings.
        env_factory: Makes a training environment; default ``mappa_env.make(config.env,
            coach=config.coach, **config.env_options)``.
        eval_env_factory: Makes a held-out evaluation environment; default as above with
            ``config.eval_env_options``.
        backend: Builds the trained agents' learners; default the one of
            ``config.distributed`` (:func:`make_backend`).
        rollout: Makes each step's episodes instead of the trainer's own runner
            (:data:`Rollout`); its engines get new weights from the learners'
            :meth:`~mappa_train.learner.Learner.start_sync` or on their own.
    """

    def __init__(
        self,
        config: TrainConfig,
        env_factory: EnvFactory | None = None,
        eval_env_factory: EnvFactory | None = None,
        *,
        backend: Backend | None = None,
        rollout: Rollout | None = None,
    ) -> None:
        self.config = config
        self.out = Path(config.output_dir)
        self.checkpoint_root = self.out / "checkpoints"
        envs = make_env_factories(config, env_factory, eval_env_factory)
        self.coach: Any = envs.coach
        self.env_factory: EnvFactory = envs.train
        self.eval_env_factory: EnvFactory = envs.eval
        self.eval_set_factories: dict[str, EnvFactory] = envs.eval_sets
        """The further held-out sets (``config.eval_sets``), by name."""
        self.backend: Backend = backend if backend is not None else make_backend(config)
        self._rollout_fn = rollout
        self._runners: dict[str, RolloutRunner] = {}
        facts = read_env(self.env_factory)
        self.agents: list[str] = facts.agents
        self.task_ids: list[str] = facts.task_ids
        if not self.task_ids:
            raise SettingsError("the training environment exposes no tasks to sample from")
        self.isolation: dict[str, Any] = facts.isolation
        """What agents' code runs under (``config.json``, metrics, the summary)."""
        self.eval_task_ids: list[str] = read_env(self.eval_env_factory).task_ids
        self.eval_set_task_ids: dict[str, list[str]] = {
            name: read_env(factory).task_ids for name, factory in self.eval_set_factories.items()
        }
        self.specs: dict[str, str] = parse_system_spec(config.system, self.agents)
        self.trained_agents: list[str] = select_trained_agents(
            config.train_agents, self.agents, self.specs, env=config.env
        )
        self.estimator = get_estimator(config.advantage_estimator)
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        if self.dtype == torch.float16:
            raise SettingsError(
                "dtype float16 needs loss scaling, which this trainer does not do: "
                "use bfloat16 (or float32)"
            )
        # Full fine-tuning in bf16 keeps float32 master weights in the optimizer; LoRA
        # adapters are float32 already (peft), over a frozen bf16 base.
        self.master_weights = (
            config.mixed_precision and self.dtype == torch.bfloat16 and config.lora_rank == 0
        )
        self.learners: dict[str, Learner] = {}
        """Per trained agent, its learner (:class:`~mappa_train.learner.Learner`)."""
        self.frozen_policies: dict[str, Any] = {}
        """Policies of the agents left out of ``train_agents`` (acting, never updated)."""
        # The learning rate is a function of the rollout step (no scheduler state to save).
        self.lr_factor = warmup_cosine(config.steps, config.warmup_ratio)
        # Stops a run whose coach scores none of its actions (mappa_train.stop_rules).
        self.stop_rule = UnscoredStopRule(config.stop_unscored_rate, config.stop_unscored_steps)
        self.step = 0
        self.resumed_from: Path | None = None
        """The checkpoint this run resumed from (set by :meth:`setup`), or ``None``."""
        self.start_step = 0
        """The step training started from: the resumed checkpoint's, else 0."""
        self.history: list[dict[str, Any]] = []
        self.sync_seconds: list[float] = []
        """Seconds of each step's weight sync to the rollout engines (:meth:`after_update`)."""
        self._metrics = MetricsLog(self.metrics_path, config, self.out / "tensorboard")

    # ------------------------------------------------------------------ setup

    @property
    def policies(self) -> dict[str, Any]:
        """The policy acting for each agent (trained or frozen), in environment order."""
        return {
            a: self.learners[a].rollout_policy if a in self.learners else self.frozen_policies[a]
            for a in self.agents
        }

    @property
    def compiles_decoding(self) -> bool:
        """Whether the agents' policies decode with CUDA graphs (``compile_decode``).

        Only full fine-tuning on CUDA does: the graphs need a CUDA device, and a
        recorded graph replays the LoRA adapter that was active when it was recorded,
        while LoRA policies switch adapters at every call.
        """
        return (
            self.config.compile_decode
            and self.config.lora_rank == 0
            and self.config.rollout_engine == "hf"
            and self.device.startswith("cuda")
        )

    def check_memory(self, sources: Sequence[str], available: int) -> str | None:
        """Warn when weights, optimizer states and references would fill most of memory.

        See :func:`mappa_train.memory.check_memory` (with this run's dtype and settings).
        """
        return check_memory(
            sources,
            available,
            weight_bytes=torch.finfo(self.dtype).bits // 8,
            master_weights=self.master_weights,
            lora=self.config.lora_rank > 0,
        )

    def setup(self) -> None:
        """Build the learners (or resume from the latest complete checkpoint) and policies."""
        config = self.config
        self.check_sandboxes()
        torch.manual_seed(config.seed)
        np.random.seed(config.seed % (2**32))
        # Resume only a whole checkpoint of this run's settings (mappa_train.resume).
        resume_from = checkpoint_to_resume(
            self.checkpoint_root, config, self.specs, self.trained_agents
        )
        run = RunSpec(
            config=config,
            agents=self.agents,
            trained_agents=self.trained_agents,
            specs=self.specs,
            device=self.device,
            dtype=self.dtype,
            master_weights=self.master_weights,
            compiles_decoding=self.compiles_decoding,
            resume_from=resume_from,
        )
        started = self.backend.start(run)
        self.learners = started.learners
        self.frozen_policies = dict(started.frozen)
        rest = [a for a in self.agents if a not in self.learners and a not in started.frozen]
        self.frozen_policies.update(
            frozen_policies(
                rest,
                self.specs,
                dtype=self.dtype,
                device=self.device,
                batch_size=config.rollout_batch_size,
                compile_decode=self.compiles_decoding,
            )
        )
        if resume_from is not None:
            ckpt.set_rng_state(torch.load(resume_from / "rng.pt", weights_only=False))
        self.backend.open_engines()
        self._start_run(resume_from)

    def _start_run(self, resume_from: Path | None) -> None:
        """The end of :meth:`setup`: the step to resume at, the metrics, ``config.json``."""
        config = self.config
        if resume_from is not None:
            state = ckpt.load_trainer_state(resume_from)
            self.step = int(state["step"])
            self.resumed_from, self.start_step = resume_from, self.step
            logger.info("resumed from %s at step %d", resume_from, self.step)
            saved = state.get("config", {})
            changed = sorted(k for k, v in config.to_dict().items() if k in saved and saved[k] != v)
            if changed:
                # e.g. a different `steps` reshapes the learning-rate schedule mid-run.
                logger.warning(
                    "resuming with settings that differ from the checkpoint: %s", changed
                )
        # Steps after the checkpoint will be redone: their lines are dropped.
        self.history = self._metrics.truncate(self.step)
        self.out.mkdir(parents=True, exist_ok=True)
        # What isolation resolved to, beside what was asked for: a run that could not
        # confine agents' code says so where its settings are read.
        written = {**config.to_dict(), "isolation_resolved": self.isolation}
        (self.out / "config.json").write_text(json.dumps(written, indent=2, default=str) + "\n")

    def check_sandboxes(self) -> None:
        """Stop before loading anything when the environments' sandboxes cannot run code.

        See :func:`mappa_train.environments.check_sandboxes`.
        """
        check_sandboxes(list({self.env_factory: None, self.eval_env_factory: None}))

    # ------------------------------------------------------------------ the loop

    def train(self, until: int | None = None) -> list[dict[str, Any]]:
        """Run (or resume) training to ``config.steps``; returns the metric history.

        Args:
            until: Stop after this step instead (the schedule still spans
                ``config.steps``), e.g. to train in stages; a later call resumes.
        """
        last = self.begin_training()
        last = last if until is None else min(until, last)
        bar = self._progress(self.config.steps, self.step)
        try:
            while self.step < last:
                metrics = self.train_step()
                self.end_step(metrics, last, bar)
        finally:
            self.end_training(bar)
        self.plot()
        return self.history

    def begin_training(self) -> int:
        """Set up (if not yet), open the metrics and evaluate the untrained system if asked.

        The first part of :meth:`train`, for loops that drive the steps themselves
        (:class:`~mappa_train.sweep.Sweep`); :meth:`end_training` is the last.

        Returns:
            The step to train to (``config.steps``).
        """
        config = self.config
        if not self.learners:
            self.setup()
        self._metrics.open()
        if (
            config.eval_at_start
            and self.step == 0
            and not any(m.get("step") == 0 for m in self.history)
        ):
            try:
                self._log({"step": 0, **self.evaluate()})
            except BaseException:
                self.end_training()  # the metrics file and environments, as train() would
                raise
        return config.steps

    def end_step(self, metrics: dict[str, Any], last: int, bar: Any = None) -> None:
        """After a step's update: evaluation when due, the metrics line, stop rule, checkpoint.

        Args:
            metrics: The step's metrics (:meth:`train_step`); evaluation adds to them.
            last: The step training stops after (a checkpoint is always saved there).
            bar: The run's progress bar, or ``None``.

        Raises:
            mappa_env.errors.RunStoppedError: When the stop rule ends the run.
        """
        config = self.config
        if config.eval_every and (self.step % config.eval_every == 0 or self.step == config.steps):
            metrics.update(self.evaluate())
        self._log(metrics)
        self.stop_rule.stop_if_due()  # raises RunStoppedError: nothing to learn from
        if (config.save_every and self.step % config.save_every == 0) or (self.step == last):
            self.save()
        raise_if_interrupted()  # a Ctrl-C whose exception was dropped where it landed
        if bar is not None:
            bar.set_postfix(
                reward=f"{metrics.get('rollout/mean_reward', float('nan')):.3f}",
                success=f"{metrics.get('rollout/success_rate', 0.0):.2f}",
                refresh=False,
            )
            bar.update(1)

    def end_training(self, bar: Any = None) -> None:
        """Close the bar and the metrics, and release the environments.

        A run that reached ``config.steps`` is closed (learners, coach); one stopped
        earlier (``until``) keeps its coach for the next call.
        """
        if bar is not None:
            bar.close()
        self._metrics.close()
        # The runners' environments (and their kernels) are released either way.
        if self.step >= self.config.steps:
            self.close()
        else:
            self._close_runners()

    def plot(self) -> None:
        """Draw the metric history to ``training.png`` in the output folder."""
        plot_history(self.history, self.agents, self.out / "training.png")

    def _close_runners(self) -> None:
        runners, self._runners = self._runners, {}
        for runner in runners.values():
            runner.close()

    def close(self) -> None:
        """Close the rollout environments, learners, frozen agents' clients and the coach.

        Each learner is closed on its own: one that fails to close leaves none of the
        others (nor the backend's shared resources) running.
        """
        self._close_runners()
        try:
            for learner in self.learners.values():
                try:
                    learner.close()
                except Exception:  # the others must be closed all the same
                    logger.exception("closing the learner of %s failed", learner.agent)
        finally:
            self.backend.close()
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
        runner = self._runners.get(kind)
        if runner is None:
            factories = {
                "train": self.env_factory,
                "eval": self.eval_env_factory,
                **{f"eval/{name}": f for name, f in self.eval_set_factories.items()},
            }
            runner = RolloutRunner(
                factories[kind],
                AgentSystem(self.policies),
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
        """Run the step's episodes with the current weights (or the ``rollout`` given)."""
        if self._rollout_fn is not None:
            return list(self._rollout_fn(self, step))
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
        return self.update_step(self.rollout_step())

    def rollout_step(self) -> StepRollouts:
        """The first half of :meth:`train_step`: the step's episodes with the current weights.

        Saved to ``rollouts/step-N.jsonl``. The weights must not change until
        :meth:`update_step` trains on them (every action is on-policy).

        Raises:
            RuntimeError: When every episode failed (nothing to train on).
        """
        started = time.perf_counter()
        episodes = self.rollout(self.step)
        rollout_s = time.perf_counter() - started
        samples = [a for e in episodes for a in e.actions]
        save_jsonl(self.out / "rollouts" / f"step-{self.step:06d}.jsonl", samples)
        if episodes and all(e.aborted for e in episodes):
            # Nothing to learn from, and the next step would most likely fail the same way.
            raise RuntimeError(
                f"every episode of step {self.step} failed, so there is nothing to train on; "
                f"the first error: {episodes[0].outcome.error}"
            )
        return StepRollouts(self.step, list(episodes), rollout_s)

    def update_step(self, rollouts: StepRollouts) -> dict[str, Any]:
        """The second half of :meth:`train_step`: update on ``rollouts``, sync, advance.

        Args:
            rollouts: This step's episodes (:meth:`rollout_step` of the current step).

        Returns:
            The step's metrics.
        """
        if rollouts.step != self.step:
            raise ValueError(
                f"episodes of step {rollouts.step} cannot train step {self.step} (off-policy)"
            )
        episodes = rollouts.episodes
        metrics = self.learn(episodes)
        metrics.update(
            self.stop_rule.observe(
                a for e in episodes for a in e.actions if a.agent in self.learners
            )
        )
        self.after_update()
        response_tokens = metrics["rollout/response_tokens"]
        rollout_s = rollouts.seconds
        metrics["rollout/seconds"] = rollout_s
        metrics["rollout/tokens_per_s"] = response_tokens / rollout_s if rollout_s > 0 else None
        self.step += 1
        return metrics

    def after_update(self) -> None:
        """Give every agent's rollout engines its new weights (all agents' syncs at once).

        With rollouts on the very modules being trained there is nothing to send. The
        seconds are kept in :attr:`sync_seconds`.
        """
        started = time.perf_counter()
        pending = [learner.start_sync() for learner in self.learners.values()]
        for sync in pending:
            sync.result()
        self.sync_seconds.append(time.perf_counter() - started)

    def learn(self, episodes: Sequence[EpisodeResult]) -> dict[str, Any]:
        """Update every trained agent once on ``episodes``; returns the step's metrics.

        Credit, old and reference log-probs, advantages, then one PPO-clipped pass per
        agent, at the learning rate of the current step (``step`` is not advanced:
        :meth:`train_step` does that). Episodes made elsewhere train the same way, as
        long as their actions carry the exact prompt and response ids of the agents'
        tokenizers: a rollout engine outside this process, or a saved run's
        trajectories. Rollout engines get the new weights in :meth:`after_update`.

        Args:
            episodes: Finished episodes of this trainer's environment.

        Returns:
            Metrics: per-agent statistics (frozen agents: ``actions``, ``mean_reward``,
            tool use and lengths; every agent: ``reward_part/<name>``, the mean of each
            named part of its coach reward, :func:`~mappa_train.reward_parts.reward_part_means`),
            rewards, success rate and timings.
        """
        samples = [a for e in episodes for a in e.actions]
        check_credit(episodes, self.config)

        train_started = time.perf_counter()
        prepared = self._prepare(samples)
        fill_advantages(prepared, self.estimator, self.config)
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
        metrics.update(reward_part_means(samples))
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

    def _prepare(self, samples: list[ActionSample]) -> dict[str, PreparedRows]:
        """Every trained agent's usable actions with their old and reference log-probs."""
        mask_truncated = self.config.mask_truncated
        usable = {
            a: usable_actions(samples, a, mask_truncated) for a in self.agents if a in self.learners
        }
        scored = self.score_agents({a: rows for a, (rows, _, _) in usable.items() if rows})
        return {a: prepared_rows(rows, scored.get(a)) for a, rows in usable.items()}

    def score_agents(
        self, rows: dict[str, list[ActionSample]]
    ) -> dict[str, tuple[torch.Tensor | None, torch.Tensor]]:
        """Old and reference log-probs of each agent's usable actions, from its learner.

        Old log-probs are ``None`` where their pass is not needed
        (:func:`~mappa_train.update.needs_old_logprobs`: an estimator that does not read
        them, one optimizer step, ``old_logprob_pass="auto"``). Every agent's scoring
        starts before any is waited for (learners in other processes then work at once).
        """
        uses_old = self.estimator.uses_old_logprobs
        pending = {
            agent: self.learners[agent].start_logprobs(
                r, old=needs_old_logprobs(uses_old, len(r), self.config)
            )
            for agent, r in rows.items()
        }
        return {agent: work.result() for agent, work in pending.items()}

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
        work = {a: p for a, p in prepared.items() if p.samples}
        for agent, update_stats in self.update_agents(work, lr).items():
            stats[agent].update(update_stats)
        return stats

    def update_agents(
        self, prepared: dict[str, PreparedRows], lr: float
    ) -> dict[str, dict[str, float]]:
        """Each agent's PPO-clipped pass by its learner (all started before any is awaited).

        Args:
            prepared: Per agent with usable actions, its rows with advantages.
            lr: The step's learning rate.
        """
        kl_in_loss = not self.estimator.kl_in_reward
        pending = {
            agent: self.learners[agent].start_update(
                prep, step=self.step, lr=lr, kl_in_loss=kl_in_loss
            )
            for agent, prep in prepared.items()
        }
        return {agent: work.result() for agent, work in pending.items()}

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
        """Write a complete checkpoint of the current step (each learner writes its agent's)."""
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

    def _log(self, metrics: dict[str, Any]) -> None:
        clean = {k: plain(v) for k, v in metrics.items()}
        # 1 when agents' code ran in namespaces, 0 when it ran unconfined, on every step.
        mode = self.isolation.get("isolation")
        clean["isolation/namespaces"] = None if mode == "unknown" else float(mode == "namespaces")
        self.history.append(clean)
        self._metrics.write(clean)

    def _progress(
        self, total: int, initial: int, desc: str = "train steps", position: int | None = None
    ) -> Any:
        if not self.config.progress:
            return None
        from tqdm.auto import tqdm

        return tqdm(
            total=total,
            initial=initial,
            desc=desc,
            position=position,
            unit="step",
            dynamic_ncols=True,
        )


def _sync_device(device: str) -> None:
    """Wait for queued GPU work, so wall-clock phases are measured honestly."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
