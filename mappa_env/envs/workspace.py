"""An episode's workspace: its directory, the sandboxes that run agents' code, confinement.

Owns :class:`EpisodeWorkspace`, the part of :class:`~mappa_env.envs.pipeline.PipelineEnv`
that makes the episode's workspace, runs code in each owner's sandbox (made on demand,
or taken from one started ahead: :mod:`mappa_env.envs._prestart`), holds the workspace's
disk quota, finds the code timeout a task implies, says how agents' code is confined
(the isolation report), removes the workspace at the episode's end and lets go of
what an idle environment holds (:meth:`EpisodeWorkspace.arelease_idle_resources`); and
:func:`resolve_sandbox_factory`, which turns the ``sandbox`` option into a factory.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from mappa_env._fs import remove_tree
from mappa_env.envs._prestart import PrestartedSandbox, new_workspace
from mappa_env.sandbox.base import ExecError, ExecResult, Sandbox, SandboxFactory, check_sandbox
from mappa_env.sandbox.isolation import (
    Confinement,
    IsolationMode,
    IsolationUnavailableError,
    UidLease,
    declared_confinement,
    isolation_required,
    resolve_confinement,
)
from mappa_env.sandbox.quota import QUOTA_ERROR, quota_error, trim_workspace, workspace_usage

logger = logging.getLogger(__name__)

#: Smallest ``code_timeout_s`` accepted. A kernel round trip alone takes milliseconds and
#: a timed-out run is interrupted (or its kernel restarted) before the next: below this
#: every code action would time out, whatever it does.
MIN_CODE_TIMEOUT_S = 0.1
#: Default ``workspace_quota_mb``: 1 GiB, room for a data set, its copies and models.
DEFAULT_WORKSPACE_QUOTA_MB = 1024
#: Largest ``code_timeout_s`` accepted: a day; an infinite wait is never meant.
MAX_CODE_TIMEOUT_S = 86_400.0


@functools.cache
def warn_unconfined_agents(reason: str) -> None:
    """Warn once per process and reason that agents' code runs unconfined."""
    logger.warning(
        "agents' code runs without namespace isolation: %s; reports say so (isolation: "
        "none). Pass isolation='none' to accept it.",
        reason,
    )


def agent_confinement(factory: SandboxFactory | None, helpers: Confinement) -> Confinement:
    """What a sandbox factory's code runs under (see ``PipelineEnv.sandbox_confinement``)."""
    if factory is None:
        return helpers
    declared = declared_confinement(factory)
    if declared is not None:
        return declared
    return Confinement(
        mode="none",
        reason=f"the sandbox factory {factory!r} declares no confinement, so its code is "
        "taken to run unconfined",
    )


def resolve_sandbox_factory(
    sandbox: str | SandboxFactory | None,
    isolation: IsolationMode = "auto",
    *,
    workspace_bytes: int | None = DEFAULT_WORKSPACE_QUOTA_MB * 1024**2,
) -> SandboxFactory | None:
    """The sandbox factory named by ``sandbox``.

    ``"jupyter"`` gives a Jupyter kernel per sandbox, confined as ``isolation`` says, with
    ``workspace_bytes`` as its workspace quota (``SandboxLimits.workspace_bytes``);
    ``None`` disables code execution. A callable must declare its confinement (a
    :class:`~mappa_env.sandbox.isolation.Confinement` as its ``confinement``
    attribute, as :meth:`JupyterSandbox.factory
    <mappa_env.sandbox.JupyterSandbox.factory>` and
    :class:`~mappa_env.sandbox.KernelPool` do) for ``isolation="namespaces"`` (or
    ``MAPPA_REQUIRE_ISOLATION``) to accept it; one that declares none is taken to run
    code unconfined, and is reported so.

    Raises:
        ValueError: For an unknown name.
        IsolationUnavailableError: For a callable whose declared confinement is not
            namespaces, when ``isolation="namespaces"`` or isolation is required.
    """
    if sandbox is None:
        return None
    if callable(sandbox):
        declared = declared_confinement(sandbox)
        if (isolation == "namespaces" or isolation_required()) and not (
            declared is not None and declared.isolated
        ):
            said = "declares no confinement" if declared is None else "declares no namespaces"
            raise IsolationUnavailableError(
                f"isolation={isolation!r} needs agents' code confined, but the sandbox "
                f"factory {sandbox!r} {said} (a Confinement with isolated=True as its "
                "`confinement` attribute): pass sandbox='jupyter', a factory made by "
                "JupyterSandbox.factory(isolation='namespaces'), or declare the "
                "confinement your factory enforces"
                + ("" if isolation == "namespaces" else "; MAPPA_REQUIRE_ISOLATION is set")
            )
        return sandbox
    if sandbox == "jupyter":
        from mappa_env.sandbox import JupyterSandbox, SandboxLimits

        limits = SandboxLimits(workspace_bytes=workspace_bytes)
        return JupyterSandbox.factory(limits=limits, isolation=isolation)
    raise ValueError(
        f"unknown sandbox {sandbox!r}: pass 'jupyter', None (no code execution) "
        "or a callable workdir -> Sandbox"
    )


class EpisodeWorkspace:
    """The episode's workspace and sandboxes, for :class:`PipelineEnv`.

    A mixin: :class:`~mappa_env.envs.pipeline.PipelineEnv` sets the options it reads
    (``workspace_quota_bytes``) and calls :meth:`_open_workspace` from its constructor.
    """

    env_id: ClassVar[str]
    isolation: IsolationMode
    workspace_quota_bytes: int | None
    _closed: bool

    def _open_workspace(
        self, sandbox: str | SandboxFactory | None, isolation: IsolationMode
    ) -> None:
        """Resolve confinement and the sandbox factory; no workspace or sandbox yet.

        Raises:
            IsolationUnavailableError: Where ``isolation`` cannot be had.
            ValueError: For an unknown sandbox name.
        """
        self.isolation: IsolationMode = isolation
        self._confinement = resolve_confinement(isolation)
        self._sandbox_factory = resolve_sandbox_factory(
            sandbox, isolation, workspace_bytes=self.workspace_quota_bytes
        )
        self._agent_confinement = agent_confinement(self._sandbox_factory, self._confinement)
        if (
            isolation != "none"
            and not self._agent_confinement.isolated
            # The same reason as the environment's own: resolve_confinement warned.
            and self._agent_confinement.reason != self._confinement.reason
        ):
            warn_unconfined_agents(self._agent_confinement.reason)
        self._workspace_lease: UidLease | None = None
        self._sandboxes: dict[str, Sandbox] = {}
        # This episode's sandbox started ahead (until its first code run takes it), and the
        # next episode's, started while this one runs.
        self._prestarted: PrestartedSandbox | None = None
        self._spare: PrestartedSandbox | None = None
        # Whether the last episode ran code: kernels start ahead only after one that did
        # (a policy that seldom writes code would leave most of them unused).
        self._code_ran: bool = True
        self._code_ran_now: bool = False

    @property
    def workdir(self) -> Path:
        """This episode's workspace directory (created on first use, removed at episode end)."""
        if self._workdir is None:
            self._workdir, self._workspace_lease = new_workspace(
                self.env_id.lower(), self._confinement
            )
        return self._workdir

    def task_code_timeout_s(self) -> float | None:
        """The code timeout the episode's task carries or implies, or ``None``.

        By default :func:`mappa_env.tasks.task_code_timeout_s` of ``self.task``: a
        ``code_timeout_s`` in the task's metadata, else the limit of its kind (a short
        arithmetic problem needs seconds, not the class default). Override for tasks
        of another shape.

        Raises:
            ValueError: If the task's ``code_timeout_s`` is not a number above 0 and at
                most :data:`MAX_CODE_TIMEOUT_S`.
        """
        from mappa_env.tasks import task_code_timeout_s

        return task_code_timeout_s(getattr(self, "task", None), high=MAX_CODE_TIMEOUT_S)

    def copy_workspace(self, destination: Path) -> None:
        """Copy this episode's workspace to ``destination`` (links copied as links)."""
        shutil.copytree(self.workdir, destination, symlinks=True)

    def restore_workspace(self, source: Path) -> None:
        """Copy the files of ``source`` (a :meth:`copy_workspace`) into the workspace.

        They are handed over to the confined user, as files the agents' own code wrote.
        """
        shutil.copytree(source, self.workdir, symlinks=True, dirs_exist_ok=True)
        self._confinement.prepare_writable(self.workdir, contents=True)

    async def run_code(
        self, code: str, owner: str, timeout: float, output_chars: int
    ) -> tuple[ExecResult | None, str]:
        """Run ``code`` in ``owner``'s sandbox in the episode's workspace.

        Each owner (an agent, or one name for a whole episode) keeps its interpreter, and
        so its variables, until :meth:`release_sandbox` or the end of the episode. The
        sandbox is made off the event loop: a kernel start or pooled hand-out blocks.

        Returns:
            ``(result, rendered output)``; ``(None, note)`` when code execution is disabled.
        """
        if self._sandbox_factory is None:
            return None, "(code execution is disabled in this environment)"
        self._code_ran_now = True
        sandbox = self._sandboxes.get(owner)
        if sandbox is None:
            self.workdir.mkdir(parents=True, exist_ok=True)  # agent code may have removed it
            sandbox = await self._take_prestarted()
            if sandbox is None:
                try:
                    sandbox = await asyncio.to_thread(self._sandbox_factory, self.workdir)
                except Exception as exc:  # e.g. a closed pool: a tool failure, not a crash
                    logger.exception("making a sandbox failed")
                    error = ExecError("SandboxError", f"no sandbox could be made: {exc}")
                    result = ExecResult(error=error)
                    return result, result.render(output_chars)
            self._sandboxes[owner] = sandbox
        started_ns = time.time_ns()
        result = await sandbox.arun(code, timeout=timeout)
        if self.workspace_quota_bytes is not None and (
            result.error is None or result.error.name != QUOTA_ERROR
        ):
            result = await asyncio.to_thread(self._hold_quota, owner, result, started_ns)
        return result, result.render(output_chars)

    def _hold_quota(self, owner: str, result: ExecResult, started_ns: int) -> ExecResult:
        """``result``, or a quota error when the run left the workspace over its quota.

        The sandbox's own watch (the Jupyter sandbox's) stops code while it writes; this
        check after the run holds for any sandbox. Closing the owner's sandbox stops what
        its code left running before the files it wrote are deleted.
        """
        quota = self.workspace_quota_bytes
        assert quota is not None
        usage = workspace_usage(self.workdir)
        if not usage.over(quota):
            return result
        sandbox = self._sandboxes.pop(owner, None)
        if sandbox is not None:
            sandbox.close()
        removed, after = trim_workspace(self.workdir, quota, started_ns)
        logger.info("%s's code took the workspace over its quota (%s)", owner, usage.describe())
        return replace(result, error=quota_error(quota, usage, removed, after), restarted=True)

    @property
    def sandbox_confinement(self) -> Confinement:
        """How agents' code is confined: what the sandbox factory declares.

        For ``sandbox="jupyter"`` the confinement ``isolation`` resolved to; for a
        callable, its ``confinement`` attribute (see
        :func:`~mappa_env.sandbox.isolation.declared_confinement`), or none when it
        declares none; without code execution, that of the helper interpreters.
        """
        return self._agent_confinement

    @property
    def helper_confinement(self) -> Confinement:
        """How the interpreters the environment itself starts on agents' files are confined.

        For example DSBench's artifact inspector, which loads pickles agent code wrote.
        """
        return self._confinement

    def isolation_report(self) -> dict[str, Any]:
        """What isolation resolved to, for ``report.json``, configs and metrics.

        Returns:
            ``isolation`` (``"namespaces"`` or ``"none"``) and what the confinement
            enforces (:meth:`Confinement.describe
            <mappa_env.sandbox.isolation.Confinement.describe>`), with ``requested``
            (the ``isolation`` option), ``required`` (whether ``MAPPA_REQUIRE_ISOLATION``
            is set) and ``code_execution`` (whether agents' code runs at all).
        """
        return {
            **self.sandbox_confinement.describe(),
            "requested": self.isolation,
            "required": isolation_required(),
            "code_execution": self._sandbox_factory is not None,
        }

    def check_sandbox(self) -> None:
        """Run one trivial cell in a sandbox made as this environment makes them.

        Trainers and evaluation scripts call it before a run, so a sandbox that cannot
        work (no kernel starts) stops the run with its cause instead of turning every
        code action into a tool error. Does nothing when code execution is disabled.

        Raises:
            SandboxUnavailableError: With the cause and what to do.
        """
        if self._sandbox_factory is not None:
            check_sandbox(self._sandbox_factory)

    def _prestart(self) -> PrestartedSandbox | None:
        """A fresh workspace with a sandbox starting in it; None (logged) when that fails."""
        if self._sandbox_factory is None or self._closed:
            return None
        try:
            return PrestartedSandbox(self.env_id.lower(), self._confinement, self._sandbox_factory)
        except Exception:  # the first code run makes its sandbox then, and reports why
            logger.warning("making a sandbox ahead failed", exc_info=True)
            return None

    async def _take_prestarted(self) -> Sandbox | None:
        """The sandbox started ahead in this episode's workspace, once; else None."""
        spare, self._prestarted = self._prestarted, None
        if spare is None or spare.workdir != self._workdir:
            if spare is not None:
                await asyncio.to_thread(spare.close)
            return None
        sandbox = await spare.take()
        confinement = getattr(sandbox, "confinement", None)
        if isinstance(confinement, Confinement):
            # Files the environment put in the workspace after the kernel started (task
            # inputs) become the agents' to change, as a start at this point would make them.
            await asyncio.to_thread(confinement.prepare_writable, self.workdir, contents=True)
        return sandbox

    def _close_spare(self) -> None:
        """Stop the next episode's sandbox and remove its workspace."""
        spare, self._spare = self._spare, None
        if spare is not None:
            spare.close()

    def release_idle_resources(self, *, end_episode: bool = False) -> None:
        """Synchronous :meth:`arelease_idle_resources`."""
        self._sync.run(self.arelease_idle_resources(end_episode=end_episode))

    async def arelease_idle_resources(self, *, end_episode: bool = False) -> None:
        """Let go of what the environment holds for episodes not yet started.

        That is the sandbox started ahead for the next episode (a running kernel) and its
        workspace and, once the current episode is over, that episode's workspace (its
        files, and the uid its confined code ran as). An environment kept idle for long
        (between a trainer's evaluations) would otherwise hold them until its next reset:
        a trainer's runners keep their environments between runs, so a run with an
        evaluation set of 64 environments held up to 64 kernels from one evaluation to
        the next, and a sweep of runs in one process held that many per run. The
        :class:`~mappa_agents.runner.RolloutRunner` calls this on the environments it
        keeps when a run ends. The next :meth:`reset` starts a sandbox ahead again where
        the last episode ran code. Does nothing on a closed environment. Reading
        :attr:`workdir` afterwards makes a new, empty workspace.

        Args:
            end_episode: Also end an episode still in progress (its sandboxes closed, its
                workspace removed), as a runner does for an episode it stopped driving
                (a failed generation or step). Without it a live episode keeps its own
                sandboxes and workspace.
        """
        if self._closed:
            return
        if end_episode and self.agents:
            await self.on_episode_end()
        await asyncio.to_thread(self._release_idle, end_episode or not self.agents)

    def _release_idle(self, episode_over: bool) -> None:
        """Stop the next episode's sandbox started ahead and remove its workspace.

        With ``episode_over``, also remove the finished episode's workspace and free its uid.
        """
        self._close_spare()
        if episode_over:
            self._remove_workdir()

    async def release_sandbox(self, owner: str) -> None:
        """Close ``owner``'s sandbox, if it has one (off the event loop)."""
        sandbox = self._sandboxes.pop(owner, None)
        if sandbox is None:
            return
        try:
            await asyncio.to_thread(sandbox.close)
        except OSError:
            logger.warning("closing the sandbox of %s failed", owner, exc_info=True)

    def _remove_workdir(self) -> None:
        prestarted, self._prestarted = self._prestarted, None
        if prestarted is not None:
            prestarted.close()  # started for this episode, and no code ran
        if self._workdir is not None:
            # Agents' code may have left a tree shutil.rmtree cannot remove (it recurses).
            left = remove_tree(self._workdir)
            if left:
                logger.warning("could not remove %d entries of %s", len(left), self._workdir)
            self._workdir = None
        if self._workspace_lease is not None:
            # The episode's sandboxes are closed (on_episode_end runs first): its uid is free.
            self._workspace_lease.release()
            self._workspace_lease = None
