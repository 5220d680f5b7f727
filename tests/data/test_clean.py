"""Cleaning rules, their order, and what cleaning never touches."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lorapilot.data.clean import clean_records, clean_text, collapse_whitespace
from lorapilot.data.rows import Record
from lorapilot.errors import UsageError


def rec(id: str, text: str, target: dict | None = None) -> Record:
    return Record(id, text, None, target, f"d.jsonl:{id}", None, "all")


def test_unicode_nfc():
    decomposed = "cafe\u0301"
    assert clean_text(decomposed, ["unicode_nfc"], None) == "caf\u00e9"
    assert clean_text(decomposed, [], None) == decomposed


def test_strip():
    assert clean_text(" \n\u00a0hi there\t\n", ["strip"], None) == "hi there"


def test_collapse_whitespace_keeps_paragraphs():
    text = (
        "ACME  Ltd\t\tInvoice   \r\n  12 Main St\r\n\r\n\r\n\r\n"
        "Total:\u00a0\u00a012.00 \n\n\n\nThanks"
    )
    assert clean_text(text, ["collapse_whitespace"], None) == (
        "ACME Ltd Invoice\n12 Main St\n\nTotal: 12.00\n\nThanks"
    )
    assert collapse_whitespace("a\u2028b\x0cc\rd") == "a\nb\nc\nd"
    assert collapse_whitespace("  lead and trail  ") == " lead and trail "  # ends are `strip`'s job


def test_lowercase():
    assert clean_text("Hello WORLD", ["lowercase"], None) == "hello world"


def test_max_chars():
    assert clean_text("abcdef", ["max_chars"], 4) == "abcd"
    assert clean_text("abc", ["max_chars"], 4) == "abc"
    with pytest.raises(UsageError, match="data.max_chars"):
        clean_text("abc", ["max_chars"], None)


def test_rules_apply_in_order():
    text = "  A    B  "
    assert clean_text(text, ["max_chars", "strip"], 4) == "A"
    assert clean_text(text, ["strip", "max_chars"], 4) == "A   "
    assert clean_text(text, ["strip", "collapse_whitespace", "max_chars"], 4) == "A B"


def test_unknown_rule():
    with pytest.raises(UsageError, match="unknown rule 'upper'"):
        clean_text("x", ["upper"], None)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab \t\n\r\u00a0\u2028\x0c"), max_size=40))
def test_collapse_whitespace_is_idempotent_and_leaves_no_runs(text):
    once = collapse_whitespace(text)
    assert collapse_whitespace(once) == once
    assert "  " not in once and "\n\n\n" not in once and " \n" not in once and "\n " not in once
    assert once.split() == text.split()  # words are never changed, only the space between


@pytest.mark.parametrize("rules", [["strip", "drop_empty"], ["strip"]])
def test_empty_after_cleaning_is_dropped_with_or_without_drop_empty(rules):
    records = [rec("a", " keep "), rec("b", "   ")]
    kept, dropped = clean_records(records, rules, None)
    assert [(r.id, r.text) for r in kept] == [("a", "keep")]
    assert dropped == [{"id": "b", "source": "d.jsonl:b", "reason": "empty after cleaning"}]


def test_targets_and_inputs_are_never_changed():
    target = {"vendor": "  ACME   Ltd  ", "note": "Line\n\n\n\nbreak"}
    original = rec("a", "  Invoice  FROM  ACME  ", dict(target))
    kept, dropped = clean_records([original], ["strip", "collapse_whitespace", "lowercase"], None)
    assert dropped == []
    assert kept[0].text == "invoice from acme"
    assert kept[0].target == target
    assert original.text == "  Invoice  FROM  ACME  "  # a new record, not a mutation
    assert (kept[0].id, kept[0].source, kept[0].category) == ("a", "d.jsonl:a", "all")
