"""Gather a pilot's state from its run records: the input of `compare` and `report`.

Everything here is read from `runs/` (the source of truth); the decision itself is the pure
rule in `compare.decide`, applied to the baseline and the chosen train run.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from lorapilot.decision.plan import replicate_of, select, selection_rule, variant_name
from lorapilot.decision.rule import (
    bootstrap_for,
    bootstrap_metrics,
    comparable,
    decide,
    flips,
    gate,
)
from lorapilot.decision.seeds import seed_noise, seed_warnings
from lorapilot.evaluate.guards import check_absolute_guards, check_guards, guard_metrics
from lorapilot.evaluate.metrics import metric_value as _num
from lorapilot.evaluate.metrics import per_group
from lorapilot.evaluate.records import BASELINE_PREDICTIONS
from lorapilot.fsutil import read_json_or_none, read_jsonl
from lorapilot.records import registry
from lorapilot.report.limitations import (
    degenerate_baseline,
    export_warnings,
    generation_warnings,
    label_set_warnings,
    limitations,
)
from lorapilot.report.prompting import (
    probe_alternative,
    probe_warnings,
    prompting_alternative,
    prompting_warnings,
)
from lorapilot.spec import Pilot


def latest_smoke(runs: list, spec_hash: str) -> dict | None:
    """The latest finished smoke run of this very spec (None: there is none)."""
    for r in reversed(runs):
        if r.kind == "smoke" and r.spec_hash == spec_hash and r.status in ("completed", "failed"):
            return {"id": r.id, "status": r.status, "ok": r.result.get("ok"), "error": r.error}
    return None


def _rows(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "predictions.jsonl")


def deltas(base: dict, cand: dict) -> dict:
    """Candidate minus baseline, overall and per category / field."""
    overall = {}
    for k, v in cand.items():
        if (
            isinstance(v, (int, float))
            and not isinstance(v, bool)
            and isinstance(base.get(k), (int, float))
        ):
            overall[k] = v - base[k]
    group, per = per_group(cand)
    _, base_per = per_group(base)
    per_delta = {}
    for name, vals in per.items():
        b = base_per.get(name, {})
        per_delta[name] = {
            m: vals[m] - b[m]
            for m in vals
            if isinstance(vals[m], (int, float))
            and isinstance(b.get(m), (int, float))
            and m != "support"
        }
    return {"overall": overall, group: per_delta}


def _protocol(pilot: Pilot, rec: registry.RunRecord) -> dict | None:
    """The full evaluation protocol of a run: in its record, else its protocol.json."""
    proto = rec.result.get("protocol")
    if isinstance(proto, dict):
        return proto
    try:
        return json.loads(
            (registry.runs_dir(pilot.dir) / rec.id / "protocol.json").read_text(encoding="utf-8")
        )
    except (OSError, ValueError, TypeError):
        return None


def _step_figures(pilot: Pilot, rec: registry.RunRecord) -> tuple[int | None, float | None]:
    """A train run's (peak memory: the largest of its steps' and its final evaluation's,
    median step time): what a variant costs beside what it scores."""
    steps = read_jsonl(registry.runs_dir(pilot.dir) / rec.id / "steps.jsonl")
    peaks = [s.get("peak_memory_bytes") for s in steps] + [rec.result.get("eval_peak_memory_bytes")]
    peaks = [p for p in peaks if isinstance(p, int)]
    times = [s["step_time_s"] for s in steps if isinstance(s.get("step_time_s"), (int, float))]
    return (max(peaks) if peaks else None), (statistics.median(times) if times else None)


def run_summary(pilot: Pilot, rec: registry.RunRecord, baseline: registry.RunRecord | None) -> dict:
    """One row of `compare`: identity, cost, metrics, deltas, guards and flips vs the baseline."""
    res = rec.result
    usd = pilot.spec.limits.usd_per_hour
    row: dict[str, Any] = {
        "id": rec.id,
        "kind": rec.kind,
        "status": rec.status,
        "parent": rec.parent,
        "reason": rec.error,
        "variant": (rec.variant or {}).get("label"),
        "name": variant_name(rec.variant) if rec.kind == "train" else None,
        "diff": (rec.variant or {}).get("diff"),
        "seed": (rec.config.get("train") or {}).get("seed"),
        "replicate": replicate_of(rec.variant) if rec.kind == "train" else None,
        "base": (rec.config.get("model") or {}).get("base"),
        "quantization": quantization_text((rec.config.get("model") or {}).get("quantization")),
        "data_version": rec.data_version,
        "eval_protocol": res.get("eval_protocol"),
        "wall_s": rec.duration_s,
        "cost_usd": round((rec.duration_s or 0) / 3600 * usd, 4),
        "metrics": res.get("metrics"),
        "generation": res.get("generation"),  # eval.generation_check (label scoring)
        "split": res.get("split", "val" if rec.kind in ("train", "baseline", "verify") else None),
    }
    row["peak_memory_bytes"], row["median_step_s"] = (
        _step_figures(pilot, rec) if rec.kind == "train" else (None, None)
    )
    if rec.kind == "baseline" and registry.is_few_shot(rec):  # the prompting alternative:
        k = (res.get("shots") or {}).get("k")  # set against the adapter, not the baseline
        similar = (res.get("shots") or {}).get("selection") == "similar"
        row["variant"] = f"{k}-shot prompt" + (" (similar examples)" if similar else "")
        row["shots"] = res.get("shots")
        return row
    if rec.kind == "baseline" and registry.is_linear_probe(rec):  # the embedding classifier
        row["variant"] = "linear probe (base features)"
        row["linear_probe"] = res.get("linear_probe")
        return row
    if baseline is None or not row["metrics"] or rec.id == baseline.id or row["split"] != "val":
        return row
    ok, why = comparable(
        baseline.result.get("eval_protocol"),
        baseline.data_version,
        row["eval_protocol"],
        rec.data_version,
        _protocol(pilot, baseline),
        _protocol(pilot, rec),
    )
    row["comparable"], row["not_comparable_reason"] = ok, why
    if ok:
        base_m = baseline.result["metrics"]
        base_rows = _rows(registry.runs_dir(pilot.dir) / baseline.id)
        cand_rows = _rows(registry.runs_dir(pilot.dir) / rec.id)
        row["deltas"] = deltas(base_m, row["metrics"])
        intervals = guard_intervals(pilot, base_m, row["metrics"], base_rows, cand_rows)
        row["guard_intervals"] = intervals
        row["guards"] = [
            g.__dict__
            for g in check_guards(
                pilot.spec.guards, base_m, row["metrics"], pilot.spec.eval.min_support, intervals
            )
        ]
        row["flips"] = flips(base_rows, cand_rows)
    return row


def guard_intervals(
    pilot: Pilot, base_m: dict, cand_m: dict, base_rows: list[dict], cand_rows: list[dict]
) -> dict[str, dict]:
    """The paired bootstrap of every concrete metric the guards check, on the same resamples
    as the success criterion's ({} without rows: the guards are then judged on the point)."""
    spec = pilot.spec
    names = guard_metrics(spec.guards, base_m, cand_m)
    if not names or not base_rows or not cand_rows:
        return {}
    return bootstrap_metrics(
        spec.task.kind,
        names,
        base_rows,
        cand_rows,
        spec.task.labels,
        task=spec.task,
        norm=spec.eval.normalize,
    )


def quantization_text(q: Any) -> str:
    """A run's `model.quantization` as one phrase: `none`, `4-bit nf4`, `8-bit`."""
    if not isinstance(q, dict) or not q.get("bits"):
        return "none"
    return f"{q['bits']}-bit" + (
        f" {q.get('type')}" if q.get("bits") == 4 and q.get("type") else ""
    )


def choose_run(pilot: Pilot, candidates: list[dict]) -> tuple[dict | None, dict]:
    """The train run the decision is about, by the spec's pre-registered selection rule
    (`plan.select`) -> (its row or None, the selection: rule, metric and every variant)."""
    spec = pilot.spec
    seeds = spec.selection.seeds
    winner, table = select(candidates, spec.variant_names(), spec.selection_metric, _num, seeds)
    by_id = {c["id"]: c for c in candidates}
    metric = spec.success.metric
    for entry in table:  # side by side: what each variant cost and changed, per category too
        for seed in entry.get("seeds") or []:  # each seed's gain, for the criterion's check
            seed_row = by_id.get(seed["run_id"]) or {}
            seed["delta"] = ((seed_row.get("deltas") or {}).get("overall") or {}).get(metric)
        row = by_id.get(entry["run_id"]) or {}
        deltas = row.get("deltas") or {}
        group, per = per_group(deltas)
        worst = min(
            ((name, d[m]) for name, d in per.items() for m in ("f1", "field_f1") if m in d),
            key=lambda x: x[1],
            default=None,
        )
        entry.update(
            variant=row.get("variant"),
            base=row.get("base"),
            quantization=row.get("quantization"),
            diff=row.get("diff"),
            success_value=_num(row.get("metrics"), metric),
            delta=(deltas.get("overall") or {}).get(metric),
            worst=worst and {"group": group, "name": worst[0], "delta": worst[1]},
            cost_usd=row.get("cost_usd"),
            peak_memory_bytes=row.get("peak_memory_bytes"),
            median_step_s=row.get("median_step_s"),
        )
    ad_hoc = [c["id"] for c in candidates if c["kind"] == "train" and c.get("name") is None]
    return winner, {
        "metric": spec.selection_metric,
        "split": spec.selection.split,
        "rule": selection_rule(seeds),
        "seeds": seeds,
        "seed_noise": seed_noise(table, spec.success.min_gain) if seeds > 1 else None,
        "variants": table,
        "selected": winner and winner.get("name"),
        "n_tried": sum(1 for v in table if v["tries"]),
        "ad_hoc_runs": ad_hoc,
    }


def collect(pilot: Pilot) -> dict:
    """Everything compare/report need, from the run records."""
    spec = pilot.spec
    runs = registry.list_runs(pilot.dir)
    latest = {k: registry.latest_run(pilot.dir, k) for k in ("data", "probe", "smoke")}
    baseline = registry.latest_run(
        pilot.dir, "baseline", where=lambda r: not registry.is_alternative(r)
    )
    latest["baseline"] = baseline
    rows = [run_summary(pilot, r, baseline) for r in runs]
    chosen, selection = choose_run(pilot, rows)
    decision = None
    if chosen and baseline:
        base_rows = _rows(registry.runs_dir(pilot.dir) / baseline.id)
        cand_rows = _rows(registry.runs_dir(pilot.dir) / chosen["id"])
        boot = bootstrap_for(
            spec.task.kind,
            spec.success.metric,
            base_rows,
            cand_rows,
            spec.task.labels,
            task=spec.task,
            norm=spec.eval.normalize,
        )
        decision = decide(
            spec.success,
            spec.guards,
            spec.eval.min_support,
            baseline.result["metrics"],
            chosen["metrics"],
            bootstrap=boot,
            guard_intervals=chosen.get("guard_intervals"),
        )
    verify = None
    test = None
    if chosen:
        for r in reversed(runs):
            if r.kind == "verify" and r.parent == chosen["id"] and verify is None:
                verify = {
                    "id": r.id,
                    "status": r.status,
                    **{
                        k: r.result.get(k)
                        for k in (
                            "ok",
                            "metrics_match",
                            "n_mismatched_predictions",
                            "base_sha256",
                            "problems",
                        )
                    },
                }
            if (
                r.kind == "eval"
                and r.parent == chosen["id"]
                and r.result.get("split") == "test"
                and test is None
                and r.status == "completed"
            ):
                test = {
                    "id": r.id,
                    "metrics": r.result.get("metrics"),
                    "baseline_metrics": r.result.get("baseline_metrics"),
                    "generation": r.result.get("generation"),
                    "baseline_generation": r.result.get("baseline_generation"),
                    "gain": test_gain(pilot, r),
                    "n": r.result.get("n"),
                    "guards": _test_guards(pilot, r),
                }
    for row in rows:  # the guards' results carry their CIs; the summaries are not needed
        row.pop("guard_intervals", None)
    smoke = latest_smoke(runs, spec.spec_hash())
    if decision is not None:  # no GO without the protocol's gates (smoke, verify, final test)
        decision = gate(decision, verify, test, smoke)
        decision["chosen_by"] = selection_rule(spec.selection.seeds)
    ledger = read_jsonl(registry.runs_dir(pilot.dir) / "test_ledger.jsonl")
    exports = exported(pilot)
    prompting = prompting_alternative(pilot, chosen)
    probe_alt = probe_alternative(pilot, chosen)
    curves = {}
    for r in runs:
        if r.kind == "train":
            d = registry.runs_dir(pilot.dir) / r.id
            name, k = variant_name(r.variant), replicate_of(r.variant)
            curves[r.id] = {
                # the plan variant (and its seed replicate), else the kind of change
                "label": (f"{name} seed+{k}" if k else name)
                or (r.variant or {}).get("label")
                or r.id,
                "train": [(s["step"], s["loss"]) for s in read_jsonl(d / "steps.jsonl")],
                "val": [(s["step"], s["val_loss"]) for s in read_jsonl(d / "val.jsonl")],
                "early_stopping": (r.result.get("train") or {}).get("early_stopping"),
            }
    return {
        "pilot": str(pilot.dir),
        "name": spec.name,
        "hypothesis": spec.hypothesis,
        "task": spec.task.model_dump(mode="json"),
        "success": spec.success.model_dump(),
        "guards": [g.model_dump(exclude_none=True) for g in spec.guards],
        "limits": spec.limits.model_dump(),
        "model": spec.model.model_dump(),
        "adapter": spec.adapter.model_dump(),
        "train": spec.train.model_dump(),
        "eval": spec.eval.model_dump(mode="json"),
        "runs": rows,
        "chosen": chosen,
        "selection": selection,
        "baseline": baseline and run_summary(pilot, baseline, None),
        "prompting": prompting,
        "linear_probe": probe_alt,
        "data": latest["data"] and latest["data"].result,
        "label_issues": suspect_labels_of(runs),
        "probe": latest["probe"] and latest["probe"].result,
        "probes": probes_by_variant(runs),
        "smoke": latest["smoke"] and latest["smoke"].result,
        "chosen_record": chosen
        and registry.get_run(pilot.dir, chosen["id"]).model_dump(mode="json"),
        "decision": decision,
        "verify": verify,
        "test": test,
        "test_ledger": ledger,
        "curves": curves,
        "exports": exports,
        # images: what `inspect` last drew (originals beside what the model sees)
        "contact_sheets": sorted(str(p) for p in (pilot.dir / "inspect").glob("contact-*.png"))
        if spec.task.modality == "image"
        else [],
        "limitations": limitations(
            pilot, rows, chosen, ledger, latest["data"] and latest["data"].result
        )
        + degenerate_baseline(baseline and _rows(registry.runs_dir(pilot.dir) / baseline.id))
        + export_warnings(exports)
        + generation_warnings(chosen)
        + prompting_warnings(prompting)
        + probe_warnings(probe_alt)
        + seed_warnings(selection["seed_noise"], selection["metric"], spec.success.metric)
        + (
            label_set_warnings(_rows(registry.runs_dir(pilot.dir) / chosen["id"]))
            if chosen and spec.task.multi_label
            else []
        ),
    }


def suspect_labels_of(runs: list) -> dict | None:
    """The latest completed baseline that reviewed the training labels (a probe: an image
    pilot's baseline, a text pilot's `--linear-probe` alternative), with its run id."""
    for r in reversed(runs):
        li = r.result.get("label_issues") if r.kind == "baseline" else None
        if r.status == "completed" and isinstance(li, dict):
            return {**li, "run_id": r.id, "data_version": r.data_version}
    return None


def probes_by_variant(runs: list) -> list[dict]:
    """The latest completed probe of each variant (a variant that changes the step shape,
    e.g. a 4-bit base, is probed on its own): which probe a figure comes from."""
    latest: dict[str, Any] = {}
    for r in runs:
        if r.kind == "probe" and r.status == "completed":
            latest[r.result.get("variant") or "base"] = r
    return [
        {
            "variant": name,
            "run_id": r.id,
            "quantization": quantization_text((r.config.get("model") or {}).get("quantization")),
            "later_step_s": _typical(r.result, "later_step_s"),
            "peak_memory_bytes": _typical(r.result, "peak_memory_bytes"),
        }
        for name, r in latest.items()
    ]


def _typical(result: dict, key: str) -> Any:
    for m in result.get("measurements") or []:
        if isinstance(m, dict) and m.get("length") == "typical" and m.get("ok"):
            return m.get(key)
    return None


def exported(pilot) -> list[dict]:
    """What deliverable/ holds besides the adapter: merged and GGUF exports, read from their
    manifests (`run` writes them for the spec's export.formats)."""
    out = []
    for fmt in ("merged", "gguf"):
        m = read_json_or_none(pilot.dir / "deliverable" / fmt / "lorapilot.json")
        if isinstance(m, dict):
            out.append({"format": fmt, "folder": f"deliverable/{fmt}", **m})
    return out


def _test_guards(pilot: Pilot, rec: registry.RunRecord) -> list[dict]:
    """Every guard on test against the base on test; absolute ones only for an older final
    test that did not evaluate the base."""
    spec = pilot.spec
    m, base_m = rec.result.get("metrics") or {}, rec.result.get("baseline_metrics")
    if base_m:
        d = registry.runs_dir(pilot.dir) / rec.id
        intervals = guard_intervals(
            pilot, base_m, m, read_jsonl(d / BASELINE_PREDICTIONS), _rows(d)
        )
        results = check_guards(spec.guards, base_m, m, spec.eval.min_support, intervals)
    else:
        results = check_absolute_guards(spec.guards, m, spec.eval.min_support)
    return [g.__dict__ for g in results]


def test_gain(pilot: Pilot, rec: registry.RunRecord) -> dict | None:
    """The chosen adapter's gain over the base on the test split, paired by example, with its
    bootstrap CI; None for a final test that did not evaluate the base (older records)."""
    d = registry.runs_dir(pilot.dir) / rec.id
    base_m, cand_m = rec.result.get("baseline_metrics"), rec.result.get("metrics")
    base_rows = read_jsonl(d / BASELINE_PREDICTIONS)
    if not base_m or not cand_m or not base_rows:
        return None
    spec = pilot.spec
    metric = spec.success.metric
    boot = bootstrap_for(
        spec.task.kind,
        metric,
        base_rows,
        _rows(d),
        spec.task.labels,
        task=spec.task,
        norm=spec.eval.normalize,
    )
    b, c = _num(base_m, metric), _num(cand_m, metric)
    return {
        "metric": metric,
        "baseline": b,
        "adapted": c,
        "gain": None if b is None or c is None else c - b,
        "bootstrap": boot,
    }
