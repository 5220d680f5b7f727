"""The smoke's stopping test: `greedy_reproduces` says whether greedy decoding writes each
row's target, checked against greedy decoding itself on a tiny model."""

from __future__ import annotations

import torch

from lorapilot.data.format import IGNORE_INDEX, Encoded
from lorapilot.evaluate.predict import generate
from lorapilot.train.batches import collate
from lorapilot.train.loss import MEMORISED_P, greedy_reproduces


def _example(prompt: list[int], answer: list[int]) -> Encoded:
    return Encoded(prompt + answer, [IGNORE_INDEX] * len(prompt) + answer, len(prompt), "")


def test_greedy_reproduces_is_what_greedy_decoding_writes(tiny_model_dir):
    from lorapilot.base.models import load_model, resolve_base

    model, tok = load_model(resolve_base(str(tiny_model_dir)))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 40000, (int(n),), generator=g).tolist() for n in (5, 9, 14)]
    written = generate(model, prompts, max_new_tokens=6, stop_ids=[], pad_id=tok.pad_token_id)
    good = [_example(p, w) for p, w in zip(prompts, written, strict=True)]
    wrong_last = list(written[1])
    wrong_last[-1] = (wrong_last[-1] + 1) % 40000  # one token off, at the end
    wrong_first = list(written[2])
    wrong_first[0] = (wrong_first[0] + 1) % 40000  # one token off, then the rest teacher-forced
    bad = [good[0], _example(prompts[1], wrong_last), _example(prompts[2], wrong_first)]
    model.eval()
    assert greedy_reproduces(model, collate(good, tok.pad_token_id)).tolist() == [True] * 3
    assert greedy_reproduces(model, collate(bad, tok.pad_token_id)).tolist() == [
        True,
        False,
        False,
    ]


def test_a_margin_is_asked_before_an_example_counts_as_memorised(tiny_model_dir):
    """A random model's greedy tokens win by a hair (probability far below 0.9): greedy
    decoding writes them, yet the evaluation's rounding could flip them, so with min_p they
    do not count; a target made the only likely token does."""
    from lorapilot.base.models import load_model, resolve_base

    model, tok = load_model(resolve_base(str(tiny_model_dir)))
    model.eval()
    prompt = list(range(100, 108))
    (written,) = generate(model, [prompt], max_new_tokens=3, stop_ids=[], pad_id=tok.pad_token_id)
    batch = collate([_example(prompt, written)], tok.pad_token_id)
    assert greedy_reproduces(model, batch).tolist() == [True]
    assert greedy_reproduces(model, batch, min_p=MEMORISED_P).tolist() == [False]
    with torch.no_grad():  # the head now puts nearly all mass on the written tokens
        head = model.get_output_embeddings()
        head.weight[list(written)] *= 1000.0
    assert greedy_reproduces(model, batch, min_p=MEMORISED_P).tolist() == [True]


def test_the_smoke_asks_every_batch_of_its_examples(tiny_model_dir):
    """More examples than one batch of the check (16): each batch is asked, and one example
    not reproduced anywhere among them is found."""
    from lorapilot.base.models import load_model, resolve_base
    from lorapilot.steps.smoke import _reproduces_all
    from lorapilot.train.examples import TextExamples

    model, tok = load_model(resolve_base(str(tiny_model_dir)))
    model.eval()
    prompts = [list(range(100 + i, 106 + i)) for i in range(20)]
    written = generate(model, prompts, max_new_tokens=2, stop_ids=[], pad_id=tok.pad_token_id)
    with torch.no_grad():  # every written token made the only likely one
        model.get_output_embeddings().weight[sorted({t for w in written for t in w})] *= 1000.0
    good = [_example(p, w) for p, w in zip(prompts, written, strict=True)]
    assert _reproduces_all(model, TextExamples(good, tok.pad_token_id), "fp32")
    last = list(written[-1])
    last[-1] = (last[-1] + 1) % 40000
    bad = [*good[:-1], _example(prompts[-1], last)]  # in the second batch of 16
    assert not _reproduces_all(model, TextExamples(bad, tok.pad_token_id), "fp32")
