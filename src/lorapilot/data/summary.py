"""The data report: what the `data` step records about the prepared splits (sizes per
category, duplicates and leaks, lengths, skipped rows, the loss-mask audit)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from lorapilot.data.audit import length_stats, mask_audit, truncation_report
from lorapilot.data.dataset import (
    PreparedData,
    describe_leaks,
    encode_records,
    formatter_for,
    group_report,
    remaining_leaks,
)
from lorapilot.data.format import rendered_system
from lorapilot.data.rows import Skipped, conversation_text, skipped_summary
from lorapilot.data.targets import grounded_in, grounded_strings
from lorapilot.errors import UsageError
from lorapilot.evaluate.leaves import root_spec
from lorapilot.spec import Pilot

# What the shared report says about rows set aside and groups, in the order it is written.
SET_ASIDE = (
    "skipped",
    "skipped_summary",
    "dropped_by_cleaning",
    "unlisted_labels",
    "groups",
    "text_template",
    "messages",
    "label_sets",
)


def shared_report(
    pilot: Pilot, prepared: PreparedData, data_warnings: list[str] | None = None
) -> dict[str, Any]:
    """What the `data` verb writes for any modality: sizes per split and category,
    duplicates and leaks, skipped and dropped rows, warnings (the modality's own
    `data_warnings` after the label-support ones)."""
    spec = pilot.spec
    counts = prepared.counts()
    per_category: dict[str, dict[str, int]] = {}
    for split, cats in counts.items():
        for cat, n in cats.items():
            per_category.setdefault(cat, {s: 0 for s in counts})[split] = n
    leaks = remaining_leaks(pilot, prepared)
    warnings = _label_support_warnings(pilot, counts.get("train", {})) + (data_warnings or [])
    invalid = [s for s in prepared.skipped if s.label is None]
    unlisted = unlisted_report(prepared.skipped) if len(invalid) < len(prepared.skipped) else None
    if unlisted:
        per = unlisted["per_label"]
        warnings.append(
            f"{unlisted['dropped']} example(s) left out for labels not in task.labels "
            "(data.unlisted_labels: drop): "
            + ", ".join(f"{label!r} {n}" for label, n in list(per.items())[:10])
            + (f" and {len(per) - 10} more label(s)" if len(per) > 10 else "")
        )
    if prepared.target_excluded:
        gone = prepared.target_excluded
        warnings.append(
            f"{len(gone)} example(s) left out because their answer would be cut by "
            f"data.max_length={spec.data.max_length} (data.on_truncated_target: exclude): "
            + ", ".join(f"{e['id']} ({e['split']})" for e in gone[:5])
            + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
            + "; raise data.max_length to keep them"
        )
    groups = group_report(pilot, prepared.splits)
    if groups and groups["shared"]:
        shown = ", ".join(repr(g["group"]) for g in groups["shared"][:10])
        warnings.append(
            f"{len(groups['shared'])} group(s) of {groups['column']!r} (data.split.group) are "
            f"in more than one of the given splits: {shown}; their examples share an origin "
            "across splits (split one file with data.file to keep each group whole)"
        )
    template = template_report(pilot, prepared)
    if template:
        warnings += template["warnings"]
    messages = messages_report(pilot, prepared)
    if messages:
        warnings += messages["warnings"]
    if leaks and spec.data.leakage == "warn":
        warnings.append(
            f"{len(leaks)} duplicate pair(s) across splits kept (data.leakage: warn): "
            + describe_leaks(leaks)
        )
    dups = prepared.duplicates.to_dict()
    dups["cross_split"] = leaks
    dups["n_cross_split"] = len(leaks)
    dups["leakage_policy"] = spec.data.leakage
    dups["dropped_from_train"] = prepared.leak_dropped
    return {
        "version": prepared.version,
        "source": spec.data.source,
        "permission": spec.data.permission,
        "n_examples": sum(len(v) for v in prepared.splits.values()),
        "splits": {s: len(v) for s, v in prepared.splits.items()},
        "per_category": per_category,
        "duplicates": dups,
        "skipped": [dataclasses.asdict(s) for s in invalid],
        "skipped_summary": skipped_summary(invalid),
        "dropped_by_cleaning": prepared.dropped,
        **({"unlisted_labels": unlisted} if unlisted else {}),
        **({"groups": groups} if groups is not None else {}),
        **({"label_sets": label_set_report(prepared)} if prepared.labels is not None else {}),
        **(
            {"text_template": {k: v for k, v in template.items() if k != "warnings"}}
            if template
            else {}
        ),
        **(
            {"messages": {k: v for k, v in messages.items() if k != "warnings"}} if messages else {}
        ),
        "warnings": warnings,
    }


def label_set_report(prepared: PreparedData, shown: int = 10) -> dict[str, Any]:
    """A multi-label task's sets: labels per example per split (mean, and how many examples
    have 1, 2, ... labels) and the commonest combinations of two labels or more."""
    per_split: dict[str, Any] = {}
    combos: dict[str, int] = {}
    for split, records in prepared.splits.items():
        sizes: dict[str, int] = {}
        for r in records:
            k = len(r.target or ())
            sizes[str(k)] = sizes.get(str(k), 0) + 1
            if k > 1:
                key = "\x1f".join(r.target)
                combos[key] = combos.get(key, 0) + 1
        n = len(records)
        per_split[split] = {
            "mean": round(sum(int(k) * v for k, v in sizes.items()) / n, 3) if n else 0.0,
            "examples_by_count": dict(sorted(sizes.items(), key=lambda kv: int(kv[0]))),
        }
    top = sorted(combos.items(), key=lambda kv: (-kv[1], kv[0]))[:shown]
    return {
        "labels_per_example": per_split,
        "commonest_combinations": [{"labels": k.split("\x1f"), "examples": v} for k, v in top],
    }


def template_report(pilot: Pilot, prepared: PreparedData) -> dict[str, Any] | None:
    """With data.fields.text_template: how many examples had each of its columns empty (the
    place left empty in their text), per split; a warning per column empty somewhere, and a
    pointed one for a column empty everywhere (a misspelt name in a JSONL file reads as
    absent in every row)."""
    template = pilot.spec.data.fields.text_template
    if template is None or pilot.spec.task.modality == "image":
        return None
    columns = pilot.spec.data.fields.input_columns("text")
    empty = {c: {s: 0 for s in prepared.splits} for c in columns}
    for split, recs in prepared.splits.items():
        for r in recs:
            for c in r.empty_fields:
                empty[c][split] += 1
    n = sum(len(v) for v in prepared.splits.values())
    warnings = []
    for c, per in empty.items():
        total = sum(per.values())
        if total == n:
            warnings.append(
                f"column {c!r} of data.fields.text_template is empty or absent in all {n} "
                "examples: is the name spelt as in the data?"
            )
        elif total:
            warnings.append(
                f"{total} of {n} example(s) have an empty {c!r} (data.fields.text_template): "
                "its place in their text is left empty"
            )
    return {
        "template": template,
        "columns": columns,
        "empty": {c: {**per, "total": sum(per.values())} for c, per in empty.items()},
        "warnings": warnings,
    }


def messages_report(pilot: Pilot, prepared: PreparedData) -> dict[str, Any] | None:
    """With data.fields.messages: the system turns the conversations carry, which the pilot
    does not use (task.system is its prompt): how many rows have one, how many of those
    differ from task.system as the prompt renders it, the commonest texts; a warning when
    any differ."""
    fm = pilot.spec.data.fields
    if fm.messages is None:
        return None
    task_system = rendered_system(pilot.spec.task)
    records = [r for recs in prepared.splits.values() for r in recs]
    with_system = [r for r in records if r.system is not None]
    differing = [r for r in with_system if r.system.strip() != (task_system or "").strip()]
    texts = Counter(r.system for r in with_system)
    warnings = []
    if differing:
        first = differing[0]
        warnings.append(
            f"{len(differing)} of {len(records)} conversation(s) in {fm.messages!r} carry a "
            f"system turn other than task.system (first: {first.source}, "
            f"{_cut(first.system or '')!r}); lorapilot prompts every example with task.system, "
            "not the data's: set task.system to the data's text to train as it was written"
        )
    return {
        "column": fm.messages,
        "n_examples": len(records),
        "with_system": len(with_system),
        "system_differs": len(differing),
        "system_texts": [{"text": _cut(t), "n": n} for t, n in texts.most_common(5)],
        "n_system_texts": len(texts),
        # conversations with turns before the last user turn: the prompt holds them
        "with_earlier_turns": sum(1 for r in records if r.context),
        "most_earlier_turns": max((len(r.context) for r in records), default=0),
        "warnings": warnings,
    }


def _cut(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def unlisted_report(skipped: list[Skipped]) -> dict[str, Any]:
    """The rows `data.unlisted_labels: drop` left out: how many per label, and which."""
    rows = [s for s in skipped if s.label is not None]
    per_label: dict[str, int] = {}
    for s in rows:
        per_label[s.label] = per_label.get(s.label, 0) + 1  # type: ignore[index]
    return {
        "policy": "drop",
        "dropped": len(rows),
        "per_label": dict(sorted(per_label.items(), key=lambda kv: (-kv[1], kv[0]))),
        "rows": [{"file": s.file, "line": s.line, "label": s.label} for s in rows],
    }


def data_report(pilot: Pilot, prepared: PreparedData, tokenizer: Any) -> dict[str, Any]:
    """Everything the `data` verb writes for a text pilot: the shared report, the lengths,
    the answers cut, the loss-mask audit and the gold values' grounding."""
    spec = pilot.spec
    fmt = formatter_for(pilot, tokenizer)
    encoded = {
        s: encode_records(fmt, spec.task, recs, prepared.answer_budget)
        for s, recs in prepared.splits.items()
    }
    grounding = gold_grounding(prepared, root_spec(spec.task)) if spec.task.grounded else None
    grounding_warnings = []
    if grounding and grounding["n_ungrounded"]:
        shown = "; ".join(
            f"{e['id']} ({e['split']}): {e['value']!r}" for e in grounding["examples"]
        )
        grounding_warnings.append(
            f"{grounding['n_ungrounded']} of {grounding['n_values']} gold string values do not "
            f"appear in their input text (task.grounded: true; annotation problems?): {shown}"
        )
    shared = shared_report(pilot, prepared, grounding_warnings)
    order = ("version", "source", "permission", "n_examples", "splits", "per_category")
    return {
        **{k: shared[k] for k in order},
        "duplicates": shared["duplicates"],
        "lengths": length_stats(encoded, fmt.max_length),
        "truncation": {
            **truncation_report(
                encoded,
                prepared.splits,
                fmt.max_length,
                spec.data.truncation,
                answer_room=prepared.answer_room,
                uncut_prompt_tokens=lambda rec: fmt.uncut_prompt_tokens(rec.text, rec.context),
            ),
            "max_length_setting": spec.data.max_length,
            "max_length_source": (
                "auto: the model's context (config.json's max_position_embeddings); no input is "
                "cut unless it is longer"
                if spec.data.max_length == "auto"
                else "data.max_length"
            ),
        },
        **{k: shared[k] for k in SET_ASIDE if k in shared},
        "target_excluded": prepared.target_excluded,
        "answer_budget_tokens": prepared.answer_budget,
        "mask_audit": mask_audit(fmt, prepared.splits, encoded, prepared.answer_budget),
        **({"grounding": grounding} if grounding is not None else {}),
        "warnings": shared["warnings"],
    }


def gold_grounding(prepared: PreparedData, root: Any = None, shown: int = 5) -> dict[str, Any]:
    """Gold free-text values that are not in their own input text: a grounded task whose
    annotations invent values teaches the model to invent them. `root`: the target's
    ValueSpec, so that closed-set values (an `enum`, `grounded: false`) are left out as the
    metric leaves them out."""
    n_values = 0
    bad = []
    for split, records in prepared.splits.items():
        for r in records:
            for value in grounded_strings(r.target, root):
                n_values += 1
                if not grounded_in(value, conversation_text(r)):
                    bad.append({"id": r.id, "split": split, "value": value[:80]})
    return {"n_values": n_values, "n_ungrounded": len(bad), "examples": bad[:shown]}


def _label_support_warnings(pilot: Pilot, train_counts: dict[str, int]) -> list[str]:
    """Labels the adapter cannot learn (no training example) or will hardly learn (fewer than
    eval.min_support): a train split with all its rows in one label passes every other check."""
    labels = pilot.spec.task.labels if pilot.spec.task.labelled else None
    if not labels:
        return []
    out = []
    missing = [lab for lab in labels if train_counts.get(lab, 0) == 0]
    if missing:
        out.append(
            f"{len(missing)} of {len(labels)} labels have no training example: "
            + ", ".join(missing)
        )
    floor = pilot.spec.eval.min_support
    few = [f"{lab} ({n})" for lab in labels if 0 < (n := train_counts.get(lab, 0)) < floor]
    if few:
        out.append(f"labels with fewer than eval.min_support={floor} training examples: "
                   + ", ".join(few))  # fmt: skip
    return out


def require_permission(pilot: Pilot) -> None:
    d = pilot.spec.data
    missing = [k for k in ("source", "permission") if not (getattr(d, k) or "").strip()]
    if missing:
        raise UsageError(
            f"{pilot.spec_path}: {', '.join('data.' + k for k in missing)} must be stated: where "
            "the data "
            "comes from and the permission to use it (a licence or an internal approval)"
        )


def truncation_failure(tr: dict[str, Any]) -> str | None:
    """Why `data` fails when max_length cuts inputs under `data.truncation: fail` (None: it
    does not), naming the examples and the length that fits them all."""
    n = tr.get("n_truncated") or 0
    if not n or tr.get("policy") == "allow":
        return None
    where = ", ".join(f"{s}: {k}" for s, k in tr["per_split"].items())
    shown = "; ".join(tr["examples"][:10])
    return (
        f"data.max_length={tr['max_length_setting']} ({tr['max_length']} tokens) cuts the input "
        f"of {n} example(s) ({where}): {shown}. Every prompt leaves room for the longest answer "
        f"({tr['answer_room_tokens']} tokens), so a max_length of {tr['fits_at']} (the longest "
        f"prompt, {tr['longest_prompt_tokens']} tokens, plus that room) fits every example "
        "whole: raise data.max_length (or leave it auto, the model's context), or set "
        "data.truncation: allow to train and evaluate on the cut inputs (counted per split and "
        "category in the data report)"
    )
