"""Buckets, the choice of sync mode, and the broadcast channel of the weight sync."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

torch = pytest.importorskip("torch")

from mappa_train import weight_sync  # noqa: E402
from mappa_train.config import TrainConfig  # noqa: E402


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(7, 5, generator=generator),
        "norm.weight": torch.randn(5, generator=generator),
        "steps": torch.tensor([3, 1], dtype=torch.int64),
        "head.weight": torch.randn(3, 7, generator=generator),
    }


def _specs(state, dtype=torch.bfloat16):
    return [
        (name, tuple(t.shape), dtype if t.is_floating_point() else t.dtype)
        for name, t in state.items()
    ]


def test_buckets_keep_order_alignment_and_size():
    buckets = weight_sync.plan_buckets(_specs(_state()), bucket_bytes=128)
    slots = [slot for bucket in buckets for slot in bucket]
    assert [s.name for s in slots] == list(_state())
    assert all(s.offset % weight_sync.ALIGNMENT == 0 for s in slots)
    # embed (70 B) and norm (10 B at offset 128) do not fit together in 128 B.
    assert [[s.name for s in b] for b in buckets] == [
        ["embed.weight"],
        ["norm.weight", "steps"],
        ["head.weight"],
    ]
    assert all(weight_sync.bucket_size(b) <= 128 for b in buckets)
    # Within a bucket, slots never overlap.
    for bucket in buckets:
        ends = [s.offset + s.nbytes for s in bucket]
        assert all(end <= nxt.offset for end, nxt in zip(ends, bucket[1:]))


def test_a_tensor_larger_than_a_bucket_gets_one_of_its_own():
    specs = [("small", (4,), torch.float32), ("big", (100,), torch.float32)]
    buckets = weight_sync.plan_buckets(specs, bucket_bytes=64)
    assert [[s.name for s in b] for b in buckets] == [["small"], ["big"]]
    assert weight_sync.bucket_size(buckets[1]) == 400
    with pytest.raises(ValueError, match="positive"):
        weight_sync.plan_buckets(specs, bucket_bytes=0)


def test_pack_then_unpack_gives_the_tensors_rounded_to_the_slot_dtype():
    state = _state()
    buckets = weight_sync.plan_buckets(_specs(state), bucket_bytes=1 << 20)
    assert len(buckets) == 1
    buffer = torch.zeros(weight_sync.bucket_size(buckets[0]), dtype=torch.uint8)
    packed = weight_sync.pack_bucket(buffer, buckets[0], state)
    assert packed.numel() == weight_sync.bucket_size(buckets[0])
    got = dict(weight_sync.unpack_bucket(buffer, buckets[0]))
    for name, tensor in state.items():
        expected = tensor.bfloat16() if tensor.is_floating_point() else tensor
        assert got[name].dtype == expected.dtype
        torch.testing.assert_close(got[name], expected, rtol=0, atol=0)
    # Views, not copies: the engine reads what the buffer holds now.
    buffer.zero_()
    assert float(got["embed.weight"].abs().sum()) == 0.0


@pytest.mark.parametrize("tied", [True, False])
def test_a_tied_head_is_planned_once_under_the_embeddings_name(tied):
    from mappa_agents.tiny_models import build_tiny_model, build_tiny_tokenizer

    model = build_tiny_model(build_tiny_tokenizer(), tie_embeddings=tied)
    state = model.state_dict()
    assert "lm_head.weight" in state  # listed under both names when tied
    kept = weight_sync.without_tied_copies(state, model)
    assert list(kept) == [name for name in state if not (tied and name == "lm_head.weight")]
    assert all(kept[name] is state[name] for name in kept)


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"),
        ),
    ],
)
def test_a_vllm_engine_reloads_once_with_every_bucket_as_received(device):
    from mappa_train.ray_trainer import RolloutEngine

    class RecordingPolicy:
        def __init__(self):
            self.loads = []

        def load_weights(self, weights):
            self.loads.append({name: tensor.clone() for name, tensor in weights})

    state = _state()
    buckets = weight_sync.plan_buckets(_specs(state, torch.float32), bucket_bytes=128)
    assert len(buckets) >= 2
    engine = RolloutEngine.__new__(RolloutEngine)  # the receiving half, without a model
    engine._vllm, engine._buckets, engine._received = True, buckets, []
    engine.policy = RecordingPolicy()
    size = max(weight_sync.bucket_size(b) for b in buckets)
    buffer = torch.empty(size, dtype=torch.uint8, device=device)
    for index, slots in enumerate(buckets):
        weight_sync.pack_bucket(buffer, slots, {k: v.to(device) for k, v in state.items()})
        engine._take(index, weight_sync.unpack_bucket(buffer, slots))
        # The next bucket reuses the buffer: what the engine kept must be its own copy,
        # in host memory (on a GPU the copies would sit beside the engine's KV cache;
        # only the cuda case can tell a host copy from a clone).
        assert all(t.device.type == "cpu" for _, t in engine._received)
        buffer.fill_(0xFF)
    (loaded,) = engine.policy.loads  # one reload per sync
    assert set(loaded) == set(state)
    for name, tensor in state.items():
        torch.testing.assert_close(loaded[name].cpu(), tensor, rtol=0, atol=0)
    assert engine._received == []


@pytest.mark.parametrize(
    ("mode", "ranks", "engines", "expected"),
    [
        ("auto", [None, None], [None], ("object_store", [0])),  # CPU
        ("auto", ["g0", "g1"], ["g0", "g1", "g1"], ("cuda_ipc", [0, 1, 1])),
        ("auto", ["g0"], ["g1", "g2"], ("broadcast", [0, 0])),
        ("auto", ["g0"], ["g0", "g1"], ("object_store", [0, 0])),  # a mix
        ("auto", ["g0"], ["g1", "g1"], ("object_store", [0, 0])),  # engines share a GPU
        ("object_store", ["g0"], ["g0"], ("object_store", [0])),
        ("broadcast", [None], [None], ("broadcast", [0])),  # gloo on CPU
        ("cuda_ipc", ["g0", "g1"], ["g1"], ("cuda_ipc", [1])),
    ],
)
def test_the_mode_follows_where_ranks_and_engines_are(mode, ranks, engines, expected):
    assert weight_sync.choose_mode(mode, ranks, engines) == expected


@pytest.mark.parametrize(
    ("mode", "ranks", "engines", "message"),
    [
        ("cuda_ipc", [None], [None], "needs the learners and engines on GPUs"),
        ("cuda_ipc", ["g0"], ["g0", "g1"], r"engines \[1\] share no GPU"),
        ("broadcast", ["g0"], ["g0"], "NCCL refuses two members"),
        ("broadcast", ["g0"], ["g1", "g1"], "NCCL refuses two members"),
        ("broadcast", ["g0"], [None], "all on GPUs \\(NCCL\\) or all on CPUs"),
        ("nccl", ["g0"], ["g1"], "weight_sync must be one of"),
    ],
)
def test_a_mode_that_cannot_work_is_refused_with_what_to_do(mode, ranks, engines, message):
    with pytest.raises(ValueError, match=message):
        weight_sync.choose_mode(mode, ranks, engines)


def test_the_config_refuses_a_sync_without_engines_and_an_empty_bucket(tmp_path):
    base = {"env": "MathChat-v0", "output_dir": str(tmp_path), "distributed": "ray"}
    with pytest.raises(ValueError, match="set engines_per_agent to 1 or more"):
        TrainConfig(**base, weight_sync="cuda_ipc")
    with pytest.raises(ValueError, match="weight_sync_bucket_mb must be positive"):
        TrainConfig(**base, engines_per_agent=1, weight_sync_bucket_mb=0)
    with pytest.raises(ValueError, match="weight_sync must be one of"):
        TrainConfig(**base, engines_per_agent=1, weight_sync="ipc")


def _free_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{sock.getsockname()[1]}"


def test_a_gloo_channel_broadcasts_every_bucket_to_every_engine():
    state = _state(seed=1)
    buckets = weight_sync.plan_buckets(_specs(state, torch.float32), bucket_bytes=128)
    address, world = _free_address(), 3
    received: dict[int, dict[str, torch.Tensor]] = {}
    errors: list[BaseException] = []

    def member(rank: int) -> None:
        try:
            channel = weight_sync.open_channel(address, rank, world, "gloo", timeout_s=30)
            size = max(weight_sync.bucket_size(b) for b in buckets)
            buffer = torch.zeros(size, dtype=torch.uint8)
            got = {}
            for slots in buckets:
                if rank == 0:
                    part = weight_sync.pack_bucket(buffer, slots, state)
                else:
                    part = buffer[: weight_sync.bucket_size(slots)]
                weight_sync.broadcast(channel, part)
                got.update({n: t.clone() for n, t in weight_sync.unpack_bucket(buffer, slots)})
            received[rank] = got
        except Exception as error:  # noqa: BLE001 (reported by the main thread)
            errors.append(error)

    threads = [threading.Thread(target=member, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert sorted(received) == [0, 1, 2]
    for rank in (1, 2):
        for name, tensor in state.items():
            torch.testing.assert_close(received[rank][name], tensor, rtol=0, atol=0)


def test_a_channel_whose_members_do_not_all_come_fails_instead_of_hanging():
    with pytest.raises(Exception, match=r"(?i)timed? ?out|timeout"):
        weight_sync.open_channel(_free_address(), 0, 2, "gloo", timeout_s=2)


_IPC_READER = """
import sys, torch, pickle
from mappa_train import weight_sync
handle = pickle.loads(sys.stdin.buffer.read())
buffer = weight_sync.open_cuda_buffer(handle)
print(int(buffer.sum()))
buffer.fill_(7)  # the sender sees this write: the memory is shared
torch.cuda.synchronize()
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a GPU")
def test_a_cuda_buffer_opened_in_another_process_is_the_same_memory():
    import pickle

    buffer = torch.arange(256, device="cuda").to(torch.uint8)
    torch.cuda.synchronize()
    expected = int(buffer.sum())  # before the reader overwrites it
    handle = weight_sync.share_cuda_buffer(buffer)
    done = subprocess.run(
        [sys.executable, "-c", _IPC_READER],
        input=pickle.dumps(handle),
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert int(done.stdout.decode().split()[-1]) == expected
    torch.cuda.synchronize()
    assert bool((buffer == 7).all())


def test_opening_a_buffer_of_a_gpu_this_process_does_not_see_says_so():
    with pytest.raises(ValueError, match="CUDA IPC needs the engine on its rank's GPU"):
        weight_sync.open_cuda_buffer({"gpu": "GPU-not-here", "args": (), "rebuild": None})
