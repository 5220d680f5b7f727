"""The probe of an image pilot: one training-step configuration measured on this machine.

Every image is the same size after the transforms, so there is one step shape per micro-batch
(no typical/long lengths as for text): the spec's micro-batch at the spec's image size is
timed over warm-up + measured real optimizer steps, with its peak memory, and the record
has the same keys as a text probe (`measurements`, `eval_examples_per_s`,
`checkpoint_save_s`, `load`), which is what `budget` plans from. There is no memory model
for images yet: `estimated_peak_memory_bytes` is None and the measured peak is the figure.
"""

from __future__ import annotations

import time
from typing import Any

from lorapilot.base.precision import resolve
from lorapilot.sizing.measure import checkpoint_seconds, make_resident, measure
from lorapilot.spec import Pilot
from lorapilot.train.loop import seed_everything
from lorapilot.train.meter import PeakMemory
from lorapilot.train.step import make_optimizer

EVAL_EXAMPLES = 64


def probe_images(pilot: Pilot, run: Any, *, steps: int, warmup: int, progress: bool, log) -> dict:
    import torch

    from lorapilot.modality import modality_of
    from lorapilot.records.progress import format_gib

    tcfg = pilot.spec.train
    device = torch.device("cpu")
    seed_everything(tcfg.seed)
    with PeakMemory(device) as load_mem:
        t0 = time.perf_counter()
        tr = modality_of(pilot).trainee()
        model = tr.model.to(device)
        make_resident(model)
        load_s = time.perf_counter() - t0
    info = tr.adapter_info
    load = {
        "seconds": load_s,
        "peak_rss_bytes": load_mem.rss_peak,
        "rss_increase_bytes": load_mem.increase,
        "base": str(tr.resolved.path),
        "base_params": info["total_params"] - info["trainable_params"],
    }
    run.update(load=load, trainable_params=info["trainable_params"])
    log(f"probe: model loaded in {load_s:.2f} s ({info['trainable_params']:,} trainable)")
    data = tr.train_set
    mb = min(tcfg.micro_batch, len(data))
    batch = data.collate(list(range(mb)))
    loss_fn, _ = data.loss_fn(tcfg)
    precision = resolve(tcfg.precision, device.type)  # `auto` as the loop resolves it
    model.train()
    m = measure(
        model,
        batch,
        make_opt=lambda: make_optimizer(model, tcfg),
        precision=precision,
        max_grad_norm=tcfg.max_grad_norm,
        steps=steps,
        warmup=warmup,
        device=device,
        loss_fn=loss_fn,
    )
    size = tr.train_set.pipeline.size
    row = {
        "length": "typical",
        "target_seq_len": size,
        "seq_len": size,
        "micro_batch": tcfg.micro_batch,
        "grad_checkpointing": tcfg.grad_checkpointing,
        "search": False,
        "measured": True,
        **m,
        "images_per_s": mb / m["later_step_s"] if m.get("later_step_s") else None,
        "estimated_peak_memory_bytes": None,
        "estimate": "no memory model for image pilots: the measured peak is the figure",
    }
    if m["ok"]:
        log(
            f"probe: {mb} images of {size}x{size}: first {m['first_step_s']:.3f} s, later "
            f"{m['later_step_s']:.3f} s ({row['images_per_s']:.1f} images/s), peak "
            f"{format_gib(m['peak_total_bytes'])}"
        )
    checkpoint_s = checkpoint_seconds(
        model, batch, tcfg, run.dir / ".probe-checkpoint", precision, loss_fn
    )
    records = tr.prepared.splits.get("val", [])[:EVAL_EXAMPLES]
    eval_eps = eval_peak = None
    if records:
        ev, _ = tr.evaluate(model, records, label="probe eval", progress=progress)
        eval_eps, eval_peak = ev.examples_per_s, ev.peak_memory_bytes
        log(f"probe: evaluation {eval_eps:.1f} images/s ({len(records)} validation images)")
    return {
        "measurements": [row],
        "lengths": {"typical": size},
        "load": load,
        "batch_search": None,
        "trainable_params": info["trainable_params"],
        "total_params": info["total_params"],
        "checkpoint_save_s": checkpoint_s,
        "eval_examples_per_s": eval_eps,
        "eval_examples": len(records),
        "eval_peak_memory_bytes": eval_peak,
        "images_per_s": row["images_per_s"],
        "step_definition": "one micro-batch forward + backward and one optimizer update",
        "load_check": None,
        "disturbed": False,
    }
