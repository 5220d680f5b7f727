"""`lorapilot smoke`: overfit a few examples through the real train and eval code. It proves
wiring (labels aligned, loss mask right, eval prompt = training prompt), not quality.

Sized to the task (spec key `smoke`): `per_category` examples from every category, at least
`min_examples` (topped up when the categories are few) and at most `max_examples`; `auto`
steps are 20 passes over them, bounded (`SmokeSpec.steps_for`). A smoke that does not
memorise its examples closes its run record as `failed` (the reason in `error`), so `runs`
lists it as failed and the decision of a pilot whose latest smoke failed is at most
INCONCLUSIVE."""

from __future__ import annotations

from lorapilot.base.precision import autocast, resolve
from lorapilot.modality import modality_of
from lorapilot.records.steprun import open_run
from lorapilot.spec import Pilot
from lorapilot.spec.checks import MICRO_BATCH
from lorapilot.train.loop import train
from lorapilot.train.loss import MEMORISED_P

PASS_LOSS = 0.1  # mean loss per target (token, or image) on the memorised examples after training
STOP_LOSS = 0.01  # below this a step asks whether the model already gives every target
CHECK_EVERY = 5
"""Steps between two such asks: each decodes every smoke example, which on long inputs (SGD
dialogues of 300-700 tokens) costs more than the step, and was asked after every step."""


def run_smoke(
    pilot: Pilot,
    *,
    per_category: int | None = None,
    max_steps: int | None = None,
    lr: float | None = None,
    progress: bool = True,
    log=print,
) -> dict:
    """Overfit a few examples per category through the real training and evaluation code.

    It proves wiring (labels aligned, mask right, eval prompt = training prompt; for images
    the labels and the head), not quality: a correct pipeline memorises a few dozen examples
    in a few dozen steps. Arguments left None come from the spec's `smoke` section.
    """
    spec = pilot.spec
    per_category = per_category or spec.smoke.per_category
    lr = lr or spec.smoke.lr
    with open_run(pilot, "smoke") as run:
        tr = modality_of(pilot).trainee(
            adapter=spec.adapter.model_copy(update={"dropout": 0.0}),
            smoke_per_category=per_category,
        )
        run.record.data_version = tr.prepared.version
        model, records, examples = tr.model, tr.train_records, tr.train_set
        max_steps = max_steps or spec.smoke.steps_for(len(examples))
        cfg = spec.train.model_copy(
            update={
                "max_steps": max_steps,
                "lr": lr,
                "micro_batch": min(len(examples), MICRO_BATCH),
                "grad_accum": 1,
                "warmup_ratio": 0.0,
                "schedule": "constant",
                "eval_every": None,
                "early_stopping": None,  # it stops when it has memorised (stop_when)
                "category_sampling": "natural",  # every example it memorises, each step
                "save_every": None,
                "weight_decay": 0.0,
            }
        )
        precision = resolve(spec.eval.precision, next(model.parameters()).device.type)

        asked = [-CHECK_EVERY]  # the step of the last ask

        def memorised(rec: dict) -> bool:
            """Overfit: the model gives every target (greedy decoding writes every answer
            token, each with a margin: MEMORISED_P); steps beyond prove nothing. A low mean
            loss alone can hide one wrong token of a long JSON answer."""
            if rec["loss"] >= STOP_LOSS or rec["step"] - asked[0] < CHECK_EVERY:
                return False
            asked[0] = rec["step"]
            return _reproduces_all(model, examples, precision)

        result = train(
            model,
            examples,
            examples,
            cfg,
            run.dir,
            stop_when=memorised,
            progress=progress,
            log=log,
        )
        # memorised means the model ranks each example's own answer first: calibrated
        # scoring divides by the content-free preferences of a model overfit on a handful
        # of examples, which can move a memorised answer (5 of 64 on BANKING77)
        plain = spec.eval.label_scoring != "sum"
        ev, _ = tr.evaluate(model, records, label="smoke eval", progress=progress, plain=plain)
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
            "per_category": per_category,
            "lr": lr,
            "note": "smoke proves wiring (labels, loss mask, eval prompt), not quality",
            "failed_examples": [r["id"] for r in ev.predictions if not r["correct"]],
        }
        if plain:  # said: this check ranked labels by their own scores, not calibrated
            out["label_scoring"] = "sum"
        run.update(**out)
        if not ok:
            run.fail_check(failure_text(out))
    return {"run_id": run.id, "status": run.record.status, **out}


def failure_text(sm: dict) -> str:
    """Why a smoke failed, with what would fix it: the run's error and `run`'s message."""
    failed = sm.get("failed_examples") or []
    loss = sm.get("final_loss")
    return (
        f"smoke: the pipeline could not overfit {sm.get('n_examples')} examples in "
        f"{sm.get('steps')} steps (final loss {loss if loss is None else f'{loss:.4g}'}; "
        f"{len(failed)} not reproduced by the evaluation"
        + (f": {', '.join(map(str, failed[:5]))}" if failed else "")
        + "); check the loss mask and labels, or give it more steps (smoke.max_steps) or "
        "fewer examples (smoke.per_category, smoke.max_examples)"
    )


def _reproduces_all(model, examples, precision: str, batch: int = 16) -> bool:
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with autocast(device.type, precision):
            for i in range(0, len(examples), batch):
                rows = examples.collate(range(i, min(i + batch, len(examples))))
                on_device = {k: v.to(device) for k, v in rows.items()}
                if not examples.reproduces(model, on_device, MEMORISED_P).all():
                    return False
        return True
    finally:
        model.train(was_training)
