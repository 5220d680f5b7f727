"""Comparing runs and deciding GO / NO-GO / INCONCLUSIVE (pure: takes metrics and rows).

The decision rule is pre-registered in the spec (success criterion, guards, min_support)
and applied here mechanically, with the numbers behind it written into the reasons, so a
reader can redo the decision by hand. A gain that the paired bootstrap cannot tell from
noise is never a GO.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, Literal

from lorapilot.evaluate.guards import RuleResult, check_guards, check_success
from lorapilot.evaluate.metrics import (
    classification_counts,
    classification_totals,
    get_metric,
    label_set_invalid,
    multi_label_counts,
    multi_label_totals,
    paired_bootstrap_counts_many,
    paired_bootstrap_macro_f1,
)
from lorapilot.evaluate.structured import Scorer, row_counts, total_of
from lorapilot.spec import EvalNormalize, GuardSpec, SuccessSpec, TaskSpec, variant_label

Decision = Literal["GO", "NO-GO", "INCONCLUSIVE"]
N_BOOT = 1000

# `base` / `one_change` / `combined`: the one-change rule lives with the spec's parameter
# groups; this name is what comparison code reads.
one_change_check = variant_label


def comparable(
    a_protocol: str | None,
    a_data: str | None,
    b_protocol: str | None,
    b_data: str | None,
    a_detail: dict | None = None,
    b_detail: dict | None = None,
) -> tuple[bool, str | None]:
    """Two results can be set side by side only with the same evaluation protocol (prompts,
    decoding, metrics) on the same data version -> (True, None) or (False, why not). With
    the protocols themselves (`a_detail`, `b_detail`), the why names the keys that differ."""
    problems = []
    for what, a, b in (
        ("evaluation protocol", a_protocol, b_protocol),
        ("data version", a_data, b_data),
    ):
        if not a or not b:
            problems.append(
                f"{what} not recorded for {'both runs' if not a and not b else 'one run'}"
            )
        elif a != b:
            if (
                what == "evaluation protocol"
                and a_detail
                and b_detail
                and not protocol_differences(a_detail, b_detail, ignore=RECORDED_ONLY)
            ):
                continue  # the same evaluation, recorded with another train.seed
            why = f"{what}s differ ({a} vs {b})"
            if what == "evaluation protocol" and a_detail and b_detail:
                keys = protocol_differences(a_detail, b_detail)
                if keys:
                    why += ": " + ", ".join(keys)
            problems.append(why)
    return (not problems, "; ".join(problems) or None)


RECORDED_ONLY = ("seed",)
"""Protocol keys recorded with a result that no evaluation draws from: the train seed
(decoding is greedy, labels are scored; a few-shot prompt's draw has its own seed in
`shots`). Two protocols that differ only there evaluate the same way, so a variant or a seed
replicate (`selection.seeds`) with another train.seed compares with the baseline; the key
stays in the hash, so results recorded before keep theirs."""


def protocol_differences(
    a: dict, b: dict, limit: int = 6, ignore: tuple[str, ...] = ()
) -> list[str]:
    """'key (a vs b)' for every protocol key whose value differs (the hash and `ignore`
    excluded)."""
    missing = "missing"
    out = []
    for key in sorted(set(a) | set(b)):
        if key == "eval_protocol" or key in ignore:
            continue
        va, vb = a.get(key, missing), b.get(key, missing)
        if va != vb:
            out.append(f"{key} ({short_text(va)} vs {short_text(vb)})")
    if len(out) > limit:
        out = out[:limit] + [f"{len(out) - limit} more"]
    return out


def short_text(v: Any, n: int = 40) -> str:
    """A value as at most `n` characters of text (JSON for non-strings), cut with `...`."""
    text = v if isinstance(v, str) else json.dumps(v, default=str, ensure_ascii=False)
    return text if len(text) <= n else text[: n - 3] + "..."


def _by_id(rows: Sequence[dict], which: str) -> dict:
    out: dict = {}
    for n, row in enumerate(rows):
        if "id" not in row:
            raise ValueError(f"{which} row {n} has no 'id': rows are paired by example id")
        if row["id"] in out:
            raise ValueError(f"{which} rows repeat the id {row['id']!r}")
        out[row["id"]] = row
    return out


def _pairs(base_rows: Sequence[dict], cand_rows: Sequence[dict]) -> list[tuple[dict, dict]]:
    """(base row, candidate row) for every id in both, in the baseline's order."""
    cand = _by_id(cand_rows, "candidate")
    return [(row, cand[key]) for key, row in _by_id(base_rows, "baseline").items() if key in cand]


def flips(base_rows: list[dict], cand_rows: list[dict]) -> dict:
    """Examples whose correctness changed, by id: what the adapter fixed and what it broke.

    -> {fixed: [ids wrong in base, right in candidate], broken: [the reverse], n_common,
    only_base, only_candidate (counts of unpaired rows)}; ids in the baseline's order.
    """
    pairs = _pairs(base_rows, cand_rows)
    fixed = [(b, c) for b, c in pairs if not b.get("correct") and c.get("correct")]
    broken = [(b, c) for b, c in pairs if b.get("correct") and not c.get("correct")]
    return {
        "fixed": [b["id"] for b, _ in fixed],
        "broken": [b["id"] for b, _ in broken],
        "n_common": len(pairs),
        "only_base": len(base_rows) - len(pairs),
        "only_candidate": len(cand_rows) - len(pairs),
        # what a reader checks by eye: the input, the gold answer and both predictions
        "examples": {
            "fixed": [_flip_example(b, c) for b, c in fixed[:FLIP_EXAMPLES]],
            "broken": [_flip_example(b, c) for b, c in broken[:FLIP_EXAMPLES]],
        },
    }


FLIP_EXAMPLES = 5  # per direction, in the report
FLIP_TEXT_CHARS = 300


def _flip_example(base: dict, cand: dict) -> dict:
    text = base.get("text")
    return {
        "id": base["id"],
        "text": short_text(text, FLIP_TEXT_CHARS) if isinstance(text, str) else text,
        "gold": base.get("gold"),
        "baseline": base.get("parsed"),
        "adapted": cand.get("parsed"),
    }


# --------------------------------------------------------------------------- bootstrap


def bootstrap_for(
    task_kind: str,
    metric: str,
    base_rows: list[dict],
    cand_rows: list[dict],
    labels: list[str] | None,
    *,
    task: TaskSpec | None = None,
    norm: EvalNormalize | None = None,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> dict | None:
    """Paired bootstrap CI of the candidate's gain on `metric` itself, rows paired by id.

    Each resample recomputes the pre-registered metric from the resampled examples: macro-F1
    and per-category scores from label counts, extraction and format metrics (micro F1 over
    fields or leaves, validity rates, per-field and per-category scores) from the summed
    counts of `structured.Scorer` (re-scored from each row's gold, raw output and text;
    extraction and format need the `task`). None when no example is in both, or when the
    metric is not among those the rows give (e.g. a category the split does not hold).
    """
    pairs = _checked_pairs(base_rows, cand_rows)
    if not pairs:
        return None
    if task_kind in ("classification", "image_classification") and metric == "macro_f1":
        if not labels:
            raise ValueError("classification metrics need the task's labels")
        golds = [b["gold"] for b, _ in pairs]
        base_p, cand_p = [b.get("parsed") for b, _ in pairs], [c.get("parsed") for _, c in pairs]
        # the vectorised form of the same computation
        result = paired_bootstrap_macro_f1(golds, base_p, cand_p, labels, n_boot=n_boot, seed=seed)
        return _bootstrap(result, metric, len(pairs))
    found = bootstrap_metrics(
        task_kind, [metric], base_rows, cand_rows, labels, task=task, norm=norm,
        n_boot=n_boot, seed=seed,
    )  # fmt: skip
    return found.get(metric)


def bootstrap_metrics(
    task_kind: str,
    metrics: Sequence[str],
    base_rows: list[dict],
    cand_rows: list[dict],
    labels: list[str] | None,
    *,
    task: TaskSpec | None = None,
    norm: EvalNormalize | None = None,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> dict[str, dict]:
    """bootstrap_for several metrics on the same resamples (the guards' concrete metrics),
    each summary also holding the candidate's own CI (`value_low`, `value_high`) for the
    absolute rules. Metrics the rows do not give are left out."""
    pairs = _checked_pairs(base_rows, cand_rows)
    if not pairs or not metrics:
        return {}
    if task_kind in ("classification", "image_classification"):  # one label per example
        if not labels:
            raise ValueError("classification metrics need the task's labels")
        golds = [b["gold"] for b, _ in pairs]
        base_c = [classification_counts(g, b.get("parsed"), labels) for g, (b, _) in
                  zip(golds, pairs, strict=True)]  # fmt: skip
        cand_c = [classification_counts(g, c.get("parsed"), labels) for g, (_, c) in
                  zip(golds, pairs, strict=True)]  # fmt: skip

        def compute(totals: dict) -> dict:
            return classification_totals(totals, labels)

    elif task_kind == "multi_label_classification":  # a set of labels per example
        if not labels:
            raise ValueError("classification metrics need the task's labels")

        def counts(row: dict, gold: list[str]) -> dict:
            bad = label_set_invalid(row.get("parsed"), row.get("unknown_labels"))
            return multi_label_counts(gold, row.get("parsed"), labels, bad)

        golds = [b["gold"] for b, _ in pairs]
        base_c = [counts(b, g) for g, (b, _) in zip(golds, pairs, strict=True)]
        cand_c = [counts(c, g) for g, (_, c) in zip(golds, pairs, strict=True)]

        def compute(totals: dict) -> dict:
            return multi_label_totals(totals, labels)

    else:
        if task is None:
            raise ValueError(f"{task_kind} metrics need the task to be re-scored")
        scorer = Scorer(task, norm or EvalNormalize(), [b.get("gold") for b, _ in pairs])
        base_c = [row_counts(scorer, b) for b, _ in pairs]
        cand_c = [row_counts(scorer, c) for _, c in pairs]
        paths = scorer.leaf_paths(total_of([*base_c, *cand_c]))

        def compute(totals: dict) -> dict:
            return scorer.metrics(totals, paths)

    full = compute(total_of(base_c))
    names = [m for m in dict.fromkeys(metrics) if _is_number(full, m)]
    if not names:
        return {}

    def values(totals: dict) -> dict[str, float]:
        got = compute(totals)
        return {m: get_metric(got, m) for m in names}

    found = paired_bootstrap_counts_many(base_c, cand_c, values, names, n_boot=n_boot, seed=seed)
    return {m: _bootstrap(found[m], m, len(pairs)) for m in names}


def _is_number(metrics: dict, name: str) -> bool:
    try:
        value = get_metric(metrics, name)
    except KeyError:
        return False
    return isinstance(value, int | float) and not isinstance(value, bool)


def _checked_pairs(base_rows: list[dict], cand_rows: list[dict]) -> list[tuple[dict, dict]]:
    pairs = _pairs(base_rows, cand_rows)
    for b, c in pairs:
        if b.get("gold") != c.get("gold"):
            raise ValueError(f"example {b['id']!r} has different gold answers in the two runs")
    return pairs


def _bootstrap(result: dict, metric: str, n: int) -> dict:
    # "stat" and "proxy" stay for records written when some metrics had a proxy
    return {**result, "metric": metric, "stat": metric, "proxy": False, "n": n, "note": None}


# --------------------------------------------------------------------------- decision


def _ci_text(bootstrap: dict) -> str:
    level = f"{100 * bootstrap.get('ci', 0.95):g}%"
    what = "the gain"
    if bootstrap.get("proxy"):
        what = f"the {bootstrap['stat']} gain (a proxy for {bootstrap['metric']})"
    return f"{level} CI of {what} [{bootstrap['ci_low']:+.3f}, {bootstrap['ci_high']:+.3f}]"


def _success_line(success: RuleResult, bootstrap: dict | None) -> str:
    if success.baseline is None or success.candidate is None:
        return success.detail
    gain = success.candidate - success.baseline
    verb = "gained" if gain >= 0 else "changed"
    line = (
        f"{success.metric} {verb} {gain:+.3f} ({success.baseline:.3f} -> {success.candidate:.3f}),"
        f" needs {success.threshold:+.3f}"
    )
    return line + (f"; {_ci_text(bootstrap)}" if bootstrap else "; no bootstrap CI")


def decide(
    spec_success: SuccessSpec,
    guards: list[GuardSpec],
    min_support: int,
    baseline_metrics: dict,
    candidate_metrics: dict,
    *,
    bootstrap: dict | None,
    guard_intervals: dict[str, dict] | None = None,
) -> dict:
    """The pre-registered decision, with the reasons and the numbers behind it.

    - NO-GO: a guard fails (with `guard_intervals`: its whole CI lies beyond the threshold);
      or the success criterion fails and even the top of the bootstrap CI of the gain is
      below min_gain (clearly not met, not noise).
    - GO: the success criterion passes, the CI's lower bound is above 0 (the gain is not
      noise), and every guard passes (none fails, none is within noise, none has
      insufficient data).
    - INCONCLUSIVE: everything else: a gain within noise (CI includes 0), a miss the CI
      cannot confirm (its top reaches min_gain), a guard missed within noise, a guard whose
      support is under min_support, a success metric that cannot be read, or no bootstrap.

    `bootstrap` is a paired bootstrap summary (`bootstrap_for`) with ci_low/ci_high;
    `guard_intervals` the guards' own (`bootstrap_metrics` of `guard_metrics`).
    -> {decision, reasons, success, guards, bootstrap}, rule results as dicts.
    """
    success = check_success(spec_success, baseline_metrics, candidate_metrics)
    results = check_guards(
        guards, baseline_metrics, candidate_metrics, min_support, guard_intervals
    )
    failed = [g for g in results if g.status == "fail"]
    noisy = [g for g in results if g.status == "within_noise"]
    thin = [g for g in results if g.status == "insufficient_data"]
    min_gain = float(spec_success.min_gain)
    readable = success.baseline is not None and success.candidate is not None
    low = bootstrap.get("ci_low") if bootstrap else None
    high = bootstrap.get("ci_high") if bootstrap else None

    reasons = [_success_line(success, bootstrap)]
    decision: Decision
    if failed:
        decision = "NO-GO"
        reasons += [f"guard failed: {g.detail}" for g in failed]
    elif readable and success.status == "fail" and high is not None and high < min_gain:
        decision = "NO-GO"
        reasons.append(
            f"success not met: even the top of the CI ({high:+.3f}) is below the required "
            f"gain {min_gain:+.3f}"
        )
    elif success.status == "pass" and low is not None and low > 0 and not thin and not noisy:
        decision = "GO"
        checks = f"all {len(results)} guard checks pass" if results else "no guards set"
        reasons.append(f"success met and above noise (CI low {low:+.3f} > 0); {checks}")
    else:
        decision = "INCONCLUSIVE"
        if not readable:
            reasons.append("the success metric cannot be read from both runs")
        elif low is None or high is None:
            reasons.append("no bootstrap CI: the gain cannot be told from noise")
        elif success.status == "pass" and low <= 0:
            reasons.append(f"gain within noise: the CI includes 0 (low {low:+.3f})")
        elif success.status == "fail":
            reasons.append(
                f"success not met by the point estimate, but the CI reaches the required gain "
                f"(high {high:+.3f} >= {min_gain:+.3f}): the miss may be noise"
            )
        reasons += [f"guard missed within noise: {g.detail}" for g in noisy]
        reasons += [f"insufficient data: {g.detail}" for g in thin]
    if results and decision == "INCONCLUSIVE":
        passed = len(results) - len(thin) - len(noisy)
        within = f", {len(noisy)} missed within noise" if noisy else ""
        reasons.append(
            f"guards: {passed} pass{within}, {len(thin)} with insufficient data"
            f" (min_support {min_support})"
        )
    return {
        "decision": decision,
        "reasons": reasons,
        "success": asdict(success),
        "guards": [asdict(g) for g in results],
        "bootstrap": bootstrap,
    }


def gate(decision: dict, verify: dict | None, test: dict | None, smoke: dict | None = None) -> dict:
    """The protocol's own gates on a decision: a pilot whose latest smoke for this spec failed
    or that has none (`smoke`: {id, status, ok, error} or None), a run that was not reloaded
    in a fresh process (`verify`), not evaluated once on the reserved test split, or whose
    test gain over the base (paired bootstrap on test, `test["gain"]`) has a CI reaching 0,
    is at most INCONCLUSIVE; a failed verify is NO-GO. A NO-GO stays NO-GO. -> a new decision
    dict, `gates` added."""
    out = {**decision, "reasons": list(decision.get("reasons", []))}
    verified = verify is not None and verify.get("status") == "completed" and verify.get("ok")
    failed = verify is not None and verify.get("status") == "failed"
    smoked = smoke is not None and smoke.get("status") == "completed" and smoke.get("ok")
    gates = {"smoke": "ok" if smoked else "failed" if smoke is not None else "not run",
             "verify": "ok" if verified else "failed" if failed else "not run",
             "final_test": "done" if test is not None else "not run"}  # fmt: skip
    out["gates"] = gates
    if failed:
        problems = "; ".join(verify.get("problems") or []) or "see the verify run"
        out["decision"] = "NO-GO"
        out["reasons"].append(
            f"verify failed ({verify.get('id')}): the adapter does not reproduce its result in "
            f"a fresh process: {problems}"
        )
        return out
    missing = []
    if smoke is None:
        missing.append("no smoke test of this spec: run `lorapilot smoke` (it proves the wiring)")
    elif not smoked:
        missing.append(
            f"the latest smoke test of this spec failed ({smoke.get('id')}): "
            f"{smoke.get('error') or 'it could not memorise its examples'}"
        )
    if not verified:
        missing.append("not reloaded in a fresh process yet: run `lorapilot verify`")
    if test is None:
        missing.append(
            "no final test evaluation of the chosen adapter yet: run "
            "`lorapilot eval --split test --final`"
        )
    if test is not None:
        confirmed, line = _test_confirms(test.get("gain"))
        gates["test_confirms"] = confirmed
        out["reasons"].append(line)
        if not confirmed:
            missing.append("the final test does not confirm the validation gain")
    if missing and out["decision"] == "GO":
        out["decision"] = "INCONCLUSIVE"
        out["reasons"].append("GO on validation, but " + "; ".join(missing))
    return out


def _test_confirms(gain: dict | None) -> tuple[bool, str]:
    """(does the test gain's CI lie above 0, the reason line). The test split is not used to
    choose; it must not contradict the choice made on validation."""
    if not gain or gain.get("gain") is None:
        return False, "final test: the base was not evaluated on the test split, no test gain"
    boot = gain.get("bootstrap")
    line = (
        f"final test: {gain['metric']} {gain['gain']:+.3f} over the base on test "
        f"({gain['baseline']:.3f} -> {gain['adapted']:.3f})"
    )
    if not boot:
        return False, line + "; no bootstrap CI"
    ok = boot["ci_low"] > 0
    return ok, line + f"; {_ci_text(boot)}" + ("" if ok else ": includes 0")
