"""The data section: versions, splits, cleaning, leaks, lengths or image properties."""

from __future__ import annotations

from functools import partial
from typing import Any

from lorapilot.report import plots
from lorapilot.report.blocks import (
    KV,
    Image,
    Items,
    NotRun,
    Para,
    Sub,
    Table,
)
from lorapilot.report.formatting import (
    fmt,
    mark,
)
from lorapilot.report.sections.state import MAX_LISTED


def _data(s: dict) -> list:
    d = s.get("data")
    if not isinstance(d, dict):
        return [NotRun("`lorapilot data PILOT` validates, versions and splits the data")]
    dups = d.get("duplicates") or {}
    splits = d.get("splits") or {}
    out: list = [
        KV(
            [
                ("data version", d.get("version")),
                ("source", d.get("source")),
                ("permission", d.get("permission")),
                ("examples", d.get("n_examples")),
                ("splits", ", ".join(f"{k} {fmt(v)}" for k, v in splits.items()) or None),
            ]
        )
    ]
    conv = d.get("messages") if isinstance(d.get("messages"), dict) else {}
    if conv.get("with_earlier_turns"):  # data.fields.messages of several exchanges
        lost = (d.get("truncation") or {}).get("n_lost_turns") or 0
        n, of = fmt(conv["with_earlier_turns"]), fmt(conv.get("n_examples"))
        out.append(
            Para(
                f"Conversations: {n} of {of} "
                f"have earlier turns (up to {fmt(conv.get('most_earlier_turns'))}), in the prompt "
                "as they were said; the loss and the metrics are on the last assistant turn"
                + (f"; {fmt(lost)} lost their oldest turns to data.max_length." if lost else ".")
            )
        )
    per = d.get("per_category") or {}
    sets = d.get("label_sets") if isinstance(d.get("label_sets"), dict) else None
    if per:
        cols = list(splits) or list(dict.fromkeys(k for v in per.values() for k in v))
        what = "label" if sets else "category"  # a multi-label example counts for each label
        rows = [[c, *(fmt((n or {}).get(sp, 0)) for sp in cols)] for c, n in per.items()]
        if sets:
            mean = sets.get("labels_per_example") or {}
            rows.append(["labels per example", *(fmt((mean.get(sp) or {}).get("mean"))
                                                 for sp in cols)])  # fmt: skip
        out += [Sub(f"Examples per {what}"), Table([what, *cols], rows)]
        combos = (sets or {}).get("commonest_combinations") or []
        if combos:
            shown = "; ".join(f"{' + '.join(c['labels'])} ({c['examples']})" for c in combos)
            out.append(Para(f"Commonest combinations of labels: {shown}."))
    if isinstance(d.get("images"), dict):
        out += _images(d, s.get("contact_sheets") or [])
    out.append(Sub("Duplicates and leaks"))
    counts = dups.get("counts") or {}
    cross = dups.get("cross_split") or []
    dropped = dups.get("dropped_from_train") or []
    out.append(
        KV(
            [
                ("exact duplicate pairs", counts.get("exact")),
                ("near duplicate pairs", counts.get("near")),
                ("pairs within a split", counts.get("within_split")),
                ("leaks (pairs across splits)", mark(not cross, "none", str(len(cross)))),
                ("leakage policy", dups.get("leakage_policy")),
                ("dropped from train (leaks)", len(dropped)),
            ]
        )
    )
    if cross:
        out.append(
            Table(
                ["example", "duplicate of", "kind", "similarity"],
                [
                    [
                        f"{p.get('a_split')}:{p.get('a_id')}",
                        f"{p.get('b_split')}:{p.get('b_id')}",
                        p.get("kind"),
                        fmt(p.get("similarity")),
                    ]
                    for p in cross[:MAX_LISTED]
                ],
            )
        )
    skipped = d.get("skipped") or []
    unlisted = d.get("unlisted_labels") if isinstance(d.get("unlisted_labels"), dict) else {}
    groups = d.get("groups") if isinstance(d.get("groups"), dict) else None
    out.append(
        KV(
            [
                ("invalid records skipped", len(skipped)),
                ("dropped by cleaning", len(d.get("dropped_by_cleaning") or [])),
                ("excluded: target too long", len(d.get("target_excluded") or [])),
                *(
                    [("left out: label not in task.labels", unlisted.get("dropped"))]
                    if unlisted
                    else []
                ),
                *(
                    [
                        (f"groups ({groups.get('column')})", groups.get("n_groups")),
                        ("groups in more than one split", len(groups.get("shared") or [])),
                    ]
                    if groups
                    else []
                ),
            ]
        )
    )
    summary = [g for g in d.get("skipped_summary") or [] if isinstance(g, dict)]
    if summary:  # grouped by problem: thousands of rows read as a few causes
        out.append(
            Table(
                ["records", "problem", "first", "commonest values"],
                [
                    [
                        fmt(g.get("count")),
                        g.get("problem"),
                        g.get("first"),
                        ", ".join(f"{v} {n}" for v, n in (g.get("values") or {}).items()),
                    ]
                    for g in summary[:MAX_LISTED]
                ],
            )
        )
    elif skipped:  # a record written before the summary existed
        out.append(
            Table(
                ["file", "line", "problem"],
                [
                    [x.get("file"), x.get("line"), x.get("problem")]
                    for x in skipped[:MAX_LISTED]
                    if isinstance(x, dict)
                ],
            )
        )
    per_label = unlisted.get("per_label") if isinstance(unlisted.get("per_label"), dict) else {}
    if per_label:
        out.append(
            Table(
                ["label left out (data.unlisted_labels: drop)", "examples"],
                [[label, fmt(n)] for label, n in list(per_label.items())[:MAX_LISTED]],
            )
        )
    mask = d.get("mask_audit")
    if isinstance(mask, dict):
        out += [
            Sub("Loss-mask audit"),
            KV(
                [
                    ("ok", mark(mask.get("ok"))),
                    ("loss on", mask.get("loss_on")),
                    ("examples checked", mask.get("n_examples")),
                    ("share of tokens in the loss", fmt(mask.get("loss_token_fraction"))),
                    ("examples with no loss token", len(mask.get("zero_loss_examples") or [])),
                    ("mismatched examples", len(mask.get("mismatched") or [])),
                ]
            ),
        ]
    out += _label_issues(s.get("label_issues"), d.get("version"))
    lengths = d.get("lengths") or {}
    if lengths:
        keys = ("n", "p50", "p95", "max", "max_length", "n_truncated", "n_target_truncated")
        out += [
            Sub("Token lengths"),
            Table(
                ["split", *keys],
                [[sp, *(fmt((v or {}).get(k)) for k in keys)] for sp, v in lengths.items()],
            ),
            Image(
                partial(plots.length_histogram, d),
                "token lengths per split",
                "The data run records only p50, p95 and max per split, not the whole "
                "distribution: the bars show those three figures; the dotted line is max_length.",
            ),
        ]
    return out


def _label_issues(li: Any, version: Any) -> list:
    """A probe baseline's review of the training labels (evaluate/label_issues.py)."""
    if not isinstance(li, dict) or li.get("skipped") or "n_suspects" not in li:
        return []
    out: list = [
        Sub("Suspect training labels"),
        Para(
            f"{fmt(li.get('n_suspects'))} of {fmt(li.get('n'))} training examples "
            f"({fmt(100 * (li.get('rate') or 0), 1)}%) carry a label the base's features "
            f"contradict, by {li.get('method')}; the probe's out-of-fold accuracy is "
            f"{fmt(li.get('out_of_fold_accuracy'))} (a weak probe disagrees with right labels "
            f"too). Candidates to review, not errors: nothing was changed. Baseline run "
            f"{li.get('run_id')}"
            + (
                f", data version {li.get('data_version')} (not the current one: run the "
                "baseline again)"
                if version and li.get("data_version") != version
                else ""
            )
            + f"; every suspect in {li.get('file') or 'its label_issues.jsonl'}."
            + (f" Note: {li['note']}." if li.get("note") else "")
        ),
    ]
    pairs = [p for p in li.get("pairs") or [] if isinstance(p, dict)]
    if pairs:
        out.append(
            Table(
                ["labelled", "the features say", "examples"],
                [[p.get("label"), p.get("suggested"), fmt(p.get("count"))] for p in pairs[:10]],
            )
        )
    shown = [x for x in li.get("suspects") or [] if isinstance(x, dict)][:MAX_LISTED]
    if shown:
        out.append(
            Table(
                ["id", "source", "labelled", "p", "the features say", "p", "input"],
                [
                    [
                        x.get("id"), x.get("source"), x.get("label"), fmt(x.get("p_label")),
                        x.get("suggested"), fmt(x.get("p_suggested")),
                        " ".join(str(x.get("text") or "").split())[:120],
                    ]
                    for x in shown
                ],
            )
        )  # fmt: skip
    return out


def _images(d: dict, sheets: list[str]) -> list:
    """Image pilots: properties per category, the shortcut warnings, the transforms, and the
    contact sheets `inspect` drew."""
    per = (d.get("images") or {}).get("per_category") or {}

    def rng(v: Any) -> str:
        if not isinstance(v, dict):
            return "-"
        return (
            fmt(v.get("min"))
            if v.get("min") == v.get("max")
            else (f"{fmt(v.get('min'))}-{fmt(v.get('max'))}")
        )

    def counts(v: Any) -> str:
        return ", ".join(f"{k} {n}" for k, n in (v or {}).items()) if isinstance(v, dict) else "-"

    out: list = [
        Sub("Images per category (all splits)"),
        Table(
            ["category", "images", "width", "height", "modes", "formats", "median bytes"],
            [
                [
                    c,
                    fmt(v.get("n")),
                    rng(v.get("width")),
                    rng(v.get("height")),
                    counts(v.get("mode")),
                    counts(v.get("format")),
                    fmt((v.get("bytes") or {}).get("median")),
                ]
                for c, v in per.items()
                if isinstance(v, dict)
            ],
        ),  # fmt: skip
    ]
    shortcuts = [w for w in d.get("warnings") or [] if "differs from the others" in str(w)]
    out.append(
        Items(shortcuts) if shortcuts else Para("No category differs from the others in size, "
                                                "mode, format or file size.")
    )  # fmt: skip
    t = d.get("transforms")
    if isinstance(t, dict):
        out.append(
            KV([(k, ", ".join(map(str, v)) if isinstance(v, list) else v) for k, v in t.items()])
        )
    for path in sheets:
        name = path.rsplit("/", 1)[-1].removeprefix("contact-").removesuffix(".png")
        out.append(
            Image(
                partial(plots.png_file, path),
                f"contact sheet: {name}",
                f"{name}: sampled originals (left) beside what the model sees (right), as "
                "`lorapilot inspect` drew them",
            )
        )
    return out
