"""Many training runs in one process (a sweep): arms x seeds stepping together.

Each run is a whole :class:`~mappa_train.trainer.Trainer` of its own config: its own
output folder, metrics, checkpoints, learners and weights. :class:`Sweep` steps them
round-robin: every run makes its step ``k`` before any run makes its step ``k + 1``, so
none is more than one step ahead of another, and a sweep cut short has every run at
the same evaluations. Each run stays exactly on-policy: its step's episodes are made
with its weights of that step, and its update starts only after they are all made; the
next step's episodes wait for that update (and its evaluation and checkpoint).

What overlaps: one run's update (in one update thread) with the other runs' rollouts
(in the calling thread). A run's randomness comes from seeds derived from its own
config and step (sampling, task order, mini-batch order), so a run in a sweep makes the
same episodes, rewards, losses and weights as it does alone; the tests check this.

A run that raises is stopped alone: it is named in the log and in :attr:`Sweep.outcomes`
(``mappa train --sweep`` exits 1 naming it), and the others carry on. A killed sweep
resumes like separate runs do: each run from its own newest checkpoint
(:mod:`mappa_train.resume`).

Limits: rollouts are not pooled across runs (each run's policies generate for its own
episodes; with HF generation one call at a time in the process), and every run holds
its own weights, reference and optimizer (full fine-tuning: about 16 bytes per parameter
per trained agent, plus activations). LoRA runs keep one base per run too: one shared
base serving every run's adapters would need peft's active adapter, which is one switch
per model, to change under one run's update while another run generates.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mappa_env.errors import SettingsError
from mappa_train.config import TrainConfig, read_config_file
from mappa_train.trainer import StepRollouts, Trainer, make_trainer

logger = logging.getLogger(__name__)

__all__ = ["SWEEP_KEYS", "RunOutcome", "Sweep", "read_sweep_file", "sweep_configs"]

SWEEP_KEYS = ("recipe", "arms", "seeds")
"""The keys of a sweep file (:func:`read_sweep_file`)."""


@dataclass
class RunOutcome:
    """How one run of a sweep ended."""

    name: str
    """The run's name (its folder's name under the sweep's)."""
    output_dir: str
    """The run's output folder."""
    step: int
    """The step the run reached."""
    steps: int
    """The steps it was to train (``config.steps``)."""
    error: str | None = None
    """Why it stopped early (``"<ExceptionType>: message"``), or ``None``."""

    @property
    def ok(self) -> bool:
        """Whether the run trained all its steps without error."""
        return self.error is None and self.step >= self.steps

    def describe(self) -> str:
        """One line: the run, where it stopped and why."""
        where = f"step {self.step}/{self.steps}"
        if self.error is not None:
            return f"{self.name}: failed at {where}: {self.error} ({self.output_dir})"
        return f"{self.name}: done, {where} ({self.output_dir})"


@dataclass
class _Live:
    trainer: Trainer
    last: int
    bar: Any


class Sweep:
    """Trains several runs in one process, round-robin by step.

    Args:
        runs: Run name -> its trainer (built, not yet trained); names must be distinct
            and each run must have its own ``output_dir``.
        overlap: Run each update in an update thread while the other runs' rollouts go
            on; ``False`` runs everything in the calling thread, one after the other
            (what a model with dropout needs to stay bit for bit as alone: its training
            forward draws from the process-wide generator that seeded sampling uses).
        progress: A progress bar per run (the trainer's own, named after the run).
    """

    def __init__(
        self, runs: Mapping[str, Trainer], *, overlap: bool = True, progress: bool = False
    ) -> None:
        if not runs:
            raise SettingsError("a sweep needs at least one run")
        folders: dict[Path, str] = {}
        for name, trainer in runs.items():
            other = folders.setdefault(trainer.out.resolve(), name)
            if other != name:
                raise SettingsError(
                    f"runs {other!r} and {name!r} share the output_dir {trainer.out}: "
                    "give each run its own"
                )
        self.runs: dict[str, Trainer] = dict(runs)
        self.overlap = overlap
        self.progress = progress
        self.order: list[tuple[str, int]] = []
        """``(run, step)`` of every step's rollouts, in the order they started."""
        self.outcomes: dict[str, RunOutcome] = {}
        """How each run ended, by name (filled by :meth:`run`)."""

    @classmethod
    def from_configs(cls, configs: Mapping[str, TrainConfig], **options: Any) -> Sweep:
        """A sweep of one trainer per config (:func:`~mappa_train.trainer.make_trainer`).

        Args:
            configs: Run name -> its config.
            **options: :class:`Sweep`'s keyword arguments.
        """
        trainers = {}
        for name, config in configs.items():
            try:
                trainers[name] = make_trainer(config)
            except SettingsError as exc:
                # Before anything trains: a run that cannot be built stops the whole sweep.
                raise SettingsError(f"run {name}: {exc}") from None
        return cls(trainers, **options)

    @property
    def failed(self) -> list[str]:
        """The runs that stopped on an error, in the sweep's order."""
        return [name for name, o in self.outcomes.items() if o.error is not None]

    def run(self) -> dict[str, RunOutcome]:
        """Train (or resume) every run to its last step; how each ended, by name.

        Runs are set up one after the other (each resuming from its own newest
        checkpoint), then stepped round-robin. ``KeyboardInterrupt`` stops the sweep
        (the update under way finishes first); every run keeps its checkpoints.
        """
        live: dict[str, _Live] = {}
        for index, (name, trainer) in enumerate(self.runs.items()):
            try:
                last = trainer.begin_training()
            except Exception as exc:  # noqa: BLE001 - a run that raises is stopped alone
                self._failed(name, trainer, exc, None)
                continue
            bar = None
            if self.progress:
                bar = trainer._progress(
                    trainer.config.steps, trainer.step, desc=name, position=index
                )
            live[name] = _Live(trainer, last, bar)
        pool = ThreadPoolExecutor(1, thread_name_prefix="sweep-update") if self.overlap else None
        pending: dict[str, Future[None]] = {}
        try:
            while live:
                for name in list(live):
                    self._turn(name, live, pending, pool)
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            for name, entry in live.items():
                # Stopped from outside (Ctrl-C): each run keeps its checkpoints.
                entry.trainer.end_training(entry.bar)
                self.outcomes.setdefault(name, self._outcome(name, "interrupted"))
        return dict(sorted(self.outcomes.items(), key=lambda kv: list(self.runs).index(kv[0])))

    # ------------------------------------------------------------------ one run's turn

    def _turn(
        self,
        name: str,
        live: dict[str, _Live],
        pending: dict[str, Future[None]],
        pool: ThreadPoolExecutor | None,
    ) -> None:
        """Run ``name``'s next step's rollouts once its previous update is done."""
        entry = live[name]
        trainer = entry.trainer
        try:
            if name in pending:
                # On-policy: the next episodes need the weights this update writes.
                pending.pop(name).result()
            if trainer.step >= entry.last:
                del live[name]
                trainer.end_training(entry.bar)
                trainer.plot()
                self.outcomes[name] = self._outcome(name, None)
                logger.info("sweep: run %s finished step %d", name, trainer.step)
                return
            rollouts = trainer.rollout_step()
        except Exception as exc:  # noqa: BLE001 - a run that raises is stopped alone
            del live[name]
            self._failed(name, trainer, exc, entry.bar)
            return
        self.order.append((name, rollouts.step))
        if pool is None:
            future: Future[None] = Future()
            try:
                self._update(entry, rollouts)
                future.set_result(None)
            except Exception as exc:  # noqa: BLE001 - handed on, as the pool would
                future.set_exception(exc)
        else:
            future = pool.submit(self._update, entry, rollouts)
        pending[name] = future

    @staticmethod
    def _update(entry: _Live, rollouts: StepRollouts) -> None:
        trainer = entry.trainer
        metrics = trainer.update_step(rollouts)
        trainer.end_step(metrics, entry.last, entry.bar)

    def _failed(self, name: str, trainer: Trainer, exc: Exception, bar: Any) -> None:
        error = f"{type(exc).__name__}: {exc}"
        logger.error(
            "sweep: run %s stopped at step %d (the other runs go on): %s",
            name,
            trainer.step,
            error,
            exc_info=exc,
        )
        self.outcomes[name] = self._outcome(name, error)
        try:
            trainer.end_training(bar)
            trainer.close()  # its models and engines are not needed any more
        except Exception:  # the run has failed already; the others must go on
            logger.exception("sweep: closing run %s failed", name)

    def _outcome(self, name: str, error: str | None) -> RunOutcome:
        trainer = self.runs[name]
        return RunOutcome(name, str(trainer.out), trainer.step, trainer.config.steps, error)


# ---------------------------------------------------------------------- sweep files


def read_sweep_file(path: str | Path) -> dict[str, Any]:
    """A sweep file's mapping: ``recipe``, and ``arms`` and/or ``seeds``.

    ``recipe`` is a ``mappa train --config`` file (relative to the sweep file) or a
    bundled recipe's name; ``arms`` maps an arm's name to the config fields it sets over
    the recipe; ``seeds`` lists the seeds each arm runs with.

    Raises:
        SettingsError: For a missing recipe, keys other than :data:`SWEEP_KEYS`, or no
            arm and no seed.
    """
    data = read_config_file(path)
    unknown = sorted(set(data) - set(SWEEP_KEYS))
    if unknown:
        raise SettingsError(
            f"sweep file {path}: unknown keys {unknown}; a sweep file has {list(SWEEP_KEYS)} "
            "(training fields go in the recipe or an arm)"
        )
    if not data.get("recipe"):
        raise SettingsError(f"sweep file {path} must name its recipe (a mappa train --config file)")
    arms = data.get("arms") or {}
    if not isinstance(arms, dict) or not all(isinstance(v, dict) for v in arms.values()):
        raise SettingsError(
            f"sweep file {path}: arms must map each arm's name to the config fields it sets"
        )
    seeds = data.get("seeds") or []
    if not isinstance(seeds, list) or not all(isinstance(s, int) for s in seeds):
        raise SettingsError(f"sweep file {path}: seeds must be a list of integers, got {seeds!r}")
    if not arms and not seeds:
        raise SettingsError(f"sweep file {path} gives no arms and no seeds: nothing to sweep")
    recipe = Path(path).parent / str(data["recipe"])
    if not recipe.exists():
        from mappa_train.bundled import resolve_config

        recipe = resolve_config(str(data["recipe"]))
    return {"recipe": recipe, "arms": arms, "seeds": seeds}


def sweep_configs(
    recipe: Mapping[str, Any],
    arms: Mapping[str, Mapping[str, Any]],
    seeds: Sequence[int],
    root: str | Path,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, TrainConfig]:
    """Every run's config: the recipe, an arm's fields, a seed, then ``overrides``.

    An arm's ``env_options`` are added to the recipe's, for training and for the held-out
    sets (``eval_env_options`` where the recipe sets it); its other fields replace the
    recipe's. Runs are named ``<arm>-s<seed>`` (``<arm>`` without seeds, ``s<seed>``
    without arms) and write to ``<root>/<name>``.

    Raises:
        SettingsError: For a field that is not a config field, or a bad value (naming the run).
    """
    arm_items = list(arms.items()) or [("", {})]
    seed_items: list[int | None] = list(seeds) or [None]
    configs: dict[str, TrainConfig] = {}
    for seed in seed_items:
        for arm, fields in arm_items:
            name = "-".join(p for p in (arm, "" if seed is None else f"s{seed}") if p)
            data = copy.deepcopy(dict(recipe))
            fields = dict(fields)
            overlay = fields.pop("env_options", None) or {}
            data["env_options"] = {**(data.get("env_options") or {}), **overlay}
            if data.get("eval_env_options") is not None:
                data["eval_env_options"] = {**data["eval_env_options"], **overlay}
            data.update(fields)
            if seed is not None:
                data["seed"] = seed
            data.update(overrides or {})
            data["output_dir"] = str(Path(root) / name)
            try:
                configs[name] = TrainConfig.from_dict(data)
            except SettingsError as exc:
                raise SettingsError(f"run {name}: {exc}") from None
    return configs
