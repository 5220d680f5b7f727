"""The training loss: the summed token cross-entropy of a causal LM with the head applied at
the target positions only, and the same loss with the prompt prefix the rows of a micro-batch
share computed once. Training, the probe, the update audit and the smoke all take their loss
from here (`loss_fn_for` picks the path), so their losses cannot drift apart."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from lorapilot.data.format import IGNORE_INDEX
from lorapilot.spec import TrainSpec
from lorapilot.train.batches import Batch

# Config keys that rescale or transform logits after the LM head. The chunked loss applies
# the head alone, so a model with one of these set takes the full-logits path instead.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def _decoder_and_head(model) -> tuple[Any, Any]:
    """(decoder, lm_head) of a causal LM, plain or PEFT-wrapped; (None, None) if not found."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    prefix = getattr(base, "base_model_prefix", None)
    decoder = getattr(base, prefix, None) if prefix else None
    get_head = getattr(base, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if decoder is None or head is None or decoder is base:
        return None, None
    config = getattr(base, "config", None)
    for key in _LOGIT_TRANSFORMS:
        value = getattr(config, key, None)
        if value not in (None, 1, 1.0):
            return None, None
    return decoder, head


def _head_loss_sum(head, hidden: torch.Tensor, labels: torch.Tensor):
    """(float32 cross-entropy sum, target count) of the head applied at the target positions
    only: position t predicts token t+1, so targets are labels shifted left by one."""
    labels = labels[:, 1:]
    mask = labels != IGNORE_INDEX
    selected = head(hidden[:, :-1][mask])
    return F.cross_entropy(selected.float(), labels[mask], reduction="sum"), mask.sum()


def causal_lm_loss_sum(model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of token cross-entropies in float32, number of target tokens).

    Position t predicts token t+1, so targets are labels shifted left by one. The LM head
    is applied only at positions with a target: for classification that is a handful of
    tokens per example, and the head over a 49k vocabulary at every position would be
    most of the step's compute and memory. Equal to the standard full-logits loss.
    """
    decoder, head = _decoder_and_head(model)
    if decoder is None:  # no separable head: full logits, still selected before the upcast
        labels = batch["labels"][:, 1:]
        mask = labels != IGNORE_INDEX
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
        ).logits
        selected = logits[:, :-1][mask]
        return F.cross_entropy(selected.float(), labels[mask], reduction="sum"), mask.sum()
    hidden = decoder(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    ).last_hidden_state
    return _head_loss_sum(head, hidden, batch["labels"])


@torch.no_grad()
def greedy_reproduces(model, batch: Batch, min_p: float = 0.0) -> torch.Tensor:
    """Per row: is the model's most likely token at every target position the target, with
    probability `min_p` or more? The first is exactly when greedy decoding from the prompt
    writes the target (by induction over its tokens), so the smoke can stop training as soon
    as it holds for every example, at the cost of one forward pass, instead of trusting a
    mean loss that can hide one wrong token. `min_p` asks for a margin the evaluation's own
    numerics cannot flip (see MEMORISED_P)."""
    labels = batch["labels"][:, 1:]
    mask = labels != IGNORE_INDEX
    decoder, head = _decoder_and_head(model)
    kw = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
    if decoder is None:
        logits = model(**kw).logits[:, :-1][mask]
    else:
        logits = head(decoder(**kw).last_hidden_state[:, :-1][mask])
    wanted = labels[mask]
    hit = logits.argmax(-1) == wanted
    if min_p > 0:
        p = logits.float().softmax(-1).gather(-1, wanted[:, None]).squeeze(-1)
        hit &= p >= min_p
    ok = torch.ones_like(labels, dtype=torch.bool)
    ok[mask] = hit
    return ok.all(dim=1)


MEMORISED_P = 0.9
"""A target the smoke counts as memorised has every token at probability 0.9 or more: then
no other token has over 0.1, a margin of ln 9 = 2.2 logits that rounding cannot flip. A bare
argmax can sit on a near-tie that the evaluation's numerics (its dtype, weights cast once, no
autocast) flip: on NLU++ one of 48 examples passed the check under bf16 autocast, then
stopped one label short, ', ' against the end of turn, in the evaluation."""


MIN_SHARED_PREFIX = 8  # tokens; below this the second forward costs more than it saves


def shared_prefix_len(batch: Batch) -> int:
    """Tokens every row of a right-padded batch starts with (real tokens, not padding),
    leaving each row at least one token of its own."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    if ids.shape[0] < 2:
        return 0
    same = ((ids == ids[:1]) & (mask == 1)).all(dim=0)
    n = int(same.long().cumprod(0).sum())
    return max(0, min(n, int(mask.sum(dim=1).min()) - 1))


# On a GPU the shared path's second decoder pass costs its kernel launches, which at LoRA
# micro-batch sizes take longer than the arithmetic: on an H200 (bench/prefix_paths.py,
# randomly initialised 135M-8B Llama shapes) the shared step was 0.46-0.92x the unshared one
# wherever the prefix tokens it spares, times the parameters of one decoder layer, stayed
# at or below 6.9e11, and 1.65-1.84x where that work was 9.4e11 or more. `auto` shares on a GPU
# from this much spared work per layer; on a CPU it always does (1.2-5x faster there).
GPU_MIN_SPARED_WORK = 8e11


def _layer_params(decoder, config) -> float:
    """Parameters of one decoder layer: everything but the embeddings, over the layer count
    (a 4-bit weight counted by its unpacked shape). Counted once per decoder: it is asked
    for every micro-batch."""
    cached = decoder.__dict__.get("_lorapilot_layer_params")
    if cached is not None:
        return cached

    def numel(p) -> int:
        state = getattr(p, "quant_state", None)
        return math.prod(state.shape) if state is not None else p.numel()

    layers = getattr(config, "num_hidden_layers", None) or 1
    body = sum(numel(p) for name, p in decoder.named_parameters() if "embed" not in name)
    decoder.__dict__["_lorapilot_layer_params"] = body / layers
    return body / layers


def prefix_path(model, batch: Batch, setting: str = "on") -> tuple[str, str]:
    """("shared", why) when `shared_prefix_loss_sum` computes this batch's prefix once under
    `train.shared_prefix: setting` ("on" or "auto"), else ("unshared", why): what the run
    record says ran."""
    path, why, _ = prefix_decision(model, batch, setting)
    return path, why


def prefix_decision(model, batch: Batch, setting: str) -> tuple[str, str, int]:
    """`prefix_path` and the shared prefix length it found, for callers that need both (the
    loss, the loop's record, the probe): the length is counted once (a host sync on a GPU)."""
    decoder, _ = _decoder_and_head(model)
    if decoder is None:
        return "unshared", "no separable decoder and head", 0
    n = shared_prefix_len(batch)
    if n < MIN_SHARED_PREFIX:
        return "unshared", f"rows share {n} tokens (< {MIN_SHARED_PREFIX})", n
    config = getattr(decoder, "config", None)
    if _replayable_cache(None, 0, config) is None:
        why = "the model's cache layers are not plain dynamic ones (sliding window?)"
        return "unshared", why, n
    rows = batch["input_ids"].shape[0]
    if setting == "auto" and next(decoder.parameters()).device.type != "cpu":
        spared = (rows - 1) * n * _layer_params(decoder, config)
        if spared < GPU_MIN_SPARED_WORK:
            why = (
                f"on a GPU, {rows} rows sharing {n} tokens spare {spared:.2g} token-parameters "
                f"a layer (< {GPU_MIN_SPARED_WORK:.0e}): less than the second decoder pass "
                "costs; train.shared_prefix: on forces it"
            )
            return "unshared", why, n
    return "shared", f"{n} shared prefix tokens computed once for {rows} rows", n


def _replayable_cache(prefix_kv: list[tuple[torch.Tensor, torch.Tensor]] | None, rows: int, config):
    """A transformers cache whose `update` gives the same answer however often it is called.

    Activation checkpointing replays each layer's forward during backward; the stock
    DynamicCache appends on every call, so a replay would see its keys twice. Without
    `prefix_kv` (the prefix pass) update records each layer's keys and values (the first
    call's: not a replay's) and returns them. With it (the rows' pass) update returns the prefix's
    keys and values, expanded to `rows` (a view, not a copy), followed by the new ones, and
    stores nothing; the cache's layers hold one-wide stand-ins with the prefix's length,
    for the masks.
    None when the model's cache layers are not the plain dynamic kind (sliding windows,
    hybrid caches): those take the unshared path.
    """
    from transformers.cache_utils import DynamicLayer

    # The cache's layers only give the masks their lengths: one-wide stand-ins of the
    # prefix's keys and values ([1, heads, n, 1]; an empty one would count as no prefix) say
    # n without a copy of the whole prefix (the layers concatenate what they are given).
    lengths = [(k.detach()[..., :1], v.detach()[..., :1]) for k, v in prefix_kv or []]
    cache = _replayable_cache_class()(lengths or None, config=config)
    cache.prefix_kv, cache.rows, cache.captured = prefix_kv, rows, {}
    if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    return cache


@functools.cache
def _replayable_cache_class():
    """One class for every call (`train.compile` guards on the cache's type: a class made per
    call would recompile the decoder at every step)."""
    from transformers import DynamicCache

    class ReplayableCache(DynamicCache):
        prefix_kv: list | None = None
        rows: int = 0

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            if self.prefix_kv is None:
                # The first record only: a checkpointed layer's replay during backward calls
                # this again, and its keys and values would keep the replay's whole graph
                # (every tensor it saved) alive until the step ends.
                self.captured.setdefault(layer_idx, (key_states, value_states))
                return key_states, value_states
            keys, values = (t.expand(self.rows, -1, -1, -1) for t in self.prefix_kv[layer_idx])
            return torch.cat([keys, key_states], dim=-2), torch.cat([values, value_states], dim=-2)

    return ReplayableCache


@contextlib.contextmanager
def _checkpointing_keeps_cache(decoder):
    """transformers drops `past_key_values` in a checkpointed layer (a replay would append
    to the cache twice) unless the layer says it may keep it; with a replayable cache it
    may, for the duration of the shared-prefix loss. Yields whether any layer checkpoints."""
    layers = [m for m in decoder.modules() if getattr(m, "gradient_checkpointing", False)]
    before = [m.__dict__.get("_can_checkpoint_with_cache") for m in layers]
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield bool(layers)
    finally:
        for layer, value in zip(layers, before, strict=True):
            if value is None:
                del layer._can_checkpoint_with_cache
            else:
                layer._can_checkpoint_with_cache = value


def shared_prefix_loss_sum(
    model, batch: Batch, setting: str = "on"
) -> tuple[torch.Tensor, torch.Tensor]:
    """causal_lm_loss_sum, with the prompt prefix every row shares run once.

    The prefix (chat header, system prompt, start of the template) goes through the decoder
    once with batch size 1, keeping its keys and values; those are broadcast (expanded, not
    copied) to the rows, whose own tokens run on top at positions after the prefix. Backward
    goes through the prefix once, and the broadcast sums the rows' gradients into it: the
    LoRA weights get exactly the gradient they would get if every row carried its own copy
    (the same arithmetic, in another order: equal within float rounding). Positions inside
    the prefix that carry loss (`loss_on: all`) are scored for every row, as in the unshared
    form. Under activation checkpointing (non-reentrant, as the loop enables it) both passes
    are replayed in backward through a cache that a replay cannot change. Falls back to
    causal_lm_loss_sum where `prefix_path` says so (the rows share too little, the model's
    cache is of another kind, or under `auto` on a GPU the batch spares too little work).
    """
    path, _, n = prefix_decision(model, batch, setting)
    if path != "shared":
        return causal_lm_loss_sum(model, batch)
    decoder, head = _decoder_and_head(model)
    config = getattr(decoder, "config", None)
    capture = _replayable_cache(None, 0, config)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    rows, width = ids.shape
    # use_cache=False: the layers use the cache they are given either way, and under
    # checkpointing transformers would turn use_cache off itself, with a warning (a graph break
    # under torch.compile). The prefix pass records its keys and values in the cache, a side
    # effect torch.compile cannot trace inside checkpointing: it then runs eagerly.
    with _checkpointing_keeps_cache(decoder) as checkpointed:
        # torch.compile's stance: a no-op for a decoder that is not compiled
        with torch.compiler.set_stance("force_eager") if checkpointed else contextlib.nullcontext():
            prefix = decoder(input_ids=ids[:1, :n], past_key_values=capture, use_cache=False)
        kv = [capture.captured.get(i) for i in range(len(capture.layers))]
        if None in kv:  # a layer that keeps no keys and values (shared across layers)
            return causal_lm_loss_sum(model, batch)
        positions = torch.arange(n, width, device=ids.device).expand(rows, -1)
        own = decoder(
            input_ids=ids[:, n:],
            attention_mask=mask,
            position_ids=positions,
            past_key_values=_replayable_cache(kv, rows, config),
            use_cache=False,
        ).last_hidden_state
    return _shared_head_loss_sum(head, prefix.last_hidden_state, own, batch["labels"])


def _shared_head_loss_sum(head, prefix: torch.Tensor, own: torch.Tensor, labels: torch.Tensor):
    """`_head_loss_sum` over the prefix's hidden states (one row, [1, n, d]) followed by every
    row's own ([rows, width - n, d]), without concatenating them into [rows, width, d]: the
    targets are selected from each part (a prefix position only under `loss_on: all`), in
    the order `_head_loss_sum` takes them."""
    n = prefix.shape[1]
    labels = labels[:, 1:]
    mask = labels != IGNORE_INDEX
    rows, positions = mask.nonzero(as_tuple=True)  # row-major, as boolean indexing selects
    in_prefix = positions < n
    selected = torch.where(
        in_prefix[:, None],
        prefix[0, positions.clamp(max=n - 1)],
        own[rows, (positions - n).clamp(min=0)],
    )
    return F.cross_entropy(head(selected).float(), labels[mask], reduction="sum"), mask.sum()


def loss_fn_for(cfg: TrainSpec) -> tuple[Callable, tuple[str, str]]:
    """The loss a training step uses, and ("shared" | "unshared", why): the loop (one process,
    DDP, FSDP; checkpointing on or off), the update audit and the probe take the same path.
    Under "on" and "auto" each micro-batch is decided by `prefix_path(model, batch, mode)`."""
    if cfg.shared_prefix == "off":
        return causal_lm_loss_sum, ("unshared", "train.shared_prefix: off")
    return functools.partial(shared_prefix_loss_sum, setting=cfg.shared_prefix), (
        "shared",
        "micro-batches whose rows share a prefix run it once",
    )


class LossModule(torch.nn.Module):
    """DDP only synchronises gradients for work done inside its own forward; the chunked
    loss calls the decoder and the head separately, so under DDP the whole loss is made
    one module's forward and that module is what DDP wraps."""

    def __init__(self, model, loss_sum: Callable | None = None):
        super().__init__()
        self.model = model
        self.loss_sum = loss_sum or causal_lm_loss_sum

    def forward(self, batch: Batch):
        return self.loss_sum(self.model, batch)


def call_module(module, batch: Batch):
    return module(batch)
