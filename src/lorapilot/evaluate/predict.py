"""Model-facing evaluation: label scoring and batched greedy generation.

Both take token ids built by `data.format` (the evaluation prompt is the training prompt minus
the answer) so there is exactly one definition of what the model sees.

Label scoring shares computation at two levels. The prefix every prompt starts with (chat
header, system prompt, start of the template: about 40% of a ticket-triage prompt) is run
once for the whole evaluation and its KV cache reused by every batch; and each prompt's
cache is reused for every label, so a 6-label task costs one forward pass over each
prompt's own tokens plus one short pass for the labels, instead of six full passes.
Greedy generation reuses the same prefix cache. Batches are grouped by length and
left-padded (between the shared prefix and each prompt's own tokens) with explicit position
ids, so results do not depend on the batch size or on padding (tested).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lorapilot.base.precision import autocast


@contextlib.contextmanager
def foldable_head(model):
    """Hand the LM head its input as one [rows, hidden] matrix while evaluating.

    With `logits_to_keep=1` the head gets the last position of [b, T, d] hidden states, a
    strided [b, 1, d] view. torch's matmul folds a 3-d input into one [b, d] x [d, V]
    product only in some layouts, or when the weight requires grad; a frozen weight (every
    adapter's base, a base under `disable_adapter`) is otherwise broadcast to [b, d, V] and
    copied for a batched product: 32 x 576 x 49k values for the default model (3-5 s of a
    32-prompt batch on a 2-core CPU, where the product itself takes 8 ms), 32 x 4096 x 128k
    (33 GB in bf16) for an 8B model. Flattened to 2-d (a copy of b x d values at most) the
    head is always one product; its output is given back its [b, T, V] shape."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if head is None:
        yield
        return
    lead: list[torch.Size] = []

    def flatten(_module, args):
        if not args or args[0].dim() < 3:
            return None
        lead.append(args[0].shape[:-1])
        return (args[0].reshape(-1, args[0].shape[-1]), *args[1:])

    def unflatten(_module, _args, out):
        return out.view(*lead.pop(), out.shape[-1]) if lead else None

    handles = [head.register_forward_pre_hook(flatten), head.register_forward_hook(unflatten)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _head_folded(fn):
    """Run `fn(model, ...)` under `foldable_head(model)`."""

    @functools.wraps(fn)
    def wrapper(model, *args, **kwargs):
        with foldable_head(model):
            return fn(model, *args, **kwargs)

    return wrapper


def _length_batches(lengths: list[int], batch_size: int) -> Iterator[list[int]]:
    """Indices grouped by length (longest first), so little compute goes to padding."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size]


def _left_pad(
    seqs: list[list[int]], pad_id: int, device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded ids, attention mask and position ids that start at 0 on the first real token."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), pos.to(device)


def shared_prefix_len(prompts: list[list[int]]) -> int:
    """Length of the token prefix common to every prompt, leaving each prompt at least one
    token of its own (its last position's logits are what scoring needs)."""
    if not prompts:
        return 0
    first = prompts[0]
    n = min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        k = 0
        while k < n and p[k] == first[k]:
            k += 1
        n = k
    return max(n, 0)


def _prefix_cache(model, prefix: list[int], precision: str):
    """Per-layer (keys, values) of the shared prefix, computed once with batch size 1."""
    if not prefix:
        return None
    device = next(model.parameters()).device
    ids = torch.tensor([prefix], dtype=torch.long, device=device)
    with autocast(device.type, precision):
        res = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    return [(layer.keys, layer.values) for layer in res.past_key_values.layers]


def _expand_cache(model, kv, batch: int):
    """A fresh DynamicCache holding the shared prefix for `batch` rows."""
    from transformers import DynamicCache

    rows = [(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1)) for k, v in kv]
    return DynamicCache(rows, config=getattr(model, "config", None))


def _prefixed_batches(
    model,
    prompts: list[list[int]],
    batch_size: int,
    pad_id: int,
    precision: str,
    share_prefix: bool,
) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor, object]]:
    """(indices, ids, mask, position ids, cache) per length-grouped batch. Each row is laid out
    as [shared prefix | left padding | the prompt's own tokens]: the prefix's KV cache is
    computed once (batch 1) and expanded into every batch's cache, and `ids` holds only the
    padded own tokens; without a shared prefix the cache is None."""
    device = next(model.parameters()).device
    n_prefix = shared_prefix_len(prompts) if share_prefix else 0
    prefix_kv = _prefix_cache(model, prompts[0][:n_prefix], precision) if n_prefix else None
    for idx in _length_batches([len(p) for p in prompts], batch_size):
        b = len(idx)
        ids, mask, pos = _left_pad([prompts[i][n_prefix:] for i in idx], pad_id, device)
        cache = None
        if prefix_kv is not None:
            cache = _expand_cache(model, prefix_kv, b)
            mask = torch.cat(
                [torch.ones((b, n_prefix), dtype=mask.dtype, device=device), mask], dim=1
            )
            pos = pos + n_prefix
        yield idx, ids, mask, pos, cache


def _feed(model, ids, mask, pos, cache, precision: str):
    """Tokens fed over a batch's KV cache (None: none yet), which grows by them. Only the
    last position's logits are computed: a full [b, T, vocab] logits tensor would cost more
    than the rest of the forward pass on a 49k vocabulary."""
    with autocast(mask.device.type, precision):
        return model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )


@torch.no_grad()
@_head_folded
def score_labels(
    model,
    prompts: list[list[int]],
    label_ids: list[list[int]],
    *,
    batch_size: int = 16,
    pad_id: int = 0,
    precision: str = "fp32",
    progress: Callable[[int], None] | None = None,
    share_prefix: bool = True,
    search: str = "all",
    offsets: np.ndarray | None = None,
    greedy: Greedy | None = None,
) -> np.ndarray:
    """Sum of log-probabilities of each label's tokens (answer + end-of-turn) after each
    prompt -> array [n_prompts, n_labels] in float64. `share_prefix=False` recomputes the
    common prefix in every batch (same result within float rounding; for benchmarks).

    `search="best_first"` scores only the labels the argmax needs (`_best_first`): the
    other entries are NaN, and `np.nanargmax` of a row is the label `search="all"` picks;
    with `offsets` (one per label, calibrated scoring), of the row plus the offsets.
    Attention kernels that cannot take a custom mask score all labels.

    `greedy`: also decode every prompt greedily from the cache its scoring computed (the
    generation check), into `greedy.ids`; the same tokens as `generate` (tested)."""
    device = next(model.parameters()).device
    n_labels = len(label_ids)
    max_lab = max(len(x) for x in label_ids)
    out = np.zeros((len(prompts), n_labels), dtype=np.float64)
    # Label continuation: tokens fed after the prompt are label[:-1]; targets are label[1:].
    lab = torch.full((n_labels, max_lab), pad_id, dtype=torch.long)
    lab_mask = torch.zeros((n_labels, max_lab), dtype=torch.long)
    for j, ids in enumerate(label_ids):
        lab[j, : len(ids)] = torch.tensor(ids)
        lab_mask[j, : len(ids)] = 1
    lab, lab_mask = lab.to(device), lab_mask.to(device)
    first = lab[:, 0]

    masks_4d = takes_4d_masks(model)
    trie = _Trie(label_ids) if masks_4d else None
    tree = _LabelTree(trie, device) if masks_4d else None
    best_first = search == "best_first" and masks_4d

    for idx, ids, mask, pos, cache in _prefixed_batches(
        model, prompts, batch_size, pad_id, precision, share_prefix
    ):
        b = len(idx)
        res = _feed(model, ids, mask, pos, cache, precision)
        logp_first = torch.log_softmax(res.logits[:, -1, :].float(), dim=-1)  # [b, V]
        if greedy is not None:  # decoded on the prompts' cache, which is then cut back to them
            _generation_check(model, greedy, idx, res, mask, pos, precision)
        res.logits = None  # held through the whole search otherwise; the cache is what stays
        if best_first:
            out[idx] = _best_first(model, trie, tree, logp_first, first, res.past_key_values,
                                   mask, pos, precision, pad_id, offsets)  # fmt: skip
            if progress:
                progress(b)
            continue
        total = logp_first[:, first]  # [b, n_labels]
        if tree is not None and tree.size:
            total = total + _score_tree(model, tree, res.past_key_values, mask, pos, precision)
        elif max_lab > 1:
            total = total + _score_repeated(
                model, lab, lab_mask, res.past_key_values, mask, pos, precision
            )
        out[idx] = total.double().cpu().numpy()
        if progress:
            progress(b)
    return out


def _generation_check(model, greedy: Greedy, idx: list[int], res, mask, pos, precision: str):
    """`score_labels`' greedy decoding of a fed batch: free, from the prompts' cache (then cut
    back to the prompts), and constrained to the labels for the rows whose free answer is
    not already one, from a copy of their rows of that cache."""
    cache = res.past_key_values
    t0 = time.perf_counter()
    logits = res.logits[:, -1, :].float()
    free = greedy.decode(model, logits.argmax(dim=-1), cache, mask, pos, precision)
    fed = cache.get_seq_length() - mask.shape[1]
    if fed:  # a negative count removes that many tokens (transformers 5)
        cache.crop(-fed)
    greedy.ids.update(zip(idx, free, strict=True))
    t1 = time.perf_counter()
    greedy.seconds += t1 - t0
    if greedy.choice is None:
        return
    held: list[list[int] | None] = [None] * len(free)
    sel = [r for r, again in enumerate(greedy.choice.to_decode(free, greedy.stopped)) if again]
    if sel:  # those rows alone, over a copy of their cache: the others cost nothing
        at = torch.tensor(sel, dtype=torch.long, device=mask.device)
        got = greedy.decode_constrained(
            model, logits[at], _rows_of(model, cache, at), mask[at], pos[at], precision
        )
        for r, ids in zip(sel, got, strict=True):
            held[r] = ids
    for i, ids, own in zip(idx, free, held, strict=True):
        greedy.constrained[i] = ids if own is None else own
    greedy.constrained_seconds += time.perf_counter() - t1


# Nodes expanded per prompt and pass once the prompt has a complete label: a pass costs a
# fixed overhead plus its tokens, so after the greedy descent the rest goes in few passes.
BEST_FIRST_WIDTH = 32
# What one forward pass costs beyond its tokens, in tokens: on a CPU every pass streams all
# the weights (a 16-row pass of the default model takes 0.3 s, 0.05 s more per 16 tokens).
PASS_OVERHEAD_TOKENS = 64
# Once the search has cost this fraction of the batch's packed tree, the prompts still open
# are scored with the tree: an unsure model (a zero-shot baseline) pays about 1.25 trees.
SWITCH_FRACTION = 0.25


def widest_search_pass(rows: int, tree_tokens: int) -> int:
    """The most nodes a prompt feeds in one best-first pass over `rows` prompts (what the
    memory model sizes the pass's logits by): BEST_FIRST_WIDTH, or fewer where the switch to
    the tree comes first, since a pass runs only while the passes so far, it included, cost
    at most SWITCH_FRACTION of the packed tree (6 labels, 11 trie tokens, 32 rows: 1)."""
    budget = SWITCH_FRACTION * (PASS_OVERHEAD_TOKENS + rows * tree_tokens) - PASS_OVERHEAD_TOKENS
    return max(1, min(BEST_FIRST_WIDTH, tree_tokens, int(budget // max(rows, 1))))


class _Trie:
    """The labels' token sequences as a prefix tree, so labels that start alike share the
    passes over their common tokens. Node 0 is the root; every other node holds one token,
    its parent and its depth (tokens up to and including it); `ends[n]` lists the labels
    whose last token is node n."""

    def __init__(self, label_ids: list[list[int]]):
        self.token, self.parent, self.depth = [-1], [-1], [0]
        self.children: list[dict[int, int]] = [{}]
        self.ends: list[list[int]] = [[]]
        self.paths: list[list[int]] = []  # each label's nodes, first token to last
        for j, lab in enumerate(label_ids):
            node, path = 0, []
            for t in lab:
                if t not in self.children[node]:
                    self.children[node][t] = len(self.token)
                    self.token.append(t)
                    self.parent.append(node)
                    self.depth.append(self.depth[node] + 1)
                    self.children.append({})
                    self.ends.append([])
                node = self.children[node][t]
                path.append(node)
            self.ends[node].append(j)
            self.paths.append(path)
        self.n_labels = len(label_ids)

    def max_below(self, per_label: np.ndarray) -> np.ndarray:
        """Per node, the largest value of `per_label` among the labels ending at or below it
        (-inf where none does)."""
        out = np.full(len(self.token), -np.inf)
        for j, path in enumerate(self.paths):
            for node in path:
                out[node] = max(out[node], per_label[j])
        return out


def _best_first(
    model,
    trie: _Trie,
    tree,
    logp_first,
    first,
    cache,
    mask,
    pos,
    precision: str,
    pad_id: int,
    offsets: np.ndarray | None = None,
) -> np.ndarray:
    """Exact argmax over the labels without scoring them all -> [b, n_labels], NaN where a
    label was not scored.

    A node's score (the log-probabilities of its tokens summed) can only fall as tokens are
    added, so it bounds every label below it. Per prompt, frontier nodes are expanded best
    first, all prompts of the batch in one forward pass over the growing KV cache (each node
    attending to the prompt and its ancestors): one node a pass until the prompt has a
    complete label (a greedy descent, which finds a good bound), then up to BEST_FIRST_WIDTH
    nodes that score at least its best complete label, each with its chain of only children;
    a prompt is done when no frontier node does. Nodes tied with the best are expanded too,
    so ties go to the first label, as np.argmax. Float addition of a non-positive number
    never increases a sum, so the bound holds in floating point as well.

    A model unsure of its answer (a zero-shot base) keeps many nodes above its bound: once
    the passes have cost SWITCH_FRACTION of the packed tree, the prompts not yet decided are
    scored with the tree (every label) instead.

    With `offsets` the argmax is of score + offset (calibrated scoring): a node is then
    bounded by its score plus the largest offset of the labels below it."""
    import heapq

    device = mask.device
    b, width = mask.shape
    scores = np.full((b, trie.n_labels), np.nan)
    best = [-np.inf] * b
    frontier: list[list[tuple[float, int]]] = [[] for _ in range(b)]
    column: list[dict[int, int]] = [{} for _ in range(b)]  # node -> its KV cache column
    last_pos = pos[:, -1].tolist()

    offset = np.zeros(trie.n_labels) if offsets is None else np.asarray(offsets, np.float64)
    bonus = trie.max_below(offset)

    def labels_at(i: int, node: int, score: float) -> None:
        for j in trie.ends[node]:
            scores[i, j] = score
            best[i] = max(best[i], score + offset[j])

    def found(i: int, node: int, score: float) -> None:
        labels_at(i, node, score)
        if trie.children[node]:
            heapq.heappush(frontier[i], (-(score + bonus[node]), node, score))

    first_nodes = list(trie.children[0].values())
    firsts = logp_first[:, [trie.token[n] for n in first_nodes]].double().cpu().numpy()
    for i in range(b):
        for k, node in enumerate(first_nodes):
            found(i, node, float(firsts[i, k]))

    prompt_keys = mask.bool()
    cache_len, spent = width, 0
    while True:
        # Per prompt, the nodes this pass feeds, in order: each popped node followed by its
        # chain of only children (`card` -> `_`: expanding one expands the other), whose
        # scores this same pass computes (`chained`).
        picks: list[list[int]] = []
        score: list[dict[int, float]] = [{} for _ in range(b)]
        chained: list[set[int]] = [set() for _ in range(b)]
        for i in range(b):
            row, popped, limit = [], 0, BEST_FIRST_WIDTH if best[i] > -np.inf else 1
            while frontier[i] and popped < limit and -frontier[i][0][0] >= best[i]:
                _, node, node_score = heapq.heappop(frontier[i])
                row.append(node)
                score[i][node], popped = node_score, popped + 1
                while len(trie.children[node]) == 1:
                    (node,) = trie.children[node].values()
                    if not trie.children[node]:
                        break
                    row.append(node)
                    chained[i].add(node)
            picks.append(row)
        k = max(len(row) for row in picks)
        if k == 0:
            return scores
        open_rows = [i for i, row in enumerate(picks) if row]
        spent += PASS_OVERHEAD_TOKENS + b * k
        if spent > SWITCH_FRACTION * (PASS_OVERHEAD_TOKENS + b * tree.size):
            cache.crop(width - cache_len)  # back to the prompts' own cache (a negative count)
            cache.batch_select_indices(torch.tensor(open_rows, device=device))
            total = logp_first[open_rows][:, first] + _score_tree(
                model, tree, cache, mask[open_rows], pos[open_rows], precision
            )
            scores[open_rows] = total.double().cpu().numpy()
            return scores
        ids = torch.full((b, k), pad_id, dtype=torch.long)
        node_pos = torch.zeros((b, k), dtype=torch.long)
        allowed = torch.zeros((b, 1, k, cache_len + k), dtype=torch.bool)
        allowed[:, 0, torch.arange(k), cache_len + torch.arange(k)] = True  # itself (pads too)
        for i, row in enumerate(picks):
            for s, node in enumerate(row):
                column[i][node] = cache_len + s
            for s, node in enumerate(row):
                ids[i, s] = trie.token[node]
                node_pos[i, s] = last_pos[i] + trie.depth[node]
                a = trie.parent[node]
                while a:
                    allowed[i, 0, s, column[i][a]] = True
                    a = trie.parent[a]
        allowed = allowed.to(device)
        for i, row in enumerate(picks):  # real nodes see the prompt; pad slots only themselves
            allowed[i, 0, : len(row), :width] = prompt_keys[i]
        attn = _mask_for(model, allowed)
        with autocast(device.type, precision):
            res = model(
                input_ids=ids.to(device),
                attention_mask=attn,
                position_ids=node_pos.to(device),
                past_key_values=cache,
                use_cache=True,
            )
        cache, cache_len = res.past_key_values, cache_len + k
        logp = torch.log_softmax(res.logits.float(), dim=-1)  # [b, k, V]
        del res  # its logits: not held beside the next pass's, nor the tree's
        where = [  # (prompt, slot, node, child, child's token) for every child of a fed node
            (i, s, node, child, t)
            for i, row in enumerate(picks)
            for s, node in enumerate(row)
            for t, child in trie.children[node].items()
        ]
        at = torch.tensor(where, dtype=torch.long, device=device)
        vals = logp[at[:, 0], at[:, 1], at[:, 4]].double().cpu().tolist()
        del logp
        # In slot order: a chained node's score is set (at its parent's slot) before its
        # own children's are computed from it.
        for (i, _, node, child, _), v in zip(where, vals, strict=True):
            sc = score[i][node] + v
            if child in chained[i]:
                score[i][child] = sc
                labels_at(i, child, sc)
            else:
                found(i, child, sc)


class _LabelTree:
    """Every label's continuation packed side by side in one row, as the trie's nodes that
    have children (labels that start alike share theirs), each node seeing the prompt and
    its ancestors only. One short pass per prompt scores all labels, instead of copying the
    prompt's KV cache once per label; each label's log-probabilities are then gathered at
    its path's nodes (`pair_slot`, `pair_target`) and summed per label (`segments`)."""

    def __init__(self, trie: _Trie, device):
        nodes = [n for n in range(1, len(trie.token)) if trie.children[n]]
        slot = {n: i for i, n in enumerate(nodes)}
        causal = torch.zeros((len(nodes), len(nodes)), dtype=torch.bool)
        for n in nodes:
            a = n
            while a:
                causal[slot[n], slot[a]] = True
                a = trie.parent[a]
        pair_slot, pair_target, owner = [], [], []
        for j, path in enumerate(trie.paths):
            for k in range(len(path) - 1):
                pair_slot.append(slot[path[k]])
                pair_target.append(trie.token[path[k + 1]])
                owner.append(j)
        segments = torch.zeros((len(owner), trie.n_labels), dtype=torch.float32)
        segments[torch.arange(len(owner)), torch.tensor(owner, dtype=torch.long)] = 1.0

        def t(x):
            return torch.tensor(x, dtype=torch.long, device=device)

        self.ids, self.offsets = (
            t([trie.token[n] for n in nodes]),
            t([trie.depth[n] - 1 for n in nodes]),
        )
        self.pair_slot, self.pair_target = t(pair_slot), t(pair_target)
        self.causal, self.segments = causal.to(device), segments.to(device)
        self.size = len(nodes)


def tree_size(label_ids: list[list[int]]) -> int:
    """Tokens of the packed label tree: the label trie's nodes that have children."""
    trie = _Trie(label_ids)
    return sum(1 for n in range(1, len(trie.token)) if trie.children[n])


def _mask_for(model, allowed: torch.Tensor) -> torch.Tensor:
    """A boolean 4D mask (True = attend) as the model's attention takes it: sdpa as it is,
    eager as an additive one (it adds the mask to the scores)."""
    if model.config._attn_implementation != "eager":
        return allowed
    dtype = next(model.parameters()).dtype
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(dtype).min
    )


def takes_4d_masks(model) -> bool:
    """sdpa and eager attention take a custom 4D mask as it is; others (flash) need 2D."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return impl in ("sdpa", "eager")


def _score_tree(model, tree: _LabelTree, cache, mask, pos, precision: str) -> torch.Tensor:
    """Sum of log-probabilities of every label's tokens after the first -> [b, n_labels]."""
    b, n = mask.shape[0], tree.size
    keys = mask.bool()[:, None, None, :].expand(b, 1, n, mask.shape[1])
    allowed = torch.cat([keys, tree.causal.expand(b, 1, n, n)], dim=-1)  # True = attend
    allowed = _mask_for(model, allowed)
    device = mask.device
    with autocast(device.type, precision):
        res = model(
            input_ids=tree.ids.expand(b, n),
            attention_mask=allowed,
            position_ids=pos[:, -1:] + 1 + tree.offsets,
            past_key_values=cache,
            use_cache=True,
        )
    # one prompt at a time: [n, V] in fp32 is 73 MB for 371 nodes of a 49k vocabulary, where
    # the whole batch's [b, n, V] (with its log_softmax) held 4.6 GB at once for 32 prompts
    tok = torch.stack(
        [
            torch.log_softmax(res.logits[i].float(), dim=-1)[tree.pair_slot, tree.pair_target]
            for i in range(b)
        ]
    )  # [b, label tokens after the first]
    return tok @ tree.segments


def _score_repeated(model, lab, lab_mask, cache, mask, pos, precision: str) -> torch.Tensor:
    """The same sums for attention kernels without custom masks: the prompt's cache is
    repeated once per label and the labels fed as a padded batch -> [b, n_labels]."""
    device = mask.device
    b, n_labels, max_lab = mask.shape[0], lab.shape[0], lab.shape[1]
    cache.batch_repeat_interleave(n_labels)
    feed = lab[:, :-1].repeat(b, 1)  # [b*L, max_lab-1]
    feed_mask = lab_mask[:, :-1].repeat(b, 1)
    full_mask = torch.cat([mask.repeat_interleave(n_labels, 0), feed_mask], dim=1)
    start = pos[:, -1:].repeat_interleave(n_labels, 0) + 1
    feed_pos = start + torch.arange(max_lab - 1, device=device)
    with autocast(device.type, precision):
        res = model(
            input_ids=feed,
            attention_mask=full_mask,
            position_ids=feed_pos,
            past_key_values=cache,
            use_cache=True,
        )
    logp = torch.log_softmax(res.logits.float(), dim=-1)  # [b*L, T-1, V]
    tgt = lab[:, 1:].repeat(b, 1)
    tok_lp = logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1) * lab_mask[:, 1:].repeat(b, 1)
    return tok_lp.sum(-1).view(b, n_labels)


@torch.no_grad()
def score_labels_reference(
    model, prompts: list[list[int]], label_ids: list[list[int]]
) -> np.ndarray:
    """Slow reference: one unbatched forward pass per (prompt, label). For tests only."""
    device = next(model.parameters()).device
    out = np.zeros((len(prompts), len(label_ids)))
    for i, p in enumerate(prompts):
        for j, lab in enumerate(label_ids):
            ids = torch.tensor([p + lab], device=device)
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
            out[i, j] = sum(logp[len(p) - 1 + k, t].item() for k, t in enumerate(lab))
    return out


@torch.no_grad()
@_head_folded
def generate(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    stop_ids: list[int],
    pad_id: int,
    batch_size: int = 16,
    precision: str = "fp32",
    progress: Callable[[int], None] | None = None,
    share_prefix: bool = True,
    alive: Callable[[list[int]], bool] | None = None,
) -> list[list[int]]:
    """Greedy decoding with the KV cache, stopping at end-of-turn -> generated ids per prompt
    (stop token excluded). `alive(ids so far)` False ends a row there (its ids kept up to
    and including that token): the generation check stops an answer that can no longer be
    a label, and a batch once every row has ended.

    A plain loop rather than `model.generate`: greedy decoding is an argmax per step, and
    owning the loop lets generation reuse the shared-prefix cache exactly as scoring does
    (an extraction prompt's instructions are most of it) and stop a batch as soon as
    every row has ended. Same tokens as `model.generate(do_sample=False)` (tested).
    `share_prefix=False` recomputes the common prefix in every batch (for benchmarks)."""
    outs: list[list[int]] = [[] for _ in prompts]
    greedy = Greedy(max_new_tokens, stop_ids, alive)
    for idx, ids, mask, pos, cache in _prefixed_batches(
        model, prompts, batch_size, pad_id, precision, share_prefix
    ):
        res = _feed(model, ids, mask, pos, cache, precision)
        first = res.logits[:, -1, :].float().argmax(dim=-1)  # [b]
        for i, toks in zip(idx, greedy.decode(model, first, res.past_key_values, mask, pos,
                                              precision), strict=True):  # fmt: skip
            outs[i] = toks
        if progress:
            progress(len(idx))
    return outs


@dataclass
class Greedy:
    """Greedy decoding to a stop token, `max_new_tokens` at most; `alive(ids so far)` False
    ends a row there (its ids kept up to and including that token). Given to `score_labels`,
    it decodes every prompt from the KV cache scoring computed (the generation check: no
    second pass over the prompts) and fills `ids` in prompt order; with `choice` (a
    `served.LabelChoice`), also decodes each prompt constrained to the labels' text into
    `constrained` (where the free answer is a label ended by a stop token, the constrained
    one is the same: each of its tokens was allowed and the likeliest)."""

    max_new_tokens: int
    stop_ids: list[int]
    alive: Callable[[list[int]], bool] | None = None
    choice: Any = None  # served.LabelChoice: the constrained pass
    ids: dict[int, list[int]] = field(default_factory=dict)  # prompt index -> generated
    constrained: dict[int, list[int]] = field(default_factory=dict)
    seconds: float = 0.0  # the free decoding's own time, inside scoring's
    constrained_seconds: float = 0.0
    stopped: list[bool] = field(default_factory=list)  # the last decode: ended at a stop token

    def decode(self, model, first, cache, mask, pos, precision: str) -> list[list[int]]:
        """Continue a fed batch: `first` [b] is each row's argmax after its prompt, `cache`
        holds the prompts (and grows here: the caller crops it if it goes on using it)."""
        device, b = first.device, first.shape[0]
        stop_set = set(self.stop_ids)
        stop = torch.tensor(sorted(stop_set), dtype=torch.long, device=device)
        ended = torch.zeros(b, dtype=torch.bool, device=device)
        steps: list[torch.Tensor] = []  # a row's tokens after its stop token are cut below
        so_far: list[list[int]] = [[] for _ in range(b)]
        cut = [self.max_new_tokens] * b  # alive: a row's length where it was ended
        nxt = first
        for step in range(self.max_new_tokens):
            steps.append(nxt)
            stopped = torch.isin(nxt, stop)
            if self.alive is not None:
                done, dead = (ended | stopped).tolist(), []
                for row, t in enumerate(nxt.tolist()):
                    if not done[row]:
                        so_far[row].append(t)
                        if not self.alive(so_far[row]):
                            cut[row] = len(so_far[row])
                            dead.append(row)
                if dead:
                    stopped[dead] = True
            ended |= stopped
            if bool(ended.all()) or step == self.max_new_tokens - 1:
                break
            mask, pos, cache, logits = _step(model, nxt, mask, pos, cache, precision)
            nxt = logits.argmax(dim=-1)
        gen = torch.stack(steps, dim=1).tolist() if steps else [[] for _ in range(b)]
        out, self.stopped = [], []
        for row in range(b):
            toks, at_stop = [], False
            for t in gen[row][: cut[row]]:
                if t in stop_set:
                    at_stop = True
                    break
                toks.append(t)
            out.append(toks)
            self.stopped.append(at_stop)
        return out

    def decode_constrained(
        self, model, logits, cache, mask, pos, precision: str
    ) -> list[list[int]]:
        """Decode every row of a fed batch greedily among the tokens `self.choice` allows
        (`logits` [b, V]: after each prompt) -> ids per row. A row ends at a stop token or
        once its answer is a label no other label continues; `cache` grows."""
        b, device = logits.shape[0], logits.device
        choice, allowed_t = self.choice, {}
        said = [b""] * b
        out: list[list[int]] = [[] for _ in range(b)]
        open_ = [True] * b
        for step in range(self.max_new_tokens):
            nxt = [0] * b  # what a closed row feeds: its outputs are unused
            for r in range(b):
                if not open_[r]:
                    continue
                allowed = choice.allowed(said[r])
                if not allowed:  # a vocabulary that cannot spell the rest: no label
                    open_[r] = False
                    continue
                if said[r] not in allowed_t:
                    allowed_t[said[r]] = torch.tensor(allowed, dtype=torch.long, device=device)
                t = allowed[int(logits[r, allowed_t[said[r]]].argmax())]
                if t in self.stop_ids:
                    open_[r] = False
                    continue
                out[r].append(t)
                said[r] += choice.vocab[t]
                nxt[r] = t
                open_[r] = not choice.complete(said[r])
            if not any(open_) or step == self.max_new_tokens - 1:
                break
            ids = torch.tensor(nxt, dtype=torch.long, device=device)
            mask, pos, cache, logits = _step(model, ids, mask, pos, cache, precision)
        return out


def _rows_of(model, cache, rows: torch.Tensor):
    """A new cache holding only `rows` of `cache` (copied: the original is left as it is)."""
    from transformers import DynamicCache

    kv = [(layer.keys[rows], layer.values[rows]) for layer in cache.layers]
    return DynamicCache(kv, config=getattr(model, "config", None))


def _step(model, nxt, mask, pos, cache, precision: str):
    """One decoding step: feed each row's token `nxt` [b] -> (mask, pos, cache, logits [b, V])."""
    one = torch.ones((mask.shape[0], 1), dtype=mask.dtype, device=mask.device)
    mask = torch.cat([mask, one], dim=1)
    pos = pos[:, -1:] + 1
    res = _feed(model, nxt[:, None], mask, pos, cache, precision)
    return mask, pos, res.past_key_values, res.logits[:, -1, :].float()
