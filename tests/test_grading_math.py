"""Tests for math answer extraction and equivalence (mappa_env.grading.math)."""

from __future__ import annotations

import asyncio
import threading
import time

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mappa_env.envs.mathchat.symbolic import _Worker
from mappa_env.grading import (
    SymbolicChecker,
    answers_match,
    answers_match_any,
    answers_match_async,
    boxed_answers,
    extract_boxed,
)

# --------------------------------------------------------------------------------------
# extract_boxed
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{42}.", "42"),
        (r"first \boxed{2} then \boxed{2}", "2"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\frac{\sqrt{3}}{\left(2\right)}}", r"\frac{\sqrt{3}}{\left(2\right)}"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\fbox{7}", "7"),
        (r"\boxed {12}", "12"),
        (r"the answer is $\boxed 5$.", "5"),
        (r"\boxed{\boxed{9}}", "9"),
        (r"\boxed{3} and later an empty \boxed{}", "3"),
        (r"\boxed{8} then an unclosed \boxed{9", "8"),
        (r"<think>maybe \boxed{1}</think> final: \boxed{2}", "2"),
        ("The final answer is $\\frac{3}{4}$. Done.", r"\frac{3}{4}"),
        ("Thus the final answer is 17.\nAnswer: 18", "17"),
        ("Some work\n**Answer:** 204", "204"),
        ("Answer: $x = 3$", "x = 3"),
        ("so the answer is 1,000.", "1,000"),
        ("I think the answer is 5, and the final answer is 6", "6"),
        ("Final Answer: 3.5 and that is it", "3.5 and that is it"),
        (r"final answer is \boxed{11}", "11"),
    ],
)
def test_extract_boxed_finds_the_final_answer(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "no answer here",
        r"\boxed{}",
        r"\boxed{\boxed{}}",
        r"\boxed{unclosed",
        "<think>\\boxed{5}</think>",
        "<think>still thinking \\boxed{5}",
        None,
        123,
    ],
)
def test_extract_boxed_returns_none_without_an_answer(text):
    assert extract_boxed(text) is None


@pytest.mark.parametrize(
    "text",
    [
        r"\boxed{42} \boxed{6534}",
        r"first \boxed{1} then \boxed{2}",
        r"\boxed{6534} or maybe \boxed{6535}. The final answer is 6534.",
        r"\boxed{\frac{1}{2}} \boxed{0.25}",
        r"\boxed{6534} \boxed{x = 6533}",
    ],
)
def test_several_different_boxed_answers_are_no_answer(text):
    # Taking the last box would let a hedge ("\boxed{42} \boxed{6534}") pass.
    assert extract_boxed(text) is None
    assert extract_boxed(text, fallback=False) is None
    assert len(boxed_answers(text)) == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{6534} so again \boxed{6534}", "6534"),
        (r"\boxed{6,534} so \boxed{6534}", "6534"),
        (r"\boxed{x = 6534}, i.e. \boxed{6534.0}", "6534.0"),
        (r"\boxed{\frac{1}{2}} = \boxed{0.5}", "0.5"),
        (r"\boxed{\dfrac{1}{2}} or \boxed{\frac12}", r"\frac12"),
        (r"\boxed{5 \text{ cm}} and \boxed{5}", "5"),
        (r"\boxed{\sqrt{2}} \boxed{\sqrt{2}}", r"\sqrt{2}"),
    ],
)
def test_boxes_holding_equal_answers_are_one_answer(text, expected):
    assert extract_boxed(text) == expected
    assert boxed_answers(text) == [expected]


def test_boxed_answers_lists_each_different_answer_once():
    text = r"\boxed{42} \boxed{6534} \boxed{42.0} <think>\boxed{7}</think>"
    assert boxed_answers(text) == ["42.0", "6534"]
    assert boxed_answers(r"\boxed{}") == []
    assert boxed_answers(None) == []


def test_a_trusted_solution_can_take_its_last_box():
    text = r"first \boxed{1} then \boxed{2}"
    assert extract_boxed(text, last_box_wins=True) == "2"
    assert extract_boxed(r"\boxed{NUMBER} then \boxed{3}", last_box_wins=True) == "3"


@pytest.mark.parametrize(
    "text",
    [
        r"The final answer is \boxed{NUMBER}",
        r"\boxed{answer}",
        r"\boxed{\text{your answer}}",
        r"\boxed{ANSWER_HERE}",
        r"\boxed{...}",
        r"\boxed{<number>}",
        r"The final answer is \boxed{}",
    ],
)
def test_a_placeholder_box_is_no_answer(text):
    assert extract_boxed(text) is None


def test_a_placeholder_box_does_not_hide_a_real_one():
    assert extract_boxed(r"Format: \boxed{NUMBER}. Here: \boxed{42}") == "42"
    assert extract_boxed(r"\boxed{NUMBER}. The answer is 42.") == "42"


def test_many_boxes_are_read_fast():
    different = " ".join(rf"\boxed{{{i}}}" for i in range(20_000))
    same = " ".join([r"\boxed{6,534}", r"\boxed{6534}"] * 10_000)
    start = time.thread_time()
    assert extract_boxed(different) is None
    assert extract_boxed(same) == "6534"
    # 0.5 s of this thread's CPU time: the bound is for a reader whose work grows with the
    # square of the boxes. CPU time, not wall time, so other processes on the cores do not
    # count against it.
    assert time.thread_time() - start < 10.0


def test_extract_boxed_fallbacks_can_be_disabled():
    assert extract_boxed("The final answer is 7.") == "7"
    assert extract_boxed("The final answer is 7.", fallback=False) is None
    assert extract_boxed(r"Answer: 3 but \boxed{4}", fallback=False) == "4"


def test_extract_boxed_box_wins_over_phrases():
    assert extract_boxed("\\boxed{4}\nThe final answer is 7") == "4"


def test_extract_boxed_handles_deep_nesting_and_long_text_fast():
    deep = r"\boxed{" + "{" * 5000 + "x" + "}" * 5000 + "}"
    assert extract_boxed(deep) == "{" * 5000 + "x" + "}" * 5000
    long_text = "word " * 200_000 + r"\boxed{5}"
    start = time.thread_time()
    assert extract_boxed(long_text) == "5"
    assert time.thread_time() - start < 2.0  # about 0.01 s of this thread's CPU time


# --------------------------------------------------------------------------------------
# answers_match: a table of cases
# --------------------------------------------------------------------------------------

MATCH_CASES = [
    # integers, AIME zero padding, AMC floats
    ("23", "023", True),
    ("023", "23", True),
    ("18", 18.0, True),
    ("18.0", "18", True),
    ("-4", "-4.0", True),
    ("0", "000", True),
    ("1,000", "1000", True),
    ("1{,}000", "1000", True),
    ("12\\,345", "12345", True),
    # fractions and decimals
    ("3/4", "\\frac{3}{4}", True),
    ("\\dfrac{3}{4}", "0.75", True),
    ("\\tfrac34", "3/4", True),
    ("-\\frac{1}{2}", "-0.5", True),
    ("\\frac{-1}{2}", "-1/2", True),
    ("0.333333", "\\frac{1}{3}", True),
    ("0.33", "\\frac{1}{3}", False),
    # LaTeX forms (symbolic path)
    ("\\sqrt{2}", "\\sqrt 2", True),
    ("2\\sqrt{2}", "\\sqrt{8}", True),
    ("\\pi", "\\pi", True),
    ("2\\pi", "\\pi \\cdot 2", True),
    ("2^{10}", "2^{10}", True),
    ("3 \\times \\sqrt{2}", "3\\sqrt{2}", True),
    ("\\left( 1, 2 \\right)", "(1,2)", True),
    ("(1, 2)", "(2, 1)", False),
    ("[1, 2)", "[1, 2]", False),
    ("\\{1, 2\\}", "\\{2, 1\\}", True),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}", True),
    # percentages: a predicted "%" stands for the number shown; a truth's "%" for that
    # number or its hundredth. Both at once would let "4200%" cover 42 and 4200.
    ("50\\%", "50", True),
    ("50%", "0.5", False),
    ("4200\\%", "42", False),
    ("4200\\%", "4200", True),
    ("0.5", "50\\%", True),
    ("50", "50\\%", True),
    ("0.5\\%", "50\\%", False),
    ("50\\%", "50\\%", True),
    ("50", "0.5", False),
    # text, units, wrappers
    ("5\\text{ cm}", "5", True),
    ("5 \\mbox{cm}^2", "5", True),
    ("12 inches", "12", True),
    ("336^\\circ", "336", True),
    ("336", "336^{\\circ}", True),
    ("\\$42", "42", True),
    ("$42$", "42", True),
    ("\\(42\\)", "42", True),
    ("x = 5", "5", True),
    ("m+n=23", "23", True),
    ("91 * 64 - 317 = 5507", "5507", True),
    ("\\boxed{23}", "23", True),
    ("\\text{yes}", "yes", True),
    ("42.", "42", True),
    # tricky negatives
    ("23", "230", False),
    ("230", "23", False),
    ("1/2", "2", False),
    ("2", "1/2", False),
    ("-5", "5", False),
    ("5", "-5", False),
    ("0.5", "5", False),
    ("12", "1 2", False),
    ("x = 6", "5", False),
    ("\\sqrt{2}", "2", False),
    ("\\sqrt{3}", "\\sqrt{2}", False),
    ("\\boxed{}", "5", False),
    ("", "5", False),
    ("5", "", False),
    ("   ", "   ", False),
    # A number's answer is a written number, not the computation that gives it: an
    # agent can write the computation by copying the problem ("Compute 91 * 64 - 317.").
    ("91 * 64 - 317", "5507", False),
    ("\\boxed{91 * 64 - 317}", "5507", False),
    ("91 \\times 64 - 317", "5507", False),
    ("(91)(64) - 317", "5507", False),
    ("144/12 = 12", "12", True),  # the value stated, then how: written out either way
    ("5507 = 91 * 64 - 317", "5507", True),
    # Several values, a negation or a contradiction state no one final value.
    ("x=3, y=-3", "-3", False),
    ("x = 1, y = 2, z = 4", "4", False),
    ("x = 5 \\text{ or } x = 6", "6", False),
    ("5 or 6", "6", False),
    ("x != 5507", "5507", False),
    ("x \\not= 5507", "5507", False),
    ("x \\ne 5507", "5507", False),
    ("5506 = 5507", "5507", False),
    ("\\approx 5507", "5507", False),
    ("5507 \\pm 1", "5507", False),
    ("5507 plus 0", "5507", False),
    ("(1) + (5506)", "5507", False),
    ("2^{1500}", str(2**1500), False),  # too long to parse, still not written out
    ("2^{10}", "1024", False),
    ("3 \\times 4", "12", False),
    ("\\sqrt{4}", "2", False),
    ("144/12", "12", False),
    ("\\frac{6}{8}", "\\frac{3}{4}", False),
    ("\\frac{6}{8}", "0.75", False),
    ("x = 2 + 3", "5", False),
    # What may surround a written number without making it a computation.
    ("(5507)", "5507", True),
    ("\\left(-5\\right)", "-5", True),
    ("{{5507}}", "5507", True),
    ("{\\frac{1}{2}}", "0.5", True),
    ("5507,", "5507", True),
    ("S=5507;", "5507", True),
    ("5507 \\\\", "5507", True),
    ("5507\\hspace{1mm}", "5507", True),
    ("5507 apples", "5507", True),
    ("\\mathrm{Answer}: 5507", "5507", True),
    ("91*64-317 = 5,507", "5507", True),
    ("\\frac 12", "0.5", True),
    ("\\frac{1}2", "0.5", True),
    ("\\frac1{2}", "0.5", True),
    ("\\frac{2}{4}", "\\frac{2}{4}", True),  # the truth itself unreduced
    ("2/4", "2/4", True),
    (str(2**1500), str(2**1500), True),
    ("+0" + str(2**1500), str(2**1500), True),
]


@pytest.mark.parametrize(("pred", "truth", "expected"), MATCH_CASES)
def test_answers_match_table(pred, truth, expected):
    assert answers_match(pred, truth) is expected


def test_answers_match_any_accepts_alternatives():
    assert answers_match_any("81", ["080", "081"])
    assert not answers_match_any("82", ["080", "081"])
    assert not answers_match_any("80", [])


@pytest.mark.parametrize(
    ("pred", "truth"),
    [(None, "5"), ("5", None), (True, "1"), (["5"], "5"), (b"5", "5"), (object(), "5")],
)
def test_answers_match_rejects_non_text(pred, truth):
    assert answers_match(pred, truth) is False


def test_fast_path_does_not_use_the_symbolic_checker():
    class RefusingChecker(SymbolicChecker):
        def check(self, pred, truth, timeout_s):
            raise AssertionError(f"symbolic check called for {pred!r} vs {truth!r}")

    checker = RefusingChecker()
    for pred, truth in [("023", "23"), ("\\frac{3}{4}", "0.75"), ("18.0", "18"), ("1", "2")]:
        answers_match(pred, truth, checker=checker)


def test_timeout_zero_skips_the_symbolic_check():
    assert answers_match("\\sqrt{2}", "\\sqrt 2", timeout_s=0) is False
    assert answers_match("023", "23", timeout_s=0) is True


# --------------------------------------------------------------------------------------
# Threads, event loops, pathological input
# --------------------------------------------------------------------------------------


def test_answers_match_from_worker_threads():
    results: dict[int, bool] = {}
    errors: list[BaseException] = []
    cases = [
        ("\\sqrt{2}", "\\sqrt 2", True),
        ("\\sqrt{8}", "2\\sqrt{2}", True),
        ("\\pi", "\\sqrt{3}", False),
    ]

    def grade(slot: int, pred: str, truth: str) -> None:
        try:
            results[slot] = answers_match(pred, truth)
        except Exception as exc:  # noqa: BLE001 - the test reports any failure in the thread
            errors.append(exc)

    threads = [
        threading.Thread(target=grade, args=(i, pred, truth))
        for i, (pred, truth, _) in enumerate(cases)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert results == {i: expected for i, (_, _, expected) in enumerate(cases)}


def test_answers_match_inside_a_running_event_loop():
    async def main() -> tuple[bool, bool, bool]:
        direct = answers_match("\\frac{\\pi}{2}", "\\pi/2")
        in_thread = await answers_match_async("\\sqrt{8}", "2\\sqrt{2}")
        wrong = await answers_match_async("\\sqrt{8}", "3")
        return direct, in_thread, wrong

    assert asyncio.run(main()) == (True, True, False)


@pytest.mark.slow
def test_runaway_expression_is_bounded_and_its_worker_replaced(monkeypatch):
    waits = []
    original_next_reply = _Worker._next_reply

    def next_reply(self, timeout_s: float):
        waits.append(timeout_s)
        return original_next_reply(self, timeout_s)

    monkeypatch.setattr(_Worker, "_next_reply", next_reply)
    checker = SymbolicChecker(max_workers=1)
    try:
        checker.warm_up()
        assert answers_match("\\sqrt{8}", "2\\sqrt{2}", checker=checker)  # worker ready
        before = {child.pid for child in psutil.Process().children()}

        waits.clear()
        start = time.perf_counter()
        result = answers_match("10^{10^{10}}", "5\\sqrt{2}", timeout_s=1.0, checker=checker)
        elapsed = time.perf_counter() - start

        assert result is False
        # The caller waited for the reply once, for the 1 s asked for. The expression never
        # finishes, so any finite bound shows the wait ended; 30 s leaves room for killing
        # and reaping the worker on a machine with other work on its cores.
        assert waits == [1.0]
        assert elapsed < 30
        assert checker.timeouts == 1
        assert checker.live_workers == 1  # the replacement, nothing leaked
        after = {child.pid for child in psutil.Process().children()}
        killed = before - after
        assert len(killed) == 1
        assert not any(psutil.pid_exists(pid) for pid in killed)
        # The replacement works.
        assert answers_match("\\sqrt{18}", "3\\sqrt{2}", checker=checker)
    finally:
        checker.close()


def test_pathological_inputs_never_hang_or_raise():
    nasty = [
        "{" * 500 + "}" * 500,
        "\\frac{" * 300,
        "9" * 100_000,
        "(" * 2000,
        "\\boxed{\\boxed{}}",
        "x^" * 400,
        "é∑∫≈ç√ 🙂",
        "\x00\x01\ud800",
        "1/0",
        "\\frac{1}{0}",
        "nan",
        "inf",
    ]
    # Waiting for a worker's verdict is bounded by timeout_s (see the runaway test); what
    # this thread does with the text itself is counted in its CPU time, which other
    # processes on the cores and worker restarts do not add to.
    start = time.thread_time()
    for pred in nasty:
        for truth in ("5", pred):
            assert answers_match(pred, truth, timeout_s=1.0) in (True, False)
    assert answers_match("9" * 100_000, "9" * 100_000) is True
    assert time.thread_time() - start < 10


# Fragments that tend to break LaTeX parsers, glued together at random.
PIECES = r"\frac|\sqrt|{|}|^|_|\boxed|\left(|\right)|\pi|\%|$|=|,|1|0|-|.|x|\text{|\{|\}| |/"
LATEX_PIECES = st.sampled_from(PIECES.split("|"))
GARBAGE = st.one_of(
    st.text(max_size=60),
    st.lists(LATEX_PIECES, max_size=25).map("".join),
    st.from_regex(r"-?[0-9]{1,30}(\.[0-9]{0,10})?%?", fullmatch=True),
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(pred=GARBAGE, truth=GARBAGE)
def test_garbage_never_raises(pred, truth):
    assert answers_match(pred, truth, timeout_s=0.5) in (True, False)
    assert extract_boxed(pred) is None or isinstance(extract_boxed(pred), str)


@settings(max_examples=200, deadline=None)
@given(value=st.integers(min_value=-(10**12), max_value=10**12), pad=st.integers(0, 3))
def test_integers_match_their_padded_and_float_forms_only(value, pad):
    text = ("-" if value < 0 else "") + "0" * pad + str(abs(value))
    assert answers_match(text, str(value))
    assert answers_match(f"{value}.0", str(value))
    assert not answers_match(str(value + 1), text)
    assert not answers_match(str(value * 10 + 1), text)


# --------------------------------------------------------------------------------------
# An agent's own final number (mappa_env.grading.answers)
# --------------------------------------------------------------------------------------


def test_numbers_in_and_last_number():
    from mappa_env.grading.answers import last_number, numbers_in

    assert numbers_in("x = 1,000 and -3, then 2.5 or 3/4") == ["1000", "-3", "2.5", "3/4"]
    assert last_number("[stdout]\n6534\n") == "6534"
    assert last_number("no digits") is None


def test_stated_answer_reads_one_answer():
    from mappa_env.grading.answers import stated_answer

    assert stated_answer("so \\boxed{6534}") == "6534"
    assert stated_answer("The answer is 6534.") == "6534"
    assert stated_answer("The answer is 6534.", fallback=False) is None
    assert stated_answer("\\boxed{42} \\boxed{6534} The answer is 6534.") is None
    assert stated_answer(None) is None


def test_the_code_executor_answer_is_its_last_printed_number_else_its_words():
    from mappa_env.grading.answers import code_executor_answer, printed_answer

    assert printed_answer(["12\n", "6534\n"]) == "6534"
    assert printed_answer(["6534\n", "done\n", None]) == "6534"  # a later run printed none
    assert printed_answer([None, ""]) is None
    assert code_executor_answer(["6534\n"], "So \\boxed{42}") == "6534"
    assert code_executor_answer([None], "So \\boxed{42}") == "42"
    assert code_executor_answer([], "The answer is 42.") == "42"
    assert code_executor_answer([], "\\boxed{1} \\boxed{2}") is None
