"""Where the Ray trainer's actors go: one placement group, a GPU per rank of a group."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
ray = pytest.importorskip("ray")

from mappa_agents.tiny_models import tiny_model_dir  # noqa: E402
from mappa_train.config import TrainConfig  # noqa: E402
from mappa_train.ray_trainer import RayTrainer, placement_bundles  # noqa: E402
from tests.toy_env import LetterEnv, LetterPairEnv  # noqa: E402


def _config(tmp_path, env: str = "Letter-v0", **changes) -> TrainConfig:
    # One agent where one is enough: each rank and engine is a process that imports
    # torch and transformers, and these tests are about where Ray puts them.
    settings = {
        "env": env,
        "system": str(tiny_model_dir(tmp_path / "model")),
        "steps": 1,
        "distributed": "ray",
        "device": "auto",  # the cluster's (fake) GPUs decide the placement
        "dtype": "float32",
        "tensorboard": False,
        "progress": False,
        "output_dir": str(tmp_path / "run"),
    }
    settings.update(changes)
    return TrainConfig(**settings)


def test_bundles_hold_rank_r_of_every_agent_and_their_engines(tmp_path):
    config = TrainConfig(ranks_per_agent=2, gpus_per_rank=0.25, engines_per_agent=3,
                         gpus_per_engine=0.1, output_dir=str(tmp_path))  # fmt: skip
    # 3 agents: bundle 0 has 3 ranks (0.75) + engines 0 and 2 of each (0.6) -> 2 GPUs;
    # bundle 1 has 3 ranks (0.75) + engine 1 of each (0.3) -> 2 GPUs.
    assert placement_bundles(config, 3) == [{"GPU": 2.0}, {"GPU": 2.0}]
    whole = TrainConfig(ranks_per_agent=1, output_dir=str(tmp_path))
    assert placement_bundles(whole, 3) == [{"GPU": 3.0}]  # a GPU per rank by default


def test_split_placement_gives_the_engines_bundles_of_their_own(tmp_path):
    config = TrainConfig(ranks_per_agent=2, gpus_per_rank=0.3, engines_per_agent=2,
                         gpus_per_engine=0.3, colocate_engines=False,
                         output_dir=str(tmp_path))  # fmt: skip
    # 3 agents: each rank bundle holds 3 ranks (0.9), each engine bundle 3 engines (0.9).
    assert placement_bundles(config, 3) == [{"GPU": 1.0}] * 4
    from mappa_train.ray_trainer import engine_bundle

    assert [engine_bundle(config, e) for e in range(2)] == [2, 3]
    colocated = TrainConfig(ranks_per_agent=2, gpus_per_rank=0.15, engines_per_agent=2,
                            gpus_per_engine=0.15, output_dir=str(tmp_path))  # fmt: skip
    assert placement_bundles(colocated, 3) == [{"GPU": 1.0}] * 2
    assert [engine_bundle(colocated, e) for e in range(2)] == [0, 1]


@pytest.fixture
def ray_with_three_gpus(ray_cluster):
    # Ray's GPU accounting without GPUs: the actors get GPU ids, and run on the CPU.
    # Three: two ranks of one group and an engine apart fit in one placement.
    ray_cluster(gpus=3)


def _engine_gpu_ids(engine) -> list:
    return ray.get(engine.__ray_call__.remote(lambda actor: ray.get_gpu_ids()))


def _placements_removed() -> bool:
    table = ray.util.placement_group_table()
    return not table or all(pg["state"] == "REMOVED" for pg in table.values())


def test_ranks_of_one_group_get_different_gpus_and_split_engines_one_apart(
    tmp_path, ray_with_three_gpus
):
    # One placement for both checks (each rank and engine is a process of its own): two
    # ranks at 0.5 GPU, which alone would fit on one GPU, and an engine in a bundle of
    # its own (bundle 2, after the ranks').
    config = _config(tmp_path, ranks_per_agent=2, gpus_per_rank=0.5, engines_per_agent=1,
                     gpus_per_engine=0.25, colocate_engines=False)  # fmt: skip
    trainer = RayTrainer(config, LetterEnv, LetterEnv)
    try:
        trainer.setup()
        for learner in trainer.learners.values():
            ids = [tuple(gpus) for gpus in learner.group.gpu_ids()]
            assert len(set(ids)) == 2, ids  # NCCL refuses two ranks of a group on one GPU
            engines = {tuple(_engine_gpu_ids(e)) for e in learner.policy.engines}
            assert len(engines) == 1, engines
            assert not engines & set(ids), (ids, engines)
    finally:
        trainer.close()
    assert _placements_removed()


def test_a_placement_the_cluster_cannot_hold_is_refused_with_the_numbers(
    tmp_path, ray_with_three_gpus
):
    config = _config(tmp_path, "LetterPair-v0", ranks_per_agent=3)
    trainer = RayTrainer(config, LetterPairEnv, LetterPairEnv)
    with pytest.raises(ValueError, match="need 6 GPUs, the cluster has 3"):
        trainer.setup()
    trainer.close()


def test_a_colocated_engine_shares_its_ranks_gpu(tmp_path, ray_with_three_gpus):
    # One rank and one engine, at 0.25 GPU apiece (split engines: the test above).
    config = _config(tmp_path, gpus_per_rank=0.25, engines_per_agent=1, gpus_per_engine=0.25,
                     colocate_engines=True)  # fmt: skip
    trainer = RayTrainer(config, LetterEnv, LetterEnv)
    try:
        trainer.setup()
        for learner in trainer.learners.values():
            ranks = {tuple(gpus) for gpus in learner.group.gpu_ids()}
            engines = {tuple(_engine_gpu_ids(e)) for e in learner.policy.engines}
            assert ranks == engines, (ranks, engines)
    finally:
        trainer.close()
    assert _placements_removed()
