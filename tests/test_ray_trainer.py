"""The Ray trainer (2 FSDP2 ranks per agent over gloo) trains as the single-process one."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
ray = pytest.importorskip("ray")

from mappa_agents.tiny_models import tiny_model_dir  # noqa: E402
from mappa_train.config import TrainConfig  # noqa: E402
from mappa_train.ray_trainer import RayTrainer  # noqa: E402
from mappa_train.trainer import Trainer  # noqa: E402
from tests.toy_env import LetterEnv, LetterPairEnv  # noqa: E402

COMPARED = ("loss", "grad_norm", "clip_fraction", "kl", "mean_reward", "actions")


@pytest.fixture
def local_ray(ray_cluster):
    # The placement tests' cluster (device "cpu" runs take none of its fake GPUs):
    # one Ray start for both modules.
    ray_cluster(gpus=3)


def _config(out, model_dir, **changes) -> TrainConfig:
    settings = {
        "env": "Letter-v0",
        "system": str(model_dir),
        "steps": 3,
        "prompts_per_step": 2,
        "samples_per_prompt": 4,
        "concurrency": 8,
        "max_new_tokens": 8,
        "lr": 1e-2,
        "kl_coef": 0.05,
        "mask_truncated": False,
        "train_batch_size": 4,
        "micro_batch_size": 1,
        "warmup_ratio": 0.0,
        "gradient_checkpointing": False,
        "save_every": 1,
        "keep_checkpoints": 1,
        "tensorboard": False,
        "progress": False,
        "device": "cpu",
        "dtype": "float32",
        "output_dir": str(out),
        "seed": 4,
    }
    settings.update(changes)
    return TrainConfig(**settings)


def _trainer(cls, config, env=LetterEnv):
    return cls(config, env_factory=env, eval_env_factory=env)


def _metrics(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _assert_same_metrics(got, expected, agents=("writer",)):
    assert [m["step"] for m in got] == [m["step"] for m in expected]
    for mine, theirs in zip(got, expected):
        for key, agent in ((k, a) for k in COMPARED for a in agents):
            name = f"{agent}/{key}"
            assert mine[name] == pytest.approx(theirs[name], rel=1e-5, abs=1e-5), (
                mine["step"],
                name,
            )
        assert mine["rollout/response_tokens"] == theirs["rollout/response_tokens"]


def test_learn_on_fixed_episodes_and_sync_match_one_process(tmp_path, local_ray):
    # Two agents whitened together (normalize_scope: all): advantages span the groups.
    # lr 1e-3: Adam divides by sqrt(v) + 1e-8, so on weights whose gradient is near 0 a
    # float rounding difference (sums in another order) moves the weight by up to ~lr;
    # at lr 1e-2 that reached 5e-5 after one learn() (measured), at 1e-3 it stays below
    # the 1e-5 compared here.
    model_dir = tiny_model_dir(tmp_path / "model")
    agents = ("writer", "editor")
    settings = {"normalize_scope": "all", "lr": 1e-3}
    single = _trainer(Trainer, _config(tmp_path / "single", model_dir, **settings), LetterPairEnv)
    sharded_config = _config(
        tmp_path / "ray",
        model_dir,
        distributed="ray",
        ranks_per_agent=2,
        agents_in_parallel=True,
        **settings,
    )
    sharded = _trainer(RayTrainer, sharded_config, LetterPairEnv)
    single.setup()
    sharded.setup()
    try:
        assert sharded.backend.agents_at_once() is True
        # A checkpoint before any step leaves the optimizers as they are (torch would
        # build their state with a zero step, which Adam would count).
        sharded.save()
        episodes = single.rollout(0)
        # What each learner was told while it learnt: the order the learn really ran in.
        told: list[bool] = []
        for learner in sharded.learners.values():
            ask = learner.at_once
            learner.at_once = lambda ask=ask: told.append(ask()) or told[-1]
        for step in range(2):
            # The first learn with the groups working at once, the second one agent after
            # another (as groups sharing GPUs do): both orders on one set of rank actors,
            # each against one process. Which order a config gets is the recording tests'.
            sharded.backend._at_once = step == 0
            single.step = sharded.step = step
            expected = single.learn(episodes)
            told.clear()
            got = sharded.learn(episodes)
            assert told, "the learners never asked in which order to work"
            assert set(told) == {step == 0}
            sharded.after_update()
            _assert_same_metrics([got], [expected], agents)
        from transformers import AutoModelForCausalLM

        start = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
        for agent in agents:
            trained = sharded.learners[agent].group.weights()
            rollout_copy = sharded.learners[agent].model.state_dict()
            reference = single.learners[agent].model.state_dict()
            moved = 0.0
            for name, value in reference.items():
                # After the sync the driver acts with exactly the group's weights...
                torch.testing.assert_close(rollout_copy[name], trained[name], rtol=0, atol=0)
                # ... which are the single process's.
                torch.testing.assert_close(trained[name], value, rtol=0, atol=1e-5)
                moved = max(moved, float((trained[name] - start[name]).abs().max()))
            assert moved > 1e-3  # weights that trained, not the initial ones
    finally:
        single.close()
        sharded.close()


class _RecordingGroup:
    """A learner group that records when its calls start and when they are waited for."""

    def __init__(self, agent, events):
        self.agent, self.events, self.world = agent, events, 2

    def _start(self, method):
        self.events.append(("start", self.agent, method))
        return [(self.agent, method)]

    def start_logprobs(self, rows, *, reference):
        return self._start("logprobs")

    def logprobs(self, rows, *, reference):
        self.events += [("start", self.agent, "logprobs"), ("wait", self.agent, "logprobs")]
        return torch.zeros(1, 1)

    def start_update(self, prep, **options):
        return self._start("update")


@pytest.mark.parametrize("at_once", [True, False])
def test_the_groups_work_at_once_only_when_told(tmp_path, monkeypatch, at_once):
    import types

    from mappa_train import ray_learner
    from mappa_train.ray_learner import RayLearner, TokenRow
    from mappa_train.update import PreparedRows

    events = []

    def fake_get(refs):
        refs = refs if isinstance(refs, list) else [refs]
        events.extend(("wait", agent, method) for agent, method in refs)
        return [torch.zeros(1, 1) if method == "logprobs" else {"loss": 0.0} for _, method in refs]

    monkeypatch.setattr(ray_learner, "import_ray", lambda: types.SimpleNamespace(get=fake_get))
    config = _config(tmp_path, tiny_model_dir(tmp_path / "model"), distributed="ray",
                     agents_in_parallel=at_once)  # fmt: skip
    trainer = _trainer(RayTrainer, config, LetterPairEnv)
    agents = ("writer", "editor")

    def learner(agent):
        group = _RecordingGroup(agent, events)
        return RayLearner(agent, None, None, None, "", group, sync=None, at_once=lambda: at_once)

    trainer.learners = {a: learner(a) for a in agents}
    sample = TokenRow(prompt_ids=[1], response_ids=[2])  # all the groups read of an action
    trainer.score_agents({a: [sample] for a in agents})
    rows = PreparedRows([sample], torch.zeros(1), *[torch.zeros(1, 1)] * 3, 0, 0)
    trainer.update_agents({a: rows for a in agents}, lr=1e-3)
    kinds = [kind for kind, _, _ in events]
    if at_once:
        # Both agents' passes start before any is waited for, then both updates.
        assert kinds == ["start"] * 4 + ["wait"] * 4 + ["start"] * 2 + ["wait"] * 2
    else:
        assert kinds == ["start", "wait"] * 6
    assert {agent for _, agent, _ in events} == set(agents)


@pytest.mark.parametrize("at_once", [True, False])
def test_a_group_skips_the_old_pass_where_the_trainer_needs_none(tmp_path, monkeypatch, at_once):
    # GRPO (no old log-probs read) with one optimizer step: only the reference pass runs
    # on the ranks, decided by the loop exactly as for in-process learners.
    import types

    from mappa_train import ray_learner
    from mappa_train.ray_learner import RayLearner, TokenRow

    passes = []

    class Group(_RecordingGroup):
        def start_logprobs(self, rows, *, reference):
            passes.append((self.agent, reference))
            return super().start_logprobs(rows, reference=reference)

        def logprobs(self, rows, *, reference):
            passes.append((self.agent, reference))
            return super().logprobs(rows, reference=reference)

    def fake_get(refs):
        return [torch.zeros(1, 1) for _ in (refs if isinstance(refs, list) else [refs])]

    monkeypatch.setattr(ray_learner, "import_ray", lambda: types.SimpleNamespace(get=fake_get))
    config = _config(tmp_path, tiny_model_dir(tmp_path / "model"), distributed="ray",
                     advantage_estimator="grpo", agents_in_parallel=at_once)  # fmt: skip
    trainer = _trainer(RayTrainer, config, LetterPairEnv)
    agents = ("writer", "editor")
    trainer.learners = {
        a: RayLearner(a, None, None, None, "", Group(a, []), sync=None, at_once=lambda: at_once)
        for a in agents
    }
    sample = TokenRow(prompt_ids=[1], response_ids=[2])
    scored = trainer.score_agents({a: [sample] for a in agents})
    assert sorted(passes) == [("editor", True), ("writer", True)]
    assert all(old is None and ref.shape == (1, 1) for old, ref in scored.values())
    passes.clear()
    scored = trainer.score_agents({a: [sample] * 5 for a in agents})  # two optimizer steps
    assert sorted(passes) == sorted((a, ref) for a in agents for ref in (False, True))


def test_agents_at_once_decides_from_the_groups_gpus():
    from mappa_train.ray_trainer import agents_at_once

    assert agents_at_once("auto", [["a", "b"], ["c", "d"]])  # apart
    assert not agents_at_once("auto", [["a", "b"], ["b", "c"]])  # two groups on GPU b
    assert agents_at_once("auto", [["a"], ["a"]])  # groups of one rank: no collectives
    assert agents_at_once("auto", [[None, None], [None, None]])  # on CPU
    assert agents_at_once(True, [["a", "b"], ["a", "b"]])
    assert not agents_at_once(False, [["a", "b"], ["c", "d"]])
    with pytest.raises(ValueError, match="agents_in_parallel must be true, false or 'auto'"):
        TrainConfig(agents_in_parallel="sometimes")


def test_the_config_picks_the_trainer_and_a_mismatch_is_refused(tmp_path):
    from mappa_train.local_backend import LocalBackend
    from mappa_train.ray_backend import RayBackend
    from mappa_train.trainer import make_trainer

    model_dir = tiny_model_dir(tmp_path / "model")
    config = _config(tmp_path / "ray", model_dir, distributed="ray")

    # One loop: the config picks its learners' backend, whichever way it is built.
    assert isinstance(make_trainer(config, LetterEnv, LetterEnv).backend, RayBackend)
    assert isinstance(Trainer(config, LetterEnv, LetterEnv).backend, RayBackend)
    assert isinstance(RayTrainer(config, LetterEnv, LetterEnv).backend, RayBackend)
    one = _config(tmp_path / "one", model_dir)
    assert isinstance(make_trainer(one, LetterEnv, LetterEnv).backend, LocalBackend)
    with pytest.raises(ValueError, match="make_trainer"):
        RayTrainer(_config(tmp_path / "one", model_dir), LetterEnv, LetterEnv)


def test_a_killed_run_resumes_across_modes_and_matches_one_process(tmp_path, local_ray):
    # Every hand-over a checkpoint can make, in one run of four steps: one process to a
    # group, a killed group to a new group, and a group back to one process. One test, so
    # the suite starts two groups' rank actors instead of three, and trains the straight
    # run once.
    model_dir = tiny_model_dir(tmp_path / "model")
    straight = _trainer(Trainer, _config(tmp_path / "straight", model_dir, steps=4))
    straight.train()
    out = tmp_path / "mixed"

    def group_config():
        return _config(out, model_dir, steps=4, distributed="ray", ranks_per_agent=2)

    one = _trainer(Trainer, _config(out, model_dir, steps=4))
    one.train(until=1)  # a one-process checkpoint (optimizer state by position)...
    one.close()
    group = _trainer(RayTrainer, group_config())
    try:
        group.train(until=2)  # ... resumed by a group, which saves by name; then stopped
    finally:  # as a killed run would have: its last checkpoint is step 2 ...
        group.close()
    resumed = _trainer(RayTrainer, group_config())
    try:
        resumed.train(until=3)  # ... resumed by a new group ...
    finally:
        resumed.close()
    again = _trainer(Trainer, _config(out, model_dir, steps=4))
    again.train()  # ... and by one process again
    metrics = _metrics(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    _assert_same_metrics(metrics, _metrics(straight.metrics_path))


def test_a_group_resumes_a_bf16_run_on_its_float32_masters(tmp_path, local_ray):
    # A one-process bf16 checkpoint keeps its float32 masters in optimizer.pt, which only
    # rank 0 reads: every rank must start from those masters, not the saved bf16 weights.
    model_dir = tiny_model_dir(tmp_path / "model")
    out = tmp_path / "bf16"
    one = _trainer(Trainer, _config(out, model_dir, dtype="bfloat16"))
    one.train(until=1)
    learner = one.learners["writer"]
    names = [name for name, _ in learner.model.named_parameters()]
    masters = dict(zip(names, (m.detach().clone() for m in learner.optimizer.master)))
    one.close()
    assert any(not torch.equal(m, m.bfloat16().float()) for m in masters.values())
    config = _config(out, model_dir, dtype="bfloat16", distributed="ray", ranks_per_agent=2)
    group = _trainer(RayTrainer, config)
    try:
        group.setup()
        weights = group.learners["writer"].group.weights()
        assert set(weights) == set(masters)
        for name, master in masters.items():
            torch.testing.assert_close(weights[name], master, rtol=0, atol=0)
        group.train(until=2)  # and it goes on training from there
        # The sync sends the weights rounded to the dtype the rollout copy acts in, and
        # the copy acts with the masters' bf16 rounding, as one process's does.
        learner = group.learners["writer"]
        masters_now = learner.group.weights()
        sent = ray.get(learner.group.weight_refs("bfloat16")[0])
        acting = learner.model.state_dict()
        for name, master in masters_now.items():
            assert sent[name].dtype == torch.bfloat16
            torch.testing.assert_close(sent[name], master.bfloat16(), rtol=0, atol=0)
            torch.testing.assert_close(acting[name], master.bfloat16(), rtol=0, atol=0)
        group.train()
    finally:
        group.close()
    assert [m["step"] for m in _metrics(out / "metrics.jsonl")] == [1, 2, 3]


def _assert_engines_hold_the_groups_weights(learner) -> None:
    trained = learner.group.weights()
    for engine in learner.policy.engines:
        acting = ray.get(engine.weights.remote())
        assert acting.keys() == trained.keys()
        for name, value in trained.items():
            torch.testing.assert_close(acting[name], value, rtol=0, atol=0)


def test_rollout_engines_as_actors_get_the_weights_and_train_alike(tmp_path, local_ray):
    # One run, both ways weights reach engines on CPUs: a broadcast in buckets (a tied
    # head, as SmolLM2's, sent once under the embedding's name) after the first step,
    # the object store after the second; the run against one process. Which way `auto`
    # takes, and which names a plan holds with and without a tied head, are
    # test_weight_sync's checks.
    from mappa_agents.tiny_models import build_tiny_model, build_tiny_tokenizer
    from mappa_train.ray.sync_modes import ObjectStoreSync
    from mappa_train.rollout_engines import EnginePolicy
    from mappa_train.sync_modes import acting_dtype

    model_dir = tmp_path / "model"
    tokenizer = build_tiny_tokenizer()
    build_tiny_model(tokenizer, tie_embeddings=True).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    straight = _trainer(Trainer, _config(tmp_path / "straight", model_dir))
    straight.train()
    config = _config(
        tmp_path / "engines", model_dir, distributed="ray", ranks_per_agent=2,
        engines_per_agent=2, weight_sync="broadcast",
        weight_sync_bucket_mb=0.05,  # several buckets (the tiny model is ~0.3 MiB)
    )  # fmt: skip
    trainer = _trainer(RayTrainer, config)
    try:
        trainer.train(until=1)  # a staged run keeps its engines for the next call
        learner = trainer.learners["writer"]
        assert isinstance(learner.policy, EnginePolicy)
        assert learner.model is None  # no copy in the driver: the engines act
        assert learner.weight_sync == "broadcast"
        # The run's own plan again (same dtype and bucket size: ranks keep the same).
        plan = learner.group.plan_sync(
            acting_dtype(learner.policy, learner.model),
            int(config.weight_sync_bucket_mb * 2**20),
        )
        assert len(plan) > 1
        assert "lm_head.weight" not in {slot.name for bucket in plan for slot in bucket}
        _assert_engines_hold_the_groups_weights(learner)
        learner.sync = ObjectStoreSync(learner.group, learner.policy)
        trainer.train(until=2)
        assert learner.weight_sync == "object_store"
        _assert_engines_hold_the_groups_weights(learner)
        trainer.train()
    finally:
        trainer.close()
    _assert_same_metrics(_metrics(trainer.metrics_path), _metrics(straight.metrics_path))


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["auto", "broadcast"])
def test_vllm_rollout_engines_as_actors_act_with_the_groups_weights(tmp_path, local_ray, sync):
    # Runs where vLLM is installed (`make test-vllm`: the CPU build in its own venv).
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM

    from mappa_agents.hf import HFPolicy
    from mappa_agents.policy import SamplingParams
    from mappa_agents.tiny_models import build_tiny_model, build_tiny_tokenizer

    model_dir = tmp_path / "model"
    tokenizer = build_tiny_tokenizer()
    build_tiny_model(tokenizer, hidden_size=128).save_pretrained(model_dir)  # head_dim 32
    tokenizer.save_pretrained(model_dir)
    config = _config(
        tmp_path / "ray", model_dir, distributed="ray", engines_per_agent=1,
        rollout_engine="vllm", steps=2, save_every=0,
        vllm_options={"max_model_len": 256, "enforce_eager": True, "gpu_memory_utilization": 0.1},
        weight_sync=sync, weight_sync_bucket_mb=0.2,  # broadcast: several buckets
    )  # fmt: skip
    trainer = _trainer(RayTrainer, config)
    try:
        trainer.setup()  # train() would close the engines at its end
        history = [trainer.train_step() for _ in range(2)]
        assert all(m["writer/grad_norm"] > 0 for m in history)
        learner = trainer.learners["writer"]
        trained = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        trained.load_state_dict(learner.group.weights())
        # The engine acts with the group's weights after the last sync. (vLLM's CPU
        # backend repacks linear weights outside named_parameters, so parameter sums
        # compare engines on GPUs only.)
        prompts = [[{"role": "user", "content": "Write a letter."}]]
        greedy = SamplingParams(max_new_tokens=8, temperature=0)
        engine_ids = [g.response_ids for g in learner.policy.generate(prompts, greedy)]
        model_ids = [g.response_ids for g in HFPolicy(trained, tokenizer).generate(prompts, greedy)]
        assert engine_ids == model_ids
    finally:
        trainer.close()
