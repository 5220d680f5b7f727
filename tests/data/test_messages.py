"""data.fields.messages: chat fine-tuning data (OpenAI's and TRL's `messages` rows) read as
the input (the last user turn, after the conversation's earlier turns) and the answer (the
last assistant turn); a system turn counted against task.system, never used silently; every
other shape an invalid row, named."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from conftest import init_tiny_pilot, run_cli, run_json
from pydantic import ValidationError

from lorapilot.data.load import load_records
from lorapilot.spec import DataSpec, FieldMap, TaskSpec

CLF = TaskSpec(kind="classification", labels=["billing", "technical"])
SYSTEM = "Route the ticket."


def conv(user, answer=None, system=SYSTEM):
    turns = [{"role": "system", "content": system}] if system is not None else []
    turns.append({"role": "user", "content": user})
    if answer is not None:
        turns.append({"role": "assistant", "content": answer})
    return {"messages": turns}


def data(file: str = "d.jsonl", **kw) -> DataSpec:
    return DataSpec(file=file, fields=FieldMap(messages="messages", id=None), **kw)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_turns_become_input_answer_and_system_and_bad_shapes_are_named(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [
        conv("I was charged twice", "billing"),
        conv("The app crashes", "technical", system=None),  # no system turn: fine
        {"messages": [{"role": "developer", "content": "x"}, *conv("Refund?", "billing",
                                                                    system=None)["messages"]]},
        conv("Hello", None),  # no answer to learn
        {"messages": [*conv("a", "billing")["messages"], {"role": "user", "content": "b"},
                      {"role": "assistant", "content": "technical"}]},  # two exchanges
        {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                      {"role": "assistant", "content": "billing"}]},  # two user turns
        {"messages": [{"role": "assistant", "content": "Hi!"}, *conv("a", "billing",
                                                                    system=None)["messages"]]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Card "},
                                                   {"type": "text", "text": "declined"}]},
                      {"role": "assistant", "content": "billing"}]},  # text parts: joined
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]},
                      {"role": "assistant", "content": "billing"}]},  # an image part
        {"messages": [{"role": "user", "content": 7},
                      {"role": "assistant", "content": "billing"}]},
        {"messages": "not a list"},
        {"messages": {"role": "user", "content": "one turn, not a list"}},
        {"messages": [{"content": "no role"}]},
        conv("Where is my parcel", "shipping"),  # not a task label
        {"text": "no conversation", "label": "billing"},
    ])  # fmt: skip
    records, skipped = load_records(path, CLF, data(on_error="skip"))
    assert [(r.text, r.label, r.system, r.context) for r in records] == [
        ("I was charged twice", "billing", SYSTEM, ()),
        ("The app crashes", "technical", None, ()),
        ("Refund?", "billing", "x", ()),
        ("b", "technical", SYSTEM, (("user", "a"), ("assistant", "billing"))),
        ("Card declined", "billing", None, ()),
    ]
    problems = [s.problem for s in skipped]
    assert problems == [
        "field 'messages' ends with a user turn: no assistant turn to learn",
        "field 'messages' has the turns user, user, assistant: a pilot reads user and "
        "assistant turns in turn, from a user turn (an optional system turn first); turn 1 is "
        "'user'",
        "field 'messages' has the turns assistant, user, assistant: a pilot reads user and "
        "assistant turns in turn, from a user turn (an optional system turn first); turn 0 is "
        "'assistant'",
        "turn 0 of 'messages' (user): a content part of type 'image_url' is not read (text "
        "parts only)",
        "turn 0 of 'messages' (user): content must be a string or a list of text parts, got number",
        "field 'messages' is not valid JSON: Expecting value (column 1)",  # text: read as JSON
        "field 'messages' must be a list of {role, content} turns, got object",
        "turn 0 of 'messages' is not a {role, content} object",
        "label 'shipping' is not one of the task labels (billing, technical); to leave such "
        "examples out, counted per label, set data.unlisted_labels: drop",
        "missing field 'messages'",
    ]


def test_csv_cells_extraction_targets_and_label_sets(tmp_path):
    path = tmp_path / "d.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["messages"])
        w.writerow([json.dumps(conv("Invoice 12 from ACME", '{"vendor": "ACME"}')["messages"])])
        w.writerow([json.dumps(conv("Invoice 13", "not json")["messages"])])
        w.writerow(["[{broken"])
    ext = TaskSpec(kind="extraction", fields=[{"name": "vendor"}])
    records, skipped = load_records(path, ext, data(on_error="skip", file="d.csv"))
    assert [(r.text, r.target) for r in records] == [("Invoice 12 from ACME", {"vendor": "ACME"})]
    assert skipped[0].problem.startswith(
        "field 'messages (assistant turn)' is not valid JSON: Expecting value"
    )
    assert skipped[1].problem.startswith("field 'messages' is not valid JSON")
    multi = TaskSpec(kind="multi_label_classification", labels=["anger", "joy", "fear"])
    path = write_jsonl(tmp_path / "m.jsonl", [conv("Ugh, yay", "joy, anger")])
    (rec,), _ = load_records(path, multi, data())
    assert rec.target == ["anger", "joy"]


def test_messages_with_text_or_an_image_pilot_are_refused():
    with pytest.raises(ValidationError, match="set it or label, text, not both"):
        FieldMap(messages="messages", text="body", label="y")
    with pytest.raises(ValidationError, match="data.fields.messages reads chat conversations"):
        from lorapilot.spec import PilotSpec

        photos = Path(__file__).parents[2] / "examples" / "clothing-photos" / "pilot.yaml"
        spec = yaml.safe_load(photos.read_text())
        spec["data"]["fields"] = {"messages": "messages"}
        PilotSpec.model_validate(spec)


@pytest.fixture(scope="module")
def chat_pilot(tmp_path_factory, tiny_model_dir):
    """`init`'s pilot with its examples written as chat fine-tuning rows, with a system turn
    of their own (not the spec's task.system)."""
    pilot = init_tiny_pilot(tmp_path_factory.mktemp("chat"), tiny_model_dir, max_steps=2)
    rows = [json.loads(x) for x in (pilot / "data" / "examples.jsonl").read_text().splitlines()]
    write_jsonl(pilot / "data" / "chat.jsonl",
                [conv(r["text"], r["label"], system="Label it.") for r in rows])  # fmt: skip
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["data"]["file"] = "data/chat.jsonl"
    spec["data"]["fields"] = {"messages": "messages", "id": None}
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return pilot, rows, spec


def test_the_data_verb_counts_system_turns_other_than_task_system(chat_pilot, tmp_path):
    pilot, rows, spec = chat_pilot
    out = run_json("data", str(pilot))
    conv_report = out["messages"]
    assert conv_report["with_system"] == conv_report["system_differs"] == len(rows)
    assert conv_report["system_texts"] == [{"text": "Label it.", "n": len(rows)}]
    assert f"{len(rows)} of {len(rows)} conversation(s) in 'messages'" in out["warnings"][0]
    shown = run_json("inspect", str(pilot))["examples"][0]["rendered"]
    assert spec["task"]["system"].split("{")[0] in shown and "Label it." not in shown
    text = run_cli("data", str(pilot)).stdout
    assert "conversations in 'messages': the last user turn is the input" in text
    report = run_json("report", str(pilot))  # a limitation of whatever is decided
    said = " ".join(Path(report["markdown"]).read_text().split())
    assert f"{len(rows)} of {len(rows)} conversations in the data carry a system turn" in said


def test_predict_reads_conversations_or_plain_columns(chat_pilot, tmp_path):
    pilot, rows, _ = chat_pilot
    run_json("train", str(pilot))
    asks = write_jsonl(tmp_path / "asks.jsonl", [conv(r["text"]) for r in rows[:3]])
    out = run_json("predict", str(pilot), "--input", str(asks))
    assert out["n"] == 3
    plain = write_jsonl(tmp_path / "plain.jsonl", [{"body": r["text"], "y": r["label"]}
                                                    for r in rows[:3]])  # fmt: skip
    out = run_json("predict", str(pilot), "--input", str(plain), "--field", "body",
                   "--answer-field", "y")  # fmt: skip
    assert out["n"] == 3 and out["metrics"]["n"] == 3
    proc = run_cli("predict", str(pilot), "--input", str(plain), "--answer-field", "y")
    assert proc.returncode == 2 and "give --field NAME for its input too" in proc.stderr


def test_parquet_and_saved_hf_datasets_hold_conversations_as_lists_of_structs(tmp_path):
    """TRL's datasets (and Parquet files written from them) store `messages` as a list of
    {role, content} structs, not as text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [conv("I was charged twice", "billing"), conv("It crashes", "technical")]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    records, _ = load_records(tmp_path / "d.parquet", CLF, data(file="d.parquet"))
    assert [(r.text, r.label, r.system) for r in records] == [
        ("I was charged twice", "billing", SYSTEM), ("It crashes", "technical", SYSTEM)
    ]  # fmt: skip
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    records, _ = load_records(tmp_path / "ds", CLF, data(file="ds"), display_path="ds")
    assert [r.label for r in records] == ["billing", "technical"]


@pytest.fixture(scope="module")
def dialog_pilot(tmp_path_factory, tiny_model_dir):
    """`init`'s pilot as conversations of two exchanges: each example's ticket follows the
    one before it and its label, the earlier exchange in the prompt, the last one judged."""
    pilot = init_tiny_pilot(tmp_path_factory.mktemp("dialog"), tiny_model_dir, max_steps=2)
    rows = [json.loads(x) for x in (pilot / "data" / "examples.jsonl").read_text().splitlines()]
    convs = [conv(rows[0]["text"], rows[0]["label"], system=None)]
    for before, r in zip(rows, rows[1:], strict=False):
        turns = conv(before["text"], before["label"], system=None)["messages"]
        convs.append({"messages": turns + conv(r["text"], r["label"], system=None)["messages"]})
    write_jsonl(pilot / "data" / "dialog.jsonl", convs)
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["data"]["file"] = "data/dialog.jsonl"
    spec["data"]["fields"] = {"messages": "messages", "id": None}
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return pilot, rows


def test_conversations_with_earlier_turns_are_prepared_trained_and_predicted(
    dialog_pilot, tmp_path
):
    pilot, rows = dialog_pilot
    out = run_json("data", str(pilot))
    assert out["messages"]["with_earlier_turns"] == len(rows) - 1
    assert out["messages"]["most_earlier_turns"] == 2
    assert out["mask_audit"]["ok"] and out["mask_audit"]["eval_prompt_is_train_prefix"]
    text = run_cli("data", str(pilot)).stdout
    assert f"{len(rows) - 1} conversation(s) have earlier turns (up to 2)" in text
    shown = run_json("inspect", str(pilot))["examples"]
    one = next(e for e in shown if e["id"] != "dialog-1")  # dialog-N: line N's conversation
    line = int(one["id"].split("-")[1])
    before, this = rows[line - 2], rows[line - 1]
    rendered = one["rendered"]
    assert rendered.index(before["text"]) < rendered.index(f"\n{before['label']}<")
    assert rendered.index(f"\n{before['label']}<") < rendered.index(this["text"])
    assert one["decoded_target"].startswith(this["label"])  # the last answer alone
    assert all(e["match"] for e in shown)
    run_json("train", str(pilot))
    ask = conv(rows[3]["text"], system=None)["messages"]
    asks = write_jsonl(tmp_path / "asks.jsonl", [
        {"messages": conv(rows[2]["text"], rows[2]["label"], system=None)["messages"] + ask},
        {"messages": ask},
    ])  # fmt: skip
    predicted = run_json("predict", str(pilot), "--input", str(asks))
    assert predicted["n"] == 2
    report = run_json("report", str(pilot))
    said = " ".join(Path(report["markdown"]).read_text().split())
    assert f"Conversations: {len(rows) - 1} of {len(rows)} have earlier turns (up to 2)" in said


def test_the_same_last_turn_after_other_turns_is_another_input(tmp_path):
    """Duplicates, the inputs' overlap with the splits and grounding compare whole
    conversations: "yes" after two different questions is not one input twice."""
    from lorapilot.data.dedup import DupItem, find_duplicates
    from lorapilot.data.rows import conversation_text

    yes = [{"role": "user", "content": "yes please"}, {"role": "assistant", "content": "billing"}]
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"messages": [*conv("Refund my order?", "billing", system=None)["messages"], *yes]},
        {"messages": [*conv("Reset my router?", "technical", system=None)["messages"], *yes]},
        {"messages": [*conv("Refund my order?", "billing", system=None)["messages"], *yes]},
    ])  # fmt: skip
    records, _ = load_records(path, CLF, data())
    assert {r.text for r in records} == {"yes please"}
    assert conversation_text(records[0]) == (
        "user: Refund my order?\nassistant: billing\nuser: yes please"
    )
    report = find_duplicates([DupItem(r.id, "all", conversation_text(r)) for r in records])
    assert [(p.a_id, p.b_id) for p in report.exact] == [(records[0].id, records[2].id)]


def test_sharegpt_rows_are_read_as_conversations(tmp_path):
    """FastChat's and axolotl's ShareGPT rows: `{"from": "human" | "gpt" | "system",
    "value": ...}`; another speaker keeps its name and is refused where it stands."""

    def said(*turns):
        return {"conversations": [{"from": f, "value": v} for f, v in turns]}

    path = write_jsonl(tmp_path / "d.jsonl", [
        said(("system", SYSTEM), ("human", "Hi"), ("gpt", "Yes?"), ("human", "Refund?"),
             ("gpt", "billing")),
        said(("human", "Call the API"), ("function_call", "{}"), ("gpt", "technical")),
    ])  # fmt: skip
    data = DataSpec(file="d.jsonl", fields=FieldMap(messages="conversations", id=None),
                    on_error="skip")  # fmt: skip
    (rec,), skipped = load_records(path, CLF, data)
    assert (rec.text, rec.label, rec.system) == ("Refund?", "billing", SYSTEM)
    assert rec.context == (("user", "Hi"), ("assistant", "Yes?"))
    assert "the turns user, function_call, assistant" in skipped[0].problem
