"""Output written to file descriptors 1 and 2 belongs to the cell that wrote it.

ipykernel forwards it from a pipe in a thread of its own; a late thread (a loaded machine)
used to let a cell's last bytes arrive after the cell was reported done, where the sandbox
no longer read them.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from mappa_env.sandbox._launcher import DescriptorSync
from mappa_env.sandbox.jupyter import JupyterSandbox


class LateForwarder:
    """ipykernel's ``OutStream`` in miniature: a pipe read in chunks by a slow thread."""

    def __init__(self, chunk: int, delay_s: float) -> None:
        self._fid, self._original_stdstream_fd = os.pipe()
        self._should_watch = True
        self.chunk, self.delay_s = chunk, delay_s
        self.received: list[str] = []
        self.watch_fd_thread = threading.Thread(target=self._watch, daemon=True)
        self.watch_fd_thread.start()

    def _watch(self) -> None:
        while data := os.read(self._fid, self.chunk):
            time.sleep(self.delay_s)  # the thread runs late
            self.write(data.decode(errors="replace"))

    def write(self, text: str) -> int:
        self.received.append(text)
        return len(text)

    def close(self) -> None:
        os.close(self._original_stdstream_fd)
        self.watch_fd_thread.join(timeout=5)
        os.close(self._fid)


@pytest.mark.parametrize("chunk", [1000, 7], ids=["whole-marker", "marker-split-across-reads"])
def test_sync_returns_once_everything_written_before_it_was_passed_on(chunk):
    stream = LateForwarder(chunk=chunk, delay_s=0.02)
    try:
        sync = DescriptorSync(stream)
        os.write(stream._original_stdstream_fd, b"last words\n")
        assert sync.sync()
        # Without the sync the first chunk is still asleep in the thread here.
        assert "".join(stream.received) == "last words\n"
        # Writes from other threads (print in the cell) go straight through.
        stream.write("printed\n")
        assert stream.received[-1] == "printed\n"
        assert sync.sync()
        assert "".join(stream.received) == "last words\nprinted\n"
    finally:
        stream.close()


def test_text_that_only_looks_like_a_marker_start_is_passed_on_at_the_next_sync():
    stream = LateForwarder(chunk=1000, delay_s=0.0)
    try:
        sync = DescriptorSync(stream)
        os.write(stream._original_stdstream_fd, b"ends in a NUL\x00")
        assert sync.sync()
        assert "".join(stream.received) == "ends in a NUL\x00"
    finally:
        stream.close()


def test_a_descriptor_pointed_elsewhere_gets_no_marker(tmp_path: Path):
    stream = LateForwarder(chunk=1000, delay_s=0.0)
    saved = os.dup(stream._original_stdstream_fd)
    try:
        sync = DescriptorSync(stream, timeout_s=0.2)
        target = tmp_path / "elsewhere.txt"
        with target.open("wb") as file:
            os.dup2(file.fileno(), stream._original_stdstream_fd)
        assert not sync.sync()
        assert target.read_bytes() == b""
    finally:
        os.dup2(saved, stream._original_stdstream_fd)
        os.close(saved)
        stream.close()


def test_a_kernel_cells_descriptor_output_and_prints_arrive_whole_and_in_order(tmp_path: Path):
    code = (
        "import os, subprocess, sys\n"
        "print('first')\n"
        "sys.stdout.flush()\n"
        "subprocess.run([sys.executable, '-c', 'print(\"from a child\")'])\n"
        "os.write(2, b'to fd 2\\n')\n"
        "os.write(1, b'x' * 5000 + b'\\nlast\\n')\n"
        "None"
    )
    with JupyterSandbox(tmp_path) as sandbox:
        for _ in range(3):
            result = sandbox.run(code)
            assert result.stdout == "first\nfrom a child\n" + "x" * 5000 + "\nlast\n"
            assert result.stderr == "to fd 2\n"
            assert "mappa-sync" not in result.stdout + result.stderr
        # Code that points descriptor 1 at a file finds none of the sandbox's bytes in it.
        result = sandbox.run(
            "import os\nsaved = os.dup(1)\nf = open('out.txt', 'wb')\nos.dup2(f.fileno(), 1)\n"
            "os.write(1, b'to the file')"
        )
        assert result.ok
        restored = sandbox.run("os.dup2(saved, 1)\nf.close()\nprint(open('out.txt').read())")
        assert restored.stdout == "to the file\n"
