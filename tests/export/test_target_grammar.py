"""An extraction pilot's answer shape as a GBNF grammar and a JSON Schema (`fields.gbnf`,
`schema.json` of `export --gguf`): every gold answer of examples/invoice-fields, as the
adapter was trained to write it, passes llama.cpp's own grammar sampler token by token on the
real default vocabulary and may end there; a wrong date, a null where a field is required, a
missing key and a stray space are refused; the schema accepts the gold targets."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import EXAMPLES, need_llama_cpp

from lorapilot.data.format import answer_text
from lorapilot.data.targets import target_schema
from lorapilot.export.serving import GrammarSampler
from lorapilot.export.target_grammar import gbnf_of, json_schema_of
from lorapilot.spec import load_pilot, spec_from_dict


def _invoices(n: int = 40):
    pilot = load_pilot(EXAMPLES / "invoice-fields")
    rows = [json.loads(line) for line in (pilot.dir / "data" / "invoices.jsonl").open()][:n]
    return pilot.spec.task, rows


def test_only_a_task_with_fields_has_a_grammar():
    assert gbnf_of(load_pilot(EXAMPLES / "ticket-triage").spec.task) is None
    assert json_schema_of(load_pilot(EXAMPLES / "ticket-triage").spec.task) is None
    task, _ = _invoices(1)
    g = gbnf_of(task)
    assert g.startswith('root ::= "{\\"vendor\\": " string ')
    assert '", \\"due_date\\": " (date | "null")' in g  # optional: nullable
    assert "line-items-item ::= " in g


def test_the_schema_accepts_the_gold_targets_and_refuses_a_wrong_type():
    import jsonschema

    task, rows = _invoices()
    schema = json_schema_of(task)
    jsonschema.Draft202012Validator.check_schema(schema)
    v = jsonschema.Draft202012Validator(schema)
    for r in rows:
        target = json.loads(answer_text(task, None, r["target"]))
        assert not list(v.iter_errors(target)), r["id"]
    bad = json.loads(answer_text(task, None, rows[0]["target"])) | {"total": "12.50"}
    assert list(v.iter_errors(bad))


@pytest.fixture(scope="module")
def llama_vocab(default_model_dir):
    need_llama_cpp()
    from llama_cpp import Llama
    from transformers import AutoTokenizer

    from lorapilot.base.models import original_gguf

    gguf, _ = original_gguf(default_model_dir)
    llm = Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    return llm, AutoTokenizer.from_pretrained(default_model_dir)


def _walk(llm, grammar: bytes, ids: list[int]) -> tuple[int | None, bool]:
    """(the first token llama.cpp's sampler refuses, or None; whether it may end after all)."""
    held = GrammarSampler(llm, grammar)
    try:
        for i, t in enumerate(ids):  # `allows` is `mask` for one token (tested below)
            if not held.allows(t):
                return i, False
            held.accept(t)
        allowed = np.flatnonzero(np.isfinite(held.mask(np.zeros(llm.n_vocab()))))
        return None, any(held.ends(int(t)) for t in allowed)
    finally:
        held.close()


def test_every_gold_answer_passes_llama_cpps_sampler_and_may_end(llama_vocab):
    llm, tok = llama_vocab
    task, rows = _invoices()
    grammar = gbnf_of(task).encode()
    with_items = 0
    for r in rows:
        text = answer_text(task, None, r["target"])
        with_items += '"line_items": [' in text
        refused, ends = _walk(llm, grammar, tok(text, add_special_tokens=False).input_ids)
        assert refused is None and ends, (r["id"], text)
    assert with_items >= 5  # nested lists of objects among them


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda t: t | {"date": t["date"].replace("-", "/")}, "a date not YYYY-MM-DD"),
        (lambda t: t | {"vendor": None}, "null for a required field"),
        (lambda t: {k: v for k, v in t.items() if k != "currency"}, "a missing key"),
        (lambda t: t | {"total": str(t["total"])}, "a number written as a string"),
    ],
)
def test_a_wrong_answer_is_refused_on_its_way(llama_vocab, change, why):
    llm, tok = llama_vocab
    task, rows = _invoices(1)
    target = json.loads(answer_text(task, None, rows[0]["target"]))
    text = json.dumps(change(target), ensure_ascii=False, separators=(", ", ": "))
    refused, _ = _walk(llm, gbnf_of(task).encode(), tok(text, add_special_tokens=False).input_ids)
    assert refused is not None, why
    spaced = answer_text(task, None, rows[0]["target"]).replace(": ", ":  ", 1)
    assert _walk(llm, gbnf_of(task).encode(), tok(spaced, add_special_tokens=False).input_ids)[0]


def test_nested_types_enums_maps_and_escapes_parse_in_llama_cpp(llama_vocab):
    llm, tok = llama_vocab
    task = spec_from_dict(
        {
            "name": "t",
            "hypothesis": "h",
            "task": {
                "kind": "extraction",
                "fields": [
                    {"name": 'say "hi"', "type": "string", "enum": ["a\\b", "Réclamation ✓"]},
                    {"name": "slots", "type": "map", "values": "string | list"},
                    {"name": "tags", "type": "list", "required": False},
                    {"name": "ok", "type": "boolean"},
                    {"name": "n", "type": "integer", "required": False},
                    {
                        "name": "prénom",  # a rule name is ASCII: pr-nom
                        "type": "object",
                        "fields": [{"name": "x", "type": "number"}],
                    },
                ],
            },
            "data": {"file": "d.jsonl"},
        }
    ).task
    grammar = gbnf_of(task).encode()
    good = {'say "hi"': "Réclamation ✓", "slots": {"a": "x", "b": ["y", "z"]},
            "tags": [1, "two", {"3": None}], "ok": True, "n": None,
            "prénom": {"x": -1.5e-05}}  # fmt: skip
    text = json.dumps(good, ensure_ascii=False, separators=(", ", ": "))
    assert _walk(llm, grammar, tok(text, add_special_tokens=False).input_ids) == (None, True)
    bad = json.dumps(good | {'say "hi"': "other"}, ensure_ascii=False, separators=(", ", ": "))
    assert _walk(llm, grammar, tok(bad, add_special_tokens=False).input_ids)[0] is not None


def test_one_token_checked_is_the_whole_vocabulary_masked(llama_vocab):
    """`Runtime.generate` asks the grammar about its likeliest token first and masks the
    vocabulary only when it is refused: `allows` must say what `mask` leaves, token by token."""
    llm, tok = llama_vocab
    task, rows = _invoices(1)
    ids = tok(answer_text(task, None, rows[0]["target"]), add_special_tokens=False).input_ids
    for k in (0, 3, len(ids)):  # the start, inside the first string, the complete answer
        held = GrammarSampler(llm, gbnf_of(task).encode())
        try:
            for t in ids[:k]:
                held.accept(t)
            masked = np.isfinite(held.mask(np.zeros(llm.n_vocab())))
            some = np.r_[np.flatnonzero(masked)[:300], np.flatnonzero(~masked)[:300]]
            assert [held.allows(int(t)) for t in some] == masked[some].tolist(), k
        finally:
            held.close()


def _trained_tiny(tmp_path, tiny_model_dir, example: str, eval_: dict, val: float, task=None):
    """A copy of an example on the tiny model, its split's val share `val`, trained 2 steps
    (`task`: the spec's task replaced)."""
    import shutil

    import yaml
    from conftest import run_json

    need_llama_cpp()
    pilot = tmp_path / example
    shutil.copytree(EXAMPLES / example, pilot, ignore=shutil.ignore_patterns("runs"))
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["model"] = {"base": str(tiny_model_dir)}
    spec["train"].update(max_steps=2, precision="fp32", threads=1)
    spec["eval"] = eval_
    spec["data"]["split"].update(val=val)
    spec["task"] = task or spec["task"]
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    run_json("train", str(pilot), "--no-progress")
    return pilot


def test_export_gguf_of_an_extraction_writes_and_decodes_fields_gbnf(tmp_path, tiny_model_dir):
    """End to end on a tiny model: `export --gguf` of an invoice-fields adapter writes
    fields.gbnf and schema.json (hashed in the manifest), decodes every validation prompt under
    the grammar in llama.cpp, scores those answers and names them in the README; reported, the
    gate stays the free answers'. `--check` decodes them again."""
    from conftest import run_cli

    eval_ = {"mode": "generate", "precision": "fp32", "max_new_tokens": 24}  # seconds
    pilot = _trained_tiny(tmp_path, tiny_model_dir, "invoice-fields", eval_, val=0.02)
    out_dir = tmp_path / "served"
    proc = run_cli("export", str(pilot), "--gguf", "--out", str(out_dir), "--json")
    assert proc.returncode in (0, 1), proc.stderr
    out = json.loads(proc.stdout)
    # the converted base written tensor by tensor, shown as a phase (an 8B base takes minutes)
    assert "writing base.gguf: 20/20 (100%)" in proc.stderr, proc.stderr
    assert {"fields.gbnf", "schema.json"} <= set(out["files"])
    assert (out_dir / "fields.gbnf").read_text() == gbnf_of(load_pilot(pilot).spec.task)
    manifest = json.loads((out_dir / "lorapilot.json").read_text())
    assert manifest["grammar"] == {"file": "fields.gbnf"}
    assert manifest["schema"] == {"file": "schema.json"}
    assert out["grammar_file"] == "fields.gbnf"
    (conf,) = out["configs"]
    held = conf["constrained"]
    assert held["n"] == out["n_examples"] > 0 and held["seconds"] is not None
    assert set(held["metrics"]) >= {"json_valid_rate", "leaf_f1"}
    assert out["constrained_agreement"] == held["agreement"]
    assert out["constrained_label_rate"] is None
    readme = (out_dir / "README.md").read_text()
    assert "## Constrained to the fields" in readme
    # and under schema.json as llama-cpp-python's server converts a response_format schema
    by_schema = conf["schema_constrained"]
    assert by_schema["file"] == "schema.json" and by_schema["n"] == held["n"]
    assert "json_schema_to_gbnf" in by_schema["what"] and by_schema["seconds"] is not None
    assert out["schema_constrained_agreement"] == by_schema["agreement"]
    assert "`schema.json` as llama-cpp-python's `json_schema_to_gbnf` converts it" in readme
    assert not [w for w in out["warnings"] if "schema.json" in w]
    # checked again: the same figures, shown to a person whether the check passes or fails
    # (the tiny model may fail it)
    shown = " ".join(run_cli("export", str(pilot), "--check", str(out_dir)).stdout.split())
    for what, h in (("fields.gbnf (llama.cpp's grammar sampler)", held),
                    ("schema.json (llama-cpp-python's converter, as its server's "
                     "response_format)", by_schema)):  # fmt: skip
        assert f"constrained by {what}: {h['n_same']} of {h['n']} lorapilot's answer" in shown


def test_a_task_given_by_its_json_schema_is_decoded_under_schema_json(tmp_path, tiny_model_dir):
    """A format task given by its `task.json_schema` gets no fields.gbnf (its answers keep
    the data's key order) but its schema.json, decoded as llama-cpp-python's server converts
    it, and said in the README."""
    from conftest import run_cli

    spec = load_pilot(EXAMPLES / "invoice-fields").spec
    task = {"kind": "format", "json_schema": json_schema_of(spec.task),
            "system": "Return the invoice as JSON.", "template": spec.task.template}  # fmt: skip
    eval_ = {"mode": "generate", "precision": "fp32", "max_new_tokens": 24}
    pilot = _trained_tiny(tmp_path, tiny_model_dir, "invoice-fields", eval_, 0.02, task)
    proc = run_cli("export", str(pilot), "--gguf", "--out", str(tmp_path / "g"), "--json")
    assert proc.returncode in (0, 1), proc.stderr
    out = json.loads(proc.stdout)
    assert "schema.json" in out["files"] and "fields.gbnf" not in out["files"]
    (conf,) = out["configs"]
    assert "constrained" not in conf and conf["schema_constrained"]["n"] == out["n_examples"]
    readme = (tmp_path / "g" / "README.md").read_text()
    assert "## Constrained to the schema" in readme and "json_schema_to_gbnf" in readme


def test_a_generated_classification_is_decoded_under_labels_gbnf(tmp_path, tiny_model_dir):
    """ticket-triage evaluated by generation (eval.mode: generate) on a tiny model: the export
    writes labels.gbnf, no schema, and the check scores the answers decoded under it."""
    from conftest import run_cli

    eval_ = {"mode": "generate", "precision": "fp32", "max_new_tokens": 6}
    pilot = _trained_tiny(tmp_path, tiny_model_dir, "ticket-triage", eval_, val=0.03)
    proc = run_cli("export", str(pilot), "--gguf", "--out", str(tmp_path / "g"), "--json")
    assert proc.returncode in (0, 1), proc.stderr
    out = json.loads(proc.stdout)
    assert "labels.gbnf" in out["files"] and "schema.json" not in out["files"]
    (conf,) = out["configs"]
    held = conf["constrained"]
    assert held["file"] == "labels.gbnf" and held["n"] == out["n_examples"] > 0
    labels = set(load_pilot(pilot).spec.task.labels)
    # an answer decoded under the grammar is a label, or one cut short by max_new_tokens
    assert held["differing"] and all(
        any(lab.startswith(d["raw"]) for lab in labels) for d in held["differing"]
    )
    assert {"accuracy", "macro_f1"} <= set(held["metrics"])


def test_the_schema_as_llama_cpp_pythons_server_converts_it_holds_the_gold_answers(llama_vocab):
    """schema.json through llama-cpp-python's own converter (what its server runs for a
    `response_format` schema): every gold invoice answer, in the layout trained on, passes
    llama.cpp's sampler and may end (the converter puts required keys first: every key of an
    answer is required, as the adapter writes them all, so it keeps the spec's order); a date
    not YYYY-MM-DD and an intent outside its enum are refused."""
    from lorapilot.export.serving import schema_grammar

    llm, tok = llama_vocab
    task, rows = _invoices()
    schema = json_schema_of(task)
    assert schema["required"] == list(schema["properties"])  # optional ones nullable
    assert target_schema(task)["required"] == ["vendor", "invoice_number", "date", "total",
                                                "currency"]  # fmt: skip
    grammar = schema_grammar(json.dumps(schema))
    for r in rows:
        text = answer_text(task, None, r["target"])
        refused, ends = _walk(llm, grammar, tok(text, add_special_tokens=False).input_ids)
        assert refused is None and ends, (r["id"], text)
    slashed = answer_text(task, None, rows[0]["target"])
    day = rows[0]["target"]["date"]
    slashed = slashed.replace(day, day.replace("-", "/"))
    assert _walk(llm, grammar, tok(slashed, add_special_tokens=False).input_ids)[0] is not None
    snips = spec_from_dict({
        "name": "s", "hypothesis": "h", "model": {"base": "x"}, "data": {"file": "d.jsonl"},
        "task": {"kind": "extraction", "fields": [
            {"name": "intent", "enum": ["PlayMusic", "GetWeather"]},
            {"name": "slots", "type": "map", "values": "string | list"}]},
    }).task  # fmt: skip
    grammar = schema_grammar(json.dumps(json_schema_of(snips)))
    for text, ok in (
        ('{"intent": "PlayMusic", "slots": {"artist": ["adele", "sia"]}}', True),
        ('{"intent": "PutMusic", "slots": {}}', False),
    ):
        refused, ends = _walk(llm, grammar, tok(text, add_special_tokens=False).input_ids)
        assert (refused is None and ends) == ok, text
    with pytest.raises(ValueError, match="Error resolving ref"):
        schema_grammar(json.dumps({"$ref": "#/definitions/missing"}))
