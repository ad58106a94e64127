"""One call: send the code to the kernel and collect what it reports until it is idle.

:func:`execute` sends one execute request and folds the kernel's messages into a
:class:`CallOutcome` (its output as :class:`~mappa_env.sandbox.output.BoundedText`, its
error, whether it timed out, died, went over a limit or lost output); what the sandbox
then does about it (restart, trim the workspace) is :mod:`mappa_env.sandbox.jupyter`'s.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from queue import Empty
from typing import TYPE_CHECKING, Any

from mappa_env.sandbox import _process
from mappa_env.sandbox._kernel import Kernel, wait_until_ready
from mappa_env.sandbox.base import ExecError
from mappa_env.sandbox.errors import SandboxError
from mappa_env.sandbox.limits import SandboxLimits
from mappa_env.sandbox.output import BoundedText, strip_ansi
from mappa_env.sandbox.quota import QUOTA_ERROR, WorkspaceUsage, workspace_usage
from mappa_env.sandbox.resources import limit_error
from mappa_env.text import truncate_middle

if TYPE_CHECKING:
    from mappa_env.sandbox.resources import SandboxResources

logger = logging.getLogger(__name__)

#: Wait this long after ``idle`` for the shell reply before giving up on it.
_REPLY_WAIT_S = 1.0
#: After the shell reply, wait this long for iopub's ``idle`` before deciding it was lost.
_IOPUB_AFTER_REPLY_S = 0.5
_MAX_TRACEBACK_CHARS = 20_000


@dataclass
class CallOutcome:
    """What the kernel reported for one execute request, before restart handling."""

    stdout: BoundedText
    stderr: BoundedText
    error: ExecError | None = None
    timed_out: bool = False
    interrupted_traceback: str = ""
    kill_reason: str | None = None  # set when the kernel must be killed and restarted
    kill_error: ExecError | None = None
    asked_exit: bool = False
    died: bool = False
    output_lost: bool = False
    closed: bool = False
    oom_kills_before: int = 0  # the cgroup's count when the call began
    over_quota: WorkspaceUsage | None = None  # the usage that broke the workspace quota


def execute(
    kernel: Kernel,
    code: str,
    timeout: float,
    *,
    limits: SandboxLimits,
    workdir: Path,
    res: SandboxResources,
    silent: bool = False,
) -> CallOutcome:
    """Send one execute request and collect its output until the kernel is idle.

    The ``idle`` status on iopub normally ends the call. Iopub may lose messages, so
    the shell reply also ends it when ``idle`` has not followed shortly; and when a
    connection drops (a message above ``max_message_bytes``), the client reconnects
    and the call ends once the kernel answers again.
    """
    outcome = CallOutcome(
        BoundedText(limits.max_output_chars), BoundedText(limits.max_output_chars)
    )
    if kernel.cgroup is not None:
        outcome.oom_kills_before = kernel.cgroup.oom_kills()
    msg_id = send_code(kernel, code, silent)
    if msg_id is None:
        outcome.kill_reason = "the code could not be sent to it"
        outcome.kill_error = ExecError(
            "SandboxError",
            "the code could not be sent to the Python process, which was restarted; "
            "earlier variables are gone and the code did not run",
        )
        return outcome
    shell, iopub = kernel.client.shell_channel, kernel.client.iopub_channel
    deadline = time.monotonic() + timeout
    give_up_at: float | None = None  # set once interrupted
    next_check = time.monotonic() + limits.watch_interval_s
    next_quota_check = time.monotonic() + limits.workspace_watch_interval_s
    reply: dict[str, Any] | None = None
    reply_seen_at = 0.0
    reconnect = False
    while True:
        now = time.monotonic()
        if give_up_at is None and now >= deadline:
            outcome.timed_out = True
            _process.interrupt_group(kernel.process)
            give_up_at = now + limits.interrupt_grace_s
        elif give_up_at is not None and now >= give_up_at:
            outcome.kill_reason = "it did not stop after an interrupt"
            break
        if now >= next_check:
            next_check = now + limits.watch_interval_s
            if res.closed:
                outcome.closed = True
                return outcome
            if not kernel.alive():
                outcome.died = True
                break
            over = limit_error(kernel, limits)
            if over is not None:
                outcome.kill_reason, outcome.kill_error = "process limit", over
                break
            if limits.workspace_bytes is not None and now >= next_quota_check:
                usage = workspace_usage(workdir)
                # A big workspace takes long to measure: measure it less often, so
                # the watch costs the call at most about a tenth of its time.
                spent = time.monotonic() - now
                next_quota_check = now + max(limits.workspace_watch_interval_s, 10 * spent)
                if usage.over(limits.workspace_bytes):
                    outcome.over_quota = usage
                    outcome.kill_reason = "workspace quota"
                    outcome.kill_error = ExecError(QUOTA_ERROR, "")
                    break
            if kernel.connection_lost():
                outcome.output_lost = reconnect = True
                break
            if reply is None:
                reply = matching_reply(shell, msg_id)
                reply_seen_at = now
            elif now - reply_seen_at > _IOPUB_AFTER_REPLY_S:
                outcome.output_lost = True
                break
        wait = min(next_check, give_up_at or deadline) - now
        try:
            message = iopub.get_msg(timeout=max(wait, 0.001))
        except Empty:
            continue
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        if handle_iopub(message, outcome):
            break

    if outcome.output_lost and not outcome.kill_reason:
        resync(kernel, outcome, deadline, limits, reconnect=reconnect)
    if outcome.timed_out:
        stopped = outcome.kill_reason is None
        outcome.error = ExecError(
            "TimeoutError",
            f"the code ran longer than {timeout:g} s and was interrupted"
            + ("" if stopped else "; it did not stop, so the Python process was restarted"),
            outcome.interrupted_traceback,
        )
        if not stopped:
            outcome.kill_error = outcome.error
    if outcome.kill_reason is None and not outcome.died:
        if reply is None and not reconnect:
            reply = wait_reply(kernel.client.shell_channel, msg_id, _REPLY_WAIT_S)
        if reply is not None:
            apply_reply(reply, outcome)
        if outcome.asked_exit:
            # ``exit()`` in IPython stops the kernel shortly after the reply.
            outcome.died = kernel.wait_exit(timeout=5)
            outcome.kill_reason = None if outcome.died else "exit requested"
    if outcome.output_lost:
        outcome.stderr.append(
            ("\n" if outcome.stderr.total_chars else "")
            + "[sandbox] some output of this call was lost: a single output larger "
            f"than {limits.max_message_bytes} bytes is dropped\n"
        )
    return outcome


def send_code(kernel: Kernel, code: str, silent: bool) -> str | None:
    """Send an execute request, reconnecting once if the shell connection is gone."""
    import zmq

    for attempt in range(2):
        try:
            if attempt:
                kernel.connect()
            drain(kernel.client.shell_channel)
            kernel.connection_lost()  # forget events from before this call
            return kernel.client.execute(
                code,
                silent=silent,
                store_history=False,
                allow_stdin=False,
                stop_on_error=False,
            )
        except zmq.ZMQError as exc:
            logger.debug("kernel pid %d: sending failed (%s)", kernel.pid, exc)
    return None


def resync(
    kernel: Kernel,
    outcome: CallOutcome,
    deadline: float,
    limits: SandboxLimits,
    *,
    reconnect: bool,
) -> None:
    """After lost messages, wait until the kernel answers on fresh, live channels.

    The kernel answers ``kernel_info`` only once the code has finished, so this
    also waits for the end of the call (interrupting it at ``deadline``).
    """
    import zmq

    try:
        if reconnect:
            kernel.connect()
        wait_until_ready(kernel, max(deadline, time.monotonic() + 1.0))
        return
    except zmq.ZMQError as exc:
        outcome.kill_reason = f"its connection could not be rebuilt ({exc})"
        return
    except SandboxError:
        if not kernel.alive():
            outcome.died = True
            return
    outcome.timed_out = True
    _process.interrupt_group(kernel.process)
    try:
        wait_until_ready(kernel, time.monotonic() + limits.interrupt_grace_s)
    except SandboxError:
        if kernel.alive():
            outcome.kill_reason = "it did not stop after an interrupt"
        else:
            outcome.died = True


def handle_iopub(message: dict[str, Any], outcome: CallOutcome) -> bool:
    """Fold one iopub message into ``outcome``; return True when the request is done."""
    kind = message["msg_type"]
    content = message["content"]
    if kind == "stream":
        target = outcome.stderr if content.get("name") == "stderr" else outcome.stdout
        target.append(content.get("text", ""))
    elif kind in ("execute_result", "display_data"):
        text = content.get("data", {}).get("text/plain")
        if text:
            outcome.stdout.append(text if text.endswith("\n") else text + "\n")
    elif kind == "error":
        traceback = strip_ansi("\n".join(content.get("traceback", [])))
        name = content.get("ename", "Error")
        value = strip_ansi(content.get("evalue", ""))
        if outcome.timed_out and name == "KeyboardInterrupt":
            outcome.interrupted_traceback = traceback
        else:
            outcome.error = ExecError(name, value, truncate_middle(traceback, _MAX_TRACEBACK_CHARS))
    elif kind == "status":
        return content.get("execution_state") == "idle"
    return False


def matching_reply(shell: Any, msg_id: str) -> dict[str, Any] | None:
    """The shell reply to ``msg_id`` if it has arrived (others are discarded), else None."""
    while shell.msg_ready():
        reply = shell.get_msg(timeout=0)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply
    return None


def wait_reply(shell: Any, msg_id: str, timeout: float) -> dict[str, Any] | None:
    """Wait up to ``timeout`` seconds for the shell reply to ``msg_id``."""
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            reply = shell.get_msg(timeout=remaining)
        except Empty:
            return None
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply
    return None


def apply_reply(reply: dict[str, Any], outcome: CallOutcome) -> None:
    """Take from the execute reply what iopub may have missed: the error, an exit request."""
    content = reply.get("content", {})
    if content.get("status") == "error" and outcome.error is None and not outcome.timed_out:
        traceback = strip_ansi("\n".join(content.get("traceback", [])))
        outcome.error = ExecError(
            content.get("ename", "Error"),
            strip_ansi(content.get("evalue", "")),
            truncate_middle(traceback, _MAX_TRACEBACK_CHARS),
        )
    outcome.asked_exit = any(
        p.get("source") == "ask_exit" and not p.get("keepkernel")
        for p in content.get("payload", [])
    )


def drain(channel: Any) -> None:
    """Discard the messages waiting on ``channel``."""
    while channel.msg_ready():
        channel.get_msg(timeout=0)
