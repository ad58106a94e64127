"""Small text helpers shared by sandboxes, environments and coaches."""

from __future__ import annotations

import ast
import functools
import re

# Every function here reads agent text (up to an action's 32,768 characters, or more of
# tool output) and runs inside an environment step: each runs in linear time. Patterns
# that let the regex engine retry a lazy or nested repetition from every start position
# (``<think>.*?</think>``, a fence with a back-reference) are replaced by scans.
_OPEN_THINK = re.compile(r"<think>", re.IGNORECASE)
_CLOSE_THINK = re.compile(r"</think>", re.IGNORECASE)


def truncate_middle(
    text: str, max_chars: int, marker: str = "\n...[{n} characters cut]...\n"
) -> str:
    """Shorten ``text`` to about ``max_chars`` by cutting from the middle.

    The head and the tail are both kept, so a traceback at the end of long output
    survives (the reference implementation cut the tail and lost it).

    Args:
        text: Text to shorten.
        max_chars: Largest length of the result, marker included. Values below 64
            keep only the tail.
        marker: Inserted where text was cut; ``{n}`` is replaced by the number of
            characters removed.

    Returns:
        ``text`` unchanged when it fits, otherwise head + marker + tail.
    """
    if max_chars < 0:
        raise ValueError(f"max_chars must be >= 0, got {max_chars}")
    if len(text) <= max_chars:
        return text
    if max_chars < 64:
        return text[len(text) - max_chars :] if max_chars else ""
    # Size the marker for the largest possible count so the result never overshoots.
    keep = max(max_chars - len(marker.format(n=len(text))), 0)
    note = marker.format(n=len(text) - keep)
    # The tail holds tracebacks and final answers: give it the larger share.
    head = keep // 3
    tail = keep - head
    return text[:head] + note + text[len(text) - tail :]


def strip_think(text: str) -> str:
    """Remove reasoning blocks (``<think>...</think>``) from a model's output.

    An unclosed ``<think>`` hides everything after it; text before a stray
    ``</think>`` (reasoning models whose template opens the block) is dropped too.

    Args:
        text: Raw model output.

    Returns:
        The visible answer part.
    """
    closes = list(_CLOSE_THINK.finditer(text))
    if closes and not _OPEN_THINK.search(text):
        # Search the original text: lower-casing can change its length ("İ" -> "i̇").
        text = text[closes[-1].end() :]
    text = _without_think_blocks(text)
    opened = _OPEN_THINK.search(text)  # an unclosed block hides the rest
    return text if opened is None else text[: opened.start()]


def _without_think_blocks(text: str) -> str:
    """``text`` without each ``<think>`` and the first ``</think>`` after it, in one pass.

    What ``re.sub(r"<think>.*?</think>", "", text, flags=DOTALL | IGNORECASE)`` gives,
    without its quadratic time on many opening tags that are never closed.
    """
    closes = [(m.start(), m.end()) for m in _CLOSE_THINK.finditer(text)]
    if not closes:
        return text
    kept: list[str] = []
    position = 0  # where the text not yet copied starts
    next_close = 0
    for opening in _OPEN_THINK.finditer(text):
        if opening.start() < position:
            continue  # inside a block already removed
        while next_close < len(closes) and closes[next_close][0] < opening.end():
            next_close += 1
        if next_close == len(closes):
            break  # no block closes after this one: it stays (and hides the rest)
        kept.append(text[position : opening.start()])
        position = closes[next_close][1]
    kept.append(text[position:])
    return "".join(kept)


# An opening fence of three or more backticks with an optional language tag, anywhere on a
# line (models write "Here: ```python"). The block runs to a closing fence at the start of a
# line, or to the end of the text (models often forget to close it).
_OPEN_FENCE = re.compile(r"`{3,}")
_LANGUAGE = re.compile(r"[ \t]*([\w+-]*)")
_PYTHON_TAGS = frozenset({"", "python", "py", "python3", "ipython", "ipython3"})


@functools.lru_cache(maxsize=64)
def _closing_fence(fence: str) -> re.Pattern[str]:
    """A line that starts (after spaces or tabs) with exactly ``fence``."""
    return re.compile(r"^[ \t]*" + fence + r"(?!`)", re.MULTILINE)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language tag, body)`` of every fenced block of ``text``, in order.

    The rule: an opening fence is a run of three or more backticks anywhere on a line,
    followed by an optional language tag and the rest of that line; its body runs to
    the first later line that starts (after spaces or tabs) with a run of exactly as
    many backticks, or to the end of the text. The next block is searched after that
    closing line. An opening fence on the text's last line (no line after it) opens
    nothing. Linear time: each character is looked at a bounded number of times.

    Args:
        text: Any text (reasoning blocks are not removed here).

    Returns:
        The blocks; bodies keep their final newline, empty bodies included.
    """
    blocks = []
    position = 0
    while (opening := _OPEN_FENCE.search(text, position)) is not None:
        line_end = text.find("\n", opening.end())
        if line_end < 0:
            break  # the opening line never ends: no body, and no later fence has one
        language = _LANGUAGE.match(text, opening.end(), line_end)
        tag = language.group(1) if language else ""
        body_start = line_end + 1
        closing = _closing_fence(opening.group()).search(text, body_start)
        if closing is None:
            blocks.append((tag, text[body_start:]))
            break
        blocks.append((tag, text[body_start : closing.start()]))
        closing_end = text.find("\n", closing.end())
        position = len(text) if closing_end < 0 else closing_end
    return blocks


def extract_code_blocks(text: str, languages: frozenset[str] = _PYTHON_TAGS) -> list[str]:
    """Fenced code blocks of ``text`` outside reasoning, in order of appearance.

    A block is kept when its language tag (lower-cased) is in ``languages``; by default
    Python tags and untagged blocks. An unclosed final block runs to the end of the text
    (see :func:`fenced_blocks` for the rule).

    Args:
        text: A model's output.
        languages: Language tags to keep.

    Returns:
        The code of each block, without the fences; empty blocks are dropped.
    """
    blocks = []
    for tag, body in fenced_blocks(strip_think(text)):
        if tag.lower() in languages and body.strip():
            blocks.append(body.rstrip("\n") + "\n")
    return blocks


def ipython_as_python(code: str) -> str:
    """``code`` as plain Python for ``ast``: IPython's own lines rewritten or left out.

    A line magic keeps the statement it runs (``%time print(1)`` is ``print(1)``) when
    that parses; other magics, cell-magic headers (``%%time``) and shell lines
    (``!pip install x``) become blank lines.
    """
    lines = []
    for line in code.splitlines():
        stripped = line.lstrip()
        kept = ""
        if stripped.startswith("%") and not stripped.startswith("%%"):
            statement = stripped.partition(" ")[2].strip()
            try:
                ast.parse(statement)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                statement = ""
            kept = line[: len(line) - len(stripped)] + statement if statement else ""
        elif not stripped.startswith(("%%", "!")):
            kept = line
        lines.append(kept)
    return "\n".join(lines)
