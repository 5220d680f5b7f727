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
    # 2 noise images of each of the 3 labels: what a tiny random ViT memorises in 40 steps
    spec["smoke"] = {"per_category": 2, "min_examples": 6}
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

    base = run_json("baseline", str(pilot), "--no-progress")
    test = run_json("eval", str(pilot), "--split", "test", "--final", "--no-progress")
    assert test["n"] == 6 and test["adapter"] == tr["adapter_path"]
    # the base on the same rows is the baseline's classifier (the probe), not a random head,
    # fitted on the training features the baseline kept
    assert set(test["baseline_metrics"]["per_category"]) == set(LABELS)
    assert test["baseline_probe"]["train_features_reused"] is True
    assert test["baseline_probe"]["train_features"] == base["probe"]["train_features"]

    # predict: the validation images and a new one, paths relative to the pilot folder; the
    # validation images get the train run's predictions, named as validation examples
    from image_helpers import noise

    noise(999).save(pilot / "data" / "new.png")
    val = [json.loads(x) for x in (pilot / "runs" / tr["run_id"] / "predictions.jsonl")
           .read_text().splitlines()]  # fmt: skip
    rows = [{"image": r["image"], "id": r["id"]} for r in val] + [{"image": "data/new.png"}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pr = run_json("predict", str(pilot), "--input", str(tmp_path / "in.jsonl"), "--no-progress")
    assert pr["train_run"] == tr["run_id"] and pr["n"] == len(val) + 1 and pr["metrics"] is None
    assert pr["in_pilot_splits"]["val"]["n"] == len(val) and sum(
        pr["summary"]["predicted"].values()
    ) == len(rows)
    got = [json.loads(x) for x in open(pr["predictions"]).read().splitlines()]
    assert [g["parsed"] for g in got[:-1]] == [r["parsed"] for r in val]
    assert got[-1]["parsed"] in LABELS and got[-1]["correct"] is None
    # a folder of images inside the pilot: a file at its top is an input without an answer,
    # one in a folder named after a label is scored; the same predictions as listed above
    new = pilot / "new"
    (new / LABELS[0]).mkdir(parents=True)
    shutil.copy(pilot / val[0]["image"], new / LABELS[0] / "a.png")
    shutil.copy(pilot / "data" / "new.png", new / "b.png")
    (new / "notes.txt").write_text("not an image")  # a bad row, as in the pilot's folders
    proc = run_cli("predict", str(pilot), "--input", str(new))
    assert proc.returncode == 2 and "new/notes.txt: not an image file extension" in proc.stderr
    (new / "notes.txt").unlink()
    folder = run_json("predict", str(pilot), "--input", str(new), "--no-progress")
    assert folder["n"] == 2 and folder["n_scored"] == 1 and folder["input"]["skipped"] == 0
    rows = {g["id"]: g for g in map(json.loads, open(folder["predictions"]))}
    assert rows["new/b.png"]["parsed"] == got[-1]["parsed"]
    assert rows[f"new/{LABELS[0]}/a.png"]["parsed"] == val[0]["parsed"]
    assert rows[f"new/{LABELS[0]}/a.png"]["gold"] == LABELS[0]
    outside = tmp_path / "outside"
    shutil.copytree(new, outside)
    proc = run_cli("predict", str(pilot), "--input", str(outside))
    assert proc.returncode == 2 and "must be inside the pilot folder" in proc.stderr

    # Merged: plain transformers loads it with the pilot's labels and the trained head.
    ex = run_json("export", str(pilot), "--merge", "--out", str(tmp_path / "merged"))
    assert ex["ok"] and ex["merged"] and ex["max_logit_diff"] <= ex["tolerance"]
    assert ex["merge_agreement"] == 1.0 and ex["merge_agreement_examples"] == 6
    from transformers import AutoModelForImageClassification

    plain = AutoModelForImageClassification.from_pretrained(tmp_path / "merged")
    assert [plain.config.id2label[i] for i in range(len(LABELS))] == LABELS
    assert not list((tmp_path / "merged").glob("adapter_*"))
    proc_cfg = json.loads((tmp_path / "merged" / "preprocessor_config.json").read_text())
    # the pilot's own transforms (normalize: none), not the base's processor (mean 0.5)
    assert proc_cfg["lorapilot_transforms"]["size"] == 16 and proc_cfg["image_mean"] == [0.0] * 3
    # Unmerged: the adapter and its manifest, re-hashed.
    ad = run_json("export", str(pilot), "--out", str(tmp_path / "adapter"))
    assert ad["ok"] and ad["merged"] is False and ad["needs_quantization"] is None
    assert {"adapter_model.safetensors", "adapter_config.json", "lorapilot.json"} <= set(
        ad["files"]
    )

    # A saved adapter without its head (peft#2171): reloaded it would be a random head.
    weights = pilot / "runs" / tr["run_id"] / "adapter" / "adapter_model.safetensors"
    save_file({k: v for k, v in load_file(weights).items() if "classifier" not in k}, weights)
    proc = run_cli("verify", str(pilot), "--json")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    problems = json.loads(proc.stdout)["problems"]
    assert any("head net.classifier is missing" in p for p in problems), problems
    for args, what in (("--merge",), "head net.classifier is missing"), ((), "differ from"):
        proc = run_cli("export", str(pilot), *args, "--out", str(tmp_path / "again"), "--json")
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert what in json.loads(proc.stdout)["error"]
        assert not (tmp_path / "again").exists()  # nothing half-written


def test_efficientnet_lora_on_its_pointwise_convs_keeps_batchnorm_frozen(tmp_path, image_model_dir):
    pilot = _on_model(image_pilot(tmp_path / "p", size=32), "efficientnet-lite0", max_steps=2)
    tr = run_json("train", str(pilot), "--no-progress")
    assert tr["status"] == "completed" and tr["update_audit"]["ok"] is True
    kinds = {m.rsplit(".", 1)[-1] for m in tr["target_modules"]}
    assert kinds == {"_expand_conv", "_project_conv", "_conv_head"}
    shutil.rmtree(pilot / "runs" / tr["run_id"] / "checkpoints")  # verify needs the adapter only
    assert run_json("verify", str(pilot))["ok"] is True

    ex = run_json("export", str(pilot), "--merge", "--merge-dtype", "float32",
                  "--out", str(tmp_path / "merged"))  # fmt: skip
    assert ex["ok"] and ex["max_logit_diff"] <= ex["tolerance"] and ex["merge_agreement"] == 1.0
    # an image model is merged in float32 only
    half = run_json("export", str(pilot), "--merge", "--merge-dtype", "float16",
                    "--out", str(tmp_path / "m16"), expect=2)  # fmt: skip
    assert "merged in float32" in half["error"]
    # The package's own model class loads the merged weights, strictly, and computes what
    # lorapilot's reading of the folder computes.
    import torch
    from efficientnet_lite_pytorch import EfficientNet

    from lorapilot.modality.image_export import load_exported

    own = EfficientNet.from_name("efficientnet-lite0", num_classes=len(LABELS))
    own.load_state_dict(load_file(tmp_path / "merged" / "model.safetensors"), strict=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(
            own.eval()(x), load_exported(tmp_path / "merged", "efficientnet", len(LABELS))(x)
        )
    # ... and lorapilot takes the folder as a base (a new head on the merged backbone)
    from lorapilot.modality.image_model import load_image_classifier
    from lorapilot.spec import load_pilot

    _, again = load_image_classifier(load_pilot(pilot, sets=[f"model.base={tmp_path / 'merged'}"]))
    merged_conv = own._conv_head.weight
    torch.testing.assert_close(again.net._conv_head.weight, merged_conv, rtol=0, atol=0)


def test_full_fine_tune_of_a_tiny_vit_verifies_tests_and_exports(tmp_path, tiny_vit_dir):
    pilot = _on_model(image_pilot(tmp_path / "p"), tiny_vit_dir, max_steps=2)
    tr = run_json("train", str(pilot), "--no-progress", "--set", "adapter.method=full")
    assert tr["status"] == "completed" and tr["update_audit"]["ok"] is True
    assert tr["trainable_params"] == tr["total_params"]
    adapter = pilot / "runs" / tr["run_id"] / "adapter"
    assert (adapter / "model.safetensors").is_file()
    assert not (adapter / "adapter_config.json").exists()
    v = run_json("verify", str(pilot))
    assert v["ok"] is True and v["n_mismatched_predictions"] == 0
    test = run_json("eval", str(pilot), "--split", "test", "--final", "--no-progress")
    # the baseline on the test rows is the probe on the *base's* features (the base loaded
    # beside the fine-tune), as the unadapted base computes it in this process
    from lorapilot.modality import modality_of
    from lorapilot.spec import load_pilot

    loaded = modality_of(load_pilot(pilot)).load()
    base, _ = loaded.evaluate_base(loaded.prepared.splits["test"], loaded.protocol, progress=False)
    assert test["baseline_metrics"] == base.metrics
    proc = run_cli("export", str(pilot), "--merge", "--out", str(tmp_path / "m"))
    assert proc.returncode == 2 and "without --merge" in proc.stderr
    ex = run_json("export", str(pilot), "--out", str(tmp_path / "whole"))
    assert ex["ok"] and ex["method"] == "full" and "model.safetensors" in ex["files"]
