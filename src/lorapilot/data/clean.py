"""Text cleaning by named rules, applied in the order the spec lists them (pure, no I/O).

Only the input text is cleaned. Targets and labels are never changed: they are the answer
key, and an answer rewritten by preprocessing would no longer be the one that was labelled.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections.abc import Iterable

from lorapilot.data.rows import Record
from lorapilot.errors import UsageError
from lorapilot.spec import CLEANING_RULES

EMPTY_AFTER_CLEANING = "empty after cleaning"

# Everything str.splitlines() treats as a line boundary becomes "\n" ("\r\n" first).
_LINE_BREAKS = re.compile(r"\r\n|[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_HSPACE = re.compile(r"[^\S\n]+")  # whitespace other than the newline: spaces, tabs, NBSP...
_SPACE_AROUND_NEWLINE = re.compile(r" ?\n ?")
_BLANK_LINES = re.compile(r"\n{3,}")


def collapse_whitespace(text: str) -> str:
    """Runs of spaces/tabs -> one space; 3+ newlines -> one blank line; no spaces at line ends.

    Newlines are kept on purpose: the line and paragraph structure of an invoice or a ticket
    (address blocks, item lines, "Total:" on its own line) carries meaning a model can use,
    while the width of an indent or a column gap, once collapsed, carries none, so the
    single space left around a newline is removed too.
    """
    text = _LINE_BREAKS.sub("\n", text)
    text = _HSPACE.sub(" ", text)
    text = _SPACE_AROUND_NEWLINE.sub("\n", text)
    return _BLANK_LINES.sub("\n\n", text)


def clean_text(text: str, rules: Iterable[str], max_chars: int | None) -> str:
    """Apply the text rules in order; `drop_empty` acts on records (see clean_records)."""
    for rule in rules:
        if rule == "unicode_nfc":
            text = unicodedata.normalize("NFC", text)
        elif rule == "strip":
            text = text.strip()
        elif rule == "collapse_whitespace":
            text = collapse_whitespace(text)
        elif rule == "lowercase":
            text = text.lower()
        elif rule == "max_chars":
            if max_chars is None or max_chars <= 0:
                raise UsageError(
                    "data.max_chars: the max_chars cleaning rule needs a positive limit"
                )
            text = text[:max_chars]
        elif rule == "drop_empty":
            continue
        else:
            raise UsageError(
                f"data.cleaning: unknown rule {rule!r}; known: {', '.join(CLEANING_RULES)}"
            )
    return text


def clean_records(
    records: Iterable[Record], rules: list[str], max_chars: int | None
) -> tuple[list[Record], list[dict]]:
    """Clean every record's text (and a conversation's earlier turns) -> (kept records,
    dropped [{id, source, reason}]).

    A text that is empty (or whitespace only) after cleaning is always dropped and listed,
    with or without `drop_empty`: an empty input cannot be trained or evaluated on, and
    keeping it silently would skew the split counts. `drop_empty` states that intent in
    the spec. The input records are not modified (new ones are made with replace()).
    """
    kept: list[Record] = []
    dropped: list[dict] = []
    for record in records:
        text = clean_text(record.text, rules, max_chars)
        if not text.strip():
            dropped.append(
                {"id": record.id, "source": record.source, "reason": EMPTY_AFTER_CLEANING}
            )
            continue
        # a conversation's earlier turns are input too: cleaned by the same rules, each one
        context = tuple((role, clean_text(said, rules, max_chars)) for role, said in record.context)
        if text != record.text or context != record.context:
            record = dataclasses.replace(record, text=text, context=context)
        kept.append(record)
    return kept, dropped
