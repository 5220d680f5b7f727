"""`lorapilot budget PILOT --gpu`: the plan on GPU classes before renting, from a base's
config.json and tokenizer alone; the time model and its calibration against the measured
rows it came from."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from conftest import EXAMPLES, run_json

from lorapilot.sizing.gpus import (
    calibration,
    calibration_rows,
    gpu_classes,
    predict_row,
    select,
)
from lorapilot.sizing.memory import ModelShape
from lorapilot.sizing.rental import HEADROOM, match_class
from lorapilot.sizing.timemodel import GpuClass, StepWork, step_seconds

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}


@pytest.fixture
def ticket(tmp_path):
    dst = tmp_path / "tt"
    shutil.copytree(EXAMPLES / "ticket-triage", dst, ignore=shutil.ignore_patterns("runs"))
    return dst


@pytest.fixture
def ticket_8b(ticket, default_model_dir):
    """ticket-triage on a folder holding only an 8B Llama's config.json and a tokenizer."""
    base = ticket / "llama8b"
    base.mkdir()
    (base / "config.json").write_text(json.dumps(LLAMA_8B))
    for f in default_model_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name == "chat_template.jinja":
            shutil.copy(f, base / f.name)
    spec = yaml.safe_load((ticket / "pilot.yaml").read_text())
    spec["model"] = {"base": "llama8b"}
    (ticket / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return ticket


def test_every_class_gets_a_plan_on_this_cpu_machine(ticket):
    out = run_json("budget", str(ticket), "--gpu", "all")
    names = [g["name"] for g in out["gpus"]]
    assert sorted(names) == sorted(c.name for c in gpu_classes())
    for g in out["gpus"]:
        assert g["fits"] is True  # a 135M model fits every class
        assert g["step_s"] > 0 and g["plan_hours"] > 0
        assert set(g["fits_days"]) == {"3", "7", "30"} and g["fits_days"]["3"]
        assert g["peak_gib"]["train"] > 0 and g["peak_gib"]["eval"] > 0
        assert g["micro_batch"] * g["grad_accum"] == 8  # the spec's effective batch
        assert "cost_usd" not in g  # no price given: none invented
    h200 = next(g for g in out["gpus"] if g["name"] == "h200")
    assert h200["calibration"].startswith("measured")
    assert next(g for g in out["gpus"] if g["name"] == "l4")["calibration"].startswith(
        "extrapolated"
    )
    assert out["inputs"]["lengths"]["shared_prefix"] > 0
    assert not (ticket / "runs").exists()  # read-only


def same_opts(gpu: dict) -> list[dict]:
    return gpu["variants"][0]["options"]


def test_an_8b_base_does_not_fit_24_gib_in_fp32_and_does_in_4_bit(ticket_8b):
    fp32 = run_json(
        "budget", str(ticket_8b), "--gpu", "l4,h100-80gb", "--set", "model.dtype=float32"
    )
    l4 = next(g for g in fp32["gpus"] if g["name"] == "l4")
    assert l4["fits"] is False and l4["why_not"]
    assert l4["peak_gib"]["train"] > HEADROOM * 24  # fp32 weights alone are 30 GiB
    assert l4["plan_hours"] is None and not any(l4["fits_days"].values())
    assert next(g for g in fp32["gpus"] if g["name"] == "h100-80gb")["fits"] is True
    assert fp32["gpus"][0]["name"] == "h100-80gb"  # what fits comes first

    bf16 = run_json("budget", str(ticket_8b), "--gpu", "l4", "--set", "model.dtype=bfloat16")
    [opt0, *_] = bf16["gpus"][0]["variants"][0]["options"]
    assert (opt0["micro_batch"], opt0["checkpointing"], opt0["fits"]) == (8, False, False)
    assert opt0["peak_gib"] > HEADROOM * 24

    # the default (model.dtype auto): frozen linears in bf16, embeddings and norms in fp32:
    # 8 rows of its long inputs with checkpointing fit 24 GiB, without checkpointing not
    auto = run_json("budget", str(ticket_8b), "--gpu", "l4")["gpus"][0]
    opts = {(o["micro_batch"], o["checkpointing"]): o for o in auto["variants"][0]["options"]}
    assert opts[(8, True)]["fits"] is True and opts[(8, True)]["peak_gib"] <= 24 * HEADROOM
    assert opts[(8, False)]["fits"] is False
    assert auto["fits"] is True and (auto["micro_batch"], auto["checkpointing"]) == (8, True)
    fp32_ckpt = next(o for o in same_opts(l4) if (o["micro_batch"], o["checkpointing"]) == (8, 1))
    # 8.03e9 x 4 bytes of weights against (6.98e9 + 0.53e9) x 2 + 0.53e9 x 4, less the casts
    assert 15 < fp32_ckpt["peak_gib"] - opts[(8, True)]["peak_gib"] < 18

    q4 = run_json("budget", str(ticket_8b), "--gpu", "l4", "--set", "model.quantization.bits=4")
    g = q4["gpus"][0]
    assert g["fits"] is True and g["peak_gib"]["train"] <= HEADROOM * 24
    same_setting = l4["variants"][0]["options"][0]  # micro-batch 8, no checkpointing
    assert g["variants"][0]["options"][0]["peak_gib"] < same_setting["peak_gib"] - 20


def test_prices_give_costs_and_bad_flags_exit_2(ticket):
    out = run_json("budget", str(ticket), "--gpu", "h100-80gb", "--price", "h100-80gb=2.5")
    g = out["gpus"][0]
    assert g["cost_usd"] == pytest.approx(g["plan_hours"] * 2.5)
    bad = run_json("budget", str(ticket), "--gpu", "nosuchgpu", expect=2)
    assert "--gpu nosuchgpu" in bad["error"] and "h100-80gb" in bad["error"]
    assert "l4" in bad["error"]
    bad = run_json("budget", str(ticket), "--gpu", "l4", "--price", "l4=cheap", expect=2)
    assert "--price l4=cheap" in bad["error"]
    bad = run_json("budget", str(ticket), "--gpu", "l4", "--price", "b200=5", expect=2)
    assert "unknown GPU class" in bad["error"]
    bad = run_json("budget", str(ticket), "--price", "l4=1", expect=2)
    assert "--gpu" in bad["error"]


def test_spec_prices_and_a_gpu_spec_file(ticket, tmp_path):
    spec = yaml.safe_load((ticket / "pilot.yaml").read_text())
    spec["limits"]["gpu_prices"] = {"L4": 0.8, "mygpu": 1.0}
    (ticket / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    extra = tmp_path / "gpus.json"
    extra.write_text(json.dumps({"classes": [
        {"name": "mygpu", "memory_gib": 48, "bf16_tflops": 180, "bandwidth_gbs": 864}
    ]}))  # fmt: skip
    out = run_json("budget", str(ticket), "--gpu", "l4,mygpu", "--gpu-spec", str(extra))
    by = {g["name"]: g for g in out["gpus"]}
    assert by["l4"]["cost_usd"] == pytest.approx(by["l4"]["plan_hours"] * 0.8)
    assert by["mygpu"]["calibration"].startswith("extrapolated")
    # without the file the spec names a class that does not exist
    bad = run_json("budget", str(ticket), "--gpu", "l4", expect=2)
    assert "limits.gpu_prices" in bad["error"] and "mygpu" in bad["error"]
    extra.write_text(json.dumps({"classes": [{"name": "x", "memory_gib": 8}]}))
    bad = run_json("budget", str(ticket), "--gpu", "x", "--gpu-spec", str(extra), expect=2)
    assert "classes[0]" in bad["error"] and "bf16_tflops" in bad["error"]


def test_the_stored_calibration_reproduces_the_rows_it_was_fitted_on():
    """bench/README's targets: step time within 30% on the H200 rows, memory within 10%."""
    rows, shapes = calibration_rows()
    classes = {c.name: c for c in gpu_classes()}
    cal = calibration("gpu")
    h200 = [r for r in rows if r["device"] == "h200" and r["what"] == "train_step"]
    assert len(h200) >= 20
    for r in h200:
        est = predict_row(r, classes["h200"], cal, shapes[r["shape"]])
        assert abs(est / r["measured_s"] - 1) <= 0.30, (r, est)


def test_the_time_model_counts_rows_checkpointing_and_quantization():
    gpu = GpuClass(name="g", label="g", memory_gib=80, bf16_tflops=1000, bandwidth_gbs=3000)
    cal = calibration("gpu")
    shape = ModelShape.from_config(LLAMA_8B)
    base = StepWork(rows=8, seq_len=512, loss_positions=3, trainable_params=40_000_000)

    def t(**kw):
        return step_seconds(gpu, cal, shape, StepWork(**{**base.__dict__, **kw}), "bf16")

    assert t(rows=16)["compute_s"] == pytest.approx(2 * t()["compute_s"], rel=0.01)
    assert t(grad_checkpointing=True)["compute_s"] > 1.4 * t()["compute_s"]
    assert t(quantized=True, weight_bytes=0.52)["bandwidth_s"] > t(weight_bytes=2)["bandwidth_s"]
    shared = t(shared_prefix=450)
    assert shared["overhead_s"] == pytest.approx(2 * t()["overhead_s"])  # a second pass
    assert shared["compute_s"] < t()["compute_s"]


def test_a_device_name_matches_its_class_and_not_a_neighbour():
    classes = gpu_classes()
    assert match_class("NVIDIA H100 80GB HBM3", classes).name == "h100-80gb"
    assert match_class("NVIDIA A100-SXM4-40GB", classes).name == "a100-40gb"
    assert match_class("NVIDIA GeForce RTX 4090", classes).name == "rtx4090"
    assert match_class("NVIDIA L4", classes).name == "l4"
    assert match_class("NVIDIA L40S", classes) is None
    assert match_class("AMD Instinct MI300X", classes).name == "mi300x"
    assert [c.name for c in select("H200, l4", classes)] == ["h200", "l4"]


def test_budget_with_a_cpu_probe_says_there_is_no_class_to_compare(tmp_path, tiny_model_dir):
    from conftest import init_tiny_pilot

    pilot = init_tiny_pilot(tmp_path, tiny_model_dir, max_steps=2)
    run_json("probe", str(pilot))
    out = run_json("budget", str(pilot))
    assert out["pre_rental"]["gpu"] is None and "the CPU" in out["pre_rental"]["why"]


def test_fp32_compute_is_said_to_be_timed_at_the_bf16_peak(ticket):
    out = run_json("budget", str(ticket), "--gpu", "l4", "--set", "train.precision=fp32")
    assert "timed at the class's bf16 peak" in out["gpus"][0]["variants"][0]["note"]
    auto = run_json("budget", str(ticket), "--gpu", "l4")
    assert "note" not in auto["gpus"][0]["variants"][0]
