"""Test doubles shared by the environment tests: an in-process sandbox and scripted coaches."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import time
import traceback
from pathlib import Path
from typing import Any

from mappa_env.coach.base import CoachRequest, CoachVerdict
from mappa_env.sandbox.base import ExecError, ExecResult


class InProcessSandbox:
    """Runs code with ``exec`` in this process: fast, stateful, no isolation (tests only)."""

    instances: list[InProcessSandbox] = []  # noqa: RUF012 - tests inspect every sandbox made

    def __init__(self, workdir: Path) -> None:
        self._workdir = Path(workdir)
        self.namespace: dict[str, Any] = {}
        self.closed = False
        self.calls: list[str] = []
        InProcessSandbox.instances.append(self)

    @property
    def workdir(self) -> Path:
        return self._workdir

    def run(self, code: str, timeout: float | None = None) -> ExecResult:
        self.calls.append(code)
        out, err = io.StringIO(), io.StringIO()
        start = time.perf_counter()
        error = None
        previous = os.getcwd()
        os.chdir(self._workdir)  # run "in" the workspace, as a real sandbox does
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                exec(compile(code, "<cell>", "exec"), self.namespace)
            except Exception as exc:  # noqa: BLE001 - the code under test may raise anything
                error = ExecError(type(exc).__name__, str(exc), traceback.format_exc())
            finally:
                os.chdir(previous)
        return ExecResult(
            stdout=out.getvalue(),
            stderr=err.getvalue(),
            error=error,
            duration_s=time.perf_counter() - start,
        )

    async def arun(self, code: str, timeout: float | None = None) -> ExecResult:
        return self.run(code, timeout)

    def close(self) -> None:
        self.closed = True


#: Longest a :class:`FixedCoach` call waits for the others it is told to gather: far past
#: what scheduling takes on a loaded machine, so only calls that never overlap exhaust it.
GATHER_PATIENCE_S = 30.0


class FixedCoach:
    """Returns the same verdict for every action, after an optional delay.

    Async calls are counted while in flight (``most_in_flight``: the most at once). With
    ``gather``, each async call first waits until that many have been in flight at once
    (or :data:`GATHER_PATIENCE_S` passed, after which no call waits): a test of overlap
    then counts calls instead of timing them.
    """

    default_reveal = "last_agent"

    def __init__(self, score: float | None = 5.0, delay_s: float = 0.0, gather: int = 0) -> None:
        self._score = score
        self.delay_s = delay_s
        self.gather = gather
        self.in_flight = 0
        self.most_in_flight = 0
        self.requests: list[CoachRequest] = []

    @property
    def name(self) -> str:
        return "fixed"

    def score(self, request: CoachRequest) -> CoachVerdict:
        self.requests.append(request)
        if self._score is None:
            return CoachVerdict.invalid("scripted failure", coach=self.name)
        return CoachVerdict(score=self._score, valid=True, analysis="fixed", coach=self.name)

    async def ascore(self, request: CoachRequest) -> CoachVerdict:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + GATHER_PATIENCE_S
            while self.most_in_flight < self.gather:
                if loop.time() > deadline:
                    self.gather = 0  # the calls do not overlap: let the rest through
                    break
                await asyncio.sleep(0.005)
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        return self.score(request)


class RaisingCoach(FixedCoach):
    """A coach with a bug: raises on every call."""

    def score(self, request: CoachRequest) -> CoachVerdict:
        raise RuntimeError("coach bug")


def csv_task(folder: Path, task_id: str, files: dict[str, str]) -> Any:
    """A DSBench classification task (target ``label``, id ``id``) from CSV texts.

    ``files`` maps ``train``, ``test`` and ``answers`` to the text of each file, which is
    written to ``folder/<name>.csv``.
    """
    from mappa_env.dsbench.tasks import DSBenchTask

    for name, text in files.items():
        (folder / f"{name}.csv").write_text(text)
    return DSBenchTask(
        id=task_id,
        description="Predict label.",
        metric="accuracy",
        task_type="classification",
        id_column="id",
        target_columns=("label",),
        train_path=folder / "train.csv",
        test_path=folder / "test.csv",
        sample_submission_path=None,
        answers_path=folder / "answers.csv",
        metadata={},
    )
