"""`lorapilot run`: every protocol step in order, reusing phases that already completed.

data -> inspect -> baseline -> smoke -> probe -> budget -> train -> verify -> final test -> report

A computing phase is reused when a completed run of its kind carries the same *inputs key*:
the spec, the bytes of the data files, the lorapilot code version and the platform
fingerprint (device type, CUDA/ROCm and library versions). Moving the pilot folder to another
platform or changing the spec therefore redoes the launch checks (smoke, audit, probe) and
the quality checks there. A failed gate (leak, mask mismatch, audit, limits, verify) stops
the pipeline with its reason and exit 1.

This is the one step that calls other steps: it is their composition, in protocol order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lorapilot import __version__, environment, registry, steprun
from lorapilot.budget import exceeded
from lorapilot.data.dataset import source_hashes
from lorapilot.errors import CheckFailed
from lorapilot.fsutil import sha256_json
from lorapilot.spec import Pilot
from lorapilot.steps.baseline import run_baseline
from lorapilot.steps.budget import run_budget
from lorapilot.steps.data import run_data
from lorapilot.steps.eval import run_eval
from lorapilot.steps.inspect import run_inspect
from lorapilot.steps.probe import run_probe
from lorapilot.steps.report import run_report
from lorapilot.steps.smoke import run_smoke
from lorapilot.steps.train import run_train
from lorapilot.steps.verify import run_verify

PHASES = (
    "data",
    "inspect",
    "baseline",
    "smoke",
    "probe",
    "budget",
    "train",
    "verify",
    "test",
    "report",
)


def inputs_key(pilot: Pilot, env: dict) -> str:
    """What a phase's result depends on; a change means the phase is redone."""

    return (
        "in-"
        + sha256_json(
            {
                "spec": pilot.spec.spec_hash(),
                "data_files": source_hashes(pilot),
                "code": [__version__, environment.git_commit()],
                "platform": environment.platform_fingerprint(env),
            }
        )[:16]
    )


def _reusable(
    pilot: Pilot, kind: str, key: str, where: Callable[[registry.RunRecord], bool] | None = None
):
    for rec in reversed(registry.list_runs(pilot.dir, kind)):
        if (
            rec.status == "completed"
            and rec.result.get("inputs_key") == key
            and (where is None or where(rec))
        ):
            return rec
    return None


def _tag(pilot: Pilot, run_id: str, key: str) -> None:
    handle = registry.RunHandle(
        pilot.dir, registry.runs_dir(pilot.dir) / run_id, registry.get_run(pilot.dir, run_id)
    )
    handle.update(inputs_key=key)


def probe_reusable(rec: registry.RunRecord) -> bool:
    """A probe whose measurement other processes disturbed is measured again."""
    return not rec.result.get("disturbed")


def run_pipeline(
    pilot: Pilot, *, progress: bool = True, log: Callable[[str], None] = print
) -> dict[str, Any]:

    env = steprun.snapshot(pilot)
    key = inputs_key(pilot, env)
    phases: list[dict] = []
    t_all = time.time()

    def phase(name: str, kind: str | None, fn: Callable[[], dict], where=None) -> dict:
        t0 = time.time()
        prev = _reusable(pilot, kind, key, where) if kind else None
        if prev is not None:
            log(f"[{len(phases) + 1}/{len(PHASES)}] {name}: reused {prev.id}")
            phases.append({"phase": name, "run_id": prev.id, "reused": True, "seconds": 0.0})
            return {"run_id": prev.id, **prev.result}
        log(f"[{len(phases) + 1}/{len(PHASES)}] {name}...")
        try:
            out = fn()
        except CheckFailed as e:
            phases.append(
                {
                    "phase": name,
                    "reused": False,
                    "failed": True,
                    "seconds": round(time.time() - t0, 2),
                }
            )
            e.details = {**e.details, "failed_phase": name, "phases": phases}
            raise
        if kind and out.get("run_id"):
            _tag(pilot, out["run_id"], key)
        phases.append(
            {
                "phase": name,
                "run_id": out.get("run_id"),
                "reused": False,
                "seconds": round(time.time() - t0, 2),
            }
        )
        log(f"    {name} done in {time.time() - t0:.1f} s")
        return out

    phase("data", "data", lambda: run_data(pilot))
    ins = phase("inspect", None, lambda: run_inspect(pilot, per_category=1))
    if not ins["ok"]:
        raise CheckFailed(
            "inspect: some examples' loss tokens do not decode to their answer", {"phases": phases}
        )
    phase(
        "baseline",
        "baseline",
        lambda: run_baseline(pilot, progress=progress, log=log),
    )
    sm = phase(
        "smoke",
        "smoke",
        lambda: run_smoke(pilot, per_category=1, max_steps=30, progress=progress, log=log),
    )
    if not sm.get("ok"):
        raise CheckFailed(
            f"smoke: the pipeline could not overfit {sm.get('n_examples')} examples "
            f"(final loss {sm.get('final_loss')}); check the loss mask and labels",
            {"phases": phases},
        )
    # A probe measured beside other jobs is not reused: its times would plan the rental.
    phase(
        "probe",
        "probe",
        lambda: run_probe(pilot, progress=progress, log=log),
        where=probe_reusable,
    )
    bud = phase("budget", None, lambda: run_budget(pilot))
    over = exceeded(bud.get("limits") or {})
    if over:
        raise CheckFailed(
            f"budget: the estimate exceeds the spec's limits ({', '.join(over)}); "
            "raise the limits or shrink the run",
            {"phases": phases, "budget": bud},
        )
    # The budget phase has just checked the limits: train does not compute the budget again.
    tr = phase(
        "train",
        "train",
        lambda: run_train(pilot, limits_checked=True, progress=progress, log=log),
    )
    train_id = tr["run_id"]
    phase(
        "verify",
        "verify",
        lambda: run_verify(pilot, train_id),
        where=lambda r: r.parent == train_id,
    )

    # The reserved test split, once per chosen adapter: never re-touched on a rerun.
    test = phase(
        "test",
        "eval",
        lambda: run_eval(
            pilot, run_id=train_id, split="test", final=True, progress=progress, log=log
        ),
        where=lambda r: r.parent == train_id and r.result.get("split") == "test",
    )
    rep = phase("report", None, lambda: run_report(pilot))
    return {
        "ok": True,
        "decision": rep["decision"],
        "reasons": rep["reasons"],
        "html": rep["html"],
        "markdown": rep["markdown"],
        "deliverable": rep["deliverable"],
        "train_run": train_id,
        "test_metrics": test.get("metrics"),
        "inputs_key": key,
        "phases": phases,
        "wall_s": round(time.time() - t_all, 2),
    }
