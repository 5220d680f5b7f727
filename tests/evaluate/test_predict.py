"""Label scoring and generation on a tiny model: agreement with a slow reference, and
independence from batch size and padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lorapilot.evaluate.predict import generate, score_labels, score_labels_reference


@pytest.fixture(scope="module")
def model_and_tok(tiny_model_dir):
    from lorapilot.models import load_model, resolve_base

    return load_model(resolve_base(str(tiny_model_dir)))


def _prompts(n=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 40, (n,), generator=g)
    return [torch.randint(10, 40000, (int(k),), generator=g).tolist() for k in lengths]


LABELS = [[100, 2], [200, 300, 2], [400, 500, 600, 2], [7]]


def test_scoring_matches_the_slow_reference(model_and_tok):
    model, tok = model_and_tok
    prompts = _prompts()
    ref = score_labels_reference(model, prompts, LABELS)
    got = score_labels(model, prompts, LABELS, batch_size=4, pad_id=tok.pad_token_id)
    np.testing.assert_allclose(got, ref, atol=1e-4)
    assert (got.argmax(1) == ref.argmax(1)).all()


def test_scoring_does_not_depend_on_batch_size(model_and_tok):
    model, tok = model_and_tok
    prompts = _prompts(seed=1)
    one = score_labels(model, prompts, LABELS, batch_size=1, pad_id=tok.pad_token_id)
    eight = score_labels(model, prompts, LABELS, batch_size=8, pad_id=tok.pad_token_id)
    np.testing.assert_allclose(one, eight, atol=1e-4)
    assert (one.argmax(1) == eight.argmax(1)).all()


def test_generation_does_not_depend_on_batch_size(model_and_tok):
    model, tok = model_and_tok
    prompts = _prompts(seed=2)
    kw = dict(max_new_tokens=6, stop_ids=[tok.eos_token_id], pad_id=tok.pad_token_id)
    assert generate(model, prompts, batch_size=1, **kw) == generate(model, prompts, batch_size=8, **kw)
