"""The prompting alternative: the chosen adapter against the base shown K training examples
(`baseline --shots K`), on the success metric, paired example by example. A pilot asks
whether adapting helps; the cheap alternative it must beat is a better prompt, not only the
zero-shot one. Reported beside the decision, never part of it (the success criterion is
pre-registered against the zero-shot baseline)."""

from __future__ import annotations

from typing import Any

from lorapilot.decision.rule import bootstrap_for, protocol_differences
from lorapilot.evaluate.metrics import metric_value
from lorapilot.fsutil import read_jsonl
from lorapilot.records import registry
from lorapilot.spec import Pilot


def shown(p: dict[str, Any]) -> str:
    """What the few-shot prompt showed: `4 training examples`, or `each input's 4 most
    similar training examples` (eval.few_shot_selection: similar)."""
    if p.get("selection") == "similar":
        return f"each input's {p.get('shots')} most similar training examples"
    return f"{p.get('shots')} training examples"


def predict_flags(p: dict[str, Any]) -> str:
    """The `predict` flags that run the same prompt on new inputs."""
    similar = " --shot-selection similar" if p.get("selection") == "similar" else ""
    return f"--base --shots {p.get('shots')}{similar}"


def prompting_alternative(pilot: Pilot, chosen: dict | None) -> dict[str, Any] | None:
    """The latest completed few-shot baseline against `chosen` (a compare row): both values,
    the gain and its paired bootstrap CI, and whether the gain reaches success.min_gain with
    its CI above 0 (`adapter_beats_prompting`). Comparable only on the same data version
    and a protocol that differs by the demonstrations alone; else `why_not` says why."""
    few = registry.latest_run(pilot.dir, "baseline", where=registry.is_few_shot)
    if few is None:
        return None
    spec = pilot.spec
    metric = spec.success.metric
    shots = few.result.get("shots") or {}
    out: dict[str, Any] = {
        "run_id": few.id,
        "shots": shots.get("k"),
        "selection": shots.get("selection", "fixed"),
        "shot_ids": shots.get("ids"),
        "metric": metric,
        "few_shot": metric_value(few.result.get("metrics"), metric),
        "adapted": None,
        "adapted_run": None,
        "gain": None,
        "ci_low": None,
        "ci_high": None,
        "min_gain": spec.success.min_gain,
        "adapter_beats_prompting": None,
        "why_not": None,
    }
    if chosen is None:
        out["why_not"] = "no adapter chosen yet"
        return out
    out["adapted_run"], out["adapted"] = chosen["id"], metric_value(chosen.get("metrics"), metric)
    chosen_rec = registry.get_run(pilot.dir, chosen["id"])
    a = {k: v for k, v in (few.result.get("protocol") or {}).items() if k != "shots"}
    b = dict(chosen_rec.result.get("protocol") or {})
    differ = protocol_differences(a, b) if a and b else ["protocol not recorded"]
    if few.data_version != chosen_rec.data_version:
        differ.append(f"data version ({few.data_version} vs {chosen_rec.data_version})")
    if differ:
        out["why_not"] = "besides the demonstrations, the evaluations differ: " + ", ".join(differ)
        return out
    if out["few_shot"] is None or out["adapted"] is None:
        out["why_not"] = f"{metric} is not among both runs' metrics"
        return out
    runs = registry.runs_dir(pilot.dir)
    boot = bootstrap_for(
        spec.task.kind, metric,
        read_jsonl(runs / few.id / "predictions.jsonl"),
        read_jsonl(runs / chosen["id"] / "predictions.jsonl"),
        spec.task.labels, task=spec.task, norm=spec.eval.normalize,
    )  # fmt: skip
    out["gain"] = round(out["adapted"] - out["few_shot"], 6)
    if boot is not None:
        out["ci_low"], out["ci_high"] = boot.get("ci_low"), boot.get("ci_high")
    low = out["ci_low"]
    out["adapter_beats_prompting"] = out["gain"] >= spec.success.min_gain and (
        low is None or low > 0
    )
    return out


def prompting_warnings(p: dict[str, Any] | None) -> list[str]:
    """A limitation when the chosen adapter does not clearly beat the few-shot prompt."""
    if not p or p.get("adapter_beats_prompting") is not False:
        return []
    low = p.get("ci_low")
    ci = f", 95% CI of the gain [{low:+.3f}, {p['ci_high']:+.3f}]" if low is not None else ""
    return [
        f"the chosen adapter ({p['adapted_run']}) gains {p['gain']:+.3f} {p['metric']} over the "
        f"base prompted with {shown(p)} ({p['few_shot']:.3f} -> "
        f"{p['adapted']:.3f}{ci}), short of success.min_gain {p['min_gain']:+.3f} or not "
        "above noise: a few-shot prompt may serve instead of the adapter"
    ]
