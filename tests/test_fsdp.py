"""A learner group of 2 ranks (FSDP2 over gloo, CPU) trains exactly as one process."""

from __future__ import annotations

import datetime
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mappa_agents.tiny_models import tiny_model_dir
from mappa_train.config import TrainConfig
from mappa_train.update import PreparedRows, shard_logprobs, update_agent

pytest.importorskip("torch.distributed.fsdp")

WORLD = 2
STEPS = 2
RANK_TIMEOUT_S = 120  # a hung collective fails the test instead of hanging it


def _config(**overrides) -> TrainConfig:
    # lr high enough that two steps move the weights well past float noise.
    settings = {
        "lr": 5e-3,
        "train_batch_size": 4,
        "micro_batch_size": 1,
        "kl_coef": 0.05,
        "grad_clip": 1.0,
        "output_dir": "unused",
        "seed": 3,
    }
    settings.update({k: v for k, v in overrides.items() if k != "skip_old"})
    return TrainConfig(**settings)


def _rows(count: int, vocab: int) -> list[SimpleNamespace]:
    generator = torch.Generator().manual_seed(11)
    rows = []
    for _ in range(count):
        prompt = int(torch.randint(3, 9, (1,), generator=generator))
        response = int(torch.randint(1, 7, (1,), generator=generator))
        ids = torch.randint(3, vocab, (prompt + response,), generator=generator).tolist()
        rows.append(SimpleNamespace(prompt_ids=ids[:prompt], response_ids=ids[prompt:]))
    return rows


def _prep(rows, old: torch.Tensor, ref: torch.Tensor, skip_old: bool = False) -> PreparedRows:
    """The rows' prepared update; without old log-probs (the pass skipped) if ``skip_old``."""
    mask = torch.zeros_like(old)
    for i, row in enumerate(rows):
        mask[i, : len(row.response_ids)] = 1.0
    generator = torch.Generator().manual_seed(5)
    advantages = torch.randn(old.shape, generator=generator) * mask
    rewards = torch.zeros(len(rows))
    kept = None if skip_old else old
    return PreparedRows(list(rows), rewards, kept, ref, mask, advantages=advantages)


def _load(model_dir: Path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def _single_process(model_dir: Path, count: int, config: TrainConfig, skip_old: bool = False):
    from mappa_train.logprobs import response_logprobs

    model, ref = _load(model_dir), _load(model_dir)
    rows = _rows(count, model.config.vocab_size)

    def score(batch, net=model):
        return response_logprobs(net, batch, chunk_size=config.logprob_chunk_size)

    old = shard_logprobs(score, rows, config, pad_id=0, device="cpu")
    ref_lp = shard_logprobs(lambda b: score(b, ref), rows, config, pad_id=0, device="cpu")
    prep = _prep(rows, old, ref_lp, skip_old)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=config.lr,
        betas=tuple(config.adam_betas),
        weight_decay=config.weight_decay,
    )
    stats = []
    for step in range(STEPS):
        model.train()
        stats.append(
            update_agent(
                score,
                optimizer,
                prep,
                config,
                step=step,
                agent="solver",
                pad_id=0,
                device="cpu",
                kl_in_loss=True,
            )
        )
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return old, ref_lp, stats, weights


def _rank_main(rank: int, port: int, model_dir: str, cases: list, out: str) -> None:
    """One rank: every case in turn on one process group (one launch for all of them)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from mappa_train.fsdp import ShardedLearner

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=RANK_TIMEOUT_S),
    )
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        results = []
        for count, overrides in cases:
            config = _config(**overrides)
            model, ref = _load(Path(model_dir)), _load(Path(model_dir))
            rows = _rows(count, model.config.vocab_size)
            learner = ShardedLearner("solver", model, ref, config, mesh=mesh, pad_id=0)
            old = learner.logprobs(rows)
            ref_lp = learner.logprobs(rows, reference=True)
            prep = _prep(rows, old, ref_lp, overrides.get("skip_old", False))
            stats = [
                learner.update(prep, step=step, lr=config.lr, kl_in_loss=True)
                for step in range(STEPS)
            ]
            weights = learner.full_state_dict()
            results.append({"old": old, "ref": ref_lp, "stats": stats, "weights": weights})
        if rank == 0:
            torch.save(results, out)
        # Leave together: a rank that tears gloo down while its peer is still busy can
        # abort in gloo's threads (seen once under load: SIGABRT, "terminate called
        # without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_group(model_dir: Path, cases: list, out: Path) -> list[dict]:
    import torch.multiprocessing as mp

    context = mp.start_processes(
        _rank_main,
        args=(_free_port(), str(model_dir), cases, str(out)),
        nprocs=WORLD,
        join=False,
        start_method="spawn",
    )
    deadline = datetime.datetime.now() + datetime.timedelta(
        seconds=len(cases) * RANK_TIMEOUT_S + 60
    )
    while not context.join(timeout=5):
        if datetime.datetime.now() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the learner group did not finish in time")
    return torch.load(out)


CASES = [
    # Batches of 4 + 1 rows, one row per micro-batch: the ranks get 2 and 2, then 1
    # and 0 micro-batches, so rank 1 has no rows and makes one filler pass.
    (5, {}),
    (6, {"micro_batch_tokens": 24, "train_batch_size": 6}),  # token-budget batches
    # One optimizer step without old log-probs (the pass skipped): the loss pass's
    # own, and the KL statistic from it, reduced over the ranks.
    (5, {"train_batch_size": 5, "skip_old": True}),
]


def test_two_ranks_train_as_one_process(tmp_path):
    # Every case on one launch of the two ranks (each rank process starts torch once).
    model_dir = tiny_model_dir(tmp_path / "model")
    groups = _run_group(model_dir, CASES, tmp_path / "rank0.pt")
    assert len(groups) == len(CASES)
    for (count, overrides), group in zip(CASES, groups):
        config = _config(**overrides)
        old, ref, stats, weights = _single_process(
            model_dir, count, config, overrides.get("skip_old", False)
        )
        # Old and reference log-probs, from which the driver computes KL and advantages.
        torch.testing.assert_close(group["old"], old, rtol=0, atol=1e-5)
        torch.testing.assert_close(group["ref"], ref, rtol=0, atol=1e-5)
        for single, sharded in zip(stats, group["stats"]):
            assert sharded.keys() == single.keys()
            assert ("kl" in single) == overrides.get("skip_old", False)
            for key in ("loss", "clip_fraction", "grad_norm", "optimizer_steps", "tokens", "kl"):
                if key in single:
                    assert sharded[key] == pytest.approx(single[key], rel=1e-5, abs=1e-5), key
        start = _load(model_dir).state_dict()
        moved = max(float((weights[k] - start[k]).abs().max()) for k in weights)
        assert moved > 1e-3  # the comparison below is of weights that trained
        for name, value in weights.items():
            torch.testing.assert_close(group["weights"][name], value, rtol=0, atol=1e-5)
