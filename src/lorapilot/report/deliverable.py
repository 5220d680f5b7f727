"""deliverable/: everything to hand over without runs/ (adapter and manifest, resolved spec,
report, baseline and final predictions, environment record, decision)."""

from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path

from lorapilot.fsutil import atomic_write_json, atomic_write_text
from lorapilot.spec import Pilot


def _copy_tree(src: Path, dst: Path) -> None:
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)


def confusion_csv(conf: dict) -> str:
    """The confusion matrix as CSV: a header of predicted labels, one row per gold label."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["gold \\ predicted", *conf["labels"]])
    for label, row in zip(conf["labels"], conf["matrix"], strict=True):
        w.writerow([label, *row])
    return buf.getvalue()


def fill_deliverable(pilot: Pilot, state: dict, report_dir: Path) -> Path:
    """Everything to hand over without runs/: adapter + manifest, resolved spec, report,
    baseline and final predictions, environment record."""
    d = pilot.dir / "deliverable"
    d.mkdir(exist_ok=True)
    runs = pilot.dir / "runs"
    atomic_write_json(d / "spec.resolved.json", pilot.spec.model_dump(mode="json"))
    shutil.copy2(pilot.spec_path, d / "pilot.yaml")
    for name in ("index.html", "report.md"):
        shutil.copy2(report_dir / name, d / name)
    if state["baseline"]:
        src = runs / state["baseline"]["id"] / "predictions.jsonl"
        if src.is_file():
            shutil.copy2(src, d / "baseline_predictions.jsonl")
    rec = state.get("chosen_record")
    if rec:
        adapter = Path(rec["result"].get("adapter_path", ""))
        if adapter.is_dir():
            _copy_tree(adapter, d / "adapter")
        src = runs / rec["id"] / "predictions.jsonl"
        if src.is_file():
            shutil.copy2(src, d / "final_val_predictions.jsonl")
        atomic_write_json(d / "environment.json", rec.get("environment", {}))
    for who, summary in (("baseline", state.get("baseline")), ("adapted", state.get("chosen"))):
        conf = ((summary or {}).get("metrics") or {}).get("confusion")
        if isinstance(conf, dict) and conf.get("matrix") and conf.get("labels"):
            atomic_write_text(d / f"confusion_{who}.csv", confusion_csv(conf))
    if state.get("test"):
        src = runs / state["test"]["id"] / "predictions.jsonl"
        if src.is_file():
            shutil.copy2(src, d / "final_test_predictions.jsonl")
    # one level: decision.json's "decision" is the verdict itself (GO / NO-GO / INCONCLUSIVE),
    # beside its reasons, gates and the rest of the decision record
    atomic_write_json(
        d / "decision.json",
        {
            **(state["decision"] or {"decision": None}),
            "limitations": state["limitations"],
            "chosen_run": state["chosen"] and state["chosen"]["id"],
        },
    )
    return d
