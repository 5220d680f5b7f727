"""`lorapilot run`: the whole plan in protocol order, reusing phases that already completed.

data -> inspect -> baseline -> smoke -> probe (one per step shape) -> budget (the whole plan
checked against the limits and the rental before anything trains) -> train (every variant,
in the spec's order) -> the selection rule picks one -> verify -> final test -> report

A computing phase is reused when a completed run of its kind carries the same *inputs key*:
the spec, the bytes of the data files, the lorapilot code version and the platform
fingerprint (device type, CUDA/ROCm and library versions). Moving the pilot folder to another
platform or changing the spec therefore redoes the launch checks (smoke, audit, probe) and
the quality checks there. A failed gate (leak, mask mismatch, audit, limits, verify) stops
the pipeline with its reason and exit 1.

This is the one step that calls other steps: it is their composition, in protocol order.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from typing import Any

from lorapilot import __version__
from lorapilot.base.manifest import MANIFEST
from lorapilot.data.dataset import source_hashes
from lorapilot.decision.plan import (
    replicate_of,
    replicate_pilots,
    step_shape,
    variant_name,
    variant_pilots,
)
from lorapilot.errors import CheckFailed
from lorapilot.fsutil import read_json_or_none, sha256_json, swap_into_place
from lorapilot.records import environment, registry, steprun
from lorapilot.report.collect import collect
from lorapilot.sizing.estimate import plan_refusal
from lorapilot.spec import Pilot
from lorapilot.spec.pilot import drop_additions
from lorapilot.steps.baseline import run_baseline
from lorapilot.steps.budget import run_budget
from lorapilot.steps.data import run_data
from lorapilot.steps.eval import run_eval
from lorapilot.steps.export import run_export
from lorapilot.steps.inspect import run_inspect
from lorapilot.steps.probe import run_probe
from lorapilot.steps.report import run_report
from lorapilot.steps.smoke import failure_text, run_smoke
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
    """What a phase's result depends on; a change means the phase is redone. The limits are
    not part of it: raising a limit that refused the plan redoes nothing already measured; nor
    are the export formats, which only add to the deliverable, nor eval.few_shot, which only
    adds the prompting alternative's own phase (nor eval.linear_probe: the probe's), nor
    selection.seeds, which only adds train runs (each replicate's seed is in its spec)."""
    spec = pilot.spec.model_dump(mode="json")
    spec["limits"] = spec["tracking"] = spec["export"] = None
    drop_additions(spec)
    return (
        "in-"
        + sha256_json(
            {
                "spec": sha256_json(spec),
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


def _resumable(pilot: Pilot, vp: Pilot) -> str | None:
    """An interrupted train run of this variant with this very spec: resumed, not redone."""
    for rec in reversed(registry.list_runs(pilot.dir, "train")):
        if (
            rec.status == "interrupted"
            and variant_name(rec.variant) == vp.variant
            and replicate_of(rec.variant) == vp.replicate
            and rec.spec_hash == vp.spec.spec_hash()
        ):
            return rec.id
    return None


def run_pipeline(
    pilot: Pilot,
    *,
    only: list[str] | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    env = steprun.snapshot(pilot)
    key = inputs_key(pilot, env)
    plan = variant_pilots(pilot, only)
    shapes: dict[str, Pilot] = {}  # one probe per distinct step shape, the first variant's
    for vp in plan:
        shapes.setdefault(step_shape(vp.spec.model_dump(mode="json")), vp)
    seeds = pilot.spec.selection.seeds
    n_phases = len(PHASES) - 2 + len(shapes) + len(plan) * seeds + bool(pilot.spec.eval.few_shot)
    n_phases += pilot.spec.eval.linear_probe
    phases: list[dict] = []
    t_all = time.time()

    def phase(name: str, kind: str | None, fn: Callable[[], dict], where=None, variant=None):
        t0 = time.time()
        tag = {"variant": variant} if variant else {}
        title = f"{name} {variant}" if variant else name
        prev = _reusable(pilot, kind, key, where) if kind else None
        if prev is not None:
            log(f"[{len(phases) + 1}/{n_phases}] {title}: reused {prev.id}")
            phases.append({"phase": name, **tag, "run_id": prev.id, "reused": True,
                           "seconds": 0.0})  # fmt: skip
            return {"run_id": prev.id, **prev.result}
        log(f"[{len(phases) + 1}/{n_phases}] {title}...")
        try:
            out = fn()
        except Exception as e:
            seconds = round(time.time() - t0, 2)
            phases.append({"phase": name, **tag, "reused": False, "failed": True,
                           "error": str(e)[:300], "seconds": seconds})  # fmt: skip
            if isinstance(e, CheckFailed):
                e.details = {**e.details, "failed_phase": name, "phases": phases}
            raise
        if kind and out.get("run_id"):
            _tag(pilot, out["run_id"], key)
        phases.append({"phase": name, **tag, "run_id": out.get("run_id"), "reused": False,
                       "seconds": round(time.time() - t0, 2)})  # fmt: skip
        log(f"    {title} done in {time.time() - t0:.1f} s")
        return out

    phase("data", "data", lambda: run_data(pilot))
    ins = phase("inspect", None, lambda: run_inspect(pilot, per_category=1))
    if not ins["ok"]:
        raise CheckFailed(
            "inspect: some examples' loss tokens do not decode to their answer", {"phases": phases}
        )
    zero_shot = lambda r: not registry.is_alternative(r)  # noqa: E731
    phase("baseline", "baseline", lambda: run_baseline(pilot, progress=progress, log=log),
          where=zero_shot)  # fmt: skip
    k, selection = pilot.spec.eval.few_shot, pilot.spec.eval.few_shot_selection
    if k:  # the prompting alternative the report sets the adapter against
        phase(
            "few-shot baseline", "baseline",
            lambda: run_baseline(pilot, progress=progress, log=log, shots=k),
            where=lambda r: (r.result.get("shots") or {}).get("k") == k
            and (r.result.get("shots") or {}).get("selection", "fixed") == selection,
        )  # fmt: skip
    if pilot.spec.eval.linear_probe:  # the embedding-classifier alternative
        phase(
            "linear-probe baseline", "baseline",
            lambda: run_baseline(pilot, progress=progress, log=log, linear_probe=True),
            where=registry.is_linear_probe,
        )  # fmt: skip
    sm = phase(
        "smoke",
        "smoke",
        lambda: run_smoke(pilot, progress=progress, log=log),
    )
    if not sm.get("ok"):
        raise CheckFailed(failure_text(sm), {"phases": phases})
    # A probe measured beside other jobs is not reused: its times would plan the rental.
    for shape, vp in shapes.items():
        phase(
            "probe",
            "probe",
            # the spec's checkpointing setting (the other only when it does not fit): the
            # budget needs no more, and the other setting doubles the probe's time
            lambda vp=vp: run_probe(vp, checkpointing="spec", progress=progress, log=log),
            where=lambda r, shape=shape: probe_reusable(r) and step_shape(r.config or {}) == shape,
            variant=vp.variant if len(plan) > 1 else None,
        )
    bud = phase("budget", None, lambda: run_budget(pilot, only))
    refusal = plan_refusal(bud)
    if refusal:
        raise CheckFailed(
            f"budget: the plan does not fit: {refusal}; raise the limits, shrink the variants "
            "or run a subset with --only",
            {"phases": phases, "budget": bud},
        )
    for vp in plan:
        for rp in replicate_pilots(vp):  # selection.seeds: each variant once per seed
            _train_variant(pilot, rp, phase, len(plan) > 1 or seeds > 1, progress, log)

    state = collect(pilot)
    chosen = state["chosen"]
    if chosen is None:
        raise CheckFailed(
            "no variant of the plan completed a comparable train run; see `lorapilot compare`",
            {"phases": phases, "selection": state["selection"]},
        )
    train_id = chosen["id"]
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
    exports = [
        phase(f"export {fmt}", None, lambda fmt=fmt: _export(pilot, train_id, fmt, log))
        for fmt in pilot.spec.export.formats
        if fmt != "peft"  # the adapter folder: the report copies it into deliverable/
    ]
    rep = phase("report", None, lambda: run_report(pilot))
    result = {
        "ok": True,
        "decision": rep["decision"],
        "reasons": rep["reasons"],
        "html": rep["html"],
        "markdown": rep["markdown"],
        "deliverable": rep["deliverable"],
        "limitations": rep["limitations"],
        "variants": [
            {
                **{k: v.get(k) for k in ("name", "run_id", "status")},
                "metric": rep["selection"]["metric"],
                **{k: v.get(k) for k in ("value", "seconds", "cost_usd", "reason")},
                # selection.seeds > 1: value is the mean over the seeds; their spread
                **{k: v[k] for k in ("sd", "low", "high", "seeds_done") if k in v},
            }
            for v in rep["selection"]["variants"]
        ],
        "selection_metric": rep["selection"]["metric"],
        "selected": rep["selection"]["selected"],
        "seed_noise": rep["selection"].get("seed_noise"),
        "train_run": train_id,
        "test_metrics": test.get("metrics"),
        "test_gain": rep["test_gain"],
        "inputs_key": key,
        "exports": exports,
        "phases": phases,
        "wall_s": round(time.time() - t_all, 2),
    }
    failed = [e for e in exports if not e.get("ok")]
    if failed:
        raise CheckFailed(
            "export: "
            + "; ".join(f"{e['format']}: {e.get('error', 'check failed')}" for e in failed)
            + " (the report shows it; the folder keeps its check)",
            result | {"ok": False},
        )
    return result


def _export(pilot: Pilot, train_id: str, fmt: str, log) -> dict:
    """deliverable/<fmt>: exported and checked for the chosen adapter, or kept when it already
    holds that adapter's export with a passing check. A failed serving check is kept (its
    manifest says so) and reported; the plan's run then exits 1 after the report."""
    target = pilot.dir / "deliverable" / fmt
    written = read_json_or_none(target / MANIFEST)
    check = (written or {}).get("serving_check") or {}
    if written and written.get("train_run") == train_id and check.get("ok", True):
        log(f"    {fmt}: deliverable/{fmt} already holds {train_id}'s export")
        return {"format": fmt, "ok": True, "out": str(target), "reused": True}
    tmp = target.with_name(f".{fmt}-{train_id}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        out = run_export(pilot, train_id, tmp, merge=fmt == "merged", gguf=fmt == "gguf",
                         progress=lambda m: log(f"    {m}"),
                         merge_dtype=pilot.spec.export.merge_dtype)  # fmt: skip
    except CheckFailed as e:
        out = {**e.details, "ok": False, "error": str(e)}
    if tmp.is_dir():  # written (a failed serving check too); swap it into place
        swap_into_place(tmp, target)
        out["out"] = str(target)
    return {"format": fmt, **{k: v for k, v in out.items() if k != "sha256"}}


def _train_variant(pilot: Pilot, vp: Pilot, phase, named: bool, progress: bool, log) -> None:
    """One variant's train phase: reused when completed with these inputs, resumed when
    interrupted. A variant that fails (an error, out of memory, a module it names that the
    model lacks) or hits a limit stays on the record with its reason and the plan goes on; a
    failed gate (the update audit) stops the plan."""
    name, k = vp.variant, vp.replicate
    title = f"{name} seed+{k}" if k else name
    resume = _resumable(pilot, vp)
    if resume:
        log(f"    {name}: resuming interrupted run {resume}")
    try:
        phase(
            "train",
            "train",
            lambda: run_train(vp, resume=resume, limits_checked=True, progress=progress, log=log),
            where=lambda r: variant_name(r.variant) == name and replicate_of(r.variant) == k,
            variant=title if named else None,
        )
    except CheckFailed:  # a failed gate (the update audit): the wiring is wrong for all
        raise
    except registry.StoppedByLimit as e:
        log(f"    {title}: stopped by a limit ({e}); the plan goes on")
    except Exception as e:  # noqa: BLE001 - the record keeps the reason; the others still run
        log(f"    {title}: failed ({type(e).__name__}: {e}); the plan goes on")
