"""DSBench's artifact inspections are remembered by the bytes they read, and only by them."""

from __future__ import annotations

import os
import pickle

import pytest

from mappa_env.dsbench.inspections import InspectionCache, inspection_key
from mappa_env.dsbench.reference import reference_script
from tests.test_dsbench_env import by_task, make_env, play

PARAMETERS = {"names": ["model.pkl", "X_test.pkl"], "task_type": "classification"}


def write(folder, name, value) -> None:
    (folder / name).write_bytes(pickle.dumps(value))


def test_the_key_follows_the_bytes_the_parameters_and_the_confinement(tmp_path):
    write(tmp_path, "model.pkl", [1, 2, 3])
    names = PARAMETERS["names"]
    first = inspection_key(tmp_path, names, PARAMETERS, "none")
    assert first is not None
    assert inspection_key(tmp_path, names, dict(PARAMETERS), "none") == first
    assert inspection_key(tmp_path, names, PARAMETERS, "namespaces python -I") != first
    assert (
        inspection_key(tmp_path, names, {**PARAMETERS, "task_type": "regression"}, "none") != first
    )
    write(tmp_path, "X_test.pkl", [0])  # a file where there was none
    second = inspection_key(tmp_path, names, PARAMETERS, "none")
    assert second != first
    write(tmp_path, "model.pkl", [1, 2, 4])  # one byte of one file
    assert inspection_key(tmp_path, names, PARAMETERS, "none") not in (first, second)


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo", "folder"])
def test_what_is_not_a_regular_file_of_its_own_is_never_cached(tmp_path, kind):
    write(tmp_path, "elsewhere.pkl", [1])
    target = tmp_path / "model.pkl"
    if kind == "symlink":
        target.symlink_to(tmp_path / "elsewhere.pkl")
    elif kind == "hardlink":
        os.link(tmp_path / "elsewhere.pkl", target)
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    assert inspection_key(tmp_path, ["model.pkl"], PARAMETERS, "none") is None


def test_the_cache_hands_out_copies_and_forgets_the_least_recently_used():
    cache = InspectionCache(max_entries=2)
    report = {"model.pkl": {"loads": True}}
    cache.put("a", report)
    report["model.pkl"]["loads"] = False  # the caller's later edit stays its own
    got = cache.get("a")
    assert got == {"model.pkl": {"loads": True}}
    got["model.pkl"]["loads"] = "edited"
    assert cache.get("a") == {"model.pkl": {"loads": True}}
    cache.put("b", {})
    cache.get("a")  # a is used again: b is the oldest
    cache.put("c", {})
    assert cache.get("b") is None
    assert cache.get("a") is not None
    assert len(cache) == 2
    assert cache.get(None) is None
    cache.put(None, {"x": {}})
    assert len(cache) == 2
    with pytest.raises(ValueError, match="max_entries"):
        InspectionCache(max_entries=0)


def test_an_episode_replayed_byte_for_byte_starts_no_new_inspector(monkeypatch):
    cache = InspectionCache()
    monkeypatch.setattr("mappa_env.envs.dsbench.SHARED_INSPECTIONS", cache)
    started = []
    env = make_env()
    original = type(env)._run_inspector

    async def counting(self, parameters):
        started.append(parameters["names"])
        return await original(self, parameters)

    monkeypatch.setattr(type(env), "_run_inspector", counting)
    try:
        task = by_task(env, "iris")
        play(env, reference_script(task), "iris")
        first = env.state()["outcome"]
        inspected = len(started)
        assert inspected >= 2
        assert cache.hits == 0
        play(env, reference_script(task), "iris")
        assert len(started) == inspected  # every inspection came from the cache
        assert cache.hits == inspected
        assert env.state()["outcome"] == first
    finally:
        env.close()


def test_a_report_on_files_that_changed_during_the_inspection_is_not_kept(monkeypatch):
    # Agent code left running (a thread in its kernel) could swap a pickle while the
    # inspector reads it: that report may describe other bytes than the ones hashed.
    cache = InspectionCache()
    monkeypatch.setattr("mappa_env.envs.dsbench.SHARED_INSPECTIONS", cache)
    env = make_env()
    original = type(env)._run_inspector

    swaps = []

    async def swapping(self, parameters):
        report = await original(self, parameters)
        swaps.append(parameters["names"][0])  # other bytes each time
        (self.workdir / swaps[-1]).write_bytes(f"swap {len(swaps)}".encode())
        return report

    monkeypatch.setattr(type(env), "_run_inspector", swapping)
    try:
        task = by_task(env, "iris")
        play(env, reference_script(task), "iris")
        assert len(swaps) == 3  # every agent's inspection ran
        assert len(cache) == 0
        assert cache.hits == 0
    finally:
        env.close()
