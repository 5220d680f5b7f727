"""An image pilot trained, verified and tested as a user runs it (#18): a tiny random ViT
(any AutoModelForImageClassification folder) and the EfficientNet-Lite0 default."""

from __future__ import annotations

import json
import shutil

import yaml
from conftest import run_cli, run_json
from image_helpers import LABELS, image_pilot
from safetensors.torch import load_file, save_file


def _on_model(pilot, base, **train):
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["model"] = {"base": str(base)}
    spec["train"] = {"precision": "fp32", "micro_batch": 4, "lr": 1e-2, **train}
    spec["eval"] = {"precision": "fp32"}
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec))
    return pilot


def test_smoke_train_verify_and_test_on_a_tiny_vit_and_a_missing_head_fails_verify(
    tmp_path, tiny_vit_dir
):
    pilot = _on_model(image_pilot(tmp_path / "p"), tiny_vit_dir, max_steps=3)
    sm = run_json("smoke", str(pilot), "--no-progress")
    assert sm["ok"] is True and sm["n_correct"] == sm["n_examples"] == 6

    tr = run_json("train", str(pilot), "--no-progress")
    assert tr["status"] == "completed" and tr["steps"] == 3
    assert tr["update_audit"]["ok"] is True, tr["update_audit"]["problems"]
    assert {"q_proj", "v_proj"} <= {m.rsplit(".", 1)[-1] for m in tr["target_modules"]}
    assert not any(m.endswith("classifier") for m in tr["target_modules"])  # the head is saved
    record = json.loads((pilot / "runs" / tr["run_id"] / "run.json").read_text())
    assert record["result"]["adapter"]["modules_to_save"] == ["net.classifier"]
    assert set(tr["metrics"]["per_category"]) == set(LABELS)
    assert tr["metrics"]["confusion"]["labels"] == LABELS

    v = run_json("verify", str(pilot))
    assert v["ok"] is True and v["n_mismatched_predictions"] == 0

    test = run_json("eval", str(pilot), "--split", "test", "--final", "--no-progress")
    assert test["n"] == 6 and test["adapter"] == tr["adapter_path"]
    # the base on the same rows is the baseline's classifier (the probe), not a random head
    assert set(test["baseline_metrics"]["per_category"]) == set(LABELS)

    # A saved adapter without its head (peft#2171): reloaded it would be a random head.
    weights = pilot / "runs" / tr["run_id"] / "adapter" / "adapter_model.safetensors"
    save_file({k: v for k, v in load_file(weights).items() if "classifier" not in k}, weights)
    proc = run_cli("verify", str(pilot), "--json")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    problems = json.loads(proc.stdout)["problems"]
    assert any("head net.classifier is missing" in p for p in problems), problems


def test_efficientnet_lora_on_its_pointwise_convs_keeps_batchnorm_frozen(tmp_path, image_model_dir):
    pilot = _on_model(image_pilot(tmp_path / "p", size=32), "efficientnet-lite0", max_steps=2)
    tr = run_json("train", str(pilot), "--no-progress")
    assert tr["status"] == "completed" and tr["update_audit"]["ok"] is True
    kinds = {m.rsplit(".", 1)[-1] for m in tr["target_modules"]}
    assert kinds == {"_expand_conv", "_project_conv", "_conv_head"}
    shutil.rmtree(pilot / "runs" / tr["run_id"] / "checkpoints")  # verify needs the adapter only
    assert run_json("verify", str(pilot))["ok"] is True
