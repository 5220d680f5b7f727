"""Examples/s of scoring-mode vs generate-mode evaluation on the default model.

    .venv/bin/python bench/eval_throughput.py [--pilot examples/ticket-triage] [--limit N] \
        [--repeat 2] [--json]

Both modes run in one process on the same model, prompts and batch size (the pilot's eval
protocol), alternating so that machine noise shows in the spread. Model loading and data
preparation are not timed. `score_unshared` is label scoring without the shared-prefix
cache (each batch recomputes the system prompt), to show what that cache buys; the same for
`generate_unshared`. `prompt_pass` is generation stopped after one token: the prompts' own
tokens through the model, which both modes must pay. An extraction pilot
(examples/invoice-fields) has only the generate modes.

    .venv/bin/python bench/eval_throughput.py --many-labels [--limit 96] [--repeat 1] --json

scores the generated 77-intent pilot of bench/many_labels.py (label list in the system
prompt) with the default best-first label search and with every label scored
(`eval.label_search: all`), alternating, and prints `many_labels: {n_labels,
examples_per_s, examples_per_s_all_labels, identical_predictions, ...}`. `--adapter DIR`
evaluates with a trained adapter instead of the zero-shot base (an adapter is sure of its
answers, the base is not: the search's best and worst cases); `--many-labels-dir` reuses a
pilot folder written by bench/many_labels.py (the one the adapter was trained on).
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
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pilot", default=str(ROOT / "examples" / "ticket-triage"))
    ap.add_argument("--limit", type=int, default=None, help="first N validation examples")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--many-labels", action="store_true", help="the 77-intent pilot")
    ap.add_argument("--many-labels-dir", type=Path, help="an existing bench/many_labels.py pilot")
    ap.add_argument("--adapter", type=Path, help="evaluate with this adapter (e.g. a train run's)")
    args = ap.parse_args()
    if args.many_labels:
        return many_labels(args)

    from lorapilot.base.models import load_base, pad_id_of
    from lorapilot.data.dataset import formatter_for, prepare_data
    from lorapilot.evaluate.predict import generate, score_labels, shared_prefix_len
    from lorapilot.evaluate.runner import cast_for_eval, evaluate_records, make_protocol
    from lorapilot.spec import load_pilot

    pilot = load_pilot(args.pilot)
    classification = pilot.spec.task.kind == "classification"
    _, model, tok = load_base(pilot)
    prepared = prepare_data(pilot, tok)
    records = prepared.splits["val"][: args.limit] if args.limit else prepared.splits["val"]
    fmt = formatter_for(pilot, tok)
    modes = ("score", "generate") if classification else ("generate",)
    spec = {m: load_pilot(args.pilot, [f"eval.mode={m}"]).spec for m in modes}
    protocols = {m: make_protocol(s, tok, prepared) for m, s in spec.items()}
    proto = protocols[modes[0]]
    evaluate_records(model, tok, fmt, spec[modes[0]], records[:4], proto, progress=False)  # warm-up
    eval_model = cast_for_eval(model, proto["precision"]).eval()
    budget = proto["answer_budget"]
    prompts = [fmt.encode_prompt(r.text, budget) for r in records]
    pad_id = pad_id_of(tok)
    batch = pilot.spec.eval.batch_size
    gen_proto = protocols["generate"]
    stop = [tok.eos_token_id]
    # The `_unshared` variants recompute the shared prefix in every batch: what the cache buys.
    # `prompt_pass`: generation stopped after its first token, i.e. the prompt pass alone (shared
    # prefix cached), which every mode pays: the floor under both.
    timed = [m for m in ("score", "score_unshared") if classification] + [
        "generate",
        "generate_unshared",
        "prompt_pass",
    ]
    if classification:
        encs = [fmt.encode("x", lab, budget) for lab in pilot.spec.task.labels]
        label_ids = [e.input_ids[e.prompt_len :] for e in encs]
    times: dict[str, list[float]] = {m: [] for m in timed}
    metrics, new_tokens = {}, {}
    for _ in range(args.repeat):
        for mode in timed:
            t0 = time.perf_counter()
            if mode == "score_unshared":
                score_labels(
                    eval_model,
                    prompts,
                    label_ids,
                    batch_size=batch,
                    pad_id=pad_id,
                    share_prefix=False,
                    search=pilot.spec.eval.label_search,
                )
            elif mode == "generate_unshared":
                gen = generate(
                    eval_model,
                    prompts,
                    max_new_tokens=gen_proto["max_new_tokens"],
                    stop_ids=stop,
                    pad_id=pad_id,
                    batch_size=batch,
                    share_prefix=False,
                )
                new_tokens[mode] = round(sum(len(g) for g in gen) / len(gen), 1)
            elif mode == "prompt_pass":
                generate(
                    eval_model,
                    prompts,
                    max_new_tokens=1,
                    stop_ids=stop,
                    pad_id=pad_id,
                    batch_size=batch,
                )
            else:
                res = evaluate_records(
                    model, tok, fmt, spec[mode], records, protocols[mode], progress=False
                )
                key = "accuracy" if classification else "json_valid_rate"
                metrics[mode] = res.metrics.get(key)
            times[mode].append(time.perf_counter() - t0)
    n = len(records)
    med = {m: statistics.median(t) for m, t in times.items()}
    out = {
        "pilot": pilot.spec.name,
        "n_examples": n,
        "batch_size": batch,
        "precision": gen_proto["precision"],  # as resolved for this machine
        "device": str(next(eval_model.parameters()).device),
        "mean_prompt_tokens": round(sum(len(p) for p in prompts) / n, 1),
        "shared_prefix_tokens": shared_prefix_len(prompts),
        "max_new_tokens": gen_proto["max_new_tokens"],
        "generated_tokens_mean_unshared": new_tokens.get("generate_unshared"),
        **{f"{m}_examples_per_s": [round(n / t, 2) for t in times[m]] for m in timed},
        "ratio_median": round(med["generate"] / med["score"], 2) if classification else None,
        "prefix_cache_speedup": {m: round(med[f"{m}_unshared"] / med[m], 2) for m in modes},
        "metrics": metrics,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")


def many_labels(args) -> None:
    import tempfile

    from many_labels import LABELS, write_pilot

    from lorapilot.base.models import attach_adapter, load_base
    from lorapilot.data.dataset import formatter_for, prepare_data
    from lorapilot.evaluate.predict import shared_prefix_len
    from lorapilot.evaluate.runner import evaluate_records, make_protocol
    from lorapilot.spec import load_pilot

    root = args.many_labels_dir or write_pilot(Path(tempfile.mkdtemp(prefix="many-labels-")))
    pilot = load_pilot(root)
    _, model, tok = load_base(pilot)
    if args.adapter:
        model = attach_adapter(model, args.adapter)
    prepared = prepare_data(pilot, tok)
    records = prepared.splits["val"][: args.limit or 96]
    fmt = formatter_for(pilot, tok)
    specs = {s: load_pilot(root, [f"eval.label_search={s}"]).spec for s in ("best_first", "all")}
    proto = make_protocol(pilot.spec, tok, prepared)
    evaluate_records(model, tok, fmt, specs["all"], records[:4], proto, progress=False)  # warm-up
    times: dict[str, list[float]] = {s: [] for s in specs}
    results = {}
    for _ in range(args.repeat):
        for search, spec in specs.items():
            results[search] = evaluate_records(
                model, tok, fmt, spec, records, proto, progress=False
            )
            times[search].append(results[search].seconds)
    n = len(records)
    best, every = (results[s].predictions for s in ("best_first", "all"))
    scored = [len(r["scores"]) for r in best]
    prompts = [fmt.encode_prompt(r.text, proto["answer_budget"]) for r in records]
    out = {
        "many_labels": {
            "n_labels": len(LABELS),
            "model": "adapter " + str(args.adapter) if args.adapter else "base (zero-shot)",
            "n_examples": n,
            "batch_size": proto["batch_size"],
            "precision": proto["precision"],
            "mean_prompt_tokens": round(sum(len(p) for p in prompts) / n, 1),
            "shared_prefix_tokens": shared_prefix_len(prompts),
            "examples_per_s": round(n / statistics.median(times["best_first"]), 2),
            "examples_per_s_all_labels": round(n / statistics.median(times["all"]), 2),
            "runs_examples_per_s": {s: [round(n / t, 2) for t in ts] for s, ts in times.items()},
            "identical_predictions": [r["parsed"] for r in best] == [r["parsed"] for r in every],
            "max_score_diff": max(
                abs(v - e["scores"][k])
                for b, e in zip(best, every, strict=True)
                for k, v in b["scores"].items()
            ),
            "labels_scored_mean": round(sum(scored) / n, 1),
            "accuracy": results["best_first"].metrics["accuracy"],
        }
    }
    print(json.dumps(out, indent=2) if args.json else out)


if __name__ == "__main__":
    main()
