"""Examples/s of scoring-mode vs generate-mode evaluation on the default model.

    .venv/bin/python bench/eval_throughput.py [--pilot examples/ticket-triage] [--limit N] [--repeat 2] [--json]

Both modes run in one process on the same model, prompts and batch size (the pilot's eval
protocol), alternating so that machine noise shows in the spread. Model loading and data
preparation are not timed. `score_unshared` is label scoring without the shared-prefix
cache (each batch recomputes the system prompt), to show what that cache buys.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pilot", default=str(ROOT / "examples" / "ticket-triage"))
    ap.add_argument("--limit", type=int, default=None, help="first N validation examples")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from lorapilot.data.dataset import formatter_for, prepare_data
    from lorapilot.evaluate.predict import score_labels, shared_prefix_len
    from lorapilot.evaluate.runner import cast_for_eval, evaluate_records, make_protocol
    from lorapilot.evaluate.stage import load_base
    from lorapilot.models import pad_id_of
    from lorapilot.spec import load_pilot

    pilot = load_pilot(args.pilot)
    _, model, tok = load_base(pilot)
    prepared = prepare_data(pilot, tok)
    records = prepared.splits["val"][: args.limit] if args.limit else prepared.splits["val"]
    fmt = formatter_for(pilot, tok)
    spec = {m: load_pilot(args.pilot, [f"eval.mode={m}"]).spec for m in ("score", "generate")}
    protocols = {m: make_protocol(s, tok, prepared) for m, s in spec.items()}
    times: dict[str, list[float]] = {"score": [], "score_unshared": [], "generate": []}
    accuracy = {}
    evaluate_records(model, tok, fmt, spec["score"], records[:4], protocols["score"], progress=False)  # warm-up
    eval_model = cast_for_eval(model, protocols["score"]["precision"]).eval()
    budget = protocols["score"]["answer_budget"]
    prompts = [fmt.encode_prompt(r.text, budget) for r in records]
    encs = [fmt.encode("x", lab, budget) for lab in pilot.spec.task.labels]
    label_ids = [e.input_ids[e.prompt_len:] for e in encs]
    pad_id = pad_id_of(tok)
    for _ in range(args.repeat):
        for mode in ("score", "score_unshared", "generate"):
            t0 = time.perf_counter()
            if mode == "score_unshared":
                score_labels(eval_model, prompts, label_ids, batch_size=pilot.spec.eval.batch_size,
                             pad_id=pad_id, share_prefix=False)
            else:
                res = evaluate_records(model, tok, fmt, spec[mode], records, protocols[mode], progress=False)
                accuracy[mode] = res.metrics.get("accuracy")
            times[mode].append(time.perf_counter() - t0)
    n = len(records)
    out = {
        "pilot": pilot.spec.name,
        "n_examples": n,
        "batch_size": pilot.spec.eval.batch_size,
        "precision": pilot.spec.eval.precision,
        "mean_prompt_tokens": round(sum(len(p) for p in prompts) / n, 1),
        "shared_prefix_tokens": shared_prefix_len(prompts),
        "score_examples_per_s": [round(n / t, 2) for t in times["score"]],
        "score_unshared_examples_per_s": [round(n / t, 2) for t in times["score_unshared"]],
        "generate_examples_per_s": [round(n / t, 2) for t in times["generate"]],
        "ratio_median": round(statistics.median(times["generate"]) / statistics.median(times["score"]), 2),
        "prefix_cache_speedup": round(statistics.median(times["score_unshared"]) / statistics.median(times["score"]), 2),
        "accuracy": accuracy,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
