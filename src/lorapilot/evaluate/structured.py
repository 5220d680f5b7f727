"""Extraction and format metrics (pure, no I/O), built from per-example counts.

Every metric of a JSON-target task is a function of counts summed over examples: validity
flags, per-field agreement and true/false positives, per-leaf true positives and the
number of gold and predicted leaves, per category. `Scorer.counts` gives one example's,
`Scorer.metrics` turns any sum of them into the metrics dict. The evaluation sums over all
examples; the paired bootstrap sums over each resample, so the decision's CI is the CI of
the pre-registered metric itself (micro F1 from summed counts), never a per-example proxy.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from lorapilot.data.targets import (
    category_of,
    grounded_in,
    grounded_strings,
    is_text_target,
    target_validator,
)
from lorapilot.evaluate import leaves
from lorapilot.evaluate.metrics import _div, _f1
from lorapilot.evaluate.values import parse_first_json, values_equal
from lorapilot.spec import EvalNormalize, FieldSpec, TaskSpec, ValueSpec
from lorapilot.spec.metric_names import path_pattern

Totals = dict[Any, float]


def _prf(tp: float, gold: float, pred: float) -> tuple[float, float, float]:
    precision, recall = _div(tp, pred), _div(tp, gold)
    return precision, recall, _f1(precision, recall)


def _field_names(task: TaskSpec, gold: Sequence[Any]) -> tuple[list[str], set[str]]:
    """(top-level field names in order, required names): task.fields, else the json_schema's
    properties, else every key the gold objects use."""
    if task.fields:
        return [f.name for f in task.fields], {f.name for f in task.fields if f.required}
    schema = task.json_schema or {}
    required = set(schema.get("required") or [])
    props = schema.get("properties")
    if isinstance(props, dict) and props:
        return list(props), required
    return sorted({k for g in gold if isinstance(g, dict) for k in g}), required


class Scorer:
    """The counting and the reduction of one task's JSON (or regex) targets."""

    def __init__(self, task: TaskSpec, norm: EvalNormalize, golds: Sequence[Any] = ()):
        self.task, self.norm = task, norm
        self.text_target = is_text_target(task)
        self.check = target_validator(task)
        self.names, self.required = _field_names(task, golds)
        root = None if self.text_target else leaves.root_spec(task)
        if (root is None or root.type != "object") and self.names:
            root = ValueSpec(type="object", fields=[FieldSpec(name=n) for n in self.names])
        self.root = root
        # declared leaf paths in spec order, a map's keys as `*` (a key may hold dots)
        self._declared = [path_pattern(p) for p in root.leaf_paths()] if root else []
        # the structured fields, whose leaves also get their own leaf-level scores
        self._subtrees = [f.name for f in (root.fields or []) if f.has_leaves] if root else []
        if self.text_target:
            self.pattern = re.compile(task.regex or "")

    # ----------------------------------------------------------------- one example

    def counts(
        self, gold: Any, output: str, *, text: str = "", category: str | None = None
    ) -> tuple[Totals, Any, str | None]:
        """One example -> (its counts, the parsed answer, the parse error)."""
        if self.text_target:
            out = output.strip()
            match = self.pattern.fullmatch(out)
            c: Totals = {
                "n": 1,
                "valid": bool(match),
                "exact": gold is not None and values_equal(out, gold, self.norm),
            }
            if not self.task.answer_group:
                return c, None, None
            # the marked part of a valid output against the same part of the target
            answer = match.group("answer") if match else None
            gold_match = self.pattern.fullmatch(gold.strip()) if isinstance(gold, str) else None
            c["answer"] = (
                answer is not None
                and gold_match is not None
                and values_equal(answer, gold_match.group("answer"), self.norm)
            )
            return c, answer, None
        obj, error = parse_first_json(output)
        if not isinstance(obj, dict):
            obj = None
        c = {
            "n": 1,
            "json_valid": obj is not None,
            "schema_valid": obj is not None and not self.check(obj),
            "required_ok": obj is not None and all(obj.get(r) is not None for r in self.required),
        }
        exact = obj is not None
        for name in self.names:
            gv = gold.get(name) if isinstance(gold, dict) else None
            pv = obj.get(name) if obj is not None else None
            same = values_equal(gv, pv, self.norm)
            exact = exact and same
            c[("field", name, "agree")] = same
            c[("field", name, "tp")] = same and gv is not None
            c[("field", name, "gold")] = gv is not None
            c[("field", name, "pred")] = pv is not None
        c["exact"] = exact
        leaf_counts = leaves.compare(gold, obj, self.root, self.norm)
        for path, (tp, g, p) in leaf_counts.items():
            c[("leaf", path, "tp")] = tp
            c[("leaf", path, "gold")] = g
            c[("leaf", path, "pred")] = p
            c[("leaf", path, "wrong")] = not tp == g == p
        if self.task.grounded:
            values = grounded_strings(obj, self.root) if obj is not None else []
            c["strings"] = len(values)
            c["ungrounded"] = sum(not grounded_in(v, text) for v in values)
        if category is not None:
            for key in ("n", "json_valid", "exact", "strings", "ungrounded"):
                if key in c:
                    c[("cat", category, key)] = c[key]
            for key, v in list(c.items()):
                if isinstance(key, tuple) and key[0] == "field":
                    c[("cat", category, key)] = v
            for i, part in enumerate(("tp", "gold", "pred")):
                c[("cat", category, "leaf_" + part)] = sum(cell[i] for cell in leaf_counts.values())
        return c, obj, error

    # ----------------------------------------------------------------- any sum of examples

    def leaf_paths(self, totals: Totals) -> list[str]:
        """The per-field paths to report: declared ones (map keys filled in) and any with gold
        leaves, in spec order; paths only predictions use count in the micro scores only."""
        seen = {k[1] for k in totals if isinstance(k, tuple) and k[0] == "leaf"}

        def rank(path: str) -> int | None:
            return next((i for i, d in enumerate(self._declared) if d.fullmatch(path)), None)

        ranked = [(rank(p), p) for p in seen]
        keep = [
            (len(self._declared) if r is None else r, p)
            for r, p in ranked
            if r is not None or totals.get(("leaf", p, "gold"), 0) > 0
        ]
        return [p for _, p in sorted(keep)]

    def metrics(self, totals: Totals, paths: list[str] | None = None) -> dict:
        """The metrics dict of summed counts (`paths`: the per-field leaf paths to report,
        fixed by the bootstrap so that every resample has the same entries)."""
        n = totals.get("n", 0)
        if self.text_target:
            out: dict[str, Any] = {"n": n, "format_valid_rate": _div(totals.get("valid", 0), n)}
            if "exact" in totals:
                out["exact_match"] = _div(totals["exact"], n)
            if self.task.answer_group and "exact" in totals:
                out["answer_match"] = _div(totals.get("answer", 0), n)
            return out
        per_field: dict[str, dict] = {}
        ftp = fgold = fpred = 0.0
        for name in self.names:
            tp, g, p = (totals.get(("field", name, k), 0) for k in ("tp", "gold", "pred"))
            per_field[name] = _entry(_div(totals.get(("field", name, "agree"), 0), n), tp, g, p)
            ftp, fgold, fpred = ftp + tp, fgold + g, fpred + p
        ltp, lgold, lpred = _leaf_sums(totals)
        for path in self.leaf_paths(totals) if paths is None else paths:
            if path in per_field:
                continue
            tp, g, p = (totals.get(("leaf", path, k), 0) for k in ("tp", "gold", "pred"))
            accuracy = 1 - _div(totals.get(("leaf", path, "wrong"), 0), n) if n else 0.0
            per_field[path] = _entry(accuracy, tp, g, p)
        for name in self._subtrees:  # beside the whole-value match: the leaves beneath it
            if name in per_field:
                per_field[name].update(_subtree(totals, name))
        fp, fr, ff = _prf(ftp, fgold, fpred)
        lp, lr, lf = _prf(ltp, lgold, lpred)
        accs = [per_field[name]["accuracy"] for name in self.names]
        out = {
            "n": n,
            "json_valid_rate": _div(totals.get("json_valid", 0), n),
            "schema_valid_rate": _div(totals.get("schema_valid", 0), n),
            "required_fields_rate": _div(totals.get("required_ok", 0), n),
            "exact_match": _div(totals.get("exact", 0), n),
            "field_accuracy": _div(sum(accs), len(accs)),
            "field_precision": fp,
            "field_recall": fr,
            "field_f1": ff,
            # beside the accuracy: how many values gold has and the model gave (an adapter
            # that answers empty fields can keep a high accuracy on mostly empty gold)
            "field_gold": round(fgold),  # counts, like per_field's support and predicted
            "field_predicted": round(fpred),
            "leaf_gold": round(lgold),
            "leaf_predicted": round(lpred),
            "leaf_precision": lp,
            "leaf_recall": lr,
            "leaf_f1": lf,
        }
        if self.task.kind == "format":  # a JSON format task's format is its schema
            out["format_valid_rate"] = out["schema_valid_rate"]
        if self.task.grounded:
            out["ungrounded_value_rate"] = _div(
                totals.get("ungrounded", 0), totals.get("strings", 0)
            )
            out["grounding_checked"] = round(totals.get("strings", 0))  # its support
        out["per_field"] = per_field
        out["per_category"] = self._per_category(totals)
        return out

    def _per_category(self, totals: Totals) -> dict[str, dict]:
        cats: dict[str, Totals] = {}
        for key, v in totals.items():
            if isinstance(key, tuple) and key[0] == "cat":
                cats.setdefault(key[1], {})[key[2]] = v
        out = {}
        for cat in sorted(cats):
            t = cats[cat]
            n = t.get("n", 0)
            accs = [_div(t.get(("field", name, "agree"), 0), n) for name in self.names]
            ftp, fgold, fpred = (
                sum(t.get(("field", name, k), 0) for name in self.names)
                for k in ("tp", "gold", "pred")
            )
            entry = {
                "support": n,
                "json_valid_rate": _div(t.get("json_valid", 0), n),
                "exact_match": _div(t.get("exact", 0), n),
                "field_accuracy": _div(sum(accs), len(accs)),
                "field_f1": _prf(ftp, fgold, fpred)[2],
                "field_gold": fgold,
                "field_predicted": fpred,
                "leaf_f1": _prf(*(t.get("leaf_" + k, 0) for k in ("tp", "gold", "pred")))[2],
            }
            if self.task.grounded:
                entry["ungrounded_value_rate"] = _div(t.get("ungrounded", 0), t.get("strings", 0))
                entry["grounding_checked"] = round(t.get("strings", 0))
            out[cat] = entry
        return out


def _leaf_sums(totals: Totals, under: str | None = None) -> tuple[float, float, float]:
    """(true positives, gold, predicted) summed over every leaf, or over the leaves beneath
    one field (`slots.city` and `line_items[].amount` are beneath `slots`, `line_items`)."""
    sums = {"tp": 0.0, "gold": 0.0, "pred": 0.0}
    for key, v in totals.items():
        if isinstance(key, tuple) and key[0] == "leaf" and key[2] in sums:
            path = key[1]
            if under is None or path == under or path.startswith((under + ".", under + "[]")):
                sums[key[2]] += v
    return sums["tp"], sums["gold"], sums["pred"]


def _subtree(totals: Totals, name: str) -> dict:
    """Leaf-level precision, recall and F1 over the leaves beneath one field, summed as the
    headline leaf_f1 sums all of them."""
    tp, gold, pred = _leaf_sums(totals, name)
    p, r, f = _prf(tp, gold, pred)
    return {
        "leaf_gold": round(gold), "leaf_predicted": round(pred),
        "leaf_precision": p, "leaf_recall": r, "leaf_f1": f,
    }  # fmt: skip


def _entry(accuracy: float, tp: float, gold: float, pred: float) -> dict:
    precision, recall, f1 = _prf(tp, gold, pred)
    return {
        "accuracy": accuracy,
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "support": gold,
        "predicted": pred,
    }


def add(total: Totals, counts: Totals) -> Totals:
    for k, v in counts.items():
        total[k] = total.get(k, 0) + v
    return total


def total_of(counts: Sequence[Totals]) -> Totals:
    """The sum of many examples' counts."""
    total: Totals = {}
    for c in counts:
        add(total, c)
    return total


def extraction_metrics(
    gold: Sequence[dict],
    raw_outputs: Sequence[str],
    task: TaskSpec,
    norm: EvalNormalize,
    *,
    categories: Sequence[str] | None = None,
    texts: Sequence[str] | None = None,
) -> dict:
    """Validity rates, field-level and leaf-level content scores of generated JSON objects.

    A field absent from the output counts as null; null gold and null prediction agree.
    field_*: the top-level fields compared whole (micro over fields: a non-null predicted
    value is a prediction, a non-null gold value a positive). leaf_*: micro over the leaves
    of nested values (`leaves.compare`); for flat fields the two agree. exact_match needs a
    parsed object with every field correct. Per category: `categories` (the records'), else
    which optional fields the gold fills. With task.grounded, `ungrounded_value_rate` is
    the share of predicted string values not found in the input text (`texts`).
    """
    if len(gold) != len(raw_outputs):
        raise ValueError(f"{len(gold)} targets but {len(raw_outputs)} outputs")
    for i, g in enumerate(gold):
        if not isinstance(g, dict):
            raise ValueError(f"target {i} is not a JSON object")
    scorer = Scorer(task, norm, gold)
    total: Totals = {}
    parsed: list[dict | None] = []
    errors: list[str | None] = []
    exact: list[bool] = []
    for i, (g, text) in enumerate(zip(gold, raw_outputs, strict=True)):
        category = categories[i] if categories is not None else category_of(None, g, task)
        c, obj, error = scorer.counts(
            g, text, text=texts[i] if texts is not None else "", category=category
        )
        add(total, c)
        parsed.append(obj)
        errors.append(error)
        exact.append(bool(c["exact"]))
    return {**scorer.metrics(total), "parsed": parsed, "parse_errors": errors, "correct": exact}


def format_metrics(
    outputs: Sequence[str],
    task: TaskSpec,
    targets: Sequence[Any] | None = None,
    norm: EvalNormalize | None = None,
    *,
    categories: Sequence[str] | None = None,
    texts: Sequence[str] | None = None,
) -> dict:
    """How often outputs follow the required format, plus content scores when targets exist.

    A regex-only task: the stripped output must fullmatch task.regex; with string targets,
    exact_match compares normalised strings, and where the regex names a group `answer`,
    answer_match compares that group of a valid output with the target's (`parsed` holds
    the output's group; `correct` is that match). Otherwise the first JSON object in the output
    must satisfy the target schema (task.json_schema, else task.fields), and with object
    targets the extraction_metrics keys are added. `correct` per example is the exact match
    when targets are given, else format validity: what a paired bootstrap should compare.
    """
    norm = norm or EvalNormalize()
    n = len(outputs)
    if targets is not None and len(targets) != n:
        raise ValueError(f"{len(targets)} targets but {n} outputs")
    if is_text_target(task):
        scorer = Scorer(task, norm)
        total: Totals = {}
        flags, answers = [], []
        for i, o in enumerate(outputs):
            c, answer, _ = scorer.counts(targets[i] if targets is not None else None, o)
            if targets is None:
                c.pop("exact")
                c.pop("answer", None)
            add(total, c)
            flags.append(c)
            answers.append(answer)
        valid = [bool(c["valid"]) for c in flags]
        out = {**scorer.metrics(total), "valid": valid, "parsed": answers}
        key = "answer" if task.answer_group else "exact"
        correct = valid if targets is None else [bool(c[key]) for c in flags]
        return {**out, "correct": correct}

    check = target_validator(task)
    parsed = [parse_first_json(o)[0] for o in outputs]
    valid = [isinstance(p, dict) and not check(p) for p in parsed]
    out = {
        "n": n,
        "json_valid_rate": _div(sum(isinstance(p, dict) for p in parsed), n),
        "format_valid_rate": _div(sum(valid), n),
        "valid": valid,
        "parsed": parsed,
    }
    if targets is None:
        return {**out, "correct": valid}
    content = extraction_metrics(
        list(targets), outputs, task, norm, categories=categories, texts=texts
    )
    return {**content, **out, "correct": content["correct"]}


def row_counts(scorer: Scorer, row: dict) -> Totals:
    """An evaluation row's counts, from what the row keeps (gold, raw output, text)."""
    c, _, _ = scorer.counts(
        row.get("gold"),
        row.get("raw_output") or "",
        text=row.get("text") or "",
        category=row.get("category"),
    )
    return c
