"""Seed replicates (`selection.seeds`): what a variant's seeds say together, and whether the
choice between variants and the gain over the baseline stand out of the noise between seeds.

Pure: compare/report rows in, dicts and sentences out. A validation gain measured on one
training run mixes the recipe's effect with its seed's luck (initialisation, data order,
dropout); with several seeds the variant is judged on its mean, and the spread says how far
one run of it can land from another.
"""

from __future__ import annotations

import statistics


def seed_summary(
    name: str, seeds: int, done: dict[int, dict], tried: dict[int, dict], metric: str, value_of
) -> dict:
    """One variant's seeds: each replicate's latest run and value, the mean over the completed
    ones (the variant's `value`), their sample standard deviation and range."""
    per = []
    for k in range(seeds):
        row = done.get(k) or tried.get(k)
        per.append(
            {
                "replicate": k,
                "seed": row and row.get("seed"),
                "run_id": row and row["id"],
                "status": row["status"] if row else "not run",
                "value": (row and value_of(row.get("metrics"), metric)) if k in done else None,
                "seconds": row and row.get("wall_s"),
            }
        )
    values = [p["value"] for p in per if p["value"] is not None]
    mean = statistics.fmean(values) if values else None
    return {
        "seeds": per,
        "seeds_done": len(done),
        "value": mean,
        "mean": mean,
        "sd": statistics.stdev(values) if len(values) > 1 else None,
        "low": min(values, default=None),
        "high": max(values, default=None),
        "seconds": sum(p["seconds"] or 0.0 for p in per) or None,
    }


def seed_noise(table: list[dict], min_gain: float) -> dict | None:
    """For the selected variant of a seeded plan (`select`'s table, each seed's `delta`: its
    success-metric gain over the baseline): its spread, the runner-up and whether the two are
    separated (the chosen variant's worst seed above the runner-up's best), and the seeds
    whose gain falls short of the success criterion's `min_gain`. None without seeds or a
    selection."""
    chosen = next((e for e in table if e.get("selected")), None)
    if chosen is None or not chosen.get("seeds"):
        return None
    n = len(chosen["seeds"])  # rivals with every seed done: a partial mean is not a rival
    rivals = [e for e in table if not e.get("selected") and e.get("seeds_done") == n
              and e.get("mean") is not None]  # fmt: skip
    runner = max(rivals, key=lambda e: e["mean"], default=None)
    short = [
        {k: s.get(k) for k in ("replicate", "seed", "run_id", "delta")}
        for s in chosen["seeds"]
        if s.get("delta") is not None and s["delta"] < min_gain
    ]
    out = {
        "variant": chosen["name"],
        "seeds": n,
        "mean": chosen["mean"],
        "sd": chosen["sd"],
        "low": chosen["low"],
        "high": chosen["high"],
        "representative": chosen["run_id"],
        "runner_up": runner and runner["name"],
        "margin": runner and chosen["mean"] - runner["mean"],
        "separated": None if runner is None else chosen["low"] > runner["high"],
        "min_gain": min_gain,
        "short_of_criterion": short,
        "gains": [s.get("delta") for s in chosen["seeds"]],
    }
    if runner is not None:
        out["runner_up_low"], out["runner_up_high"] = runner["low"], runner["high"]
    return out


def seed_warnings(noise: dict | None, metric: str, success_metric: str) -> list[str]:
    """The report's limitations: a choice inside the noise between seeds, and seeds of the
    chosen recipe that would not have met the success criterion on their own."""
    if not noise:
        return []
    out = []
    name, n = noise["variant"], noise["seeds"]
    if noise["separated"] is False:
        out.append(
            f"the choice of {name} over {noise['runner_up']} is within the noise between seeds: "
            f"their {n} seeds' validation {metric} ranges overlap ({name} "
            f"{noise['low']:.3f}-{noise['high']:.3f}, {noise['runner_up']} "
            f"{noise['runner_up_low']:.3f}-{noise['runner_up_high']:.3f}; means differ by "
            f"{noise['margin']:+.3f}); another set of seeds could choose the other"
        )
    short = noise["short_of_criterion"]
    if short:
        which = ", ".join(f"seed {s['seed']} {s['delta']:+.3f}" for s in short)
        out.append(
            f"{len(short)} of {n} seeds of {name} fall short of the success criterion's gain "
            f"(+{noise['min_gain']:g} {success_metric}): {which}; the decision is taken on its "
            "median seed, and one run of this recipe may not reach the criterion"
        )
    return out
