"""Sandboxes: where agents' Python code runs.

- :class:`Sandbox` / :class:`SandboxFactory` are the protocols; :class:`ExecResult` and
  :class:`ExecError` describe what one piece of code did.
- :class:`JupyterSandbox` runs code in a Jupyter kernel confined by :class:`SandboxLimits`
  (time, memory, CPU, files, processes, output size; a scrubbed environment).
- :class:`KernelPool` keeps kernels started in the background and hands them out, so an
  episode does not wait for a kernel start.
- :func:`check_sandbox` runs one trivial cell before a run, so a sandbox that cannot
  work stops the run with its cause instead of scoring every code action as a failure.

Importing this package is cheap: jupyter-client is imported when a kernel first starts.
"""

from __future__ import annotations

from mappa_env.sandbox.base import (
    ExecError,
    ExecResult,
    Sandbox,
    SandboxFactory,
    SandboxUnavailableError,
    check_sandbox,
)
from mappa_env.sandbox.jupyter import JupyterSandbox, JupyterSandboxFactory, SandboxError
from mappa_env.sandbox.limits import SandboxLimits, inherited_import_paths, kernel_environment
from mappa_env.sandbox.pool import KernelPool

__all__ = [
    "ExecError",
    "ExecResult",
    "JupyterSandbox",
    "JupyterSandboxFactory",
    "KernelPool",
    "Sandbox",
    "SandboxError",
    "SandboxFactory",
    "SandboxLimits",
    "SandboxUnavailableError",
    "check_sandbox",
    "inherited_import_paths",
    "kernel_environment",
]
