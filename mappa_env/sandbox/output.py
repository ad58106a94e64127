"""What a call's text becomes: bounded, without terminal codes, encodable as UTF-8.

:class:`BoundedText` collects a stream keeping its head and tail within a limit;
:func:`strip_ansi` and :func:`utf8_safe` clean what the kernel sent, and
:func:`unencodable_code_error` refuses code that cannot be sent to it. Used by
:mod:`mappa_env.sandbox.calls` and :mod:`mappa_env.sandbox.jupyter`.
"""

from __future__ import annotations

import re

from mappa_env.sandbox.base import ExecError
from mappa_env.text import truncate_middle

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
#: Surrogate code points: the only ones a ``str`` may hold that UTF-8 cannot encode.
_SURROGATE = re.compile("[\ud800-\udfff]")


def strip_ansi(text: str) -> str:
    """Remove terminal colour/cursor escape sequences from ``text``."""
    return _ANSI_ESCAPE.sub("", text)


def utf8_safe(text: str) -> str:
    """Return ``text`` with lone surrogates replaced by U+FFFD, so it encodes as UTF-8.

    A result that cannot be encoded would break whoever stores or sends it on (a JSON
    file, a model API request). Surrogate pairs are joined into the character they
    stand for; only unpaired halves are replaced.
    """
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def unencodable_code_error(code: str) -> ExecError | None:
    """Describe why ``code`` cannot be sent to the kernel, or None when it can.

    Messages to the kernel are UTF-8; a lone surrogate (say, half of an emoji left by a
    JSON escape cut in the middle) cannot be encoded, so such code is refused unrun.

    Args:
        code: The code a caller wants to run.

    Returns:
        A ``UnicodeEncodeError`` naming the first offending character and where it is.
    """
    first = _SURROGATE.search(code)
    if first is None:
        return None
    count = len(_SURROGATE.findall(code))
    offset = first.start()
    line = code.count("\n", 0, offset) + 1
    column = offset - (code.rfind("\n", 0, offset) + 1) + 1
    # The message names the character by its code point: the character itself would
    # make this result as unencodable as the code.
    return ExecError(
        "UnicodeEncodeError",
        f"the code was not run: it contains {count} character(s) that cannot be encoded "
        f"as UTF-8 (lone surrogates, such as half of an emoji); the first is "
        f"U+{ord(first.group()):04X} at line {line}, column {column}. Remove or replace "
        "them and run the code again",
    )


class BoundedText:
    """Collects streamed text keeping the head and a rolling tail of at most ``limit`` each.

    Memory stays bounded however much is appended, so ``while True: print(...)`` cannot
    exhaust this process; :meth:`text` then cuts to ``limit`` from the middle.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._head = ""
        self._tail: list[str] = []
        self._tail_chars = 0
        self.total_chars = 0

    def append(self, text: str) -> None:
        """Add ``text`` to what was collected (only its head and tail are kept)."""
        if not text:
            return
        self.total_chars += len(text)
        if len(self._head) < self._limit:
            room = self._limit - len(self._head)
            self._head += text[:room]
            text = text[room:]
            if not text:
                return
        self._tail.append(text)
        self._tail_chars += len(text)
        if self._tail_chars > 2 * self._limit:
            kept = "".join(self._tail)[-self._limit :]
            self._tail = [kept]
            self._tail_chars = len(kept)

    def text(self) -> tuple[str, bool]:
        """Return the collected text, cut to the limit, and whether it was cut."""
        full = self._head + "".join(self._tail)
        if self.total_chars <= self._limit:
            return full, False
        marker = f"\n...[output cut from the middle: {self.total_chars} characters in all]...\n"
        return truncate_middle(full, self._limit, marker=marker), True


def utf8_safe_error(error: ExecError | None) -> ExecError | None:
    """``error`` with every text field made encodable (see :func:`utf8_safe`)."""
    if error is None:
        return None
    fields = (error.name, error.value, error.traceback)
    safe = tuple(utf8_safe(text) for text in fields)
    return error if safe == fields else ExecError(*safe)
