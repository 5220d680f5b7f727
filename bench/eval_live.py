"""The live tensors of a pilot's widest evaluation batch with the zero-shot base, beside the
memory model's figure for it (the probe measures the same batch with its probe-trained
adapter, whose confident scores a best-first search prunes; the zero-shot base is the worst
case the model estimates: every prompt scored over the whole label tree):

    .venv/bin/python bench/eval_live.py PILOT [--json]

Loads the base as evaluation does, takes the `eval.batch_size` longest validation prompts,
warms up on two of them (the cast to the evaluation dtype), then evaluates the batch under
`train.meter.live_tensor_peak` (CPU). Reported: the live peak, the estimate's components
that live in tensors (`steps.probe.eval_batch_estimate`, the probe's own figure:
`sizing.memory.EVAL_LIVE_COMPONENTS`) and their relative error.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pilot", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from lorapilot.base.models import load_base
    from lorapilot.data.dataset import formatter_for, prepare_data
    from lorapilot.evaluate.runner import evaluate_records, make_protocol
    from lorapilot.sizing.memory import EVAL_LIVE_COMPONENTS, ModelShape
    from lorapilot.spec import load_pilot
    from lorapilot.steps.probe import eval_batch_estimate
    from lorapilot.train.meter import live_tensor_peak

    pilot = load_pilot(args.pilot)
    spec = pilot.spec
    _, model, tok = load_base(pilot, use="eval")
    model.eval()
    prepared = prepare_data(pilot, tok)
    fmt = formatter_for(pilot, tok)
    protocol = make_protocol(spec, tok, prepared)
    val = prepared.splits["val"]
    budget = protocol["answer_budget"]
    widths = [len(fmt.encode_prompt(r.text, budget)) for r in val]
    order = sorted(range(len(val)), key=lambda i: -widths[i])[: spec.eval.batch_size]
    chosen = [val[i] for i in order]
    evaluate_records(model, tok, fmt, spec, chosen[:2], protocol, progress=False)
    with live_tensor_peak(model) as seen:  # a window per decoding step: bounded memory
        evaluate_records(model, tok, fmt, spec, chosen, protocol, progress=False)

    shape = ModelShape.from_config(model.config.to_dict())
    widest = [widths[i] for i in order]
    est = eval_batch_estimate(shape, spec, model, fmt, protocol, chosen, widest, on_cpu=True)
    parts = est["estimate_components"]
    estimated = sum(parts[k] for k in EVAL_LIVE_COMPONENTS)
    out = {
        "pilot": str(args.pilot),
        "batch_size": len(chosen),
        "prompt_len": est["prompt_len"],
        "live_peak_bytes": seen["peak_bytes"],
        "estimated_live_bytes": estimated,
        "live_estimate_error": round(estimated / seen["peak_bytes"] - 1, 4),
        "components": {k: parts[k] for k in EVAL_LIVE_COMPONENTS},
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
