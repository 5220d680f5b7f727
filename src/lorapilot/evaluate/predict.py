"""Model-facing evaluation: label scoring and batched greedy generation.

Both take token ids built by `data.format` (the evaluation prompt is the training prompt minus
the answer) so there is exactly one definition of what the model sees.

Label scoring computes each prompt once and reuses its KV cache for every label: for a
6-label task that is one long forward pass and one short one per batch, instead of six long
ones. Batches are grouped by length and prompts are left-padded with explicit position ids,
so results do not depend on the batch size or on padding (tested).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import numpy as np
import torch


def autocast_ctx(device: torch.device, precision: str):
    """bf16/fp16 autocast (also on CPU, where AMX makes bf16 matmul several times faster)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def _length_batches(lengths: list[int], batch_size: int) -> Iterator[list[int]]:
    """Indices grouped by length (longest first), so little compute goes to padding."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size]


def _left_pad(seqs: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded ids, attention mask and position ids that start at 0 on the first real token."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), pos.to(device)


@torch.no_grad()
def score_labels(
    model,
    prompts: list[list[int]],
    label_ids: list[list[int]],
    *,
    batch_size: int = 16,
    pad_id: int = 0,
    precision: str = "fp32",
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Sum of log-probabilities of each label's tokens (answer + end-of-turn) after each
    prompt -> array [n_prompts, n_labels] in float64."""
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

    for idx in _length_batches([len(p) for p in prompts], batch_size):
        b = len(idx)
        ids, mask, pos = _left_pad([prompts[i] for i in idx], pad_id, device)
        with autocast_ctx(device, precision):
            # Only the last position's logits are needed: a full [b, T, vocab] logits tensor
            # would cost more than the rest of the forward pass on a 49k vocabulary.
            res = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        logp_first = torch.log_softmax(res.logits[:, -1, :].float(), dim=-1)  # [b, V]
        total = logp_first[:, first]  # [b, n_labels]
        if max_lab > 1:
            cache = res.past_key_values
            cache.batch_repeat_interleave(n_labels)
            feed = lab[:, :-1].repeat(b, 1)  # [b*L, max_lab-1]
            feed_mask = lab_mask[:, :-1].repeat(b, 1)
            full_mask = torch.cat([mask.repeat_interleave(n_labels, 0), feed_mask], dim=1)
            start = pos[:, -1:].repeat_interleave(n_labels, 0) + 1
            feed_pos = start + torch.arange(max_lab - 1, device=device)
            with autocast_ctx(device, precision):
                res2 = model(input_ids=feed, attention_mask=full_mask, position_ids=feed_pos,
                             past_key_values=cache, use_cache=True)
            logp = torch.log_softmax(res2.logits.float(), dim=-1)  # [b*L, T-1, V]
            tgt = lab[:, 1:].repeat(b, 1)
            tok_lp = logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1) * lab_mask[:, 1:].repeat(b, 1)
            total = total + tok_lp.sum(-1).view(b, n_labels)
        out[idx] = total.double().cpu().numpy()
        if progress:
            progress(b)
    return out


@torch.no_grad()
def score_labels_reference(model, prompts: list[list[int]], label_ids: list[list[int]]) -> np.ndarray:
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
) -> list[list[int]]:
    """Greedy decoding with the KV cache, stopping at end-of-turn -> generated ids per prompt
    (stop token excluded)."""
    device = next(model.parameters()).device
    outs: list[list[int]] = [[] for _ in prompts]
    stop = set(stop_ids)
    for idx in _length_batches([len(p) for p in prompts], batch_size):
        ids, mask, _ = _left_pad([prompts[i] for i in idx], pad_id, device)
        with autocast_ctx(device, precision):
            gen = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                eos_token_id=list(stop), pad_token_id=pad_id, num_beams=1,
            )
        for row, i in enumerate(idx):
            toks = []
            for t in gen[row, ids.shape[1]:].tolist():
                if t in stop:
                    break
                toks.append(t)
            outs[i] = toks
        if progress:
            progress(len(idx))
    return outs
