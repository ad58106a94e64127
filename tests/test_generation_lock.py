"""Which local generate calls run at the same time: unseeded calls of different models
together, a seeded call alone, calls on one model in turn."""

from __future__ import annotations

import threading

import pytest

from mappa_agents.generation_lock import GenerationLock

WAIT_S = 30.0
"""Longest wait for something that must happen (generous: a loaded machine is slow)."""

QUIET_S = 0.3
"""How long something that must not happen is watched for."""


class Model:
    """A stand-in model: the lock only needs an object to key on."""


def in_thread(target, *args):
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def test_unseeded_calls_of_different_models_hold_the_lock_together():
    lock = GenerationLock()
    both_inside = threading.Barrier(2, timeout=WAIT_S)

    def call(model):
        with lock.hold(model, exclusive=False):
            both_inside.wait()  # breaks (and the thread raises) if they cannot overlap

    threads = [in_thread(call, Model()) for _ in range(2)]
    for thread in threads:
        thread.join(WAIT_S)
    assert not both_inside.broken


def assert_second_waits_for_first(first_hold, second_hold):
    """The second holder does not get in while the first holds, and does after it leaves."""
    inside, release, entered = threading.Event(), threading.Event(), threading.Event()

    def first():
        with first_hold():
            inside.set()
            release.wait(WAIT_S)

    def second():
        with second_hold():
            entered.set()

    holder = in_thread(first)
    assert inside.wait(WAIT_S)
    waiter = in_thread(second)
    assert not entered.wait(QUIET_S)
    release.set()
    assert entered.wait(WAIT_S)
    holder.join(WAIT_S)
    waiter.join(WAIT_S)


@pytest.mark.parametrize("second", ["exclusive", "same model"])
def test_a_call_that_may_not_share_waits_for_the_one_inside(second):
    lock = GenerationLock()
    model = Model()
    exclusive = second == "exclusive"
    assert_second_waits_for_first(
        lambda: lock.hold(model, exclusive=False),
        lambda: lock.hold(Model() if exclusive else model, exclusive=exclusive),
    )


def test_a_waiting_seeded_call_goes_before_unseeded_calls_that_come_after_it():
    lock = GenerationLock()
    order: list[str] = []
    inside, release = threading.Event(), threading.Event()

    def first():
        with lock.hold(Model(), exclusive=False):
            inside.set()
            release.wait(WAIT_S)

    def seeded():
        with lock.hold(Model(), exclusive=True):
            order.append("seeded")

    def unseeded():
        with lock.hold(Model(), exclusive=False):
            order.append("unseeded")

    threads = [in_thread(first)]
    assert inside.wait(WAIT_S)
    threads.append(in_thread(seeded))
    while not lock.calls.exclusive_waiting:  # the seeded call is queued
        threading.Event().wait(0.01)
    threads.append(in_thread(unseeded))
    assert not threading.Event().wait(QUIET_S)
    assert order == []  # the unseeded call waits behind the queued seeded one
    release.set()
    for thread in threads:
        thread.join(WAIT_S)
    assert order == ["seeded", "unseeded"]


def test_policies_decode_beside_each_other_only_unseeded_and_where_allowed():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from mappa_agents.hf import HFPolicy
    from mappa_agents.policy import SamplingParams
    from mappa_agents.tiny_models import tiny_model_and_tokenizer

    policies = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        policies.append(HFPolicy(*tiny_model_and_tokenizer(), compile_decode=True))
    assert [p.decodes_beside_others for p in policies] == [False, False]  # the CPU default
    chat = [{"role": "user", "content": "count the shells"}]

    def run_both(params, barrier):
        for policy in policies:
            decode = policy._decode_with_graphs

            def meeting(*args, _decode=decode, **kwargs):
                barrier.wait()
                return _decode(*args, **kwargs)

            policy._decode_with_graphs = meeting
        results: list[str] = []

        def call(policy):
            try:
                policy.generate([chat], params)
                results.append("generated")
            except threading.BrokenBarrierError:
                results.append("met no one")

        threads = [in_thread(call, policy) for policy in policies]
        for thread in threads:
            thread.join(WAIT_S)
        for policy in policies:
            del policy._decode_with_graphs
        return results

    unseeded = SamplingParams(max_new_tokens=4)
    seeded = SamplingParams(max_new_tokens=4, seed=3)
    for policy in policies:
        policy.decodes_beside_others = True
    for params in (unseeded, seeded):  # a seeded call samples from its own generator
        together = threading.Barrier(2, timeout=WAIT_S)
        assert run_both(params, together) == ["generated", "generated"]
        assert not together.broken
    # A pick that takes no generator draws from the process's: a seeded call runs alone,
    # so the two never meet and each goes on after waiting, one after the other.
    for policy in policies:
        policy.pick = lambda scores, params: scores.argmax(-1)
    apart = threading.Barrier(2, timeout=QUIET_S)
    assert run_both(seeded, apart) == ["met no one", "met no one"]


def test_a_seeded_call_on_its_own_generator_draws_what_a_reseeded_one_draws():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from mappa_agents.hf import HFPolicy
    from mappa_agents.policy import SamplingParams
    from mappa_agents.tiny_models import tiny_model_and_tokenizer

    policy = HFPolicy(*tiny_model_and_tokenizer(), compile_decode=True)
    chats = [[{"role": "user", "content": "count the shells " * n}] for n in (1, 4, 2)]
    params = SamplingParams(max_new_tokens=12, temperature=1.5, top_k=40, seed=11)
    reseeded = policy.generate(chats, params)  # the process's generator, reseeded
    policy.decodes_beside_others = True
    state = torch.get_rng_state()
    own = policy.generate(chats, params)
    assert torch.equal(torch.get_rng_state(), state)  # the process's generator untouched
    assert [g.response_ids for g in own] == [g.response_ids for g in reseeded]
    assert [g.logprobs for g in own] == [g.logprobs for g in reseeded]
    other = policy.generate(chats, SamplingParams(max_new_tokens=12, temperature=1.5, seed=12))
    assert [g.response_ids for g in other] != [g.response_ids for g in own]


def test_a_decoder_samples_each_id_holding_random_draws_shared():
    # A CUDA graph capture holds it alone: another thread's draw during a capture fails.
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from mappa_agents.generation_lock import RANDOM_DRAWS
    from mappa_agents.graph_decode import GraphDecoder
    from mappa_agents.tiny_models import tiny_model_and_tokenizer

    model, _ = tiny_model_and_tokenizer()
    held: list[int] = []

    def pick(scores):
        held.append(RANDOM_DRAWS._shared)
        return torch.multinomial(torch.softmax(scores, -1), 1)[:, 0]

    GraphDecoder(model).decode(
        torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long), max_new_tokens=3,
        cache_length=512, pick=pick, eos_token_ids=[0], pad_token_id=0,
    )  # fmt: skip
    assert held == [1, 1, 1]


def test_seeded_rollouts_of_policies_decoding_beside_each_other_repeat_exactly():
    # The ticks schedule seeds every batch: with the agents' calls running at the same
    # time, each call's own generator keeps a seeded run independent of thread timing.
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import mappa_env
    from mappa_agents.hf import HFPolicy
    from mappa_agents.policy import SamplingParams
    from mappa_agents.runner import RolloutRunner
    from mappa_agents.system import AgentSystem
    from mappa_agents.tiny_models import tiny_model_and_tokenizer
    from mappa_env.tasks import MathTask
    from tests.fakes import FixedCoach, InProcessSandbox

    agents = ["problem_solver", "code_executor", "verifier"]
    policies = {}
    for index, agent in enumerate(agents):
        torch.manual_seed(index)
        policies[agent] = HFPolicy(*tiny_model_and_tokenizer(), compile_decode=True)
        policies[agent].decodes_beside_others = True
    tasks = [MathTask(id=f"t{i}", prompt=f"What is {i} * 7?", answer=str(i * 7)) for i in range(4)]

    def rollout():
        runner = RolloutRunner(
            lambda: mappa_env.make(
                "MathChat-v0", tasks=tasks, sandbox=InProcessSandbox, coach=FixedCoach()
            ),
            AgentSystem(policies),
            concurrency=4,
            seed=5,
            sampling=SamplingParams(max_new_tokens=8, temperature=1.0),
            progress=False,
        )
        with runner:
            episodes = runner.run(4)
        return [(a.agent, a.response_ids) for e in episodes for a in e.actions]

    first = rollout()
    assert {agent for agent, _ in first} == set(agents)
    assert rollout() == first


def test_only_a_pick_that_names_a_generator_gets_one():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from mappa_agents.hf import pick_next_ids, takes_generator

    def named(scores, params, generator=None):
        return scores

    def anything(scores, params, **kwargs):  # may draw from the default generator
        return scores

    assert takes_generator(pick_next_ids)
    assert takes_generator(named)
    assert not takes_generator(anything)
    assert not takes_generator(lambda scores, params: scores)


def test_a_closed_policys_call_holds_the_lock_alone():
    lock = GenerationLock()
    assert_second_waits_for_first(
        lambda: lock.hold(None, exclusive=False), lambda: lock.hold(Model(), exclusive=False)
    )
