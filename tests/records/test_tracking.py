"""Tracking mirrors (spec key `tracking`): real MLflow (sqlite store, no server) and
TensorBoard, written when a run closes and by `lorapilot sync`, read back here.

Importing mlflow is slow, so one module fixture makes the runs (a completed and a failed
train run, as subprocesses the way a user runs them) and the tests read that one store.
"""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from conftest import EXAMPLES, run_cli, run_json

from lorapilot.fsutil import read_jsonl
from lorapilot.records import registry, tracking
from lorapilot.spec import requirements

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    # MLflow 3.17 with SQLAlchemy 2.1: a deprecation notice inside MLflow, not ours
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning"),
]
LABELS = ["billing", "technical", "account", "shipping", "refund", "feature_request"]


@pytest.fixture(autouse=True)
def _local_store(monkeypatch):
    """A tracking URI set on the machine must not send the tests' runs elsewhere."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def _pilot(folder, tiny_model_dir, targets):
    pilot = folder / "ticket-triage"
    shutil.copytree(EXAMPLES / "ticket-triage", pilot, ignore=shutil.ignore_patterns("runs"))
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["model"] = {"base": str(tiny_model_dir)}
    spec["train"].update(precision="fp32", max_steps=3, lr=0.01)
    spec["tracking"] = targets
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return pilot


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, tiny_model_dir):
    """tracking: [mlflow, tensorboard]; one completed and one failed train run."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        pilot = _pilot(
            tmp_path_factory.mktemp("tracking"), tiny_model_dir, ["mlflow", "tensorboard"]
        )
        proc = run_cli("train", str(pilot), "--no-progress", "--json")
        assert proc.returncode == 0, proc.stderr
        assert "warning: tracking" not in proc.stderr, proc.stderr
        ok = json.loads(proc.stdout)
        # fails after the run is opened: the adapter cannot find its target modules
        bad = run_json(
            "train",
            str(pilot),
            "--set",
            "adapter.target_modules=[no_such_module]",
            "--no-progress",
            expect=2,
        )
        assert "target_modules" in bad["error"]
    (failed,) = [r for r in registry.list_runs(pilot) if r.id != ok["run_id"]]
    assert failed.status == "failed"
    return pilot, ok, failed.id


def _mlflow_runs(pilot, db=None, experiment="ticket-triage"):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(
        tracking_uri=f"sqlite:///{db or pilot / 'runs' / 'mlflow.db'}"
    )  # default store
    exp = client.get_experiment_by_name(experiment)
    return client, {
        r.data.tags["lorapilot.run_id"]: r for r in client.search_runs([exp.experiment_id])
    }


def test_train_runs_appear_in_mlflow_with_params_steps_metrics_status(tracked):
    pilot, ok, failed_id = tracked
    client, runs = _mlflow_runs(pilot)
    assert set(runs) == {ok["run_id"], failed_id}  # one MLflow run per lorapilot run
    run = runs[ok["run_id"]]
    assert run.info.status == "FINISHED" and run.info.run_name == ok["run_id"]
    params = run.data.params
    assert params["train.max_steps"] == "3" and params["adapter.r"] == "16"
    assert params["task.kind"] == "classification" and json.loads(params["task.labels"]) == LABELS
    tags = run.data.tags
    manifest = json.loads(
        (pilot / "runs" / ok["run_id"] / "adapter" / "lorapilot.json").read_text()
    )
    assert tags["lorapilot.kind"] == "train" and tags["lorapilot.variant"] == "base"
    assert tags["lorapilot.variant_name"] == "base" and "lorapilot.replicate" not in tags
    assert tags["lorapilot.data_version"] == ok["data_version"]
    assert tags["lorapilot.eval_protocol"] == ok["eval_protocol"]
    assert tags["lorapilot.base_sha256"] == manifest["base"]["sha256"]
    steps = read_jsonl(pilot / "runs" / ok["run_id"] / "steps.jsonl")
    loss = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in loss] == [(s["step"], s["loss"]) for s in steps] and len(
        loss
    ) == 3
    assert [m.step for m in client.get_metric_history(run.info.run_id, "lr")] == [1, 2, 3]
    assert len(client.get_metric_history(run.info.run_id, "tokens_per_s")) == 3
    metrics = run.data.metrics
    assert (
        metrics["accuracy"] == ok["metrics"]["accuracy"]
        and metrics["macro_f1"] == ok["metrics"]["macro_f1"]
    )
    for label in LABELS:
        assert metrics[f"per_category.{label}.f1"] == ok["metrics"]["per_category"][label]["f1"]
    assert metrics["final_val_loss"] == ok["final_val_loss"]
    top = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"run.json", "predictions.jsonl", "metrics.json", "steps.jsonl", "adapter"} <= top
    assert [a.path for a in client.list_artifacts(run.info.run_id, "adapter")] == [
        "adapter/lorapilot.json"
    ]

    bad = runs[failed_id]
    assert bad.info.status == "FAILED" and "target_modules" in bad.data.tags["lorapilot.error"]
    assert bad.data.tags["lorapilot.variant"] == "one_change"
    assert "run.json" in {a.path for a in client.list_artifacts(bad.info.run_id)}


def test_sync_is_idempotent_and_replaces_a_changed_record(tracked, tmp_path, monkeypatch):
    pilot, ok, failed_id = tracked
    client, before = _mlflow_runs(pilot)
    out = tracking.sync(pilot, ["mlflow", "tensorboard"])
    assert out["ok"] and out["counts"] == {
        "mlflow": {"unchanged": 2},
        "tensorboard": {"unchanged": 2},
    }
    _, after = _mlflow_runs(pilot)
    assert {k: r.info.run_id for k, r in after.items()} == {
        k: r.info.run_id for k, r in before.items()
    }

    # a record that changes after its run closed (the pipeline tags reused phases): replaced
    rec = registry.get_run(pilot, ok["run_id"])
    registry.RunHandle(pilot, pilot / "runs" / ok["run_id"], rec).update(inputs_key="in-test")
    out = tracking.sync(pilot, ["mlflow"])
    assert {r["id"]: r["mlflow"] for r in out["runs"]} == {
        ok["run_id"]: "replaced",
        failed_id: "unchanged",
    }
    _, replaced = _mlflow_runs(pilot)
    assert set(replaced) == {ok["run_id"], failed_id}  # still one active MLflow run each
    new = replaced[ok["run_id"]]
    assert new.info.run_id != before[ok["run_id"]].info.run_id
    assert [m.step for m in client.get_metric_history(new.info.run_id, "loss")] == [1, 2, 3]

    # the verb (targets from the spec), then a store elsewhere rebuilt from the files alone
    res = run_json("sync", str(pilot))
    assert res["counts"] == {
        "mlflow": {"unchanged": 2},
        "tensorboard": {"replaced": 1, "unchanged": 1},
    }
    assert res["mlflow_uri"] == f"sqlite:///{pilot.resolve() / 'runs' / 'mlflow.db'}"
    elsewhere = tmp_path / "store" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{elsewhere}")
    assert tracking.sync(pilot, ["mlflow"])["counts"] == {"mlflow": {"created": 2}}
    _, rebuilt = _mlflow_runs(pilot, elsewhere)
    assert (
        rebuilt[ok["run_id"]].info.status == "FINISHED"
        and rebuilt[failed_id].info.status == "FAILED"
    )
    assert len(list((tmp_path / "store" / "mlflow-artifacts").glob("*/artifacts/run.json"))) == 2


def test_a_store_moved_with_the_pilot_is_refused_not_written_outside(tracked, tmp_path):
    pilot, ok, failed_id = tracked
    moved = tmp_path / "moved"
    shutil.copytree(pilot, moved)  # the pilot folder copied back from a rented machine
    (moved / "runs" / ok["run_id"] / "run.json").write_text(  # a changed record, to be re-mirrored
        (pilot / "runs" / ok["run_id"] / "run.json")
        .read_text()
        .replace('"host"', '"moved": true, "host"')
    )
    before = sorted(p.name for p in (pilot / "runs" / "mlflow-artifacts").iterdir())
    out = tracking.sync(moved, ["mlflow"])
    assert not out["ok"] and out["counts"] == {"mlflow": {"failed": 1, "unchanged": 1}}
    msg = next(r["mlflow"] for r in out["runs"] if r["id"] == ok["run_id"])
    assert "was made in another folder" in msg and "lorapilot sync" in msg
    assert sorted(p.name for p in (pilot / "runs" / "mlflow-artifacts").iterdir()) == before


def test_tensorboard_scalars_read_back(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    pilot, ok, failed_id = tracked
    logdir = pilot / "runs" / "tensorboard" / ok["run_id"]
    ea = EventAccumulator(str(logdir))
    ea.Reload()
    steps = read_jsonl(pilot / "runs" / ok["run_id"] / "steps.jsonl")
    loss = ea.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2, 3]
    assert [e.value for e in loss] == pytest.approx([s["loss"] for s in steps], rel=1e-6)
    assert [e.step for e in ea.Scalars("val/loss")] == [0, 3]
    assert ea.Scalars("final/accuracy")[0].value == pytest.approx(ok["metrics"]["accuracy"])
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 1  # sync rewrote, never appended
    assert (pilot / "runs" / "tensorboard" / failed_id / tracking.MARKER).is_file()


def test_unwritable_store_warns_and_keeps_the_run(tmp_path, capsys):
    (tmp_path / "runs" / "mlflow.db").mkdir(parents=True)  # sqlite cannot open a folder
    tracked = {
        "config": {"name": "p", "tracking": ["mlflow"]},
        "on_close": tracking.mirror_on_close,
    }
    with registry.open_run(tmp_path, "data", **tracked) as run:
        run.update(metrics={"accuracy": 1.0})
    assert registry.get_run(tmp_path, run.id).status == "completed"
    err = " ".join(capsys.readouterr().err.split())
    assert (
        f"warning: tracking (mlflow) could not mirror run {run.id}" in err
        and "lorapilot sync" in err
    )
    assert "cannot open the MLflow sqlite store" in err  # at once: not MLflow's ~100 s of retries
    with (
        pytest.raises(ValueError, match="boom"),
        registry.open_run(tmp_path, "data", **tracked),
    ):
        raise ValueError("boom")  # the run's own error propagates, not the mirror's
    assert [r.status for r in registry.list_runs(tmp_path)] == ["completed", "failed"]


def test_missing_extra_is_refused_up_front_with_exit_2(tmp_path, monkeypatch, tiny_model_dir):
    from typer.testing import CliRunner

    from lorapilot.cli import app

    pilot = _pilot(tmp_path, tiny_model_dir, ["tensorboard", "mlflow"])
    monkeypatch.setattr(requirements, "available", lambda module: module != "mlflow")
    for verb in ("check", "train", "sync"):
        res = CliRunner().invoke(app, [verb, str(pilot), "--json"])
        assert res.exit_code == 2, res.output
        msg = json.loads(res.stdout)["error"]
        assert "tracking: mlflow" in msg and "pip install 'lorapilot[mlflow]'" in msg
    assert not (pilot / "runs").exists()  # refused before any run was opened
    monkeypatch.setattr(requirements, "available", lambda module: True)
    res = CliRunner().invoke(app, ["sync", str(pilot), "--to", "wandb", "--json"])
    assert res.exit_code == 2 and "wandb" in json.loads(res.stdout)["error"]


def test_spec_key_schema_and_hash():
    from lorapilot.spec import json_schema, spec_from_dict

    raw = yaml.safe_load((EXAMPLES / "ticket-triage" / "pilot.yaml").read_text())
    plain = spec_from_dict(raw)
    assert plain.tracking == []
    with_tracking = spec_from_dict({**raw, "tracking": ["mlflow", "tensorboard"]})
    assert with_tracking.spec_hash() == plain.spec_hash()  # mirrors change no result
    with pytest.raises(Exception, match="tracking"):
        spec_from_dict({**raw, "tracking": ["wandb"]})
    prop = json_schema()["properties"]["tracking"]
    assert (
        prop["items"]["enum"] == ["mlflow", "tensorboard"]
        and "lorapilot[mlflow]" in prop["description"]
    )


def test_flatten_and_safe_keys():
    assert tracking.flatten({"a": {"b": 1, "c": [1, 2]}, "d": "x"}) == {
        "a.b": 1,
        "a.c": [1, 2],
        "d": "x",
    }
    assert (
        tracking._key("per_category.feature/request (new)!.f1")
        == "per_category.feature_request _new__.f1"
    )
    assert tracking.STATUS["stopped_by_limit"] == tracking.STATUS["interrupted"] == "KILLED"


def test_set_tracking_is_not_a_variant(tmp_path, tiny_model_dir):
    from lorapilot.spec import load_pilot, variant_label

    pilot = _pilot(tmp_path, tiny_model_dir, [])
    p = load_pilot(pilot, ["tracking=[tensorboard]"])
    assert p.spec.tracking == ["tensorboard"] and p.diff == {} and variant_label(p.diff) == "base"
    assert p.spec.spec_hash() == load_pilot(pilot).spec.spec_hash()


def _append(path, rows, partial=""):
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows) + partial)


def _step(i):
    return {
        "step": i,
        "loss": 1.0 / i,
        "lr": 0.01,
        "tokens": 100,
        "step_time_s": 0.5,
        "time": 1_800_000_000 + i,
    }


def test_live_mirror_shows_steps_while_the_run_runs_then_the_close_replaces_it(tmp_path):
    """During a train run the new steps.jsonl/val.jsonl lines reach MLflow (a RUNNING run)
    and TensorBoard at every poll, a half-written line waits for its end; at close the
    complete mirror takes the live copy's place (still one MLflow run, one event file)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with registry.open_run(
        tmp_path,
        "train",
        config={"name": "p", "tracking": ["mlflow", "tensorboard"]},
        on_close=tracking.mirror_on_close,
    ) as run:
        live = tracking.LiveMirror(run.dir, ["mlflow", "tensorboard"], interval=3600)
        with live:
            _append(run.dir / "steps.jsonl", [_step(1), _step(2)], partial='{"step": 3, "lo')
            _append(run.dir / "val.jsonl", [{"step": 0, "val_loss": 2.0, "time": 1_800_000_000}])
            assert live.poll() == 2 * 5 + 1  # loss, lr, tokens, step_time_s, tokens_per_s; val_loss
            client, runs = _mlflow_runs(tmp_path, experiment="p")
            mid = runs[run.id].info.run_id
            assert (
                runs[run.id].info.status == "RUNNING"
                and runs[run.id].data.tags["lorapilot.live"] == "true"
            )
            assert [(m.step, m.value) for m in client.get_metric_history(mid, "loss")] == [
                (1, 1.0),
                (2, 0.5),
            ]
            ea = EventAccumulator(str(tmp_path / "runs" / "tensorboard" / run.id))
            ea.Reload()
            assert [e.step for e in ea.Scalars("train/loss")] == [1, 2] and [
                e.step for e in ea.Scalars("val/loss")
            ] == [0]
            assert live.poll() == 0  # nothing new: the partial line is not read
            _append(run.dir / "steps.jsonl", [], partial='ss": 0.25, "time": 1800000003}\n')
            assert live.poll() == 1
            assert [m.step for m in client.get_metric_history(mid, "loss")] == [1, 2, 3]
            (run.dir / "steps.jsonl").write_text(
                json.dumps(_step(1)) + "\n"
            )  # a resume cut it back
            _append(run.dir / "steps.jsonl", [_step(2)])
            assert live.poll() == 2 * 5  # read again from the start, not from the old offset
        assert not live.failed
    client, runs = _mlflow_runs(tmp_path, experiment="p")
    final = runs[run.id]
    assert final.info.status == "FINISHED" and "lorapilot.mirror" in final.data.tags
    assert [m.step for m in client.get_metric_history(final.info.run_id, "loss")] == [
        1,
        2,
    ]  # the files as they are
    assert (
        len(list((tmp_path / "runs" / "tensorboard" / run.id).glob("events.out.tfevents.*"))) == 1
    )


def test_live_mirror_thread_sends_without_being_asked_and_a_broken_tracker_only_warns(
    tmp_path, capsys
):
    import time

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tmp_path / "runs" / "mlflow.db").mkdir(parents=True)  # sqlite cannot open a folder
    with registry.open_run(tmp_path, "train", config={"name": "p"}) as run:
        live = tracking.LiveMirror(run.dir, ["mlflow", "tensorboard"], interval=0.05)
        with live:
            _append(run.dir / "steps.jsonl", [_step(1)])
            deadline = time.time() + 30
            while live.logged == 0 and time.time() < deadline:
                time.sleep(0.05)
            assert live.logged == 5  # sent by the thread
            _append(run.dir / "steps.jsonl", [_step(2)])
        assert live.logged == 10  # the last lines are sent on exit
        assert set(live.failed) == {"mlflow"}
    err = " ".join(capsys.readouterr().err.split())
    assert err.count("warning: live tracking (mlflow) stopped") == 1 and "Training goes on" in err
    ea = EventAccumulator(str(tmp_path / "runs" / "tensorboard" / run.id))
    ea.Reload()
    assert [e.step for e in ea.Scalars("train/loss")] == [1, 2]


def test_live_interval_from_the_environment(monkeypatch):
    from lorapilot.errors import UsageError
    from lorapilot.records.tracking import live_interval as _live_interval

    monkeypatch.delenv("LORAPILOT_TRACKING_INTERVAL", raising=False)
    assert _live_interval() == tracking.LIVE_INTERVAL_S
    monkeypatch.setenv("LORAPILOT_TRACKING_INTERVAL", "0.5")
    assert _live_interval() == 0.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        monkeypatch.setenv("LORAPILOT_TRACKING_INTERVAL", bad)
        with pytest.raises(UsageError, match="LORAPILOT_TRACKING_INTERVAL"):
            _live_interval()


def test_every_step_run_is_mirrored_verify_included(tracked, monkeypatch):
    """The close hook reaches the runs of every step, not only train's: a verify run of the
    tracked pilot appears in MLflow, FINISHED. (Last in the file: it adds a run.)"""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    pilot, ok, _ = tracked
    out = run_json("verify", str(pilot), "--run", ok["run_id"])
    _, runs = _mlflow_runs(pilot)
    assert runs[out["run_id"]].info.status == "FINISHED"
    assert runs[out["run_id"]].data.tags["lorapilot.kind"] == "verify"
