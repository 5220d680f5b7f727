"""Label scoring and generation on a tiny model: agreement with a slow reference, and
independence from batch size and padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lorapilot.evaluate.predict import (
    Greedy,
    generate,
    score_labels,
    score_labels_reference,
    shared_prefix_len,
    tree_size,
)


@pytest.fixture(scope="module")
def model_and_tok(tiny_model_dir):
    from lorapilot.base.models import load_model, resolve_base

    return load_model(resolve_base(str(tiny_model_dir)))


def _prompts(n=10, seed=0, prefix=0):
    """Random prompts; with `prefix`, all start with the same `prefix` tokens (like a system
    prompt) and some go on with the same next token too (a longer shared prefix for those)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 40, (n,), generator=g)
    head = torch.randint(10, 40000, (prefix,), generator=g).tolist()
    return [head + torch.randint(10, 40000, (int(k),), generator=g).tolist() for k in lengths]


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
    assert generate(model, prompts, batch_size=1, **kw) == generate(
        model, prompts, batch_size=8, **kw
    )
    no_stop = generate(model, prompts[:3], max_new_tokens=4, stop_ids=[], pad_id=tok.pad_token_id)
    assert [len(g) for g in no_stop] == [4, 4, 4]  # nothing ends a row: max_new_tokens each


def test_a_row_ends_where_alive_says_so_and_keeps_what_it_had(model_and_tok):
    model, tok = model_and_tok
    prompts = _prompts(seed=3)
    kw = dict(max_new_tokens=8, stop_ids=[], pad_id=tok.pad_token_id, batch_size=4)
    whole = generate(model, prompts, **kw)
    seen: list[list[int]] = []

    def alive(ids: list[int]) -> bool:
        seen.append(list(ids))
        return len(ids) < 1 + ids[0] % 4  # each row its own length, 1-4 tokens

    cut = generate(model, prompts, alive=alive, **kw)
    for w, c in zip(whole, cut, strict=True):
        assert c == w[: 1 + w[0] % 4]  # the same tokens, up to and including the ending one
    assert all(s in [w[: len(s)] for w in whole] for s in seen)  # asked with each row's own ids
    assert max(len(s) for s in seen) <= 4  # nothing asked of a row once it ended


@pytest.mark.parametrize("search", ["all", "best_first"])
@pytest.mark.parametrize("prefix", [0, 12])
def test_scoring_decodes_greedily_from_its_own_cache_as_generate_does(
    search, prefix, model_and_tok
):
    """The generation check rides on scoring's prompt caches: the same tokens as `generate`
    (cut by `alive` alike), and not one score changed by the tokens it fed and cropped."""
    model, tok = model_and_tok
    prompts = _prompts(seed=4, prefix=prefix)
    kw = dict(pad_id=tok.pad_token_id, batch_size=4)
    plain = score_labels(model, prompts, LABELS, search=search, **kw)
    greedy = Greedy(6, [tok.eos_token_id, 7], alive=lambda ids: ids[-1] % 5 != 0)
    scored = score_labels(model, prompts, LABELS, search=search, greedy=greedy, **kw)
    np.testing.assert_array_equal(np.isnan(plain), np.isnan(scored))
    np.testing.assert_allclose(np.nan_to_num(scored), np.nan_to_num(plain), atol=1e-5)
    made = generate(model, prompts, max_new_tokens=6, stop_ids=[tok.eos_token_id, 7],
                    alive=greedy.alive, **kw)  # fmt: skip
    assert [greedy.ids[i] for i in range(len(prompts))] == made
    assert greedy.seconds > 0


def test_tree_size_counts_shared_beginnings_once():
    # [1, 2, 3] and [1, 2, 4] share the nodes 1 and 2; [5, 6] has 5; leaves are not fed
    assert tree_size([[1, 2, 3], [1, 2, 4], [5, 6]]) == 3
    assert tree_size([[7]]) == 0 and tree_size([[1, 2], [1, 2, 9]]) == 2


def test_shared_prefix_len_leaves_every_prompt_a_token_of_its_own():
    assert shared_prefix_len([[1, 2, 3, 4], [1, 2, 3, 5]]) == 3
    assert shared_prefix_len([[1, 2, 3], [1, 2, 3, 4]]) == 2  # [1,2,3] needs its last token
    assert shared_prefix_len([[1, 2], [3, 4]]) == 0
    assert shared_prefix_len([[7, 8, 9]]) == 2
    assert shared_prefix_len([]) == 0


def test_shared_prefix_scoring_matches_the_slow_reference(model_and_tok):
    """The prefix computed once (batch 1) and reused by every batch gives the same scores
    as full forward passes, for any batch size."""
    model, tok = model_and_tok
    prompts = _prompts(n=9, seed=3, prefix=12)
    assert shared_prefix_len(prompts) >= 12
    ref = score_labels_reference(model, prompts, LABELS)
    for bs in (1, 4, 9):
        got = score_labels(model, prompts, LABELS, batch_size=bs, pad_id=tok.pad_token_id)
        np.testing.assert_allclose(got, ref, atol=1e-4)
        assert (got.argmax(1) == ref.argmax(1)).all()
    unshared = score_labels(
        model, prompts, LABELS, batch_size=4, pad_id=tok.pad_token_id, share_prefix=False
    )
    np.testing.assert_allclose(unshared, ref, atol=1e-4)


@pytest.mark.parametrize("path", ["sdpa-tree", "eager-tree", "repeated-cache"])
def test_every_label_continuation_path_matches_the_reference(path, tiny_model_dir, monkeypatch):
    """Labels after their first token are scored as a packed tree with a custom 4D mask
    (sdpa: boolean, eager: additive) or, for attention kernels without custom masks, with
    the prompt's cache repeated per label: all three give the reference's scores."""
    from lorapilot.base.models import load_model, resolve_base
    from lorapilot.evaluate import predict

    model, tok = load_model(resolve_base(str(tiny_model_dir)))
    if path == "eager-tree":
        model.config._attn_implementation = "eager"
    if path == "repeated-cache":
        monkeypatch.setattr(predict, "takes_4d_masks", lambda m: False)
    prompts = _prompts(n=7, seed=4, prefix=5)
    ref = score_labels_reference(model, prompts, LABELS)
    got = score_labels(model, prompts, LABELS, batch_size=3, pad_id=tok.pad_token_id)
    np.testing.assert_allclose(got, ref, atol=1e-4)


def _hf_generate(model, prompts, max_new_tokens, stop_ids, pad_id):
    """Reference: transformers' own greedy `generate`, one prompt at a time (no padding)."""
    outs = []
    for p in prompts:
        ids = torch.tensor([p])
        gen = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            eos_token_id=stop_ids,
            pad_token_id=pad_id,
        )
        toks = []
        for t in gen[0, len(p) :].tolist():
            if t in stop_ids:
                break
            toks.append(t)
        outs.append(toks)
    return outs


def _context_sensitive(model, tok):
    """A copy of the tiny model with weights at unit-variance scale: the default init (std
    0.02) leaves the next token a function of the last token alone, so a wrong position or
    mask would go unnoticed in generated tokens; here every token depends on all of them."""
    import copy

    model = copy.deepcopy(model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 1.5 / p.shape[1] ** 0.5)
    return model, tok


@pytest.mark.parametrize("prefix", [0, 9])
def test_generation_matches_transformers_generate(prefix, model_and_tok):
    """The greedy loop (shared-prefix cache, left padding, early stop) produces the tokens of
    `model.generate(do_sample=False)`, with the prefix shared or not, at any batch size."""
    model, tok = _context_sensitive(*model_and_tok)
    prompts = _prompts(n=7, seed=5, prefix=prefix)
    # A random model rarely emits a given token: make its own favourite next token a stop
    # token for some prompts, so that early stopping is exercised.
    first = _hf_generate(model, prompts, 1, [tok.eos_token_id], tok.pad_token_id)
    stop = sorted({tok.eos_token_id, first[0][0], first[3][0]})
    ref = _hf_generate(model, prompts, 8, stop, tok.pad_token_id)
    assert any(len(r) < 8 for r in ref) and any(len(r) == 8 for r in ref)
    for bs, share in ((1, True), (4, True), (7, True), (4, False)):
        got = generate(
            model,
            prompts,
            max_new_tokens=8,
            stop_ids=stop,
            pad_id=tok.pad_token_id,
            batch_size=bs,
            share_prefix=share,
        )
        assert got == ref, (bs, share)


def _many_labels(n=40, seed=5):
    """Labels that share beginnings, as `card_arrival`, `card_linking`, ... do: a trie with
    branching at several depths, different lengths, one label a prefix of another, one label
    of a single token; every label but that one ends with token 2 (end of turn)."""
    g = torch.Generator().manual_seed(seed)
    stems = [torch.randint(10, 40000, (int(k),), generator=g).tolist() for k in (1, 2, 1, 3)]
    labels = []
    while len(labels) < n - 2:
        stem = stems[int(torch.randint(0, len(stems), (1,), generator=g))]
        tail = torch.randint(10, 40000, (int(torch.randint(0, 4, (1,), generator=g)),), generator=g)
        lab = stem + tail.tolist() + [2]
        if lab not in labels:
            labels.append(lab)
    labels.append(labels[0][:-1] + [2, 9])  # labels[0] is a prefix of it
    labels.append([7])
    return labels


@pytest.mark.parametrize(
    "attn, switch",
    [("sdpa", "never"), ("eager", "never"), ("sdpa", "at_once"), ("sdpa", "after_a_pass"),
     ("eager", "after_a_pass"), ("sdpa", "auto")],
)  # fmt: skip
def test_best_first_search_picks_the_argmax_of_every_label(
    attn, switch, tiny_model_dir, monkeypatch
):
    """Best-first scoring expands only what the argmax needs: its prediction is the one of
    scoring every label, the labels it scored have the reference's scores, and it left
    labels unscored (NaN), which is where the time goes. Switched to the packed tree for
    the prompts still open (at once, or when the search costs too much: the rule), it
    gives the same predictions with every label scored."""
    from lorapilot.base.models import load_model, resolve_base
    from lorapilot.evaluate import predict

    labels = _many_labels()
    # after_a_pass: the first pass (4 rows, one node each) fits the budget, the next does not
    # (bs 4 below; with bs 1 the budget is a quarter of the 4-row one: it switches at once)
    one_pass = predict.PASS_OVERHEAD_TOKENS + 4
    fraction = {
        "never": 1e9,
        "at_once": 0.0,
        "after_a_pass": one_pass / (predict.PASS_OVERHEAD_TOKENS + 4 * tree_size(labels)),
    }
    if switch != "auto":
        monkeypatch.setattr(predict, "SWITCH_FRACTION", fraction[switch])
    model, tok = load_model(resolve_base(str(tiny_model_dir)))
    model.config._attn_implementation = attn
    prompts = _prompts(n=11, seed=6, prefix=6)
    ref = score_labels_reference(model, prompts, labels)
    full = score_labels(model, prompts, labels, batch_size=4, pad_id=tok.pad_token_id)
    for bs in (1, 4):
        got = score_labels(
            model, prompts, labels, batch_size=bs, pad_id=tok.pad_token_id, search="best_first"
        )
        assert (np.nanargmax(got, axis=1) == ref.argmax(1)).all()
        assert (np.nanargmax(got, axis=1) == full.argmax(1)).all()
        scored = ~np.isnan(got)
        np.testing.assert_allclose(got[scored], ref[scored], atol=1e-4)
        assert scored[np.arange(len(prompts)), ref.argmax(1)].all()
        if switch == "never":
            assert scored.all(axis=1).sum() < len(prompts)  # it did prune
        if switch == "at_once":  # rows decided by the first-token pass alone stay pruned
            assert scored.all(axis=1).sum() >= 1


def test_best_first_ties_go_to_the_first_label(model_and_tok):
    """Two labels with the same tokens score the same; np.argmax would pick the first."""
    model, tok = model_and_tok
    labels = [[300, 2], [100, 2], [100, 2], [7]]
    prompts = _prompts(n=5, seed=7)
    got = score_labels(model, prompts, labels, pad_id=tok.pad_token_id, search="best_first")
    ref = score_labels_reference(model, prompts, labels)
    assert (np.nanargmax(got, axis=1) == ref.argmax(1)).all()
    assert np.array_equal(np.isnan(got[:, 1]), np.isnan(got[:, 2]))


def test_the_prefix_cache_setting_resolves_per_device():
    """`auto`: the cache on a CPU, none on a GPU (slower there: bench/README.md); `on` and
    `off` as written."""
    from lorapilot.evaluate.runner import prefix_cache_on

    assert prefix_cache_on("auto", "cpu") and not prefix_cache_on("auto", "cuda")
    assert prefix_cache_on("on", "cuda") and prefix_cache_on("on", "cpu")
    assert not prefix_cache_on("off", "cpu") and not prefix_cache_on("off", "cuda")


def test_a_frozen_lm_head_is_one_product_not_a_copy_per_row(tiny_model_dir):
    """Under an adapter the base's weights are frozen; the head's input at the last
    position is a strided view, which torch's matmul would answer by copying the
    [vocab, hidden] weight once per row for a batched product (seconds a batch on the
    default model). Scoring and generation hand the head a contiguous input instead."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from lorapilot.base.models import load_model, resolve_base

    model, tok = load_model(resolve_base(str(tiny_model_dir)))
    model.requires_grad_(False)
    vocab = model.get_output_embeddings().weight.shape[0]

    class BatchedHeadProducts(TorchDispatchMode):
        seen = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.bmm.default and args[1].shape[-1] == vocab:
                self.seen += 1
            return func(*args, **(kwargs or {}))

    prompts = _prompts(n=6, seed=4, prefix=8)
    for share in (True, False):
        with BatchedHeadProducts() as spy:
            got = score_labels(
                model, prompts, LABELS, batch_size=3, pad_id=tok.pad_token_id, share_prefix=share
            )
            generate(model, prompts, max_new_tokens=2, stop_ids=[2], pad_id=tok.pad_token_id,
                     batch_size=3, share_prefix=share)  # fmt: skip
        assert spy.seen == 0
        np.testing.assert_allclose(got, score_labels_reference(model, prompts, LABELS), atol=1e-4)


def test_best_first_with_calibration_offsets_picks_the_argmax_of_score_plus_offset(
    tiny_model_dir, monkeypatch
):
    """Calibrated scoring ranks score + offset: the search bounds a node by its score plus
    the largest offset below it, so it picks what scoring every label picks, though offsets
    move the winner (here: large ones on labels the plain argmax never picks)."""
    from lorapilot.base.models import load_model, resolve_base
    from lorapilot.evaluate import predict

    monkeypatch.setattr(predict, "SWITCH_FRACTION", 1e9)  # the search alone, never the tree
    labels = _many_labels()
    model, tok = load_model(resolve_base(str(tiny_model_dir)))
    prompts = _prompts(n=9, seed=8, prefix=6)
    full = score_labels(model, prompts, labels, batch_size=4, pad_id=tok.pad_token_id)
    offsets = np.zeros(len(labels))
    losers = [j for j in range(len(labels)) if j not in set(full.argmax(1))]
    offsets[losers[::3]] = np.ptp(full, axis=1).mean() / 2  # enough to win some rows
    want = (full + offsets).argmax(1)
    assert (want != full.argmax(1)).any()
    got = score_labels(model, prompts, labels, batch_size=4, pad_id=tok.pad_token_id,
                       search="best_first", offsets=offsets)  # fmt: skip
    assert (np.nanargmax(got + offsets, axis=1) == want).all()
    assert np.isnan(got).any()  # it still pruned


def _constrained_reference(model, prompt, choice, max_new):
    """Constrained greedy decoding the slow way: the whole sequence again at every step."""
    ids, said = [], b""
    for _ in range(max_new):
        allowed = choice.allowed(said)
        if not allowed:
            break
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, -1].float()
        t = allowed[int(logits[allowed].argmax())]
        if t in choice.stop_ids:
            break
        ids.append(t)
        said += choice.vocab[t]
    return ids


@pytest.mark.parametrize("prefix", [0, 12])
def test_constrained_decoding_matches_the_slow_reference(prefix, model_and_tok):
    """The constrained pass picks, token by token, the likeliest token that spells on towards
    a label (labels made of this random model's own likeliest tokens, and others)."""
    from lorapilot.evaluate.served import LabelChoice, token_bytes

    model, tok = model_and_tok
    prompts = _prompts(seed=6, prefix=prefix)
    kw = dict(pad_id=tok.pad_token_id, batch_size=4)
    vocab = token_bytes(tok)
    free = generate(model, prompts, max_new_tokens=3, stop_ids=[], **kw)
    spelled = [b"".join(vocab[t] or b"\xff" for t in w[:2]) for w in free]
    text = [s.decode("utf-8", "ignore") for s in spelled]
    own = [i for i, s in enumerate(spelled) if text[i].encode() == s and text[i].isprintable()]
    own = own[:3]
    labels = sorted({text[i] for i in own} | {"bill", "billing", "tech"})
    stop = sorted({free[i][2] for i in own} - {t for i in own for t in free[i][:2]})
    choice = LabelChoice(vocab, labels, stop)
    greedy = Greedy(12, stop, choice=choice)
    plain = score_labels(model, prompts, LABELS, **kw)
    scored = score_labels(model, prompts, LABELS, greedy=greedy, **kw)
    np.testing.assert_allclose(scored, plain, atol=1e-5)  # the passes' tokens were cropped
    got = [greedy.constrained[i] for i in range(len(prompts))]
    want = [_constrained_reference(model, p, choice, 12) for p in prompts]
    assert got == want
    assert all(choice.answer(g).decode() in labels for g in got)
    assert greedy.constrained_seconds > 0
