"""The update half of a MAPPA step for one agent, on one rank's share of its rows.

The single-process trainer and every rank of a sharded learner group run these same
functions: the trainer is the case ``Shard(0, 1)`` with :class:`LocalReducer`. A rank
of a group of ``W`` trains on ``members[rank::W]`` of every optimizer batch (rows sorted
by length, so each rank pads about as little as one process would) and the group's
:class:`Reducer` adds up what the ranks hold.

Why the ranks agree with one process exactly:

- Each micro-batch's loss is the token mean of the PPO loss, weighted by its share of
  the optimizer batch's valid tokens (``weight = n_micro / n_batch``), so the summed
  gradient ``sum_micro weight * grad(loss_micro) = grad(sum_tokens loss_t) / n_batch``
  does not depend on how the rows are split, across micro-batches or ranks. A group
  must therefore add its ranks' gradients, not average them (FSDP averages unless told
  otherwise: :func:`mappa_train.fsdp.shard_for_training` sets its divide factor to 1).
- Statistics are token-weighted sums, reduced over ranks the same way.
- Every rank makes the same number of forward and backward passes (a sharded model's
  passes are collective): a rank with fewer micro-batches adds passes of weight 0 on a
  row of the batch, which change no gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from mappa_agents.seeds import derive_seed
from mappa_train.algorithms.reinforce_pp import clip_fraction, kl_penalty, ppo_clip_loss
from mappa_train.config import TrainConfig
from mappa_train.logprobs import PackedBatch, move_to, pack
from mappa_train.packing import token_budget_batches
from mappa_train.precision import MasterWeightAdamW
from mappa_train.rows import TokenRows

Scorer = Callable[[PackedBatch], Tensor]
"""Log-probs ``[B, T]`` of a packed batch's response tokens under one model."""


@dataclass
class PreparedRows:
    """One agent's usable actions as padded tensors (CPU), ready for its update.

    ``old_logprobs`` is ``None`` when the old-log-prob pass was skipped
    (:func:`needs_old_logprobs`): :func:`update_agent` then takes the loss pass's own
    detached log-probs as the ratio's denominator.
    """

    samples: list[TokenRows]
    rewards: Tensor
    old_logprobs: Tensor | None
    ref_logprobs: Tensor
    mask: Tensor
    masked_length: int = 0
    masked_invalid: int = 0
    advantages: Tensor | None = None
    stats: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Shard:
    """Which rows of each batch one rank of a learner group works on.

    Attributes:
        rank: This rank's index in its group, ``0 <= rank < world``.
        world: Number of ranks in the group (1: a single process).
    """

    rank: int = 0
    world: int = 1

    def __post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} of a group of {self.world} does not exist")

    def take(self, members: Sequence[int]) -> list[int]:
        """This rank's share of ``members`` (sorted by length): every ``world``-th row."""
        return list(members[self.rank :: self.world])


class Reducer(Protocol):
    """Adds up values across the ranks of a learner group."""

    def sum(self, values: Tensor) -> Tensor:
        """Elementwise sum over ranks (every rank gets the result)."""
        ...

    def max(self, value: int) -> int:
        """Largest ``value`` over ranks."""
        ...


class LocalReducer:
    """The reducer of a single process: every value is already the total."""

    def sum(self, values: Tensor) -> Tensor:
        """``values`` itself."""
        return values

    def max(self, value: int) -> int:
        """``value`` itself."""
        return value


def optimizer_steps(rows: int, config: TrainConfig) -> int:
    """How many optimizer steps :func:`update_agent` takes on ``rows`` actions.

    One epoch, cut into optimizer batches of ``train_batch_size``: ``ceil(rows / size)``.
    """
    return -(-rows // config.train_batch_size)


def needs_old_logprobs(uses_old_logprobs: bool, rows: int, config: TrainConfig) -> bool:
    """Whether an agent's update needs the no-grad pass for its old log-probs.

    The pass can be skipped only when nothing reads its result before the update (the
    estimator declared ``uses_old_logprobs=False``) and the update is one optimizer
    step (``rows <= train_batch_size``): every loss pass then runs on the weights that
    the old pass would have scored, so its detached log-probs are the old log-probs.
    ``config.old_logprob_pass == "always"`` keeps it.

    Args:
        uses_old_logprobs: The advantage estimator's declaration.
        rows: The agent's usable actions this step.
        config: The run's settings.
    """
    if config.old_logprob_pass == "always" or uses_old_logprobs:
        return True
    return optimizer_steps(rows, config) > 1


def row_length(sample: TokenRows) -> int:
    """Prompt plus response tokens of one action."""
    return len(sample.prompt_ids) + len(sample.response_ids)


def by_length(samples: Sequence[TokenRows], indices: Sequence[int]) -> list[int]:
    """``indices`` ordered by prompt + response length, so micro-batches pad little."""
    return sorted(indices, key=lambda i: (row_length(samples[i]), i))


def micro_batches(
    samples: Sequence[TokenRows], order: Sequence[int], config: TrainConfig
) -> list[list[int]]:
    """``order`` (sample indices sorted by length) cut into micro-batches.

    By ``micro_batch_tokens`` padded tokens when set (at most ``train_batch_size`` rows
    each), else by ``micro_batch_size`` rows.
    """
    if config.micro_batch_tokens > 0:
        runs = token_budget_batches(
            [row_length(samples[i]) for i in order],
            config.micro_batch_tokens,
            max_rows=config.train_batch_size,
        )
        return [[order[p] for p in run] for run in runs]
    size = config.micro_batch_size
    return [list(order[start : start + size]) for start in range(0, len(order), size)]


def largest_micro_batch_tokens(samples: Sequence[TokenRows], config: TrainConfig) -> int:
    """An upper bound on the padded tokens (rows x longest row) of any micro-batch.

    Micro-batches are cut within shuffled optimizer batches, so the bound is what any
    split could reach: the token budget (or the longest row, when one row is longer), or
    ``micro_batch_size`` rows of the longest row.
    """
    if not samples:
        return 0
    longest = max(row_length(s) for s in samples)
    if config.micro_batch_tokens > 0:
        return max(config.micro_batch_tokens, longest)
    rows = min(config.micro_batch_size, config.train_batch_size, len(samples))
    return rows * longest


def _padded(
    batches: list[list[int]], filler: int, reducer: Reducer
) -> list[tuple[list[int], bool]]:
    """``batches`` as ``(rows, real)``, plus filler passes up to the group's largest count."""
    count = reducer.max(len(batches))
    return [(rows, True) for rows in batches] + [([filler], False)] * (count - len(batches))


@torch.no_grad()
def shard_logprobs(
    score: Scorer,
    samples: Sequence[TokenRows],
    config: TrainConfig,
    *,
    pad_id: int,
    device: Any,
    shard: Shard = Shard(),
    reducer: Reducer | None = None,
) -> Tensor:
    """Log-probs ``[N, T]`` of every sample's response under ``score`` (CPU, float32).

    Each rank scores its share of the rows and leaves the others at 0; the reducer's
    sum then gives every rank the whole table.
    """
    reducer = reducer or LocalReducer()
    width = max(len(s.response_ids) for s in samples)
    out = torch.zeros((len(samples), width))
    order = by_length(samples, range(len(samples)))
    mine = shard.take(order)
    for indices, real in _padded(micro_batches(samples, mine, config), order[0], reducer):
        chunk = [samples[i] for i in indices]
        batch = pack([s.prompt_ids for s in chunk], [s.response_ids for s in chunk], pad_id)
        values = score(batch.to(device)).float().cpu()
        if real:
            out[indices, : values.shape[1]] = values
    return reducer.sum(out)


def update_agent(
    score: Scorer,
    optimizer: torch.optim.Optimizer | MasterWeightAdamW,
    prep: PreparedRows,
    config: TrainConfig,
    *,
    step: int,
    agent: str,
    pad_id: int,
    device: Any,
    kl_in_loss: bool,
    shard: Shard = Shard(),
    reducer: Reducer | None = None,
) -> dict[str, float]:
    """One PPO-clipped pass over one agent's prepared rows (this rank's share of them).

    Rows are shuffled by ``derive_seed(seed, "minibatch", step, agent)`` and cut into
    optimizer batches of ``train_batch_size``; each batch's gradient is accumulated over
    micro-batches, clipped to ``grad_clip`` and applied. Per micro-batch::

        L = ppo_clip_loss(logp, old, A, mask) [+ kl_coef * mean_t kl(logp, ref)]
        (L * n_micro / n_batch).backward()

    Without old log-probs (``prep.old_logprobs is None``, the pass skipped by
    :func:`needs_old_logprobs`; one optimizer step only) ``old = stop_grad(logp)``, the
    loss pass's own log-probs: ``ratio = exp(logp - stop_grad(logp)) = 1``, so the clip
    never binds and ``grad L = -mean_t A_t grad logp_t``, the plain policy gradient, which
    is also what the clipped loss's gradient is at the first step with the pass (its old
    log-probs equal ``logp`` up to float rounding). The ``kl`` statistic, which the
    trainer otherwise takes from the old pass, is then this pass's token mean of
    ``kl(logp, ref)``: the same weights, so the same quantity.

    Args:
        score: Log-probs of a packed batch under the model being trained (with grad).
        optimizer: The agent's optimizer (``param_groups`` hold what it trains).
        prep: The agent's rows, advantages filled in; the same on every rank.
        config: The run's settings.
        step: The step being trained (seeds the shuffle).
        agent: The agent's id (seeds the shuffle).
        pad_id: The tokenizer's padding id.
        device: Where the model is.
        kl_in_loss: Add the KL penalty to the loss (estimators that keep it out of the
            reward).
        shard: This rank's place in its group.
        reducer: Adds up over the group (``None``: a single process).

    Returns:
        ``loss`` (mean over optimizer steps), token-weighted ``clip_fraction``, mean
        ``grad_norm``, ``optimizer_steps``, ``tokens`` and ``response_tokens`` (over
        the whole group); ``kl`` too when ``prep.old_logprobs`` is ``None``.

    Raises:
        ValueError: When ``prep.old_logprobs`` is ``None`` but the rows make more than
            one optimizer step (later steps need the weights before the first).
    """
    reducer = reducer or LocalReducer()
    reuse = prep.old_logprobs is None
    if reuse and optimizer_steps(len(prep.samples), config) > 1:
        raise ValueError(
            f"agent {agent!r}: {len(prep.samples)} rows make "
            f"{optimizer_steps(len(prep.samples), config)} optimizer steps of "
            f"{config.train_batch_size}; only one can do without old log-probs"
        )
    order = np.random.default_rng(derive_seed(config.seed, "minibatch", step, agent)).permutation(
        len(prep.samples)
    )
    assert prep.advantages is not None, "advantages are filled in before the update"
    # Summed over the pass, reduced once at the end: loss, clipped and valid tokens, the
    # KL to the reference (without old log-probs) (on the device), tokens and response
    # tokens (on the host).
    totals = torch.zeros(4, dtype=torch.float64, device=device)
    tokens = response_tokens = 0
    norms: list[Tensor] = []
    for start in range(0, len(order), config.train_batch_size):
        members = by_length(
            prep.samples, [int(i) for i in order[start : start + config.train_batch_size]]
        )
        total = float(prep.mask[members].sum())
        optimizer.zero_grad(set_to_none=True)
        mine = micro_batches(prep.samples, shard.take(members), config)
        for micro, real in _padded(mine, members[0], reducer):
            rows = [prep.samples[i] for i in micro]
            width = max(len(s.response_ids) for s in rows)
            cpu_mask = prep.mask[micro, :width] if real else torch.zeros((1, width))
            # Copy everything this micro-batch needs before launching its forward pass:
            # a blocking host-to-device copy in between would wait for the GPU queue.
            batch = pack([s.prompt_ids for s in rows], [s.response_ids for s in rows], pad_id)
            batch = batch.to(device)
            adv, mask = (move_to(t, device) for t in (prep.advantages[micro, :width], cpu_mask))
            if prep.old_logprobs is not None:
                old = move_to(prep.old_logprobs[micro, :width], device)
            if reuse or (kl_in_loss and config.kl_coef):
                ref = move_to(prep.ref_logprobs[micro, :width], device)
            logp = score(batch)
            if reuse:
                old = logp.detach()  # ratio exp(logp - stop_grad(logp)) = 1
            loss = ppo_clip_loss(logp, old, adv, mask, config.clip_eps, config.clip_eps_high)
            kl = None
            if kl_in_loss and config.kl_coef:
                kl = kl_penalty(logp, ref, config.kl_estimator)
                loss = loss + config.kl_coef * (kl * mask).sum() / mask.sum().clamp(min=1)
            weight = float(cpu_mask.sum()) / max(total, 1.0)
            # A filler pass has weight 0: it only keeps the group's collectives in step.
            (loss * weight).backward()
            if isinstance(optimizer, MasterWeightAdamW):
                optimizer.accumulate_grads()  # bf16 gradients into the masters
            if real:
                # Statistics stay on the device until the end: reading them per
                # micro-batch would stall the GPU queue every time.
                valid = mask.sum()
                clipped = clip_fraction(logp, old, mask, config.clip_eps, config.clip_eps_high)
                kl_sum = torch.zeros((), device=valid.device)
                if reuse:
                    if kl is None:
                        kl = kl_penalty(logp.detach(), ref, config.kl_estimator)
                    kl_sum = (kl.detach() * mask).sum()
                totals += torch.stack(
                    [
                        loss.detach().double() * weight,
                        (clipped * valid).double(),
                        valid.double(),
                        kl_sum.double(),
                    ]
                )
                tokens += sum(row_length(s) for s in rows)
                response_tokens += sum(len(s.response_ids) for s in rows)
        trained = [p for group in optimizer.param_groups for p in group["params"]]
        norm = torch.nn.utils.clip_grad_norm_(trained, config.grad_clip)
        # A sharded model's norm is a distributed tensor: its value is the whole model's.
        norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        optimizer.step()
    # Gradients are not needed until this agent's next update: free them for the other
    # agents' updates and the rollouts (4 bytes per weight in float32).
    optimizer.zero_grad(set_to_none=True)
    counts = torch.tensor([float(tokens), float(response_tokens)], dtype=torch.float64)
    loss_sum, clipped, valid, kl_sum, all_tokens, all_response = reducer.sum(
        torch.cat([totals.cpu(), counts])
    ).tolist()
    stats = {
        "loss": loss_sum / max(1, len(norms)),
        "clip_fraction": clipped / max(valid, 1.0),
        "grad_norm": float(torch.stack(norms).float().mean()),
        "optimizer_steps": float(len(norms)),
        "tokens": all_tokens,
        "response_tokens": all_response,
    }
    if reuse:
        stats["kl"] = kl_sum / max(valid, 1.0)
    return stats
