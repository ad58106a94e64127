"""A seccomp filter for confined interpreters, as the classic BPF program bubblewrap loads.

Namespaces leave a few system calls that reach past the sandbox or open the kernel's
larger attack surface; the filter makes them fail with ``EPERM``:

- ``unshare`` and ``clone`` / ``clone3`` with ``CLONE_NEWUSER``: a new user namespace
  would give the code every capability inside it (``clone3``, whose flags a classic
  filter cannot read, fails with ``ENOSYS`` so that C libraries fall back to ``clone``);
- ``setns``: joining other namespaces;
- ``add_key``, ``request_key``, ``keyctl``: the kernel keyrings are per user, so
  sandboxes running as the same user could pass data through them;
- ``ptrace``: no process may trace another.

System calls of another architecture (32-bit calls on a 64-bit machine, x32) fail too:
they would reach the same kernel functions under other numbers. Every other call is
allowed. The filter exists for x86-64 and AArch64; elsewhere none is loaded (the
namespaces still apply).
"""

from __future__ import annotations

import atexit
import errno
import functools
import os
import platform
import struct
from pathlib import Path

from mappa_env.tempdirs import make_temp_file

# Classic BPF instruction classes and fields (linux/filter.h, linux/bpf_common.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JSET_K = 0x45
_RET_K = 0x06
# Return values (linux/seccomp.h).
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
# Offsets in struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6].
_NR, _ARCH, _ARG0_LOW = 0, 4, 16
_CLONE_NEWUSER = 0x10000000
_X32_BIT = 0x40000000

#: Architecture: (AUDIT_ARCH value, system call numbers by name).
_TABLES = {
    "x86_64": (
        0xC000003E,
        {
            "unshare": 272,
            "clone": 56,
            "clone3": 435,
            "setns": 308,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
            "ptrace": 101,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "unshare": 97,
            "clone": 220,
            "clone3": 435,
            "setns": 268,
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
            "ptrace": 117,
        },
    ),
}
_DENIED = ("unshare", "setns", "add_key", "request_key", "keyctl", "ptrace")


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def filter_program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this one), or None where none is defined.

    Returns:
        The ``struct sock_filter`` array, as bubblewrap's ``--seccomp`` reads it.
    """
    table = _TABLES.get(machine or platform.machine())
    if table is None:
        return None
    arch, numbers = table
    eperm = _ERRNO | errno.EPERM
    program = [
        _op(_LD_W_ABS, _ARCH),
        _op(_JEQ_K, arch, jt=1),  # this architecture: go on
        _op(_RET_K, eperm),  # another one's calls (32-bit, say) are refused
        _op(_LD_W_ABS, _NR),
    ]
    if machine == "x86_64" or (machine is None and platform.machine() == "x86_64"):
        program += [_op(_JSET_K, _X32_BIT, jt=0, jf=1), _op(_RET_K, eperm)]
    for name in _DENIED:
        program += [_op(_JEQ_K, numbers[name], jf=1), _op(_RET_K, eperm)]
    program += [_op(_JEQ_K, numbers["clone3"], jf=1), _op(_RET_K, _ERRNO | errno.ENOSYS)]
    # clone: refuse only a new user namespace (threads and processes are clones too).
    program += [
        _op(_JEQ_K, numbers["clone"], jf=3),
        _op(_LD_W_ABS, _ARG0_LOW),
        _op(_JSET_K, _CLONE_NEWUSER, jf=1),
        _op(_RET_K, eperm),
        _op(_RET_K, _ALLOW),
    ]
    return b"".join(program)


@functools.cache
def filter_file() -> Path | None:
    """This process's copy of the filter on disk (read by every sandbox it starts)."""
    program = filter_program()
    if program is None:
        return None
    handle, name = make_temp_file("seccomp", suffix=".bpf")
    with os.fdopen(handle, "wb") as out:
        out.write(program)
    os.chmod(name, 0o444)
    atexit.register(_remove, name)
    return Path(name)


def _remove(name: str) -> None:
    try:
        os.unlink(name)
    except OSError:
        pass
