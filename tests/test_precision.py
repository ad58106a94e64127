"""Float32 master weights for a bf16 model: kept updates, exact save and load."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from mappa_train.precision import MasterWeightAdamW  # noqa: E402


def _model(seed: int = 0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(
        torch.bfloat16
    )


def _micro_step(model, optimizer, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(2):  # two micro-batches per optimizer step
        x = torch.randn(4, 8, generator=generator).to(torch.bfloat16)
        model(x).float().pow(2).mean().backward()
        optimizer.accumulate_grads()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.parametrize("fused", [False, True])
def test_small_steps_add_up_in_the_masters(fused):
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = MasterWeightAdamW(model.parameters(), lr=1e-6, fused=fused)
    _micro_step(model, optimizer, seed=1)
    # The masters moved; the bf16 weights hold them rounded (mostly unchanged yet).
    masters_moved = sum(
        int((m != b.float()).sum()) for m, b in zip(optimizer.master, before)
    ) / sum(m.numel() for m in optimizer.master)
    assert masters_moved > 0.9
    for param, master in zip(model.parameters(), optimizer.master):
        assert param.dtype == torch.bfloat16
        assert master.dtype == torch.float32
        assert torch.equal(param, master.to(torch.bfloat16))
        assert param.grad is None
        assert master.grad is None


@pytest.mark.parametrize("fused", [False, True])
def test_save_and_load_mid_run_is_exact(fused):
    straight_model = _model()
    straight = MasterWeightAdamW(straight_model.parameters(), lr=1e-3, fused=fused)
    for seed in range(4):
        _micro_step(straight_model, straight, seed)

    model = _model()
    optimizer = MasterWeightAdamW(model.parameters(), lr=1e-3, fused=fused)
    for seed in range(2):
        _micro_step(model, optimizer, seed)
    state = optimizer.state_dict()
    resumed_model = _model(seed=99)  # other weights: the state must restore them
    resumed = MasterWeightAdamW(resumed_model.parameters(), lr=1e-3, fused=fused)
    resumed.load_state_dict(state)
    for seed in range(2, 4):
        _micro_step(resumed_model, resumed, seed)
    for a, b in zip(straight.master, resumed.master):
        assert torch.equal(a, b)
    for a, b in zip(straight_model.parameters(), resumed_model.parameters()):
        assert torch.equal(a, b)


def test_lr_set_on_param_groups_reaches_the_update():
    model = _model()
    optimizer = MasterWeightAdamW(model.parameters(), lr=1e-3)
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    before = [m.clone() for m in optimizer.master]
    _micro_step(model, optimizer, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(before, optimizer.master))


def test_a_state_without_masters_is_refused_with_advice():
    model = _model()
    plain = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer = MasterWeightAdamW(model.parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="resume with the settings"):
        optimizer.load_state_dict(plain.state_dict())


def test_checkpoint_loading_takes_this_runs_kernel_choice(tmp_path):
    from types import SimpleNamespace

    from mappa_train import checkpoint as ckpt

    model = _model()
    saved = MasterWeightAdamW(model.parameters(), lr=1e-3, fused=False)
    _micro_step(model, saved, seed=0)
    agent_dir = tmp_path / "agents" / "a"
    agent_dir.mkdir(parents=True)
    torch.save(saved.state_dict(), agent_dir / "optimizer.pt")
    torch.save(ckpt.rng_state(), tmp_path / "rng.pt")
    live = MasterWeightAdamW(model.parameters(), lr=1e-3, fused=True)
    ckpt.load_optimizer_states(tmp_path, {"a": SimpleNamespace(optimizer=live)})
    assert live.param_groups[0]["fused"] is True
    # A plain optimizer refuses a state with masters.
    plain = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="mixed_precision"):
        ckpt.load_optimizer_states(tmp_path, {"a": SimpleNamespace(optimizer=plain)})
