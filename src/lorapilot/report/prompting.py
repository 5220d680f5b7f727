"""The alternatives to adapting: the chosen adapter against the base shown K training examples
(`baseline --shots K`) and against a logistic regression on the base's prompt features
(`baseline --linear-probe`), on the success metric, paired example by example. A pilot asks
whether adapting helps; the cheap alternatives it must beat are a better prompt and an
embedding classifier, not only the zero-shot prompt. Reported beside the decision, never
part of it (the success criterion is pre-registered against the zero-shot baseline)."""

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
    shots = few.result.get("shots") or {}
    head = {
        "run_id": few.id,
        "shots": shots.get("k"),
        "selection": shots.get("selection", "fixed"),
        "shot_ids": shots.get("ids"),
    }
    out = _against(pilot, chosen, few, head, "few_shot", "shots", "the demonstrations")
    out["adapter_beats_prompting"] = out.pop("beats")
    return out


def probe_alternative(pilot: Pilot, chosen: dict | None) -> dict[str, Any] | None:
    """The latest completed linear-probe baseline (`baseline --linear-probe`: a logistic
    regression on the base's prompt features) against `chosen`, as `prompting_alternative`
    sets the few-shot prompt: values, gain, paired CI, `adapter_beats_probe`."""
    probe = registry.latest_run(pilot.dir, "baseline", where=registry.is_linear_probe)
    if probe is None:
        return None
    fit = probe.result.get("linear_probe") or {}
    head = {"run_id": probe.id, "fitted_on": (fit.get("fitted_on") or {}).get("n")}
    out = _against(pilot, chosen, probe, head, "probe", "linear_probe", "the classifier")
    out["adapter_beats_probe"] = out.pop("beats")
    return out


def _against(
    pilot: Pilot, chosen: dict | None, alt: Any, head: dict, name: str, key: str, what: str
) -> dict[str, Any]:
    """`chosen` against an alternative's baseline run `alt` on the success metric, paired
    by example: {**head, metric, <name>: its value, adapted, gain, ci_low, ci_high,
    min_gain, beats, why_not}. Comparable when the protocols differ by `key` alone."""
    spec = pilot.spec
    metric = spec.success.metric
    out: dict[str, Any] = {
        **head,
        "metric": metric,
        name: metric_value(alt.result.get("metrics"), metric),
        "adapted": None,
        "adapted_run": None,
        "gain": None,
        "ci_low": None,
        "ci_high": None,
        "min_gain": spec.success.min_gain,
        "beats": None,
        "why_not": None,
    }
    if chosen is None:
        out["why_not"] = "no adapter chosen yet"
        return out
    out["adapted_run"], out["adapted"] = chosen["id"], metric_value(chosen.get("metrics"), metric)
    chosen_rec = registry.get_run(pilot.dir, chosen["id"])
    a = {k: v for k, v in (alt.result.get("protocol") or {}).items() if k != key}
    b = dict(chosen_rec.result.get("protocol") or {})
    differ = protocol_differences(a, b) if a and b else ["protocol not recorded"]
    if alt.data_version != chosen_rec.data_version:
        differ.append(f"data version ({alt.data_version} vs {chosen_rec.data_version})")
    if differ:
        out["why_not"] = f"besides {what}, the evaluations differ: " + ", ".join(differ)
        return out
    if out[name] is None or out["adapted"] is None:
        out["why_not"] = f"{metric} is not among both runs' metrics"
        return out
    runs = registry.runs_dir(pilot.dir)
    boot = bootstrap_for(
        spec.task.kind, metric,
        read_jsonl(runs / alt.id / "predictions.jsonl"),
        read_jsonl(runs / chosen["id"] / "predictions.jsonl"),
        spec.task.labels, task=spec.task, norm=spec.eval.normalize,
    )  # fmt: skip
    out["gain"] = round(out["adapted"] - out[name], 6)
    if boot is not None:
        out["ci_low"], out["ci_high"] = boot.get("ci_low"), boot.get("ci_high")
    low = out["ci_low"]
    out["beats"] = out["gain"] >= spec.success.min_gain and (low is None or low > 0)
    return out


def prompting_warnings(p: dict[str, Any] | None) -> list[str]:
    """A limitation when the chosen adapter does not clearly beat the few-shot prompt."""
    if not p or p.get("adapter_beats_prompting") is not False:
        return []
    return [_short_of(p, "few_shot", f"the base prompted with {shown(p)}", "a few-shot prompt")]


def probe_warnings(p: dict[str, Any] | None) -> list[str]:
    """A limitation when the chosen adapter does not clearly beat the linear probe."""
    if not p or p.get("adapter_beats_probe") is not False:
        return []
    who = "a logistic regression on the base's features"
    return [_short_of(p, "probe", who, "an embedding classifier")]


def _short_of(p: dict[str, Any], value: str, who: str, instead: str) -> str:
    """The limitation's words: the adapter's gain over an alternative, short of the bar."""
    low = p.get("ci_low")
    ci = f", 95% CI of the gain [{low:+.3f}, {p['ci_high']:+.3f}]" if low is not None else ""
    return (
        f"the chosen adapter ({p['adapted_run']}) gains {p['gain']:+.3f} {p['metric']} over "
        f"{who} ({p[value]:.3f} -> {p['adapted']:.3f}{ci}), short of success.min_gain "
        f"{p['min_gain']:+.3f} or not above noise: {instead} may serve instead of the adapter"
    )
