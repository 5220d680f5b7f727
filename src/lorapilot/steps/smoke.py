"""`lorapilot smoke`: overfit a few examples through the real train and eval code. It proves
wiring (labels aligned, loss mask right, eval prompt = training prompt), not quality."""

from __future__ import annotations

from lorapilot.adapter import build_adapter
from lorapilot.data.audit import sample_per_category
from lorapilot.data.dataset import encode_records, formatter_for, prepare_data
from lorapilot.evaluate.runner import evaluate_records, make_protocol
from lorapilot.models import load_base, pad_id_of
from lorapilot.precision import autocast, resolve
from lorapilot.spec import Pilot
from lorapilot.steprun import open_run
from lorapilot.train.batches import collate
from lorapilot.train.loop import train
from lorapilot.train.step import greedy_reproduces

PASS_LOSS = 0.1  # mean loss per target token on the memorised examples after training
STOP_LOSS = 0.01  # below this a step asks whether greedy decoding already writes every target


def run_smoke(
    pilot: Pilot,
    *,
    per_category: int = 2,
    max_steps: int = 40,
    lr: float = 2e-3,
    progress: bool = True,
    log=print,
) -> dict:
    """Overfit a few examples per category through the real training and evaluation code.

    It proves wiring (labels aligned, mask right, eval prompt = training prompt), not
    quality: a correct pipeline memorises a dozen examples in a few dozen steps.
    """
    spec = pilot.spec
    with open_run(pilot, "smoke") as run:
        _, model, tok = load_base(pilot)
        prepared = prepare_data(pilot, tok)
        run.record.data_version = prepared.version
        fmt = formatter_for(pilot, tok)
        records = sample_per_category(prepared.splits["train"], per_category, spec.train.seed)
        examples = encode_records(fmt, spec.task, records, prepared.answer_budget)
        pad_id = pad_id_of(tok)
        model, _ = build_adapter(
            model, spec.adapter.model_copy(update={"dropout": 0.0}), seed=spec.train.seed
        )
        cfg = spec.train.model_copy(
            update={
                "max_steps": max_steps,
                "lr": lr,
                "micro_batch": min(len(examples), 16),
                "grad_accum": 1,
                "warmup_ratio": 0.0,
                "schedule": "constant",
                "eval_every": None,
                "save_every": None,
                "weight_decay": 0.0,
            }
        )
        precision = resolve(spec.eval.precision, next(model.parameters()).device.type)

        def memorised(rec: dict) -> bool:
            """Overfit: greedy decoding writes every target; steps beyond prove nothing. A
            low mean loss alone can hide one wrong token of a long JSON answer."""
            return rec["loss"] < STOP_LOSS and _writes_every_target(
                model, examples, pad_id, precision
            )

        result = train(
            model,
            examples,
            examples,
            cfg,
            run.dir,
            pad_id=pad_id,
            stop_when=memorised,
            progress=progress,
            log=log,
        )
        protocol = make_protocol(spec, tok, prepared)
        ev = evaluate_records(
            model, tok, fmt, spec, records, protocol, progress=progress, label="smoke eval"
        )
        n_correct = sum(bool(r["correct"]) for r in ev.predictions)
        final_loss = result.final_val_loss
        ok = final_loss < PASS_LOSS and n_correct == len(records)
        out = {
            "ok": ok,
            "final_loss": final_loss,
            "initial_loss": result.initial_val_loss,
            "n_examples": len(records),
            "n_correct": n_correct,
            "steps": result.steps,
            "max_steps": max_steps,
            "stopped_early": result.steps < max_steps,
            "note": "smoke proves wiring (labels, loss mask, eval prompt), not quality",
            "failed_examples": [r["id"] for r in ev.predictions if not r["correct"]],
        }
        run.update(**out)
    return {"run_id": run.id, "status": run.record.status, **out}


def _writes_every_target(model, examples, pad_id: int, precision: str, batch: int = 16) -> bool:
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with autocast(device.type, precision):
            for i in range(0, len(examples), batch):
                rows = collate(examples[i : i + batch], pad_id)
                if not greedy_reproduces(model, {k: v.to(device) for k, v in rows.items()}).all():
                    return False
        return True
    finally:
        model.train(was_training)
