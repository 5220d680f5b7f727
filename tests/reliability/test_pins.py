"""What lorapilot hashes, `verify` checks: a changed adapter file, chat template or data set
is refused (exit 1), each named in the message.

Already covered elsewhere: changed base weights and an adapter on another base refused, a
missing adapter file (tests/steps/test_verify_export.py); checkpoint checksums
(tests/train/test_loop.py and test_kill_and_resume.py here).
"""

from __future__ import annotations

import json
import shutil

from rel_helpers import run_ok, small_pilot


def test_verify_refuses_a_changed_adapter_file_template_or_data(tmp_path, tiny_model_dir):
    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    pilot = small_pilot(tmp_path / "pilot", base, max_steps=2)
    adapter = (
        tmp_path
        / "pilot"
        / "runs"
        / run_ok("train", str(pilot), "--no-progress")["run_id"]
        / "adapter"
    )

    weights = adapter / "adapter_model.safetensors"
    original = weights.read_bytes()
    flipped = bytearray(original)
    flipped[-1] ^= 0x01
    weights.write_bytes(bytes(flipped))
    out = run_ok("verify", str(pilot), expect=1)
    assert "adapter file adapter_model.safetensors: sha256" in out["error"] and out["ok"] is False
    weights.write_bytes(original)

    template = base / "chat_template.jinja"
    template.write_text(
        "{# renders the same, but is not the template trained with #}" + template.read_text()
    )
    with (pilot / "data.jsonl").open("a") as f:
        f.write(
            json.dumps({"id": "late", "text": "one record added after training", "label": "beta"})
            + "\n"
        )
    out = run_ok("verify", str(pilot), expect=1)
    problems = " ".join(out["problems"])
    assert "chat template sha256" in problems and "tokenizer sha256" in problems
    assert "data version" in problems and "differs from the trained one" in problems
