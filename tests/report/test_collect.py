"""`compare` rows: a result measured with another evaluation protocol is not compared with the
baseline, and the reason names the protocol keys that differ."""

from __future__ import annotations

import json
import shutil

from conftest import EXAMPLES

from lorapilot.records import registry
from lorapilot.report.collect import run_summary
from lorapilot.spec import load_pilot

PROTOCOL = {"mode": "score", "batch_size": 32, "precision": "bf16", "eval_protocol": "ep-aaaa"}


def _record(pilot_dir, kind, protocol, *, in_record=True):
    with registry.open_run(pilot_dir, kind, config={"name": "t"}) as run:
        run.record.data_version = "dv-1"
        result = {
            "split": "val",
            "metrics": {"accuracy": 0.5},
            "eval_protocol": protocol["eval_protocol"],
        }
        if in_record:
            result["protocol"] = protocol
        else:  # older records: the protocol only in protocol.json
            (run.dir / "protocol.json").write_text(json.dumps(protocol))
        run.update(**result)
    return registry.get_run(pilot_dir, run.id)


def test_not_comparable_reason_names_the_protocol_keys(tmp_path):
    pilot_dir = tmp_path / "tt"
    shutil.copytree(
        EXAMPLES / "ticket-triage",
        pilot_dir,
        ignore=shutil.ignore_patterns("runs", "report", "deliverable"),
    )
    pilot = load_pilot(pilot_dir)
    base = _record(pilot_dir, "baseline", PROTOCOL, in_record=False)
    other = _record(pilot_dir, "train", {**PROTOCOL, "batch_size": 8, "eval_protocol": "ep-bbbb"})
    row = run_summary(pilot, other, base)
    assert row["comparable"] is False and "deltas" not in row
    assert (
        row["not_comparable_reason"]
        == "evaluation protocols differ (ep-aaaa vs ep-bbbb): batch_size (32 vs 8)"
    )
    same = _record(pilot_dir, "train", PROTOCOL)
    assert run_summary(pilot, same, base)["comparable"] is True


def test_a_near_constant_baseline_is_named_as_a_limitation():
    """#35 item 6 (the warning): a zero-shot baseline that puts more than half of the
    examples in one class is a weak starting point, and the report says so with the numbers."""
    from lorapilot.report.limitations import degenerate_baseline

    rows = [{"parsed": "Refund_not_showing_up"}] * 149 + [{"parsed": "card_arrival"}] * 5
    [line] = degenerate_baseline(rows)
    assert "'Refund_not_showing_up' for 149 of 154" in line and "(97%)" in line
    balanced = [{"parsed": lab} for lab in ("a", "b", "c")] * 10
    assert degenerate_baseline(balanced) == [] and degenerate_baseline(None) == []
    assert (
        degenerate_baseline([{"parsed": "a"}] * 5 + [{"parsed": "b"}] * 5) == []
    )  # half: not more


SLOT_SPEC = """
name: slots
hypothesis: an adapter fills the intent and its slots better than zero-shot
task:
  kind: extraction
  grounded: true
  fields:
    - {name: intent, type: string, enum: [book, play]}
    - {name: slots, type: map, values: string}
model: {base: smollm2-135m-instruct}
data: {source: test, permission: test, file: data.jsonl, fields: {text: text, target: target}}
eval: {mode: generate, min_support: 20}
success: {metric: leaf_f1, min_gain: 0.1}
guards:
  - {metric: ungrounded_value_rate, max: 0.02}
"""


def test_a_guard_on_fewer_values_than_min_support_is_not_a_no_go(tmp_path):
    """#35 acceptance: the grounding guard misses on 1 invented value of the 15 the adapter
    predicted, under eval.min_support 20: the decision is not NO-GO on that guard alone, and
    the report shows the support."""
    from lorapilot.evaluate.structured import extraction_metrics
    from lorapilot.report.collect import collect
    from lorapilot.report.render import render_markdown

    (tmp_path / "pilot.yaml").write_text(SLOT_SPEC)
    (tmp_path / "data.jsonl").write_text('{"text": "x", "target": {"intent": "book"}}\n')
    pilot = load_pilot(tmp_path)
    task, norm = pilot.spec.task, pilot.spec.eval.normalize
    texts = [f"book a table in city{i} for friday" for i in range(40)]
    golds = [{"intent": "book", "slots": {"city": f"city{i}"}} if i < 14 else
             {"intent": "play", "slots": {}} for i in range(40)]  # fmt: skip
    base_out = ['{"intent": "play", "slots": {}}'] * 40
    cand_out = [json.dumps(g) for g in golds]
    cand_out[14] = '{"intent": "play", "slots": {"artist": "nobody said"}}'  # the invented one

    def record(kind, outputs):
        m = extraction_metrics(golds, outputs, task, norm, texts=texts, categories=["all"] * 40)
        with registry.open_run(tmp_path, kind, config={"name": "t"}) as run:
            rows = [
                {"id": f"e{i}", "gold": g, "raw_output": o, "text": t, "category": "all",
                 "parsed": p, "correct": c}
                for i, (g, o, t, p, c) in enumerate(
                    zip(golds, outputs, texts, m.pop("parsed"), m.pop("correct"), strict=True)
                )
            ]  # fmt: skip
            (run.dir / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            m.pop("parse_errors")
            run.update(split="val", metrics=m, eval_protocol="ep-1", protocol=PROTOCOL)
            run.record.data_version = "dv-1"
        return m

    record("baseline", base_out)
    cand = record("train", cand_out)
    assert cand["grounding_checked"] == 15 and cand["ungrounded_value_rate"] == 1 / 15
    state = collect(pilot)
    decision = state["decision"]
    assert decision["decision"] != "NO-GO"
    (guard,) = decision["guards"]
    assert guard["status"] == "insufficient_data"
    assert (guard["support"], guard["support_of"]) == (15, "values checked")
    assert guard["ci_low"] is not None and guard["ci_low"] <= guard["candidate"] <= guard["ci_high"]
    assert any("insufficient data: ungrounded_value_rate" in r for r in decision["reasons"])
    page = render_markdown(state)
    row = next(line for line in page.splitlines() if "| guard | ungrounded_value_rate |" in line)
    assert "| 15 values checked |" in row and "insufficient_data" in row


def test_probes_are_kept_per_variant_with_their_quantization(tmp_path):
    """#35 item 9: the latest completed probe of each variant, named with its quantization."""
    from lorapilot.report.collect import probes_by_variant, quantization_text

    spec = {"model": {"base": "b", "quantization": None}}
    for variant, quant, step in (("base", None, 1.0), ("nf4", {"bits": 4, "type": "nf4"}, 2.0),
                                 ("base", None, 3.0)):  # fmt: skip
        config = {**spec, "model": {"base": "b", "quantization": quant}}
        with registry.open_run(tmp_path, "probe", config=config) as run:
            m = {"length": "typical", "ok": True, "later_step_s": step, "peak_memory_bytes": 7}
            run.update(variant=variant, measurements=[m])
    with registry.open_run(tmp_path, "probe", config=spec) as run:
        run.update(variant="base")
        run.fail_check("interrupted on purpose")  # a failed probe is not the latest
    got = {p["variant"]: p for p in probes_by_variant(registry.list_runs(tmp_path))}
    assert got["base"]["later_step_s"] == 3.0 and got["base"]["quantization"] == "none"
    assert got["nf4"]["later_step_s"] == 2.0 and got["nf4"]["quantization"] == "4-bit nf4"
    assert quantization_text({"bits": 8}) == "8-bit"


def test_an_exports_warning_is_a_limitation_of_the_deliverable():
    from lorapilot.report.limitations import export_warnings

    gguf = {
        "format": "gguf",
        "folder": "deliverable/gguf",
        "serving_check": {"warnings": ["base+adapter: served as the Modelfile serves it"]},
    }
    assert export_warnings([{"format": "merged", "folder": "deliverable/merged"}, gguf]) == [
        "the gguf export in deliverable/gguf: base+adapter: served as the Modelfile serves it"
    ]  # fmt: skip
    assert export_warnings([{"format": "gguf", "serving_check": {"warnings": []}}]) == []


def test_a_chosen_adapter_that_generates_other_labels_is_a_limitation():
    from lorapilot.report.limitations import generation_warnings

    g = {"agreement": 0.675, "label_rate": 0.896, "n": 154, "n_same": 104, "n_labels": 138,
         "not_labels": [["open_account", 3]],
         "metrics": {"macro_f1": {"scored": 0.321, "generated": 0.297}}}  # fmt: skip
    (line,) = generation_warnings({"id": "t9", "generation": g})
    assert line.startswith("the chosen adapter (train run t9): served by a runtime that generates")
    assert "104 of 154" in line and "16 are no label at all ('open_account' x3)" in line
    assert "Constrained" not in line and "constrained to the labels, " not in line
    assert generation_warnings({"id": "t9", "generation": {**g, "agreement": 0.99}}) == []
    # constrained decoding's figure is given, and offered as a way out when it agrees
    held = {"agreement": 0.987, "n": 154, "n_same": 152}
    (line,) = generation_warnings({"id": "t9", "generation": {**g, "constrained": held}})
    assert "(vLLM guided_choice, a TGI or llama.cpp grammar), 152 of 154 are (98.7%)" in line
    assert "serve what was decided, serve it constrained to the labels, serve it by" in line
    (line,) = generation_warnings(
        {"id": "t9", "generation": {**g, "constrained": {**held, "agreement": 0.9}}}
    )
    assert "152 of 154 are (90.0%)" in line and "constrained to the labels, " not in line
    assert generation_warnings({"id": "t9"}) == [] and generation_warnings(None) == []


def test_a_multi_label_adapter_that_never_names_two_labels_is_a_limitation():
    from lorapilot.report.limitations import label_set_warnings

    rows = [{"gold": ["joy"], "parsed": ["joy"]}, {"gold": ["joy", "anger"], "parsed": ["joy"]},
            {"gold": ["fear"], "parsed": None}]  # fmt: skip
    [line] = label_set_warnings(rows)
    assert "one label at most" in line and "1 of 3 have two or more" in line
    rows[0]["parsed"] = ["joy", "anger"]  # it names two somewhere: no warning
    assert label_set_warnings(rows) == []
    single = [{"gold": ["joy"], "parsed": ["joy"]}]  # no example has two: nothing to miss
    assert label_set_warnings(single) == []
