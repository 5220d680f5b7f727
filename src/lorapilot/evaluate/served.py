"""A label-scoring classifier's answers as a generating server gives them.

lorapilot decides a classification pilot on label scoring (`eval.mode: score`): every label's
log-probability, the argmax. A chat server (vLLM, TGI, Ollama, a transformers pipeline)
does not score: it generates greedily to the end of the turn, and what it answers can be
another label or no label at all (measured on BANKING77: 104 of 154 answers the scored label).
These figures say how far the served classifier is from the decided one; they are reported,
never gated, and are not part of the evaluation protocol (they change no prediction).
Pure: the generated texts come from the caller (torch here, llama.cpp in the GGUF check).
"""

from __future__ import annotations

from collections import Counter

GENERATION_AGREEMENT_MIN = 0.98
"""Below this share of answers that are the scored label, the report says the classifier a
generating server serves is not the one decided on (the GGUF check's default gate)."""

WHAT = "greedy generation to the end of the turn, as a chat server answers"


def could_be_label(text: str, labels: set[str]) -> bool:
    """Whether a generated text, continued, can still parse to one of `labels` (casefolded)
    by the rule for generated labels (stripped, compared casefolded): the generation check
    stops an answer once it cannot, which parses the same as generating it to the end. A
    text ending in an incomplete character (a byte token decoded alone) is not judged yet."""
    said = text.lstrip().casefold()
    if not said or said.endswith("\ufffd"):
        return True
    return said.rstrip() in labels or any(lab.startswith(said) for lab in labels)


def generation_figures(
    scored: list[dict],
    generated: list[dict],
    scored_metrics: dict,
    generated_metrics: dict,
    keys: list[str],
    *,
    what: str = WHAT,
    theirs: str = "scored",
    ours: str = "generated",
) -> dict:
    """`scored` and `generated`: prediction rows of the same examples in the same order (`id`,
    `gold`, `parsed`; the generated ones with `raw_output`, `parsed` None when the text is no
    label). -> how often generation answers the scored label (`agreement`), any label
    (`label_rate`), the texts that were none, the main metrics both ways (`metrics`, keyed by
    `theirs` / `ours`) and the first examples that differ."""
    n = len(generated)
    same = [s.get("parsed") == g["parsed"] for s, g in zip(scored, generated, strict=True)]
    labelled = sum(g["parsed"] is not None for g in generated)
    not_labels = Counter(g["raw_output"].strip() for g in generated if g["parsed"] is None)
    return {
        "what": what,
        "agreement": sum(same) / n if n else 1.0,
        "label_rate": labelled / n if n else 1.0,
        "n": n,
        "n_same": sum(same),
        "n_labels": labelled,
        "not_labels": [[text, k] for text, k in not_labels.most_common(10)],
        "metrics": {
            k: {theirs: scored_metrics.get(k), ours: generated_metrics.get(k)} for k in keys
        },
        "differing": [
            {
                "id": g["id"],
                "gold": g["gold"],
                theirs: s.get("parsed"),
                "generated": g["raw_output"],
            }
            for s, g, ok in zip(scored, generated, same, strict=True)
            if not ok
        ][:20],
    }


def generation_warning(
    who: str,
    figures: dict,
    minimum: float = GENERATION_AGREEMENT_MIN,
    *,
    served_as: str = "served by a runtime that generates (vLLM, TGI, Ollama, a transformers "
    "pipeline)",
    scorer: str = "",
    theirs: str = "scored",
    ours: str = "generated",
    serve_by: str = "serve it by label scoring (`export --gguf` writes classify.py, the "
    "pilot's rule in llama.cpp), ",
) -> str:
    """One paragraph for when a generating server would serve another classifier than the one
    decided on; '' when generation agrees well enough. The torch evaluation's figures by
    default; the GGUF check names its runtimes (`theirs`, `ours`: the figures' metric keys;
    `scorer`: who scored) and how its folder serves label scoring."""
    if figures["agreement"] >= minimum:
        return ""
    n, odd = figures["n"], ", ".join(f"{t!r} x{k}" for t, k in figures["not_labels"][:3])
    by = f" {scorer}" if scorer else ""
    metrics = "; ".join(
        f"{k} {v[theirs]:.3f} scored{f' in {scorer}' if scorer else ''}, {v[ours]:.3f} generated"
        for k, v in figures["metrics"].items()
        if isinstance(v.get(theirs), int | float) and isinstance(v.get(ours), int | float)
    )
    return (
        f"{who}: {served_as}, {figures['n_same']} of {n} validation answers are the label"
        f"{by} scored ({figures['agreement']:.1%} < {minimum:.0%}) and "
        f"{n - figures['n_labels']} are no label at all{f' ({odd})' if odd else ''}; "
        f"{metrics}. The decision was made on label scoring: to serve what was decided, "
        f"{serve_by}train until the adapter answers in the label set (more steps, a higher "
        "train.lr), or decide on what generation serves (eval.mode: generate)"
    )
