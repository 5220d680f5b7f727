"""The report's figures: small PNGs returned as base64 data URIs, so the HTML is one file.

Every function takes plain data (what `collect` gathered), draws with matplotlib's Agg
backend (no display, no files), closes its figure and returns `data:image/png;base64,...`,
or None when there is nothing to draw. Labels come from user data: `_text` keeps them from
being read as mathtext (`$`) or hidden from the legend (a leading `_`).
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display, works on a headless rented machine

import matplotlib.pyplot as plt  # noqa: E402

DPI = 90
SIZE = (6.0, 3.5)
BASE_COLOR = "#9aa5b1"
ADAPTED_COLOR = "#1f6feb"
MAX_LABEL = 28


def _text(s: object, limit: int = MAX_LABEL) -> str:
    """A user string made safe for matplotlib: no mathtext, visible in legends, short."""
    t = " ".join(str(s).split())
    if len(t) > limit:
        t = t[: limit - 1] + "\u2026"
    t = t.replace("$", r"\$")
    return " " + t if t.startswith("_") else t


def _num(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def _png(fig) -> str:
    """Encode and close the figure (always: pyplot keeps every open figure alive)."""
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    finally:
        plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def per_group_bars(
    baseline_per: Mapping[str, Mapping] | None,
    chosen_per: Mapping[str, Mapping] | None,
    metric: str,
) -> str | None:
    """Grouped bars of `metric` per category / field: baseline beside the adapted model.

    Either side may be missing (None or no value for a group): its bar is left out.
    """
    baseline_per, chosen_per = baseline_per or {}, chosen_per or {}
    names = list(dict.fromkeys([*baseline_per, *chosen_per]))
    base = [_num((baseline_per.get(n) or {}).get(metric)) for n in names]
    cand = [_num((chosen_per.get(n) or {}).get(metric)) for n in names]
    if not names or all(v is None for v in base + cand):
        return None
    fig, ax = plt.subplots(figsize=(max(SIZE[0], 0.45 * len(names) + 2), SIZE[1]))
    width = 0.4
    xs = range(len(names))
    for offset, vals, label, color in (
        (-width / 2, base, "baseline", BASE_COLOR),
        (width / 2, cand, "adapted", ADAPTED_COLOR),
    ):
        pts = [(x + offset, v) for x, v in zip(xs, vals, strict=True) if v is not None]
        if pts:
            ax.bar([p[0] for p in pts], [p[1] for p in pts], width, label=label, color=color)
    ax.set_xticks(list(xs))
    crowded = len(names) > 4 or sum(len(_text(n)) for n in names) > 48
    ax.set_xticklabels(
        [_text(n) for n in names],
        rotation=30 if crowded else 0,
        ha="right" if crowded else "center",
    )
    top = max([v for v in base + cand if v is not None] + [1.0])
    ax.set_ylim(0, top * 1.18)  # headroom for the legend
    ax.set_ylabel(_text(metric))
    ax.set_title(f"{_text(metric)} per group: baseline vs adapted")
    ax.legend(loc="upper right", ncol=2, fontsize="small")
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def confusion(
    matrix: Sequence[Sequence[float]] | None, labels: Sequence[str] | None, title: str
) -> str | None:
    """Heatmap of a confusion matrix (rows: gold, columns: predicted) with the counts written in."""
    if not matrix or not labels or len(matrix) != len(labels):
        return None
    rows = [[_num(v) or 0.0 for v in row] for row in matrix]
    width = max(len(r) for r in rows)
    if width == 0:
        return None
    rows = [r + [0.0] * (width - len(r)) for r in rows]  # ragged input: pad, never crash
    n = len(labels)
    side = min(6.0, 1.6 + 0.45 * n)
    fig, ax = plt.subplots(figsize=(side + 0.8, side))
    im = ax.imshow(rows, cmap="Blues", vmin=0)
    peak = max((v for row in rows for v in row), default=0) or 1
    for i, row in enumerate(rows):
        for j, v in enumerate(row):
            ax.text(
                j,
                i,
                f"{v:g}",
                ha="center",
                va="center",
                fontsize=8,
                color="white" if v > peak / 2 else "black",
            )
    names = [_text(x, 16) for x in labels]
    n_cols = max(len(r) for r in rows)
    ax.set_xticks(range(n_cols))
    ax.set_xticklabels(
        names[:n_cols] + [""] * (n_cols - len(names)), rotation=45, ha="right", fontsize=8
    )
    ax.set_yticks(range(n))
    ax.set_yticklabels(names, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    ax.set_title(_text(title, 60), fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return _png(fig)


def loss_curves(curves: Mapping[str, Mapping] | None) -> str | None:
    """Training loss of every train run (solid) and its validation loss (dashed, same colour)."""
    curves = curves or {}
    fig, ax = plt.subplots(figsize=SIZE)
    drawn = False
    for k, (run_id, c) in enumerate(curves.items()):
        c = c or {}
        color = f"C{k % 10}"
        label = str(c.get("label") or run_id)
        name = _text(label if label == run_id else f"{label} ({run_id})", 40)
        for key, style, suffix in (("train", "-", "train"), ("val", "--", "val")):
            pts = [(_num(p[0]), _num(p[1])) for p in (c.get(key) or []) if len(p) >= 2]
            pts = [p for p in pts if p[0] is not None and p[1] is not None]
            if pts:
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    style,
                    color=color,
                    linewidth=1.4,
                    marker="o" if key == "val" else None,
                    markersize=3,
                    label=f"{name} {suffix}",
                )
                drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title("training loss (solid) and validation loss (dashed)")
    ax.grid(alpha=0.3)
    # outside the axes: with several variants an inside legend hides the curves
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


def length_histogram(data: Mapping | None) -> str | None:
    """Token lengths per split. The data run records only p50 / p95 / max per split (not the
    whole distribution), so these three are drawn as bars per split, with the spec's
    max_length as a line when known."""
    lengths = (data or {}).get("lengths") or {}
    splits = [s for s, v in lengths.items() if isinstance(v, Mapping)]
    if not splits:
        return None
    stats = ("p50", "p95", "max")
    fig, ax = plt.subplots(figsize=SIZE)
    width = 0.26
    for k, stat in enumerate(stats):
        xs = [i + (k - 1) * width for i in range(len(splits))]
        vals = [_num(lengths[s].get(stat)) or 0.0 for s in splits]
        ax.bar(xs, vals, width, label=stat, color=f"C{k}")
    limit = next(
        (_num(lengths[s].get("max_length")) for s in splits if _num(lengths[s].get("max_length"))),
        None,
    )
    if limit:
        ax.axhline(
            limit, color="#d73a49", linestyle=":", linewidth=1.2, label=f"max_length {limit:g}"
        )
    ax.set_xticks(range(len(splits)))
    ax.set_xticklabels([_text(s) for s in splits])
    ax.set_ylabel("tokens per example")
    ax.set_title("token lengths per split (p50 / p95 / max)")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.15)  # headroom for the legend
    ax.legend(fontsize="small", ncol=4, loc="upper center")
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def png_file(path: str) -> str | None:
    """A PNG written by lorapilot (an `inspect` contact sheet) as a data URI, or None when
    the file is gone or is not a PNG."""
    from pathlib import Path

    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return None
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")
