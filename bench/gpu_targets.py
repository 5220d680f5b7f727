"""#36's GPU targets read off `scripts/gpu_check.sh --targets`'s JSON: which side met which
target, so that a short lease ends with the verdict next to the figures.

    python3 bench/gpu_targets.py GPU_CHECK.json     # prints {targets: ...}

`gpu_check.sh` adds the same object to its output as `targets_summary`. Targets (#36):
- 135M, ticket-triage shapes: a lorapilot step >= 1.5x faster than the plain PEFT step timed
  in the same process (`ratio` = plain PEFT's step time / the side's);
- 8B shape, long shared prompt: a lorapilot step <= 0.15 s;
- 8B, r 16, 8 x 512 tokens, checkpointing, under a 24 GiB cap: it runs, its measured peak and
  the memory model's estimate are <= 24 GiB, and the estimate is within 10% of the peak.
Each lorapilot side counts (eager with the fused or PEFT's LoRA forward, compiled, CUDA
graphs): the targets ask whether lorapilot can, and `best` names the setting that did.
"""

from __future__ import annotations

import json
import sys

SIDES = ("lorapilot", "lorapilot_peft_forward", "lorapilot_compiled", "lorapilot_cudagraphs")
RATIO_135M, STEP_8B_S, CAP_GIB, ESTIMATE_ERROR = 1.5, 0.15, 24, 0.10


def _entries(res: dict, keys: tuple[str, ...], shape: str, case: str) -> list[dict]:
    """The case's entries from the runs that timed it (eager, compiled), in that order."""
    found = []
    for key in keys:
        entry = (((res.get(key) or {}).get("shapes") or {}).get(shape) or {}).get("cases") or {}
        if entry.get(case):
            found.append(entry[case])
    return found


def _side_times(entries: list[dict]) -> dict[str, tuple[float, float | None]]:
    """{side: (step_s, plain PEFT's step_s in the same run)} of every lorapilot side timed."""
    times = {}
    for entry in entries:
        reference = (entry.get("plain_peft") or {}).get("step_s")
        for side in SIDES:
            step_s = (entry.get(side) or {}).get("step_s")
            if step_s:
                times[side] = (step_s, reference)
    return times


def summarize(res: dict) -> dict:
    """{target: {...figures, best, met}} for each target the JSON has figures for."""
    out: dict = {}
    times = _side_times(_entries(res, ("targets_135m", "targets_135m_compiled"), "135m", "ticket"))
    ratios = {s: round(ref / t, 3) for s, (t, ref) in times.items() if ref}
    if ratios:
        best = max(ratios, key=ratios.get)
        out["135m_ticket"] = {"target": f"ratio >= {RATIO_135M} (plain PEFT step / lorapilot's)",
                              "ratios": ratios, "best": best, "ratio": ratios[best],
                              "met": ratios[best] >= RATIO_135M}  # fmt: skip
    times = _side_times(_entries(res, ("targets_8b", "targets_8b_compiled"), "8b", "long"))
    if times:
        steps = {s: t for s, (t, _) in times.items()}
        best = min(steps, key=steps.get)
        out["8b_long"] = {"target": f"step <= {STEP_8B_S} s", "step_s": steps, "best": best,
                          "best_step_s": steps[best], "met": steps[best] <= STEP_8B_S}  # fmt: skip
    for row in (res.get("targets_capped") or {}).get("capped") or []:
        entry = {k: row.get(k) for k in ("ok", "peak_gib", "estimated_gib", "estimate_error",
                                          "step_s", "error") if k in row}  # fmt: skip
        if row.get("cap_gib") == CAP_GIB:
            entry["target"] = (f"runs under {CAP_GIB} GiB, peak and estimate <= {CAP_GIB} GiB, "
                               f"estimate within {ESTIMATE_ERROR:.0%}")  # fmt: skip
            entry["met"] = bool(
                row.get("ok")
                and row.get("peak_gib", CAP_GIB + 1) <= CAP_GIB
                and row.get("estimated_gib", CAP_GIB + 1) <= CAP_GIB
                and abs(row.get("estimate_error", 1.0)) <= ESTIMATE_ERROR
            )
        out[f"8b_capped_{row.get('cap_gib'):g}gib"] = entry
    return out


def main() -> None:
    if len(sys.argv) != 2:
        print("usage: python3 bench/gpu_targets.py GPU_CHECK.json", file=sys.stderr)
        sys.exit(2)
    with open(sys.argv[1], encoding="utf-8") as f:
        print(json.dumps({"targets": summarize(json.load(f))}, indent=2))


if __name__ == "__main__":
    main()
