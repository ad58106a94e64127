"""Text helpers: middle truncation, reasoning removal, code-block extraction."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mappa_env.text import extract_code_blocks, strip_think, truncate_middle


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
