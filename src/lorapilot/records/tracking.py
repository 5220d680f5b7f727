"""Mirror run records into MLflow and TensorBoard (spec key `tracking`).

The files under `runs/<run_id>/` stay the source of truth; a tracker gets a faithful copy
for people who already look at their runs there, and can always be rebuilt from the files.
One function, `mirror_run`, reads a run folder and writes the mirror: the steps' close hook
(`mirror_on_close`, given to `registry.open_run`) calls it when a run closes (whatever its
status) and `lorapilot sync` calls it for existing
records. Mirroring again is idempotent: the MLflow run is found by its `lorapilot.run_id` tag
and kept when the record is unchanged (a fingerprint tag), replaced when it changed; a
TensorBoard folder is rewritten whole. A tracker failure only warns: it never fails a run.
While a train run runs, `LiveMirror` sends its new per-step records every 15 s, so curves
are visible before the end; the complete mirror at close then replaces that live copy.

Where the mirrors go (nothing leaves the pilot folder unless MLFLOW_TRACKING_URI says so):
`runs/mlflow.db` (sqlite store) with artifacts in `runs/mlflow-artifacts/`, and
`runs/tensorboard/<run_id>/`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import re
import shutil
import sqlite3
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lorapilot.errors import LorapilotError, UsageError
from lorapilot.fsutil import atomic_write_json, locked, read_jsonl, sha256_file, sha256_json
from lorapilot.records import registry

TARGETS = ("mlflow", "tensorboard")
MIRROR_VERSION = 1  # bump when what is mirrored changes: every run is then mirrored anew
MLFLOW_DB = "mlflow.db"
MLFLOW_ARTIFACTS = "mlflow-artifacts"
TENSORBOARD_DIR = "tensorboard"
MARKER = "lorapilot-mirror.json"
LOCK = ".tracking.lock"
STATUS = {
    "completed": "FINISHED",
    "failed": "FAILED",
    "interrupted": "KILLED",
    "stopped_by_limit": "KILLED",
    "running": "RUNNING",
}
STEP_KEYS = (
    "loss",
    "lr",
    "grad_norm",
    "step_time_s",
    "tokens",
    "target_tokens",
    "padding_efficiency",
    "peak_memory_bytes",
    "epoch",
)
ARTIFACTS = (
    "run.json",
    "metrics.json",
    "predictions.jsonl",
    "protocol.json",
    "steps.jsonl",
    "val.jsonl",
)
MANIFEST = ("adapter", "lorapilot.json")
_PARAM_MAX, _TAG_MAX, _BATCH = 6000, 8000, 100  # MLflow's limits


# --------------------------------------------------------------------------- availability


def mlflow_uri(runs_root: Path) -> str:
    """MLFLOW_TRACKING_URI when set, else a sqlite store inside the pilot's runs folder."""
    return (
        os.environ.get("MLFLOW_TRACKING_URI")
        or f"sqlite:///{Path(runs_root).resolve() / MLFLOW_DB}"
    )


# --------------------------------------------------------------------------- reading a run


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> dotted keys (`per_category.billing.f1`); lists and scalars are leaves."""
    if not isinstance(obj, dict):
        return {prefix: obj} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in obj.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _key(key: str) -> str:
    """An MLflow-safe name: each dotted part keeps letters, digits, _ - . and spaces."""
    return ".".join(re.sub(r"[^\w.\- ]", "_", part) or "_" for part in key.split("."))[:250]


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _ms(iso: str | None) -> int | None:
    return int(dt.datetime.fromisoformat(iso).timestamp() * 1000) if iso else None


def series(steps: list[dict], val: list[dict]) -> list[tuple[str, int, float, float | None]]:
    """Per-step values as (name, step, value, unix time) from steps.jsonl and val.jsonl rows."""
    out = []
    for row in steps:
        t = row.get("time")
        for k in STEP_KEYS:
            if (v := _number(row.get(k))) is not None:
                out.append((k, int(row["step"]), v, t))
        tok, secs = _number(row.get("tokens")), _number(row.get("step_time_s"))
        if tok is not None and secs:
            out.append(("tokens_per_s", int(row["step"]), tok / secs, t))
    for row in val:
        if (v := _number(row.get("val_loss"))) is not None:
            out.append(("val_loss", int(row["step"]), v, row.get("time")))
    return out


def _pilot_name(rec: registry.RunRecord) -> str:
    """The MLflow experiment a run goes to: the pilot's name."""
    return str(rec.config.get("name") or Path(rec.pilot).name)


def _tb_tag(key: str) -> str:
    return "val/loss" if key == "val_loss" else f"train/{key}"


def _step_metrics(
    values: list[tuple[str, int, float, float | None]], default_ms: int | None
) -> list:
    """MLflow Metrics of per-step values; a value without its own time gets `default_ms`."""
    from mlflow.entities import Metric

    return [Metric(k, v, int(t * 1000) if t else default_ms, s) for k, s, v, t in values]


class _Run:
    """What a mirror needs from a run folder, read once."""

    def __init__(self, run_dir: Path):
        self.dir = Path(run_dir)
        rec = registry.read_record(self.dir)
        if rec is None:
            raise LorapilotError(f"{self.dir}: no readable run.json to mirror")
        self.record = rec
        self.status = registry.effective_status(rec)
        self.pilot = _pilot_name(rec)
        self.steps = read_jsonl(self.dir / "steps.jsonl")
        self.val = read_jsonl(self.dir / "val.jsonl")
        self.files = [self.dir / n for n in ARTIFACTS if (self.dir / n).is_file()]
        manifest = self.dir.joinpath(*MANIFEST)
        self.manifest = manifest if manifest.is_file() else None
        self.last_step = int(self.steps[-1]["step"]) if self.steps else 0
        # Changes whenever a mirrored file or the effective status does: then re-mirror.
        self.fingerprint = sha256_json(
            {
                "v": MIRROR_VERSION,
                "status": self.status,
                "files": {
                    str(p.relative_to(self.dir)): sha256_file(p)
                    for p in [*self.files, *filter(None, [self.manifest])]
                },
            }
        )[:32]

    def series(self) -> list[tuple[str, int, float, float | None]]:
        return series(self.steps, self.val)

    def final_metrics(self) -> dict[str, float]:
        """The verb's numeric results (top level) and its metrics, flattened."""
        res = self.record.result
        metrics = res.get("metrics") or {}
        if (self.dir / "metrics.json").is_file():
            metrics = json.loads((self.dir / "metrics.json").read_text(encoding="utf-8"))
        out = {k: v for k, v in ((k, _number(v)) for k, v in res.items()) if v is not None}
        out.update(
            {
                k: v
                for k, v in ((k, _number(v)) for k, v in flatten(metrics).items())
                if v is not None
            }
        )
        if self.record.duration_s is not None:
            out["duration_s"] = self.record.duration_s
        return {_key(k): v for k, v in out.items()}

    def params(self) -> dict[str, str]:
        """The resolved config, one param per spec key (`train.lr`)."""
        out = {}
        for k, v in flatten(self.record.config).items():
            text = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)
            out[_key(k)] = text[:_PARAM_MAX]
        return out

    def tags(self) -> dict[str, str]:
        rec, res = self.record, self.record.result
        base = res.get("base") if isinstance(res.get("base"), dict) else {}
        protocol = res.get("eval_protocol")
        tags = {
            "mlflow.runName": rec.id,
            "lorapilot.run_id": rec.id,
            "lorapilot.kind": rec.kind,
            "lorapilot.status": self.status,
            "lorapilot.variant": (rec.variant or {}).get("label"),
            "lorapilot.variant_diff": json.dumps((rec.variant or {}).get("diff"))
            if rec.variant
            else None,
            # the plan variant and its seed replicate (selection.seeds), to group runs by
            "lorapilot.variant_name": (rec.variant or {}).get("name"),
            "lorapilot.replicate": (rec.variant or {}).get("replicate"),
            "lorapilot.data_version": rec.data_version or res.get("data_version"),
            "lorapilot.eval_protocol": protocol if isinstance(protocol, str) else None,
            "lorapilot.base_sha256": base.get("sha256"),
            "lorapilot.spec_hash": rec.spec_hash,
            "lorapilot.parent": rec.parent,
            "lorapilot.error": rec.error,
            "lorapilot.host": rec.host,
            "lorapilot.run_dir": str(self.dir.resolve()),
        }
        return {k: str(v)[:_TAG_MAX] for k, v in tags.items() if v is not None}


# --------------------------------------------------------------------------- mirrors


def _sqlite_path(uri: str) -> Path | None:
    path = uri[len("sqlite:///") :] if uri.startswith("sqlite:///") else ""
    return Path(path) if path and path != ":memory:" else None


def _check_sqlite(uri: str) -> None:
    """Open a sqlite store ourselves first: MLflow retries a store it cannot open for about
    100 s before giving up, which would hold the closing run that long."""
    path = _sqlite_path(uri)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        con = sqlite3.connect(path, timeout=30)
        try:
            con.execute("PRAGMA schema_version")
        finally:
            con.close()
    except sqlite3.Error as e:
        raise LorapilotError(f"{path}: cannot open the MLflow sqlite store: {e}") from None


def _chunks(items: list, n: int = _BATCH) -> Iterable[list]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def _mlflow_experiment(runs_root: Path, pilot: str):
    """(client, experiment or None, experiment id, sqlite path, artifact location) for the
    pilot's MLflow experiment, created or restored as needed."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # no network at run time
    from mlflow.tracking import MlflowClient

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    uri = mlflow_uri(runs_root)
    _check_sqlite(uri)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(pilot)
    db = _sqlite_path(uri)
    artifacts = (db.resolve().parent / MLFLOW_ARTIFACTS).as_uri() if db else None
    if exp is None:  # a sqlite store keeps its artifacts beside it, not in the working folder
        exp_id = client.create_experiment(pilot, artifact_location=artifacts)
    else:
        exp_id = exp.experiment_id
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp_id)
    return client, exp, exp_id, db, artifacts


def _mlflow(run: _Run, runs_root: Path) -> str:
    """One MLflow run per lorapilot run, in the experiment named after the pilot."""
    from mlflow.entities import Metric, Param, RunTag

    client, exp, exp_id, db, artifacts = _mlflow_experiment(runs_root, run.pilot)
    rid = run.record.id
    existing = client.search_runs([exp_id], filter_string=f"tags.`lorapilot.run_id` = '{rid}'")
    if any(r.data.tags.get("lorapilot.mirror") == run.fingerprint for r in existing):
        return "unchanged"
    old = exp.artifact_location if exp is not None else ""
    if (
        artifacts
        and old.startswith("file:")
        and old.endswith(f"/{MLFLOW_ARTIFACTS}")
        and old != artifacts
    ):
        # MLflow keeps absolute artifact paths: a store copied with the pilot folder would
        # write outside it. It is a mirror, so it is rebuilt rather than patched.
        raise LorapilotError(
            f"{db} was made in another folder (its artifacts are at {old}); delete it and "
            f"{db.parent / MLFLOW_ARTIFACTS}, then `lorapilot sync` rebuilds it from the run "
            "records"
        )
    for stale in existing:  # the record changed (resumed, re-tagged, ...): replace, never duplicate
        client.delete_run(stale.info.run_id)
    mr = client.create_run(
        exp_id, start_time=_ms(run.record.started_at), tags=run.tags(), run_name=rid
    )
    mid = mr.info.run_id
    end_ms = _ms(run.record.ended_at) or _ms(registry.now_iso())
    metrics = _step_metrics(run.series(), end_ms)
    metrics += [Metric(k, v, end_ms, run.last_step) for k, v in run.final_metrics().items()]
    params = [Param(k, v) for k, v in run.params().items()]
    for chunk in _chunks(params):
        client.log_batch(mid, params=chunk, synchronous=True)
    for chunk in _chunks(metrics, 1000):
        client.log_batch(mid, metrics=chunk, synchronous=True)
    for path in run.files:
        client.log_artifact(mid, str(path))
    if run.manifest is not None:
        client.log_artifact(mid, str(run.manifest), artifact_path=MANIFEST[0])
    if run.status != "running":
        client.set_terminated(mid, STATUS[run.status], end_time=end_ms)
    # Last: a mirror cut short has no fingerprint, so the next sync replaces it.
    client.log_batch(mid, tags=[RunTag("lorapilot.mirror", run.fingerprint)], synchronous=True)
    return "replaced" if existing else "created"


def _tensorboard(run: _Run, runs_root: Path) -> str:
    """Scalars per step into runs/tensorboard/<run_id>/, written aside and swapped in whole."""
    root = Path(runs_root) / TENSORBOARD_DIR
    dest = root / run.record.id
    try:
        if json.loads((dest / MARKER).read_text())["fingerprint"] == run.fingerprint:
            return "unchanged"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    from torch.utils.tensorboard import SummaryWriter

    tmp = root / f".{run.record.id}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    writer = SummaryWriter(log_dir=str(tmp))
    try:
        for k, s, v, t in run.series():
            writer.add_scalar(_tb_tag(k), v, s, walltime=t)
        end = (_ms(run.record.ended_at) or 0) / 1000 or None
        for k, v in run.final_metrics().items():
            writer.add_scalar(f"final/{k}", v, run.last_step, walltime=end)
    finally:
        writer.close()
    atomic_write_json(
        tmp / MARKER,
        {"run_id": run.record.id, "status": run.status, "fingerprint": run.fingerprint},
    )
    existed = dest.exists()
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return "replaced" if existed else "created"


_MIRRORS = {"mlflow": _mlflow, "tensorboard": _tensorboard}


def mirror_run(run_dir: Path, targets: Iterable[str]) -> dict[str, str]:
    """Mirror one run folder -> {target: created|replaced|unchanged}. Raises on failure.

    Serialised per pilot by a lock, so a run closing while `sync` runs never duplicates."""
    run_dir = Path(run_dir)
    run = _Run(run_dir)
    out = {}
    with locked(run_dir.parent / LOCK):
        for target in targets:
            if target not in _MIRRORS:
                raise UsageError(f"unknown tracking target {target!r}; known: {', '.join(TARGETS)}")
            out[target] = _MIRRORS[target](run, run_dir.parent)
    return out


def mirror_on_close(run_dir: Path, record: registry.RunRecord) -> None:
    """registry.open_run's close hook: mirror the saved record to the trackers its config
    names (`tracking`); never raises."""
    if record.config.get("tracking"):
        mirror_quietly(run_dir, record.config["tracking"])


def mirror_quietly(run_dir: Path, targets: Iterable[str]) -> dict[str, str]:
    """At run close: mirror, and on any failure warn on stderr. The run's files are already
    written, so a missing package or an unwritable store never fails or loses the run."""
    out: dict[str, str] = {}
    for target in targets:
        try:
            out.update(mirror_run(run_dir, [target]))
        except Exception as e:  # a mirror must never fail the run it mirrors
            out[target] = f"failed: {type(e).__name__}: {e}"
            pilot = Path(run_dir).parent.parent
            print(
                f"warning: tracking ({target}) could not mirror run {Path(run_dir).name}: "
                f"{type(e).__name__}: {e}. The run's records are intact; retry with "
                f"`lorapilot sync {pilot} --to {target}`.",
                file=sys.stderr,
            )
    return out


def sync(pilot_dir: Path, targets: list[str]) -> dict[str, Any]:
    """Mirror every existing run record of a pilot (the `sync` verb); failures are listed."""
    runs_root = registry.runs_dir(pilot_dir)
    rows, failed = [], 0
    for rec in registry.list_runs(pilot_dir):
        row: dict[str, Any] = {"id": rec.id, "kind": rec.kind, "status": rec.status}
        for target in targets:
            try:
                row.update(mirror_run(runs_root / rec.id, [target]))
            except Exception as e:  # keep going, report each failure
                row[target] = f"failed: {type(e).__name__}: {e}"
                failed += 1
        rows.append(row)
    counts = {t: {} for t in targets}
    for row in rows:
        for t in targets:
            outcome = row[t].split(":", 1)[0]
            counts[t][outcome] = counts[t].get(outcome, 0) + 1
    out: dict[str, Any] = {
        "ok": failed == 0,
        "pilot": str(pilot_dir),
        "targets": targets,
        "runs": rows,
        "counts": counts,
    }
    if "mlflow" in targets:
        out["mlflow_uri"] = mlflow_uri(runs_root)
    if "tensorboard" in targets:
        out["tensorboard_dir"] = str(runs_root / TENSORBOARD_DIR)
    return out


# --------------------------------------------------------------------------- live, during training

LIVE_INTERVAL_S = 15.0  # how often a running train run's new records go to the trackers


class LiveMirror:
    """While a train run runs: every `interval` seconds the lines appended to steps.jsonl and
    val.jsonl since the last look go to the trackers, so loss curves show up in MLflow
    (a RUNNING run) and TensorBoard during a long run, not only when it ends.

    It only reads the files the loop writes (they stay the source of truth) and runs in a
    daemon thread; a tracker that fails is warned about once and left alone, never failing
    the run. When the run closes, `mirror_run` replaces the live copy with the complete,
    fingerprinted mirror (params, final metrics, artifacts, status), as for any run.
    """

    FILES = ("steps.jsonl", "val.jsonl")

    def __init__(self, run_dir: Path, targets: Iterable[str], interval: float = LIVE_INTERVAL_S):
        self.dir, self.targets, self.interval = (
            Path(run_dir),
            [t for t in targets if t in TARGETS],
            interval,
        )
        self.offsets = dict.fromkeys(self.FILES, 0)
        self.failed: dict[str, str] = {}
        self.logged = 0  # values sent to every working tracker so far
        self._mlflow: tuple[Any, str] | None = None
        self._writer: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _new_rows(self, name: str) -> list[dict]:
        """Complete lines appended since the last call (a line being written waits)."""
        path = self.dir / name
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size < self.offsets[name]:
                    self.offsets[name] = (
                        0  # rewritten shorter (a resume cuts records after its checkpoint)
                    )
                f.seek(self.offsets[name])
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1
        self.offsets[name] += end
        rows = []
        for line in chunk[:end].splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
        return rows

    def _send_mlflow(self, values: list[tuple[str, int, float, float | None]]) -> None:
        if self._mlflow is None:
            rec = registry.read_record(self.dir)
            pilot = _pilot_name(rec) if rec else self.dir.parent.parent.name
            client, _, exp_id, _, _ = _mlflow_experiment(self.dir.parent, pilot)
            rid = self.dir.name
            tags = {
                "mlflow.runName": rid,
                "lorapilot.run_id": rid,
                "lorapilot.status": "running",
                "lorapilot.live": "true",
            }
            if rec is not None:
                tags["lorapilot.kind"] = rec.kind
            start = _ms(rec.started_at) if rec is not None else None
            mr = client.create_run(exp_id, start_time=start, tags=tags, run_name=rid)
            self._mlflow = (client, mr.info.run_id)
        client, mid = self._mlflow
        metrics = _step_metrics(values, _ms(registry.now_iso()))
        for chunk in _chunks(metrics, 1000):
            client.log_batch(mid, metrics=chunk, synchronous=True)

    def _send_tensorboard(self, values: list[tuple[str, int, float, float | None]]) -> None:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(
                log_dir=str(self.dir.parent / TENSORBOARD_DIR / self.dir.name)
            )
        for k, s, v, t in values:
            self._writer.add_scalar(_tb_tag(k), v, s, walltime=t)
        self._writer.flush()

    def poll(self) -> int:
        """Send what was appended since the last poll -> number of values read."""
        values = series(self._new_rows("steps.jsonl"), self._new_rows("val.jsonl"))
        if not values:
            return 0
        for target in self.targets:
            if target in self.failed:
                continue
            try:
                (self._send_mlflow if target == "mlflow" else self._send_tensorboard)(values)
            except Exception as e:  # a live mirror must never disturb training
                self.failed[target] = f"{type(e).__name__}: {e}"
                print(
                    f"warning: live tracking ({target}) stopped for run {self.dir.name}: "
                    f"{self.failed[target]}. "
                    "Training goes on; the run is mirrored again when it ends.",
                    file=sys.stderr,
                )
        self.logged += len(values)
        return len(values)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def __enter__(self) -> LiveMirror:
        if self.targets:
            self._thread = threading.Thread(
                target=self._loop, name="lorapilot-live-tracking", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        """Stop the thread, send the last lines and close the writers (before the run closes
        and is mirrored whole)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.poll()
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()


def live_interval() -> float:
    """Seconds between live tracking updates: LORAPILOT_TRACKING_INTERVAL, default 15."""
    raw = os.environ.get("LORAPILOT_TRACKING_INTERVAL")
    if raw is None:
        return LIVE_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise UsageError(
            f"LORAPILOT_TRACKING_INTERVAL={raw!r}: must be a positive number of seconds"
        )
    return value
