"""The metric names each task kind produces, so a spec's success metric and guards are
checked before anything runs (a misspelt metric would otherwise end a pilot INCONCLUSIVE
with no reason). Pure and import-free: the spec validates with it; tests hold it equal to
what `evaluate.metrics` really returns."""

from __future__ import annotations

import difflib
import re

LABELLED = ("classification", "multi_label_classification", "image_classification")
PER_CATEGORY_CLASSIFICATION = ("precision", "recall", "f1", "support", "predicted")
PER_FIELD = ("accuracy", "precision", "recall", "f1", "support", "predicted")
SUBTREE = ("leaf_gold", "leaf_predicted", "leaf_precision", "leaf_recall", "leaf_f1")
"""Beside a structured field's whole-value scores: the leaves beneath it, scored as leaf_f1."""
PER_CATEGORY_EXTRACTION = (
    "support",
    "json_valid_rate",
    "exact_match",
    "field_accuracy",
    "field_f1",
    "field_gold",
    "field_predicted",
    "leaf_f1",
)
_EXTRACTION = (
    "json_valid_rate", "schema_valid_rate", "required_fields_rate", "exact_match",
    "field_accuracy", "field_precision", "field_recall", "field_f1",
    "leaf_precision", "leaf_recall", "leaf_f1",
)  # fmt: skip
# extraction/format with task.grounded, top level and per category: the rate and its support
GROUNDED = ("ungrounded_value_rate", "grounding_checked")
TOP_LEVEL = {
    "classification": ("accuracy", "macro_f1", "invalid_rate"),
    "image_classification": ("accuracy", "macro_f1", "invalid_rate"),
    # accuracy: the whole label set right; micro_f1 pools every (example, label) decision
    "multi_label_classification": (
        "accuracy",
        "macro_f1",
        "micro_f1",
        "invalid_rate",
        "labels_per_example",
        "predicted_per_example",
    ),  # fmt: skip
    "extraction": _EXTRACTION,
    "format": ("format_valid_rate", "answer_match", *_EXTRACTION),
}
ANSWER_GROUP = ("answer_match",)
"""A regex format task's metric only where task.regex names a group `answer`."""
PER_GROUP = {
    "classification": {"per_category": PER_CATEGORY_CLASSIFICATION},
    "image_classification": {"per_category": PER_CATEGORY_CLASSIFICATION},
    "multi_label_classification": {"per_category": PER_CATEGORY_CLASSIFICATION},
    "extraction": {"per_field": PER_FIELD, "per_category": PER_CATEGORY_EXTRACTION},
    "format": {"per_field": PER_FIELD, "per_category": PER_CATEGORY_EXTRACTION},
}


def path_pattern(path: str) -> re.Pattern:
    """A declared leaf path as a pattern: a map's keys (`slots.*`) match any key, dots
    included (a key may hold one)."""
    return re.compile(re.escape(path).replace(r"\*", ".+"))


def known(
    kind: str,
    labels: list[str] | None,
    fields: list[str] | None,
    grounded: bool = False,
    subtrees: list[str] | None = None,
) -> list[str]:
    """Every valid name: top-level metrics, `per_<group>.<m>` (every entry), for known
    entries (labels, field names and leaf paths) `per_<group>.<entry>.<m>`, and for the
    structured fields (`subtrees`) `per_field.<field>.leaf_f1` and the other SUBTREE names."""
    # extraction/format categories come from the data: not known here (see `problem`), nor
    # the keys of a map (`slots.*`)
    fields = [f for f in fields or [] if "*" not in f]
    labelled = kind in LABELLED
    entries = {"per_category": labels if labelled else None, "per_field": fields}
    names = list(TOP_LEVEL[kind])
    if grounded and not labelled:
        names += GROUNDED
    for group, metrics in PER_GROUP[kind].items():
        if grounded and group == "per_category" and not labelled:
            metrics = (*metrics, *GROUNDED)
        names += [f"{group}.{m}" for m in metrics]
        names += [f"{group}.{e}.{m}" for e in entries[group] or [] for m in metrics]
    if not labelled:
        names += [f"per_field.{s}.{m}" for s in subtrees or [] for m in SUBTREE]
    return names


def problem(
    name: str,
    kind: str,
    labels: list[str] | None,
    fields: list[str] | None,
    grounded: bool = False,
    subtrees: list[str] | None = None,
) -> str | None:
    """None for a metric this task kind produces, else the message, with the closest names.
    Extraction and format categories come from the data, so any `per_category.<x>.<m>` with
    a known <m> is accepted there; so is `per_field.<path>.<m>` for a path under a map
    (`slots.*` accepts `per_field.slots.city.f1`)."""
    valid = known(kind, labels, fields, grounded, subtrees)
    if name in valid:
        return None
    head, _, rest = name.partition(".")
    if kind not in LABELLED and head == "per_category" and "." in rest:
        allowed = PER_GROUP[kind]["per_category"] + (GROUNDED if grounded else ())
        if rest.rsplit(".", 1)[1] in allowed:
            return None
    if kind not in LABELLED and head == "per_field" and "." in rest:
        path, metric = rest.rsplit(".", 1)
        for pattern in fields or []:
            if "*" in pattern and metric in PER_FIELD:
                if path_pattern(pattern).fullmatch(path):
                    return None
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    hint = f"; closest: {', '.join(close)}" if close else ""
    shown = ", ".join(TOP_LEVEL[kind] + tuple(f"{g}.<m>" for g in PER_GROUP[kind]))
    return f"unknown metric {name!r} for a {kind} task{hint} (known: {shown})"
