"""The sandbox protocol: where agents' Python code runs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from mappa_env.text import truncate_middle


@dataclass(frozen=True)
class ExecError:
    """An exception raised by the executed code (or by the sandbox on its behalf).

    Attributes:
        name: Exception class name, e.g. ``"ZeroDivisionError"``, or a sandbox
            condition such as ``"TimeoutError"``, ``"KernelDied"``, ``"MemoryError"``.
        value: The exception message.
        traceback: The traceback as plain text (ANSI colour codes removed).
    """

    name: str
    value: str
    traceback: str = ""


@dataclass(frozen=True)
class ExecResult:
    """What happened when one piece of code ran.

    Attributes:
        stdout: Captured standard output, plus the plain-text value of the cell's
            last expression (as a notebook would show it).
        stderr: Captured standard error.
        error: ``None`` when the code finished without an exception.
        timed_out: True when the wall-clock limit interrupted the code.
        duration_s: Wall-clock seconds the call took.
        truncated: True when stdout or stderr was cut to the output limit.
        restarted: True when the sandbox had to restart its interpreter (the code
            killed it, exhausted a limit, or could not be interrupted); state from
            earlier calls is lost in that case.
        files_written: Workspace files created or modified by this call, relative
            paths, when the sandbox tracks them.
    """

    stdout: str = ""
    stderr: str = ""
    error: ExecError | None = None
    timed_out: bool = False
    duration_s: float = 0.0
    truncated: bool = False
    restarted: bool = False
    files_written: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        """True when the code ran to completion without an exception or timeout."""
        return self.error is None and not self.timed_out

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form for ``infos``, JSON export and coach prompts."""
        data = asdict(self)
        data["files_written"] = list(self.files_written)
        data["ok"] = self.ok
        return data

    def render(self, max_chars: int = 4000) -> str:
        """Readable text of the result, as shown to agents and coaches.

        Long output is cut from the middle, so the end (where tracebacks are) survives.

        Args:
            max_chars: Upper bound on the length of the returned text.

        Returns:
            A multi-line description: stdout, stderr, error and timeout notes.
        """
        parts: list[str] = []
        if self.stdout:
            parts.append(f"[stdout]\n{self.stdout.rstrip()}")
        if self.stderr:
            parts.append(f"[stderr]\n{self.stderr.rstrip()}")
        if self.timed_out:
            parts.append(f"[timeout] the code was stopped after {self.duration_s:.1f} s")
        if self.error is not None:
            body = self.error.traceback.rstrip() or f"{self.error.name}: {self.error.value}"
            parts.append(f"[error] {self.error.name}: {self.error.value}\n{body}")
        if self.restarted:
            parts.append("[note] the Python process was restarted; earlier variables are gone")
        if not parts:
            parts.append("[no output]")
        return truncate_middle("\n".join(parts), max_chars)


@runtime_checkable
class Sandbox(Protocol):
    """Runs code with persistent state in a working directory.

    Implementations never raise out of :meth:`run` / :meth:`arun` because of what
    the code does: every failure comes back as an :class:`ExecResult`.
    """

    @property
    def workdir(self) -> Path:
        """Directory the code runs in (its current working directory)."""
        ...

    def run(self, code: str, timeout: float | None = None) -> ExecResult:
        """Run ``code`` and wait for it, at most ``timeout`` seconds."""
        ...

    async def arun(self, code: str, timeout: float | None = None) -> ExecResult:
        """Like :meth:`run`, without blocking the event loop."""
        ...

    def close(self) -> None:
        """Stop the interpreter and release every resource. Idempotent."""
        ...


class SandboxFactory(Protocol):
    """Makes a sandbox whose working directory is ``workdir``.

    Environments take a factory so that each episode (and, for DSBench, each agent)
    gets its own interpreter over a workspace directory the environment owns.
    """

    def __call__(self, workdir: Path) -> Sandbox:
        """Return a new sandbox running in ``workdir``."""
        ...


class SandboxUnavailableError(RuntimeError):
    """A sandbox cannot run even trivial code, so no run that needs one can be meaningful.

    Raised by :func:`check_sandbox` before a run starts: otherwise every code action
    would come back as a tool error and be scored as the agent's failure.
    """


#: What :func:`check_sandbox` runs, and what it must print.
_PROBE_CODE, _PROBE_OUTPUT = "print(6 * 7)", "42"


def check_sandbox(factory: SandboxFactory, timeout: float = 60.0) -> None:
    """Make one sandbox from ``factory`` in a temporary directory and run ``print(6 * 7)``.

    Args:
        factory: The sandbox factory an environment will use.
        timeout: Seconds the probe code may take (a kernel start comes first).

    Raises:
        SandboxUnavailableError: Naming the cause (the kernel's start-up error, for
            example) and what to do, when the sandbox cannot be made, or the code fails
            or prints something else.
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="mappa-sandbox-check-") as workdir:
        try:
            sandbox = factory(Path(workdir))
        except Exception as exc:  # noqa: BLE001 - any failure to build one is the finding
            cause = f"making a sandbox raised {type(exc).__name__}: {exc}"
        else:
            try:
                result = sandbox.run(_PROBE_CODE, timeout=timeout)
            finally:
                sandbox.close()
            if result.ok and result.stdout.strip() == _PROBE_OUTPUT:
                return
            if result.error is not None:
                cause = f"{result.error.name}: {result.error.value}"
            else:
                cause = f"{_PROBE_CODE} printed {result.stdout.strip()[:200]!r}"
            if result.stderr.strip():
                cause += f"\nstderr:\n{truncate_middle(result.stderr.strip(), 2000)}"
    raise SandboxUnavailableError(
        f"the sandbox cannot run code ({cause}). Every code action would come back as a "
        f"tool error and be scored as the agent's fault, so nothing runs. {_advice(cause)} "
        "To run without code execution, use sandbox=None (`--sandbox none`)."
    )


# A kernel that started but did not answer in time, or code that ran past its limit.
_HUNG = ("did not answer within the start timeout", "TimeoutError:")


def _advice(cause: str) -> str:
    """What to do about a sandbox that cannot run code, by what went wrong."""
    import sys

    if "bubblewrap refused" in cause:
        return (
            "Fix what bubblewrap names above, or run agents' code unconfined with "
            "isolation='none' (`--isolation none`)."
        )
    if any(sign in cause for sign in _HUNG):
        return (
            "The kernel hung rather than failed: on a busy machine run fewer episodes at "
            "once (`--concurrency`), or give kernels longer to start with "
            "JupyterSandbox.factory(limits=SandboxLimits(start_timeout_s=...)) (default "
            "60 s); if it hangs on an idle machine, start "
            f"`{sys.executable} -m ipykernel` by hand to see where it waits."
        )
    return (
        f"For the Jupyter sandbox, make ipykernel and jupyter-client importable by "
        f"{sys.executable} (`{sys.executable} -m pip install ipykernel jupyter-client`); "
        "packages that are reachable only through PYTHONPATH are passed on to the kernel."
    )
