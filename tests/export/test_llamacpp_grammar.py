"""lorapilot's constrained check (`evaluate.served.LabelChoice`) against llama.cpp's own grammar
sampler over the same labels (`served.gbnf_choice`, the export's labels.gbnf): on the real
default vocabulary, every state an answer can reach allows exactly the same tokens, so the two
decode alike wherever their arithmetic gives the same logits."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import need_llama_cpp

from lorapilot.evaluate.served import LabelChoice, gbnf_choice, token_bytes
from lorapilot.export.serving import GrammarSampler

LABELS = [
    "billing", "technical", "account", "feature_request",  # ticket-triage's own
    "card", "card_linking", "card_not_working",  # one label the start of others
    "Réclamation ✓", 'say "hi"', "back\\slash", "two words",  # escapes, UTF-8, a space
]  # fmt: skip


@pytest.fixture(scope="module")
def llama_vocab(default_model_dir):
    need_llama_cpp()
    from llama_cpp import Llama
    from transformers import AutoTokenizer

    from lorapilot.base.models import original_gguf

    gguf, _ = original_gguf(default_model_dir)
    assert gguf is not None, "the default model's GGUF is installed with its recorded sha256"
    llm = Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    return llm, AutoTokenizer.from_pretrained(default_model_dir)


def _allowed(llm, grammar: bytes, accepted: list[int]) -> set[int]:
    """The tokens llama.cpp's grammar sampler (as the serving check runs it) leaves after
    `accepted`."""
    held = GrammarSampler(llm, grammar)
    try:
        for t in accepted:
            held.accept(t)
        return set(np.flatnonzero(np.isfinite(held.mask(np.zeros(llm.n_vocab())))).tolist())
    finally:
        held.close()


def test_the_label_choice_allows_what_llama_cpps_grammar_allows(llama_vocab):
    llm, tok = llama_vocab
    ends = GrammarSampler(llm, b'root ::= "x"')
    eog = [i for i in range(llm.n_vocab()) if ends.ends(i)]
    ends.close()
    choice = LabelChoice(token_bytes(tok), LABELS, stop_ids=eog)
    grammar = gbnf_choice(LABELS).encode()
    states = sorted({lab[:k] for lab in LABELS for k in range(len(lab) + 1)})
    for said in states:
        ids = tok(said, add_special_tokens=False).input_ids if said else []
        assert choice.answer(ids) == said.encode()
        assert _allowed(llm, grammar, ids) == set(choice.allowed(said.encode())), said
    # the end of the turn is allowed exactly when the answer is a label
    assert set(eog) <= _allowed(llm, grammar, tok("card", add_special_tokens=False).input_ids)
    assert not set(eog) & _allowed(llm, grammar, tok("car", add_special_tokens=False).input_ids)
    assert len(states) == 100 and len(choice.allowed(b"")) > len(LABELS)


def test_a_label_grammar_that_llama_cpp_cannot_parse_is_refused(llama_vocab):
    llm, _ = llama_vocab
    with pytest.raises(ValueError, match="cannot parse the grammar"):
        GrammarSampler(llm, b'root ::= "a')
