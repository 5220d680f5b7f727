"""`lorapilot export --gguf` end to end on the real default model (its base *is* a GGUF): a
briefly trained ticket-triage adapter exported, its files named and hashed, the Modelfile
asking what the pilot asked, the validation split predicted in llama.cpp and compared with
lorapilot's predictions; a changed byte refused; an image pilot and bad flags exit 2.

Six steps leave the adapter close to the zero-shot model, whose label scores are close calls
that llama.cpp's Q4_1 arithmetic can flip (92.6% agreement measured on the whole validation
split, against 99.1% for the example's trained adapter): so the gate is exercised both ways
here with explicit minimums, and the conversion's exactness is test_llamacpp_parity's."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from conftest import EXAMPLES, need_llama_cpp, run_cli, run_json

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exported(tmp_path_factory, default_model_dir):
    need_llama_cpp()
    root = tmp_path_factory.mktemp("gguf-export")
    pilot = root / "tt"
    shutil.copytree(EXAMPLES / "ticket-triage", pilot, ignore=shutil.ignore_patterns("runs"))
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["train"].update(max_steps=6, micro_batch=4, lr=2e-3, threads=1)
    spec["data"]["split"].update(val=0.02)  # 15 validation tickets: the check in seconds
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    train = run_json("train", str(pilot), "--no-progress")
    proc = run_cli("export", str(pilot), "--gguf", "--out", str(root / "served"), "--json")
    assert proc.returncode in (0, 1), proc.stderr
    out = json.loads(proc.stdout)
    out["exit"] = proc.returncode
    out["stderr"] = proc.stderr
    return pilot, root / "served", train, out


def test_the_serving_check_shows_its_progress(exported):
    """The llama.cpp process reports each prompt; the export shows the count (a plain line
    every 30 s and at the end: a generation task's check takes minutes)."""
    *_, out = exported
    n = out["n_examples"]
    assert f"serving check: {n}/{n} (100%)" in out["stderr"]


def test_files_manifest_and_modelfile(exported):
    pilot, served, train, out = exported
    names = {p.name for p in served.iterdir()}
    assert names == {"base.gguf", "adapter.gguf", "Modelfile", "README.md", "lorapilot.json",
                     "classify.py", "classifier.json", "labels.gbnf"}  # fmt: skip
    manifest = json.loads((served / "lorapilot.json").read_text())
    assert set(manifest["files"]) == names - {"lorapilot.json"}
    trained = json.loads(
        (pilot / "runs" / train["run_id"] / "adapter" / "lorapilot.json").read_text()
    )
    assert manifest["base"]["sha256"] == trained["base"]["sha256"]
    assert manifest["base_gguf"]["type"] == "original"
    assert manifest["base_gguf"]["original"]["gguf_file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    modelfile = (served / "Modelfile").read_text()
    assert "FROM ./base.gguf" in modelfile and "ADAPTER ./adapter.gguf" in modelfile
    assert 'PARAMETER stop "<|im_end|>"' in modelfile
    assert "Answer with exactly one category: billing, technical" in modelfile
    assert out["modelfile_prompt_matches"] is True
    assert "Generated greedily on the validation split" in (served / "README.md").read_text()


def test_llama_cpp_predictions_compared_and_gated(exported):
    pilot, _, train, out = exported
    labels = yaml.safe_load((pilot / "pilot.yaml").read_text())["task"]["labels"]
    assert out["format"] == "gguf" and out["gated"] and out["serving_agreement_min"] == 0.98
    (conf,) = out["configs"]
    n = out["n_examples"]
    assert conf["name"] == "base+adapter" and conf["n_same"] + conf["n_differing"] == n >= 10
    # the gate's figure: the same answers, and the near-ties within the runtimes' noise
    ties = conf["ties"]
    assert 0 <= ties["near_ties"] <= conf["n_differing"] == len(ties["served_margins"])
    assert out["serving_agreement"] == pytest.approx((conf["n_same"] + ties["near_ties"]) / n)
    assert conf["example_agreement"] == pytest.approx(conf["n_same"] / n)
    # the gate: exit 1 exactly when the agreement is under the minimum
    assert out["ok"] == (out["serving_agreement"] >= 0.98) == (out["exit"] == 0)
    assert len(conf["differing"]) == conf["n_differing"]
    for d in conf["differing"]:
        assert d["lorapilot"] != d["llama_cpp"] and d["llama_cpp"] in labels
    macro = conf["metrics"]["macro_f1"]
    assert macro["lorapilot"] == pytest.approx(train["metrics"]["macro_f1"])
    assert 0 <= macro["llama_cpp"] <= 1 and conf["examples_per_s"] > 0
    # the labels generated freely, as the Modelfile serves them: reported, warned, not gated
    g = conf["generation"]
    assert 0 <= g["n_same"] <= g["n_labels"] <= n
    assert out["generation_agreement"] == pytest.approx(g["n_same"] / n)
    assert out["generation_label_rate"] == pytest.approx(g["n_labels"] / n)
    assert len(out["warnings"]) == (g["agreement"] < 0.98)
    for d in g["differing"]:
        assert d["generated"].strip().casefold() != d["lorapilot"].casefold()
    # and constrained by the folder's labels.gbnf in llama.cpp's grammar sampler: every answer
    # one of the labels, written exactly; compared with lorapilot's own constrained check
    h = g["constrained"]
    assert h["n_labels"] == h["n"] == n and out["constrained_label_rate"] == 1.0
    assert out["constrained_agreement"] == pytest.approx(h["n_same"] / n)
    assert all(d["generated"] in labels for d in h["differing"])
    assert h["lorapilot_constrained"]["n"] == n  # the train run recorded its constrained labels
    assert h["lorapilot_constrained"]["n_same"] >= 0.8 * n  # only arithmetic may part them


def test_classify_py_classifies_as_the_pilot_did(exported, tmp_path):
    """The exported script, run as a user runs it (its folder, no lorapilot), answers what
    lorapilot predicted where the check found them the same; its cut of a too-long input is
    the pilot's, token for token."""
    import subprocess
    import sys

    from llama_cpp import Llama

    from lorapilot.base.models import load_tokenizer
    from lorapilot.data.dataset import formatter_for
    from lorapilot.spec import load_pilot

    pilot, served, train, out = exported
    manifest = json.loads((served / "lorapilot.json").read_text())
    assert manifest["classifier"]["file"] == "classify.py"
    assert "## Classify as the pilot did" in (served / "README.md").read_text()
    rows = [json.loads(x) for x in (pilot / "runs" / train["run_id"] / "predictions.jsonl")
            .read_text().splitlines()]  # fmt: skip
    differ = {d["id"] for d in out["configs"][0]["differing"]}
    same = [r for r in rows if r["id"] not in differ][:3]
    proc = subprocess.run(
        [sys.executable, "-I", str(served / "classify.py"), "--scores", *(r["text"] for r in same)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [g["label"] for g in got] == [r["parsed"] for r in same]
    for g in got:  # the labels that could still win, scored whole; the answer the best
        assert g["scores"][g["label"]] == max(g["scores"].values())
    lines = "".join(json.dumps({"id": r["id"], "text": r["text"]}) + "\n" for r in same)
    proc = subprocess.run(
        [sys.executable, "-I", str(served / "classify.py"), "--jsonl"],
        input=lines, capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(g["id"], g["label"]) for g in got] == [(r["id"], r["parsed"]) for r in same]
    # the cut: a max_length that cuts every input, as the pilot's formatter cuts it
    config = json.loads((served / "classifier.json").read_text())
    (tmp_path / "classifier.json").write_text(json.dumps(config | {"max_length": 90}))
    module = _load(served / "classify.py")
    llm = Llama(model_path=str(served / "base.gguf"), n_ctx=256, verbose=False, n_threads=1)
    clf = module.Classifier(tmp_path, llm=llm)
    loaded = load_pilot(pilot)
    _, tok = load_tokenizer(loaded)
    fmt = formatter_for(loaded, tok)
    fmt.max_length, fmt.truncation_side = 90, config["truncation_side"]
    texts = [r["text"] for r in rows[:8]]
    assert any(fmt.fit_text(t, config["answer_budget"])[1] for t in texts)  # some are cut
    for t in texts:
        assert clf.prompt_ids(t) == fmt.encode_prompt(t, config["answer_budget"])


def _load(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("exported_classify", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_classify_py_needs_nothing_of_lorapilot():
    """The script is delivered alone: standard library, numpy and llama_cpp only."""
    import ast

    from lorapilot.export import classify

    tree = ast.parse(open(classify.__file__, encoding="utf-8").read())
    imported = {
        (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in (n.names if isinstance(n, ast.Import) else [n])
    }
    assert imported == {"__future__", "json", "os", "sys", "pathlib", "numpy", "llama_cpp"}


def test_a_changed_byte_is_refused_naming_the_file(exported, tmp_path):
    pilot, served, _, _ = exported
    copy = tmp_path / "served"
    shutil.copytree(served, copy)
    data = bytearray((copy / "adapter.gguf").read_bytes())
    data[-5] ^= 0x01
    (copy / "adapter.gguf").write_bytes(bytes(data))
    proc = run_cli("export", str(pilot), "--check", str(copy), "--json")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert not out["ok"]
    (problem,) = out["problems"]
    assert "adapter.gguf" in problem and "sha256" in problem and "changed after export" in problem


def test_recheck_gives_the_same_agreement_under_a_stricter_minimum(exported):
    """`--check` again with minimum 1: the same figures (shown to a person whether the check
    passes or fails), the exit code by the minimum."""
    pilot, served, _, first = exported
    proc = run_cli("export", str(pilot), "--check", str(served), "--min-agreement", "1")
    assert proc.returncode == (0 if first["serving_agreement"] == 1.0 else 1), proc.stderr
    assert f"llama.cpp agrees with lorapilot {first['serving_agreement']:.1%} " in proc.stdout
    held = first["configs"][0]["generation"]["constrained"]  # labels.gbnf again
    assert (
        "base+adapter, constrained by labels.gbnf (llama.cpp's grammar sampler): "
        f"{held['agreement']:.1%} the scored label, {held['label_rate']:.1%} a label"
    ) in proc.stdout


def test_image_pilot_and_bad_flags_exit_2(tmp_path):
    pilot = tmp_path / "fi"
    shutil.copytree(EXAMPLES / "fashion-items", pilot, ignore=shutil.ignore_patterns("runs"))
    proc = run_cli("export", str(pilot), "--gguf", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "image" in proc.stderr
    tt = tmp_path / "tt"
    shutil.copytree(EXAMPLES / "ticket-triage", tt, ignore=shutil.ignore_patterns("runs"))
    for args, says in (
        (["--gguf", "--out", "o", "--gguf-base", "q4"], "--gguf-base q4"),
        (["--out", "o", "--gguf-base", "f16"], "go with --gguf"),
        (["--gguf"], "--out is required"),
    ):
        proc = run_cli("export", str(tt), *args)
        assert proc.returncode == 2 and says in proc.stderr, (args, proc.stderr)


def test_a_plain_prompt_format_is_served_as_trained(tmp_path, default_model_dir):
    """model.chat_template: plain on the real default model: llama.cpp tokenizes every plain
    prompt as the pilot does (no problem named), the Modelfile's PLAIN template renders the
    pilot's prompt, and the folder carries the template with the flags that pass it."""
    need_llama_cpp()
    pilot = tmp_path / "tt"
    shutil.copytree(EXAMPLES / "ticket-triage", pilot, ignore=shutil.ignore_patterns("runs"))
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["model"]["chat_template"] = "plain"
    spec["train"].update(max_steps=2, micro_batch=4, threads=1)
    spec["data"]["split"].update(val=0.02)
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    run_json("train", str(pilot), "--no-progress")
    proc = run_cli("export", str(pilot), "--gguf", "--out", str(tmp_path / "served"), "--json")
    assert proc.returncode in (0, 1), proc.stderr  # the agreement gate may refuse 2 steps
    out = json.loads(proc.stdout)
    assert out["problems"] == [] and out["modelfile_prompt_matches"] is True
    served = tmp_path / "served"
    assert "chat_template.jinja" in out["sha256"]
    assert "### Response:" in (served / "chat_template.jinja").read_text()
    assert 'TEMPLATE """{{ if .System }}' in (served / "Modelfile").read_text()
    readme = (served / "README.md").read_text()
    assert "--jinja --chat-template-file chat_template.jinja" in readme
