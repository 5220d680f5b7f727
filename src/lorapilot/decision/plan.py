"""The experiment plan: the spec's pre-registered variants, their step shapes, and the rule
that picks the one the decision is about.

A variant is a few overrides of the base recipe written in pilot.yaml before anything
trains (`variants:`); `base` is the spec as written. The winner is chosen by the spec's
`selection` rule alone (default: the success metric on validation, ties to the cheaper run),
among the plan's own runs: an ad-hoc `train --set` run is shown beside them but never
chosen, so trying more things by hand cannot make the decision more optimistic.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lorapilot.decision.seeds import seed_summary
from lorapilot.fsutil import sha256_json
from lorapilot.spec import Pilot, load_pilot
from lorapilot.spec.evaluation import ALTERNATIVE_KEYS

SELECTION_RULE = (
    "the plan's variant (base and the spec's `variants`) whose latest completed train run, "
    "comparable with the baseline, has the best validation value of the selection metric "
    "(ties: the cheaper run, then the earlier); ad-hoc `train --set` runs are never chosen"
)
SEEDS_RULE = (
    "the plan's variant (base and the spec's `variants`) whose {n} seeds (train.seed + 0..{last})"
    " all completed a train run comparable with the baseline, with the best mean validation "
    "value of the selection metric over its seeds (ties: the cheaper, then the earlier); its "
    "adapter is its median seed's; ad-hoc `train --set` runs are never chosen"
)


def selection_rule(seeds: int) -> str:
    """The rule in words, as the decision states how it was chosen."""
    return SEEDS_RULE.format(n=seeds, last=seeds - 1) if seeds > 1 else SELECTION_RULE


# Settings that change what one training step costs (time, memory). The rest of the recipe
# (learning rate, schedule, duration, seed, regularisation, alpha) changes the numbers a
# step computes, not its size, so variants that differ only there share one probe.
_NOT_SHAPE = {
    "train": ("seed", "epochs", "max_steps", "lr", "weight_decay", "schedule", "warmup_ratio",
              "eval_every", "save_every", "max_grad_norm", "grad_accum", "early_stopping",
              "category_sampling"),
    "adapter": ("alpha", "dropout", "rslora"),  # the scale only; dora changes the step
    # the alternatives' own evaluations (few-shot prompt, linear probe), no training step
    "eval": ALTERNATIVE_KEYS,
}  # fmt: skip
_NOT_SHAPE_SECTIONS = (
    "name", "hypothesis", "success", "guards", "limits", "tracking", "variants", "selection",
    "export",
)  # fmt: skip


def step_shape(config: dict) -> str:
    """A short hash of what sizes a training step, from a spec dump (a run's `config`)."""
    shape = {k: v for k, v in config.items() if k not in _NOT_SHAPE_SECTIONS}
    for section, keys in _NOT_SHAPE.items():
        shape[section] = {k: v for k, v in (config.get(section) or {}).items() if k not in keys}
    return "shape-" + sha256_json(shape)[:12]


def variant_pilots(pilot: Pilot | Path | str, only: Sequence[str] | None = None) -> list[Pilot]:
    """One Pilot per variant of the plan, in the spec's order (`only`: that subset)."""
    spec_path = pilot.spec_path if isinstance(pilot, Pilot) else pilot
    first = load_pilot(spec_path)
    names = first.spec.variant_names()
    if only:
        unknown = [n for n in only if n not in names]
        if unknown:
            from lorapilot.errors import UsageError

            raise UsageError(
                f"--only {', '.join(unknown)}: not in the plan of {first.spec_path} "
                f"({', '.join(names)})"
            )
        names = [n for n in names if n in only]
    return [first if n == "base" else load_pilot(spec_path, variant=n) for n in names]


def replicate_pilots(vp: Pilot) -> list[Pilot]:
    """A plan variant's seed replicates (`selection.seeds`): the variant as written, then
    its recipe with train.seed + 1, + 2, ..."""
    n = vp.spec.selection.seeds
    return [vp] + [load_pilot(vp.spec_path, variant=vp.variant, replicate=k) for k in range(1, n)]


def replicate_of(record_variant: dict | None) -> int:
    """Which seed replicate of its variant a train run is (0: the variant as written)."""
    return int((record_variant or {}).get("replicate") or 0)


def variant_name(record_variant: dict | None) -> str | None:
    """The plan variant a train run ran: its recorded name; records from before plans
    existed are `base` when they changed nothing; ad-hoc overrides: None."""
    v = record_variant or {}
    if "name" in v:
        return v["name"]
    return "base" if not v.get("diff") else None


def pilot_of_run(path: Pilot | Path | str, run_id: str) -> Pilot:
    """The pilot a train run ran, from its record alone: its plan variant, or its ad-hoc
    `--set` overrides (so `train --resume RUN` and `eval --run RUN` need nothing else)."""
    import json

    from lorapilot.records import registry

    spec_path = path.spec_path if isinstance(path, Pilot) else path
    bare = load_pilot(spec_path)
    rec = registry.get_run(bare.dir, run_id)
    name = variant_name(rec.variant)
    k = replicate_of(rec.variant)
    if rec.kind != "train" or (name == "base" and not k):
        return bare
    if name is not None:
        return load_pilot(spec_path, variant=name, replicate=k)
    diff = (rec.variant or {}).get("diff") or {}
    return load_pilot(spec_path, [f"{k}={json.dumps(v[1])}" for k, v in diff.items()])


def select(
    rows: Sequence[dict], plan: Sequence[str], metric: str, value_of: Any, seeds: int = 1
) -> tuple[dict | None, list[dict]]:
    """The pre-registered selection among compare rows (`run_summary` dicts, oldest first).

    Per variant of `plan` and seed replicate (`seeds`, the spec's `selection.seeds`), the
    latest completed train run comparable with the baseline is its candidate; a variant
    competes only when all its seeds have one, with the mean of their
    `value_of(metrics, metric)`, and is represented by its median seed (the lower middle
    one for an even count; with one seed, the run itself). The winner has the highest value;
    ties go to the cheaper (shorter) runs, then the earlier. -> (the winning variant's
    representative row or None, one entry per plan variant: {name, run_id, status, value,
    seconds, selected, tries, reason}, with `seeds` (one entry per replicate), `mean`, `sd`,
    `low`, `high` and `seeds_done` when `seeds` > 1).
    """
    latest: dict[str, dict[int, dict]] = {}
    tries: dict[str, int] = {}
    attempts: dict[str, dict[int, dict]] = {}
    for row in rows:
        if row.get("kind") != "train" or row.get("name") not in plan:
            continue
        name, k = row["name"], int(row.get("replicate") or 0)
        if k >= seeds:  # a replicate the spec no longer registers
            continue
        tries[name] = tries.get(name, 0) + 1
        attempts.setdefault(name, {})[k] = row  # the latest attempt of any status
        if row.get("status") == "completed" and row.get("comparable"):
            latest.setdefault(name, {})[k] = row
    order = {r["id"]: i for i, r in enumerate(rows)}

    def value(row: dict) -> float:
        v = value_of(row.get("metrics"), metric)
        return v if v is not None else float("-inf")

    complete = {n: reps for n, reps in latest.items() if len(reps) == seeds}
    middle = {  # the median seed: the lower middle by value, ties to the earlier run
        n: sorted(reps.values(), key=lambda r: (value(r), order[r["id"]]))[(seeds - 1) // 2]
        for n, reps in complete.items()
    }

    def key(name: str):
        reps = complete[name].values()
        return (
            statistics.fmean(value(r) for r in reps),
            -sum(r.get("wall_s") or 0.0 for r in reps),
            -order[middle[name]["id"]],
        )

    best = max(complete, key=key) if complete else None
    winner = middle[best] if best else None
    table = []
    for name in plan:
        row = middle.get(name) or _latest(attempts.get(name), order)
        entry = {
            "name": name,
            "run_id": row and row["id"],
            "status": row["status"] if row else "not run",
            "value": row and value_of(row.get("metrics"), metric),
            "seconds": row and row.get("wall_s"),
            "selected": name == best,
            "tries": tries.get(name, 0),
            "reason": row and row.get("reason"),
        }
        if seeds > 1:
            entry.update(seed_summary(name, seeds, latest.get(name, {}), attempts.get(name, {}),
                                       metric, value_of))  # fmt: skip
            if name not in complete and row and row["status"] == "completed":
                entry["status"] = "incomplete"
                entry["reason"] = (
                    f"{entry['seeds_done']} of {seeds} seeds completed a comparable run: a "
                    "variant competes with all its seeds"
                )
        table.append(entry)
    return winner, table


def _latest(reps: dict[int, dict] | None, order: dict[str, int]) -> dict | None:
    return max(reps.values(), key=lambda r: order[r["id"]]) if reps else None
