"""Temporary files name their owner; the next start removes those of dead runs only."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from mappa_env.tempdirs import make_temp_dir, make_temp_file, owner_tag, remove_stale


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_dead_runs_entries_of_this_machine_are_removed(tmp_path):
    mine = make_temp_dir("kernel")
    handle, seccomp = make_temp_file("seccomp", suffix=".bpf")
    os.close(handle)
    try:
        assert mine.name.startswith(f"mappa-kernel-{owner_tag()}-")
        host = owner_tag().split("h")[-1]
        dead = _dead_pid()
        stale_dir = tmp_path / f"mappa-mathchat-v0-p{dead}h{host}-abc"
        (stale_dir / "deep" / "er").mkdir(parents=True)
        (stale_dir / "deep" / "er" / "file.txt").write_text("x")
        stale_file = tmp_path / f"mappa-seccomp-p{dead}h{host}-xyz.bpf"
        stale_file.write_text("")
        live = tmp_path / f"mappa-sandbox-{owner_tag()}-keep"
        live.mkdir()
        other_host = tmp_path / f"mappa-sandbox-p{dead}h000000-keep"
        other_host.mkdir()
        unrelated = tmp_path / "mappa-something-else"
        unrelated.mkdir()
        assert sorted(remove_stale(tmp_path)) == sorted([stale_dir, stale_file])
        assert all(p.exists() for p in (live, other_host, unrelated))
        assert mine.is_dir()  # this live process's own folder stays
    finally:
        os.rmdir(mine)
        os.unlink(seccomp)


def test_the_mappa_command_clears_a_killed_runs_folders_at_start(tmp_path, monkeypatch):
    from mappa_train.command import main

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    host = owner_tag().split("h")[-1]
    stale = tmp_path / f"mappa-kernel-p{_dead_pid()}h{host}-left"
    stale.mkdir()
    assert main(["train", "--steps", "ten"]) == 2  # any start, even one refused at once
    assert not stale.exists()
