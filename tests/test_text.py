"""Text helpers: middle truncation, reasoning removal, code-block extraction."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mappa_env.grading.math import extract_boxed
from mappa_env.text import extract_code_blocks, fenced_blocks, strip_think, truncate_middle


def test_truncate_middle_keeps_head_and_tail():
    text = "HEAD" + "x" * 10_000 + "Traceback: ZeroDivisionError"
    cut = truncate_middle(text, 200)
    assert len(cut) <= 200
    assert cut.startswith("HEAD")
    assert cut.endswith("Traceback: ZeroDivisionError")
    assert "characters cut" in cut
    assert truncate_middle("short", 200) == "short"
    assert truncate_middle("abcdef", 3) == "def"  # tiny limits keep the tail


@given(st.text(), st.integers(min_value=0, max_value=500))
def test_truncate_middle_never_exceeds_the_limit(text, limit):
    assert len(truncate_middle(text, limit)) <= max(limit, 0)


def test_strip_think_variants():
    assert strip_think("a<think>hidden</think>b") == "ab"
    assert strip_think("plan</think>answer") == "answer"  # template-opened block
    assert strip_think("answer <think>unfinished") == "answer "
    assert strip_think("x</THINK>y") == "y"
    # Lower-casing "İ" changes the length: the cut must use the original text.
    assert strip_think("İİİİ</think>answer") == "answer"


def test_extract_code_blocks():
    text = (
        "Intro\n```python\nprint(1)\n```\nmore\n```\nx = 2\n```\n```bash\nls\n```\n"
        "<think>```python\nhidden()\n```</think> Inline: ```py\nprint(3)"
    )
    assert extract_code_blocks(text) == ["print(1)\n", "x = 2\n", "print(3)\n"]
    assert extract_code_blocks("no code") == []
    assert extract_code_blocks("```python\n\n```") == []


# The former regular expressions: the reference for small texts, where their backtracking
# (cubic on a run of backticks, quadratic on unclosed <think> tags) does not matter.
_FORMER_FENCE = re.compile(
    r"(?P<fence>`{3,})[ \t]*(?P<lang>[\w+-]*)[^\n]*\n"
    r"(?P<body>.*?)"
    r"(?:^[ \t]*(?P=fence)(?!`)[^\n]*$|\Z)",
    re.DOTALL | re.MULTILINE,
)
_FORMER_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FORMER_UNCLOSED_THINK = re.compile(r"<think>.*\Z", re.DOTALL | re.IGNORECASE)

_PIECES = st.sampled_from(
    ["`", "```", "````", "```python", "```py ", "```bash", "\n", " ", "\t", "x", "print(1)",
     "<think>", "</think>", "<THINK>", "é", "İ", "+-"]
)  # fmt: skip
_TEXTS = st.lists(_PIECES, max_size=40).map("".join)


@given(_TEXTS)
def test_fenced_blocks_agree_with_the_former_expression(text):
    former = [(m.group("lang"), m.group("body")) for m in _FORMER_FENCE.finditer(text)]
    assert fenced_blocks(text) == former


@given(_TEXTS)
def test_strip_think_agrees_with_the_former_expressions(text):
    closes = list(re.finditer("</think>", text, re.IGNORECASE))
    former = text
    if closes and not re.search("<think>", text, re.IGNORECASE):
        former = former[closes[-1].end() :]
    former = _FORMER_UNCLOSED_THINK.sub("", _FORMER_THINK_BLOCK.sub("", former))
    assert strip_think(text) == former


@pytest.mark.parametrize(
    "piece", ["`", "``", "```", "```\n", "\n", "\r\n", "<think>", "</think>", "<think>`"]
)
def test_reading_a_hostile_action_takes_linear_time(piece):
    # 8,000 backticks took 118 s through the former fence expression, 32,768 newlines 4.5 s
    # through the answer-line one; a whole action of any piece now reads in about 10 ms.
    # The CPU time of this thread counts the readers' work: other processes on the cores
    # do not add to it, so the bound holds on a loaded machine and still fails the old
    # readers by far.
    text = (piece * (32_768 // len(piece) + 1))[:32_768]
    start = time.thread_time()
    extract_code_blocks(text)
    strip_think(text)
    extract_boxed(text, fallback=True)
    assert time.thread_time() - start < 1.0
