"""The one cleaner of stored text (``tenure.adapters.core.text.clean_text``), one test per
character class and policy: what a stored error, a terminal line or a console page may
carry of a text someone else wrote."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenure.adapters.core.text import MAX_TEXT_BYTES, NEUTRALISED, REPLACEMENT, clean_text

C0 = [chr(code) for code in range(0x20) if code not in (0x09, 0x0A, 0x0D)]
C1_AND_DEL = [chr(code) for code in range(0x7F, 0xA0)]
BIDIRECTIONAL = ["\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069"]
SEPARATORS = ["\u2028", "\u2029"]


@pytest.mark.parametrize("one_line", [False, True], ids=["lines_kept", "one_line"])
@pytest.mark.parametrize("character", C0, ids=lambda character: f"U+{ord(character):04X}")
def test_a_c0_control_but_tab_and_the_line_breaks_becomes_the_replacement_character(character: str,
                                                                                     one_line: bool) -> None:
    assert clean_text(f"a{character}b", one_line=one_line) == f"a{REPLACEMENT}b"


@pytest.mark.parametrize("character", C1_AND_DEL, ids=lambda character: f"U+{ord(character):04X}")
def test_del_and_every_c1_control_nel_included_become_the_replacement_character(character: str) -> None:
    assert clean_text(f"a{character}b") == f"a{REPLACEMENT}b"
    assert clean_text(f"a{character}b", one_line=True) == f"a{REPLACEMENT}b"


@pytest.mark.parametrize("one_line", [False, True], ids=["lines_kept", "one_line"])
@pytest.mark.parametrize("character", BIDIRECTIONAL, ids=lambda character: f"U+{ord(character):04X}")
def test_a_bidirectional_embedding_override_or_isolate_becomes_the_replacement_character(character: str,
                                                                                         one_line: bool) -> None:
    # "Trojan Source": an override stored in an error would reorder what a reader sees.
    assert clean_text(f"price {character}01$ to pay", one_line=one_line) == f"price {REPLACEMENT}01$ to pay"


def test_the_bidirectional_marks_stay_since_they_reorder_no_span() -> None:
    assert clean_text("a\u200eb\u200fc\u061cd") == "a\u200eb\u200fc\u061cd"


@pytest.mark.parametrize("separator", [*SEPARATORS, "\r", "\r\n"],
                         ids=["U+2028", "U+2029", "carriage_return", "crlf"])
def test_a_carriage_return_and_the_line_and_paragraph_separators_become_one_line_feed(separator: str) -> None:
    assert clean_text(f"first{separator}second") == "first\nsecond"


def test_a_carriage_return_cannot_write_over_a_line() -> None:
    assert clean_text("status: ok\rstatus: FAILED") == "status: ok\nstatus: FAILED"


def test_tabs_and_line_feeds_stay_when_lines_are_kept() -> None:
    assert clean_text("Traceback:\n\tline 1\n\n  line 2\t") == "Traceback:\n\tline 1\n\n  line 2\t"


@pytest.mark.parametrize("white", ["\n", "\t", "\r", "\r\n", "\u2028", "\u2029", "  \n\t ", "\u00a0"])
def test_one_line_makes_every_run_of_white_space_one_space(white: str) -> None:
    assert clean_text(f"{white}first{white}second{white}", one_line=True) == "first second"


def test_a_character_utf8_cannot_encode_becomes_a_question_mark() -> None:
    assert clean_text("lone \udc80 surrogate") == "lone ? surrogate"


def test_a_long_text_is_cut_on_a_character_boundary_and_says_so() -> None:
    cut = clean_text("é" * 100, 51)
    assert len(cut.encode()) <= 51 and cut.endswith("\u2026") and cut[:-1] == "é" * 24
    assert clean_text("x" * MAX_TEXT_BYTES) == "x" * MAX_TEXT_BYTES  # exactly the bound: whole
    assert clean_text("x" * (MAX_TEXT_BYTES + 1)).endswith("\u2026")


def test_a_replaced_control_counts_its_three_bytes_against_the_bound() -> None:
    cut = clean_text("\x1b" * 10, 12)
    assert cut == REPLACEMENT * 3 + "\u2026"


def test_a_text_cut_before_its_white_space_collapsed_still_says_it_was_cut() -> None:
    text = " " * 100 + "hidden"
    assert clean_text(text, 20, one_line=True) == "\u2026"
    assert clean_text("a\r\n" * 10, 20).endswith("\u2026")  # CRLF shrinks, and the rest was cut


def test_none_stays_none() -> None:
    assert clean_text(None) is None
    assert clean_text(None, 10, one_line=True) is None


@given(st.text(), st.integers(3, 300), st.booleans())
def test_what_comes_out_is_clean_bounded_and_cleaning_it_again_changes_nothing(text: str, max_bytes: int,
                                                                               one_line: bool) -> None:
    cleaned = clean_text(text, max_bytes, one_line=one_line)
    assert len(cleaned.encode("utf-8")) <= max_bytes
    assert not NEUTRALISED & set(cleaned)
    assert not {"\r", "\u2028", "\u2029"} & set(cleaned)
    if one_line:
        assert cleaned == " ".join(cleaned.split())
    assert clean_text(cleaned, max_bytes, one_line=one_line) == cleaned
