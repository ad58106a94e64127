"""Small text helpers shared by sandboxes, environments and coaches."""

from __future__ import annotations

import ast
import re

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_UNCLOSED_THINK = re.compile(r"<think>.*\Z", re.DOTALL | re.IGNORECASE)
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
    text = _THINK_BLOCK.sub("", text)
    return _UNCLOSED_THINK.sub("", text)


# An opening fence of three or more backticks with an optional language tag, anywhere on a
# line (models write "Here: ```python"). The block runs to a closing fence at the start of a
# line, or to the end of the text (models often forget to close it).
_FENCE = re.compile(
    r"(?P<fence>`{3,})[ \t]*(?P<lang>[\w+-]*)[^\n]*\n"
    r"(?P<body>.*?)"
    r"(?:^[ \t]*(?P=fence)(?!`)[^\n]*$|\Z)",
    re.DOTALL | re.MULTILINE,
)
_PYTHON_TAGS = frozenset({"", "python", "py", "python3", "ipython", "ipython3"})


def extract_code_blocks(text: str, languages: frozenset[str] = _PYTHON_TAGS) -> list[str]:
    """Fenced code blocks of ``text`` outside reasoning, in order of appearance.

    A block is kept when its language tag (lower-cased) is in ``languages``; by default
    Python tags and untagged blocks. An unclosed final block runs to the end of the text.

    Args:
        text: A model's output.
        languages: Language tags to keep.

    Returns:
        The code of each block, without the fences; empty blocks are dropped.
    """
    blocks = []
    for match in _FENCE.finditer(strip_think(text)):
        if match.group("lang").lower() in languages:
            body = match.group("body")
            if body.strip():
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
