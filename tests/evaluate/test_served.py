"""The generation check's figures (`evaluate.served`): a scored classifier's answers as a
generating server gives them, counted against the scored ones."""

from __future__ import annotations

import pytest

from lorapilot.evaluate.served import (
    LabelChoice,
    could_be_label,
    gbnf_choice,
    generation_figures,
    generation_warning,
    token_bytes,
)


def _rows(parsed, raw=None):
    raw = raw or [p or "?" for p in parsed]
    return [
        {"id": f"e{i}", "gold": "a", "parsed": p, "raw_output": r}
        for i, (p, r) in enumerate(zip(parsed, raw, strict=True))
    ]


def test_figures_count_the_same_label_any_label_and_the_texts_that_are_none():
    scored = _rows(["a", "b", "a", "c"])
    generated = _rows(["a", "c", None, None], ["a", "c", "gas_fill_fill", " gas_fill_fill\n"])
    f = generation_figures(
        scored, generated, {"macro_f1": 0.5, "accuracy": 0.5}, {"macro_f1": 0.25}, ["macro_f1"]
    )
    assert (f["n"], f["n_same"], f["n_labels"]) == (4, 1, 2)
    assert f["agreement"] == 0.25 and f["label_rate"] == 0.5
    assert f["not_labels"] == [["gas_fill_fill", 2]]  # stripped, counted once per text
    assert f["metrics"] == {"macro_f1": {"scored": 0.5, "generated": 0.25}}
    assert [d["id"] for d in f["differing"]] == ["e1", "e2", "e3"]
    assert f["differing"][0] == {"id": "e1", "gold": "a", "scored": "b", "generated": "c"}


def test_figures_of_nothing_agree_and_the_runtimes_can_be_named():
    f = generation_figures([], [], {}, {}, [], theirs="lorapilot", ours="llama_cpp")
    assert f["agreement"] == 1.0 and f["label_rate"] == 1.0 and f["differing"] == []
    g = generation_figures(_rows(["a"]), _rows(["b"]), {"m": 1}, {"m": 0}, ["m"],
                           theirs="lorapilot", ours="llama_cpp")  # fmt: skip
    assert g["metrics"] == {"m": {"lorapilot": 1, "llama_cpp": 0}}
    assert g["differing"][0]["lorapilot"] == "a" and g["differing"][0]["generated"] == "b"


def test_the_warning_names_the_counts_the_metrics_and_the_ways_out():
    scored = _rows(["a"] * 50)
    generated = _rows(["a"] * 48 + [None, "b"], ["a"] * 48 + ["zzz", "b"])
    f = generation_figures(scored, generated, {"macro_f1": 0.9}, {"macro_f1": 0.85}, ["macro_f1"])
    assert f["agreement"] == 0.96
    text = generation_warning("the chosen adapter (train run t1)", f)
    assert text.startswith("the chosen adapter (train run t1): served by a runtime that generates")
    assert "48 of 50 validation answers are the label scored (96.0% < 98%)" in text
    assert "1 are no label at all ('zzz' x1)" in text
    assert "macro_f1 0.900 scored, 0.850 generated" in text
    assert "classify.py" in text and "eval.mode: generate" in text
    assert generation_warning("x", f, minimum=0.95) == ""  # agreement at or above: nothing


def test_an_answer_is_alive_while_it_can_still_parse_to_a_label():
    labels = {"billing", "refund_not_showing_up", "feature request"}
    for text in ("", "  ", "\n b", "Bill", "billing", " BILLING \n", "REFUND_not", "feature ",
                 "feature request", "x\ufffd"):  # fmt: skip
        assert could_be_label(text, labels), text
    for text in ("billing issue", "The", "billingx", "feature  request", "b\ni", "refund."):
        assert not could_be_label(text, labels), text


def test_a_label_choice_allows_every_token_that_spells_on_towards_a_label():
    vocab = [b"b", b"ill", b"bill", b"ing", b"billing", b"t", b"ech", None, b"x", b"illing"]
    choice = LabelChoice(vocab, ["bill", "billing", "tech"], stop_ids=[7])
    assert choice.allowed(b"") == [0, 2, 4, 5]  # not only each label's own first token
    assert choice.allowed(b"b") == [1, 9]
    assert choice.allowed(b"bill") == [3, 7]  # a label, and the start of another
    assert choice.allowed(b"billing") == [7] and choice.complete(b"billing")
    assert not choice.complete(b"bill") and not choice.complete(b"t")
    assert choice.allowed(b"x") == []  # no label starts so
    assert choice.answer([0, 1, 3]) == b"billing"
    # a free answer that spells a label and ended at a stop token is what constrained
    # decoding gives too; one cut short, or spelling no label, is decoded again
    free = [[0, 1, 3], [2], [2], [8], [0, 9, 3]]
    assert choice.to_decode(free, [True, True, False, True, True]) == [
        False, False, True, True, True
    ]  # fmt: skip


def test_token_bytes_spell_the_text_back_and_leave_special_tokens_out(default_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    vocab = token_bytes(tok)
    assert len(vocab) == len(tok)
    for text in ["billing", "feature_request", " two words", "Réclamation ✓", "Ärger\n"]:
        ids = tok(text, add_special_tokens=False).input_ids
        assert b"".join(vocab[i] for i in ids) == text.encode()
    assert all(vocab[i] is None for i in tok.all_special_ids)
    assert vocab[tok.convert_tokens_to_ids("<|im_end|>")] is None


def test_a_label_grammar_escapes_what_gbnf_would_read_otherwise():
    assert gbnf_choice(["billing", "feature_request"]) == 'root ::= "billing" | "feature_request"\n'
    text = gbnf_choice(['say "hi"', "back\\slash", "two\nlines", "tab\tx", "Réclamation ✓"])
    assert text == (
        'root ::= "say \\"hi\\"" | "back\\\\slash" | "two\\x0alines" | "tab\\x09x" '
        '| "Réclamation ✓"\n'
    )
    for bad in ([], ["a", ""]):
        with pytest.raises(ValueError):
            gbnf_choice(bad)
