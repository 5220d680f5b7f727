"""`probe` in-process on the 2-layer, 32-wide random Llama with ticket-triage's real data:
full steps at the typical and long lengths with checkpointing off and on, the batch
search (memory limit, injected out-of-memory), and --estimate-only without any weights.

Memory on CPU is a peak RSS increase sampled every 5 ms. For a model this small it is
noise-sized (a few MB, sometimes less than what the allocator already holds), so the
tests require it to be >= 0 and the estimate to be > 0, not the two to agree; the real
model's figures are in bench/README.md (bench/probe_accuracy.py).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml
from conftest import EXAMPLES

from lorapilot.sizing import measure as stepmeasure
from lorapilot.sizing import probe_plan as sizing
from lorapilot.sizing.memory import ModelShape
from lorapilot.spec import AdapterSpec, load_pilot
from lorapilot.steps import probe

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_pilot(tmp_path, tiny_model_dir, **overrides):
    pilot = tmp_path / "ticket-triage"
    shutil.copytree(EXAMPLES / "ticket-triage", pilot, ignore=shutil.ignore_patterns("runs"))
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["model"] = {"base": str(tiny_model_dir)}
    spec["train"]["micro_batch"] = 8  # pinned: the assertions below rely on these
    spec["data"]["max_length"] = 256
    for key, value in overrides.items():
        section, name = key.split("__")
        spec.setdefault(section, {})[name] = value
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return pilot


# --------------------------------------------------------------------------- pure parts


def test_lengths_and_example_choice():
    lengths = [10, 50, 30, 31, 29, 200, 30]
    assert sizing.target_lengths(lengths, max_length=128) == {"typical": 30, "long": 128}
    assert sizing.target_lengths(lengths, max_length=512)["long"] == 200
    assert sizing.pick_examples(lengths, 30, 3) == [2, 6, 3]  # closest first, ties in data order
    assert sizing.pick_examples([5, 9], 9, 5) == [1, 0, 1, 0, 1]  # too few: real examples repeat


def test_analytic_lora_count_matches_peft(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from lorapilot.base.adapter import build_adapter

    config = json.loads((tiny_model_dir / "config.json").read_text())
    shape = ModelShape.from_config(config)
    for adapter in (AdapterSpec(r=4), AdapterSpec(r=8, target_modules=["q_proj", "down_proj"])):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        _, info = build_adapter(model, adapter, seed=0)
        assert sizing.lora_trainable_params(shape, adapter) == info["trainable_params"]


# --------------------------------------------------------------------------- measured


@pytest.fixture(scope="module")
def probed(tmp_path_factory, tiny_model_dir):
    pilot = tiny_pilot(tmp_path_factory.mktemp("probe"), tiny_model_dir)
    lines: list[str] = []
    out = probe.run_probe(load_pilot(pilot), steps=5, progress=False, log=lines.append)
    return pilot, out, lines


def test_probe_measures_two_lengths_with_checkpointing_off_and_on(probed):
    pilot, out, lines = probed
    rows = out["measurements"]
    assert out["status"] == "completed" and out["estimate_only"] is False
    assert {(r["length"], r["grad_checkpointing"]) for r in rows} == {
        ("typical", False),
        ("typical", True),
        ("long", False),
        ("long", True),
    }
    for r in rows:
        assert r["ok"] is True and r["error"] is None and r["measured"] is True
        assert r["micro_batch"] == 8 and r["steps_run"] == 1 + 5
        assert r["first_step_s"] > 0 and r["later_step_s"] > 0
        assert r["later_step_max_s"] >= r["later_step_s"]
        assert r["tokens_per_s"] > 0 and r["tokens"] > 0
        assert r["peak_memory_bytes"] >= 0 and r["peak_total_bytes"] > 0
        assert r["estimated_peak_memory_bytes"] > 0 and r["estimate_basis"] == "step_increase"
        assert r["estimate_components"]["weights"] > 0  # kept, only left out of the comparison
        if r["peak_memory_bytes"] > 0:
            assert r["estimate_error"] is not None
        # what the step's tensors held at once (profiled last step, not timed) beside the
        # memory model's count of them
        assert r["peak_live_bytes"] > 0 and r["estimated_live_bytes"] > 0
        assert r["live_estimate_error"] == pytest.approx(
            r["estimated_live_bytes"] / r["peak_live_bytes"] - 1
        )
    typical = next(r for r in rows if r["length"] == "typical")
    long = next(r for r in rows if r["length"] == "long")
    assert typical["seq_len"] < long["seq_len"] <= 256  # data.max_length of ticket-triage
    assert out["lengths"]["typical"] <= typical["seq_len"]  # padded to the longest chosen example
    assert long["seq_len"] == out["lengths"]["long"]

    load = out["load"]
    assert load["seconds"] > 0 and load["peak_rss_bytes"] > 0 and load["weights_bytes"] > 0
    env = out["environment"]
    assert env["accelerator"] == "cpu" and env["available_memory_bytes"] > 0
    assert "load_average" in env["other_processes"] and len(env["other_processes"]["top"]) <= 5
    assert out["eval_examples_per_s"] > 0 and out["eval_examples"] == 32
    assert out["checkpoint_save_s"] > 0
    assert out["batch_search"] is None and out["trainable_params"] > 0

    run_dir = pilot / "runs" / out["run_id"]
    assert sorted(p.name for p in run_dir.iterdir()) == ["run.json"]  # temp checkpoint removed
    rec = json.loads((run_dir / "run.json").read_text())
    assert rec["kind"] == "probe" and rec["status"] == "completed"
    assert rec["result"]["measurements"] == json.loads(json.dumps(rows))
    assert any("ckpt on" in line for line in lines) and any("evaluation" in line for line in lines)
    assert out["eval_peak_memory_bytes"] > 0 and any("longest prompts" in ln for ln in lines)
    # the memory model's figure for the widest evaluation batch, beside the measurement
    ev = out["eval_estimate"]
    assert (
        ev["batch_size"] == 32 and ev["prompt_len"] > 0 and ev["estimate_basis"] == "step_increase"
    )
    comp = ev["estimate_components"]
    assert comp["kv_cache"] > 0 and comp["logits"] > 0 and comp["weights"] > 0
    assert ev["estimated_peak_memory_bytes"] == comp["total"] - comp["weights"]
    if ev["measured_peak_memory_bytes"]:
        assert ev["estimate_error"] == pytest.approx(
            ev["estimated_peak_memory_bytes"] / ev["measured_peak_memory_bytes"] - 1
        )
    # on a CPU also the live tensors of that batch, held to the components that live in
    # tensors; the label tree's logits are the worst case (an unsure model), so the estimate
    # is at least what a (probe-trained) adapter held
    assert ev["measured_live_bytes"] > 0
    assert ev["estimated_live_bytes"] == sum(
        comp[k] for k in ("kv_cache", "logits", "activations", "masks")
    )
    assert ev["live_estimate_error"] == pytest.approx(
        ev["estimated_live_bytes"] / ev["measured_live_bytes"] - 1
    )
    assert ev["live_estimate_error"] >= 0 and "unsure model" in ev["estimate_case"]
    assert any("tensors live" in ln and "unsure model" in ln for ln in lines)


def test_live_tensor_bytes_are_the_same_every_time_and_grow_with_the_batch(probed):
    """Unlike a CPU's RSS (which depends on what the heap kept from earlier work), the bytes
    torch holds live during a step are a property of the step: measured twice, the same."""
    from lorapilot.modality import modality_of
    from lorapilot.train.batches import collate
    from lorapilot.train.step import make_optimizer

    pilot, _, _ = probed
    p = load_pilot(pilot)
    tr = modality_of(p).trainee()
    tr.model.train()
    ex = tr.train_set.examples

    def live(n: int) -> int:
        batch = collate(ex[:n], tr.train_set.pad_id)
        m = stepmeasure.measure(
            tr.model, batch, make_opt=lambda: make_optimizer(tr.model, p.spec.train),
            precision=p.spec.train.precision,  # a base held in bf16 runs under its autocast
            max_grad_norm=1.0, steps=2, warmup=1, device=torch.device("cpu"),
            live=True,
        )  # fmt: skip
        assert m["steps_run"] == 3 and m["profiled_step_s"] > 0
        return m["peak_live_bytes"]

    four = live(4)
    assert live(4) == four and live(8) > four


def test_search_batch_records_an_injected_oom_and_goes_on(tmp_path, tiny_model_dir, monkeypatch):
    real_step = stepmeasure.train_step  # the step `measure` runs, looked up there
    sizes = []

    def step(model, optimizer, scheduler, micro_batches, *args, **kwargs):
        n = micro_batches[0]["input_ids"].shape[0]
        sizes.append(n)
        if n == 32:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (injected)"
            )
        return real_step(model, optimizer, scheduler, micro_batches, *args, **kwargs)

    monkeypatch.setattr(stepmeasure, "train_step", step)
    pilot = tiny_pilot(tmp_path, tiny_model_dir)
    out = probe.run_probe(
        load_pilot(pilot), search_batch=True, steps=5, progress=False, log=lambda s: None
    )
    assert out["status"] == "completed"
    searched = [r for r in out["measurements"] if r["search"]]
    assert [(r["micro_batch"], r["grad_checkpointing"], r["ok"]) for r in searched] == [
        (16, False, True),
        (32, False, False),
        (16, True, True),
        (32, True, False),
    ]
    for r in searched:
        assert r["length"] == "long"
        if not r["ok"]:
            assert "OutOfMemoryError" in r["error"] and r["first_step_s"] is None
            assert r["estimate_error"] is None and r["estimated_peak_memory_bytes"] > 0
    for setting in ("off", "on"):
        assert out["batch_search"][setting] == {
            "largest_ok_micro_batch": 16,
            "stopped_because": "out of memory",
        }
    assert 64 not in sizes  # the search stopped at the failure
    assert out["checkpoint_save_s"] > 0 and out["eval_examples_per_s"] > 0  # the probe went on


def test_search_batch_stops_at_the_memory_limit(tmp_path, tiny_model_dir):
    pilot = tiny_pilot(tmp_path, tiny_model_dir, limits__memory_gb=0.001)  # 1 MiB
    out = probe.run_probe(
        load_pilot(pilot), search_batch=True, steps=5, progress=False, log=lambda s: None
    )
    assert not [r for r in out["measurements"] if r["search"]]
    assert len(out["measurements"]) == 4
    for setting in ("off", "on"):
        assert out["batch_search"][setting] == {
            "largest_ok_micro_batch": None,
            "stopped_because": "limits.memory_gb exceeded",
        }


def test_spec_mode_measures_the_spec_setting_and_the_other_only_when_it_does_not_fit(
    tmp_path, tiny_model_dir
):
    """`run` asks for the spec's checkpointing setting only; the other is the fix to try
    when the spec's step is over limits.memory_gb, so then it is measured too."""
    fits = probe.run_probe(
        load_pilot(tiny_pilot(tmp_path / "a", tiny_model_dir)),
        checkpointing="spec", steps=5, progress=False, log=lambda s: None,
    )  # fmt: skip
    rows = [(r["length"], r["grad_checkpointing"]) for r in fits["measurements"]]
    assert rows == [("typical", False), ("long", False)]
    assert fits["checkpointing_settings"] == ["off"]
    tight = probe.run_probe(
        load_pilot(tiny_pilot(tmp_path / "b", tiny_model_dir, limits__memory_gb=0.001)),
        checkpointing="spec", steps=5, progress=False, log=lambda s: None,
    )  # fmt: skip
    rows = [(r["length"], r["grad_checkpointing"]) for r in tight["measurements"]]
    assert rows == [("typical", False), ("long", False), ("typical", True), ("long", True)]
    assert tight["checkpointing_settings"] == ["off", "on"]


def test_probe_pads_its_batches_as_training_does(tmp_path, tiny_model_dir):
    """`train.pad_to_multiple_of`: the probe measures the padded widths training runs."""
    out = probe.run_probe(
        load_pilot(tiny_pilot(tmp_path, tiny_model_dir, train__pad_to_multiple_of=48)),
        checkpointing="spec", steps=5, progress=False, log=lambda s: None,
    )  # fmt: skip
    widths = [r["seq_len"] for r in out["measurements"]]
    assert widths and all(w % 48 == 0 for w in widths), widths


def test_probe_refuses_too_few_steps(tmp_path, tiny_model_dir):
    from lorapilot.errors import UsageError

    pilot = tiny_pilot(tmp_path, tiny_model_dir)
    with pytest.raises(UsageError, match="5 measured steps"):
        probe.run_probe(load_pilot(pilot), steps=3, log=lambda s: None)
    assert not (pilot / "runs").exists()


# --------------------------------------------------------------------------- estimate only


def test_estimate_only_loads_no_weights_and_honours_set(tmp_path, tiny_model_dir, monkeypatch):
    import transformers

    def no_weights(*args, **kwargs):
        raise AssertionError("--estimate-only must not load model weights")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    # every step the probe takes (measure, checkpoint_seconds) is stepmeasure's train_step
    monkeypatch.setattr(stepmeasure, "train_step", no_weights)
    pilot = tiny_pilot(tmp_path, tiny_model_dir)
    out = probe.run_probe(
        load_pilot(pilot, ["data.max_length=4096"]), estimate_only=True, log=lambda s: None
    )
    assert out["status"] == "completed" and out["estimate_only"] is True
    rows = out["measurements"]
    assert {r["length"] for r in rows} == {"typical", "long", "max_length"}
    assert len(rows) == 6 and {r["grad_checkpointing"] for r in rows} == {False, True}
    assert out["lengths"]["max_length"] == 4096
    assert any(r["seq_len"] == 4096 for r in rows)
    for r in rows:
        assert (
            r["measured"] is False and r["first_step_s"] is None and r["peak_memory_bytes"] is None
        )
        assert r["estimated_peak_memory_bytes"] > 0 and r["estimate_basis"] == "total"
    off = sorted((r for r in rows if not r["grad_checkpointing"]), key=lambda r: r["seq_len"])
    assert [r["estimated_peak_memory_bytes"] for r in off] == sorted(
        r["estimated_peak_memory_bytes"] for r in off
    )
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert out["trainable_params"] == sizing.lora_trainable_params(
        ModelShape.from_config(config), AdapterSpec()
    )
    rec = json.loads((pilot / "runs" / out["run_id"] / "run.json").read_text())
    assert rec["kind"] == "probe" and rec["result"]["estimate_only"] is True


# --------------------------------------------------------------------------- load


def test_disturbed_means_half_a_core_or_a_quarter_of_the_cores_used_by_others():
    from lorapilot.sizing.measure import is_disturbed

    assert not is_disturbed(0.1, 2) and is_disturbed(0.5, 2) and is_disturbed(1.9, 2)
    assert not is_disturbed(3.0, 16) and is_disturbed(4.0, 16)


def test_cpu_load_sees_a_busy_neighbour(monkeypatch):
    """A process spinning one core beside the measurement: about one core of other use."""
    import subprocess
    import sys
    import time

    from lorapilot.sizing.measure import CpuLoad

    monkeypatch.setenv("LORAPILOT_LOAD_CHECK", "on")
    meter = CpuLoad()
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\n"
                             "while time.time() - t < 1.5: pass"])  # fmt: skip
    time.sleep(1.5)  # the spinner runs, we wait: its CPU is someone else's until reaped
    out = meter.stop(threads=1)
    spin.wait(timeout=30)
    assert out["other_cores"] >= 0.6 and out["disturbed"]
    assert out["threads"] == 1 and out["cores"] >= 1 and out["checked"] is True
    monkeypatch.setenv("LORAPILOT_LOAD_CHECK", "off")
    assert CpuLoad().stop(threads=1)["disturbed"] is False


def test_probe_records_its_load_check(probed):
    _, out, _ = probed
    lc = out["load_check"]
    assert set(lc) >= {"other_cores", "cores", "threads", "seconds", "checked", "disturbed"}
    assert lc["threads"] >= 1 and lc["seconds"] > 0 and out["disturbed"] == lc["disturbed"]
