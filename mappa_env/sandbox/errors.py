"""The sandbox's own failures, shared by every module of the package.

:class:`SandboxError` says the sandbox itself failed (never the code it runs), and
:class:`IsolationUnavailableError` that namespace isolation cannot work here;
:data:`CGROUP_JOIN_FAILED` is the exit status by which the launch shim (see
:mod:`mappa_env.sandbox.confinement`) says a kernel could not join its cgroup.
"""

from __future__ import annotations


class SandboxError(RuntimeError):
    """The sandbox itself failed (a kernel could not start, or it was used after close).

    Code that misbehaves never raises this: its failures come back as results.
    """


class IsolationUnavailableError(SandboxError):
    """``isolation="namespaces"`` was asked for, but bubblewrap cannot confine here."""


#: Exit status of the launch shim when the kernel cannot join its cgroup (see confinement).
CGROUP_JOIN_FAILED = 97
