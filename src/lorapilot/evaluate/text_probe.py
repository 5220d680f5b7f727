"""The embedding-classifier alternative of a text classification pilot: a logistic regression
on the frozen base's features of each prompt (`baseline --linear-probe`, `eval.linear_probe`).

Before renting a GPU to adapt a model, a team can classify with the base as an encoder: one
forward pass per document, a linear classifier fitted on the training split. The adapter must
beat that too, not only the zero-shot prompt. The classifier is the image baseline's
(`evaluate/linear_probe.py`: standardised features, L2, full-batch L-BFGS, deterministic);
the features are what the LM head reads where the answer would begin: the final hidden state
(after the last norm) at the prompt's last token, the prompt exactly as the evaluation builds
it (template, cut to `data.max_length`). Rows and metrics are the label scoring's
(`runner.score_predictions`), the logits in place of the label scores, so the bootstrap, the
report and `compare` read them as any classification's. A multi-label task gets one binary
probe per label (one-vs-rest): the labels whose probability reaches 0.5, or the likeliest one
when none does (every example has a label), written as the answer an adapter writes, so its
rows are parsed and scored as the adapter's are.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lorapilot.data.rows import Record
from lorapilot.errors import UsageError
from lorapilot.evaluate.feature_cache import cached, keep
from lorapilot.evaluate.label_issues import suspect_labels
from lorapilot.evaluate.linear_probe import L2, MAX_ITER, fit_linear_probe
from lorapilot.evaluate.runner import EvalResult, score_predictions
from lorapilot.records.progress import Phase
from lorapilot.spec import PilotSpec
from lorapilot.spec.task import LABEL_SEPARATOR

FEATURES = (
    "the final hidden state (after the last norm) at the prompt's last token: what the LM "
    "head reads where the answer begins; the frozen base, no adapter"
)
PROTOCOL = {"features": "last prompt token, final norm", "classifier": "logistic regression",
            "l2": L2, "fitted_on": "train"}  # fmt: skip
"""What the eval protocol adds for the probe: the zero-shot protocol's prompts, read so."""
THRESHOLD = 0.5  # multi-label: a label is named when its own probe gives it at least this


def protocol_of(task: Any) -> dict:
    """PROTOCOL, with the one-vs-rest rule for a multi-label task."""
    if not task.multi_label:
        return PROTOCOL
    return {**PROTOCOL, "classifier": "one-vs-rest logistic regression", "threshold": THRESHOLD}


def refuse(spec: PilotSpec, shots: int, adapter: bool) -> None:
    """`--linear-probe` where it has no meaning: exit 2 saying why, before any model loads."""
    why = None
    if spec.task.modality == "image":
        why = "an image pilot's baseline already is a linear probe on the frozen features"
    elif not spec.task.labelled:
        why = (
            "a logistic regression on the base's features picks from task.labels; this "
            f"pilot's task.kind is {spec.task.kind} (classification and multi-label only)"
        )
    elif shots:
        why = "it reads the zero-shot prompt's features; --shots prompts the base instead"
    elif adapter:
        why = "it is an alternative to adapting, fitted on the frozen base's features"
    if why:
        raise UsageError(f"--linear-probe: {why}")


def prompt_features(
    model: Any,
    fmt: Any,
    pad_id: int,
    records: list[Record],
    answer_budget: int,
    precision: str,
    batch_size: int,
    tick: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, list[list[int]], list[int]]:
    """(n, hidden) float64 features of every record's evaluation prompt, in order, with the
    prompts' ids and the input tokens cut to fit. Batches of similar length, right-padded:
    a causal decoder's state at a real token never sees the padding after it."""
    import torch

    from lorapilot.base.precision import autocast

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder()
    device = next(base.parameters()).device
    prompts = [fmt.prompt_and_cut(r.text, answer_budget, r.context) for r in records]
    order = sorted(range(len(records)), key=lambda i: len(prompts[i][0]))
    out: np.ndarray | None = None
    # an attached adapter switched off: the frozen base's features
    off = model.disable_adapter() if hasattr(model, "disable_adapter") else contextlib.nullcontext()
    was_training = base.training
    base.eval()
    with torch.inference_mode(), off:
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            width = max(len(prompts[i][0]) for i in idx)
            ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for row, i in enumerate(idx):
                p = prompts[i][0]
                ids[row, : len(p)] = torch.tensor(p, dtype=torch.long)
                mask[row, : len(p)] = 1
            ids, mask = ids.to(device), mask.to(device)
            with autocast(device.type, precision):
                hidden = decoder(input_ids=ids, attention_mask=mask).last_hidden_state
            last = hidden[torch.arange(len(idx), device=device), mask.sum(1) - 1]
            if out is None:
                out = np.zeros((len(records), last.shape[-1]), dtype=np.float64)
            out[idx] = last.double().cpu().numpy()
            if tick:
                tick(len(idx))
    base.train(was_training)
    if out is None:
        out = np.zeros((0, 0), dtype=np.float64)
    return out, [p[0] for p in prompts], [p[1] for p in prompts]


def probe_evaluation(
    model: Any,
    tok: Any,
    fmt: Any,
    spec: PilotSpec,
    train: list[Record],
    records: list[Record],
    answer_budget: int,
    protocol: dict,
    *,
    progress: bool = True,
    label: str = "linear probe",
    log: Callable[[str], None] | None = None,
    issues: bool = False,
    cache: Path | None = None,
) -> tuple[EvalResult, dict]:
    """The probe fitted on `train`'s features, evaluated on `records` -> (its evaluation,
    {linear_probe: its settings and fit}); `issues`: also the training examples whose label
    the features contradict (`label_issues.py`; single-label tasks); `cache`: where the
    training features are kept between fits (`feature_cache.py`, the caller's key)."""
    from lorapilot.base.models import pad_id_of

    labels = list(spec.task.labels or [])
    if not train:
        raise UsageError("the linear probe is fitted on the train split, which is empty")
    precision = protocol["precision"]
    batch = spec.eval.batch_size
    pad = pad_id_of(tok)
    t0 = time.perf_counter()
    f_train = cached(cache, len(train)) if cache is not None else None
    reused = f_train is not None
    todo = len(records) + (0 if reused else len(train))
    with Phase(f"{label}: features", todo, bar=progress, log=log) as bar:
        if f_train is None:
            f_train, _, _ = prompt_features(
                model, fmt, pad, train, answer_budget, precision, batch,
                lambda n: bar.advance(n=n),
            )  # fmt: skip
            if cache is not None:
                keep(cache, f_train)
        f_eval, ids, cuts = prompt_features(
            model, fmt, pad, records, answer_budget, precision, batch, lambda n: bar.advance(n=n)
        )
    prompts = [tok.decode(p) for p in ids]
    if spec.task.multi_label:
        probes, probs = _one_vs_rest(f_train, train, labels, f_eval)
        named = [_label_set(p, labels) for p in probs]
        metrics, rows = score_predictions(spec, records, prompts, None, named)
        for row, p in zip(rows, probs, strict=True):  # each label's own probability
            row["scores"] = {lab: round(float(v), 6) for lab, v in zip(labels, p, strict=True)}
    else:
        index = {lab: i for i, lab in enumerate(labels)}
        y = np.array([index[r.label] for r in train], dtype=np.int64)
        probes = [fit_linear_probe(f_train, y, len(labels))]
        metrics, rows = score_predictions(spec, records, prompts, probes[0].logits(f_eval), None)
    for row, cut in zip(rows, cuts, strict=True):
        row["tokens_cut"] = cut
    seconds = time.perf_counter() - t0
    device = str(next(model.parameters()).device)
    extras = {
        "linear_probe": {
            "features": FEATURES,
            "classifier": "one-vs-rest logistic regression (a label at probability >= 0.5, "
            "else the likeliest)"
            if spec.task.multi_label
            else "multinomial logistic regression",
            "l2": L2,
            "optimizer": "lbfgs",
            "max_iter": MAX_ITER,
            "standardised": True,
            "iterations": sum(p.iterations for p in probes),
            "train_loss": round(float(np.mean([p.train_loss for p in probes])), 6),
            "fitted_on": {"split": "train", "n": len(train)},
            "hidden_size": int(f_eval.shape[1]) if f_eval.size else None,
            **(
                {
                    "train_features": str(cache.relative_to(cache.parents[2])),  # runs/.features
                    "train_features_reused": reused,
                }
                if cache is not None
                else {}
            ),  # fmt: skip
        }
    }
    if issues and not spec.task.multi_label:
        extras.update(suspect_labels(f_train, labels, train))
    n_all = len(train) + len(records)
    result = EvalResult(metrics, rows, seconds, n_all / max(seconds, 1e-9), protocol, device)
    return result, extras


def _one_vs_rest(
    f_train: np.ndarray, train: list[Record], labels: list[str], f_eval: np.ndarray
) -> tuple[list, np.ndarray]:
    """One binary probe per label (its examples against the rest) -> (the probes, (n, labels)
    probabilities of each label on `f_eval`)."""
    probes, cols = [], []
    for lab in labels:
        y = np.array([lab in (r.target or ()) for r in train], dtype=np.int64)
        probe = fit_linear_probe(f_train, y, 2)
        z = probe.logits(f_eval)
        cols.append(1.0 / (1.0 + np.exp(z[:, 0] - z[:, 1])))  # softmax's second class
        probes.append(probe)
    return probes, np.stack(cols, axis=1)


def _label_set(p: np.ndarray, labels: list[str]) -> str:
    """The answer an adapter writes for the labels at THRESHOLD or above (task order), or
    the likeliest label alone when none reaches it."""
    on = [lab for lab, v in zip(labels, p, strict=True) if v >= THRESHOLD]
    return LABEL_SEPARATOR.join(on or [labels[int(np.argmax(p))]])
