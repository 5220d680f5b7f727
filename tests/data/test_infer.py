"""data.infer: the input, the answer and the task a data file's rows suggest, each with its
reason, for `lorapilot init --from`."""

from __future__ import annotations

import json
import re

import pytest

from lorapilot.data.infer import fields_of, final_line_regex, infer, value_kind


def test_columns_by_name_make_a_classification_with_its_labels_and_ids():
    kinds = ["praise", "complaint", "question"]
    rows = [{"id": f"r{i}", "text": f"message {i}", "label": kinds[i % 3]} for i in range(30)]
    got = infer(rows)
    assert (got.task, got.text, got.answer, got.id) == ("classification", "text", "label", "id")
    assert got.labels == ["complaint", "praise", "question"]
    assert got.label_counts == {"complaint": 10, "praise": 10, "question": 10}
    assert "input: column 'text' (its name), answer: column 'label' (its name)" in got.reasons
    assert any(r.startswith("task: classification (column 'label'") for r in got.reasons)
    assert got.warnings == [] and got.n_rows == 30


def test_columns_named_otherwise_are_found_by_their_values():
    """The longest text is the input; a column of few repeated values the answer; an id-like
    name with a repeated value is no id."""
    rows = [{"uid": "x", "what": f"a long customer message number {i}", "kind": "ab"[i % 2],
             "note": f"n{i}"} for i in range(20)]  # fmt: skip
    got = infer(rows)
    assert (got.text, got.answer, got.id) == ("what", "kind", None)
    assert "input: column 'what' (the longest text), answer: column 'kind' (its values)" in (
        got.reasons
    )
    assert got.other_text_columns == ["note"]  # offered for a text_template


def test_lists_make_a_multi_label_task_from_jsonl_and_csv_cells():
    lists = [["joy"], ["anger", "joy"], ["fear"], ["joy", "fear"]] * 3
    as_lists = [{"text": f"t{i}", "emotions": e} for i, e in enumerate(lists)]
    as_cells = [{"text": f"t{i}", "emotions": json.dumps(e)} for i, e in enumerate(lists)]
    for rows in (as_lists, as_cells):
        got = infer(rows)
        assert got.task == "multi_label_classification" and got.answer == "emotions"
        assert got.labels == ["anger", "fear", "joy"]
        assert got.label_counts == {"joy": 9, "fear": 6, "anger": 3}


def test_objects_make_an_extraction_with_typed_nested_fields():
    targets = [
        {"vendor": "Acme", "date": "2024-01-02", "total": 12.5, "n": 1, "paid": True,
         "po": None, "items": [{"sku": "a", "qty": 2}], "meta": {"page": 1}},
        {"vendor": "Birch", "date": "2024-03-04", "total": 7, "n": 2, "paid": False,
         "items": [{"sku": "b"}], "meta": {"page": 2, "lang": "en"}},
    ]  # fmt: skip
    rows = [{"text": f"invoice {i}", "target": t} for i, t in enumerate(targets)]
    got = infer(rows)
    assert got.task == "extraction" and got.answer == "target"
    assert got.fields == fields_of(targets) == [
        {"name": "vendor", "type": "string", "required": True},
        {"name": "date", "type": "date", "required": True},
        {"name": "total", "type": "number", "required": True},
        {"name": "n", "type": "integer", "required": True},
        {"name": "paid", "type": "boolean", "required": True},
        {"name": "po", "type": "string", "required": False},
        {"name": "items", "type": "list", "required": True, "items": {"type": "object", "fields": [
            {"name": "sku", "type": "string", "required": True},
            {"name": "qty", "type": "integer", "required": False}]}},
        {"name": "meta", "type": "object", "required": True, "fields": [
            {"name": "page", "type": "integer", "required": True},
            {"name": "lang", "type": "string", "required": False}]},
    ]  # fmt: skip


def test_free_text_answers_make_a_format_task_and_a_shared_last_line_its_regex():
    worked = [f"{a} + {a} = {2 * a}\n#### {2 * a}" for a in range(40)]
    got = infer([{"question": f"q{i}", "answer": w} for i, w in enumerate(worked)])
    assert got.task == "format" and got.final_line == "#### "
    rx = re.compile(got.regex)
    assert all(rx.fullmatch(w).group("answer") == w.rsplit(" ", 1)[1] for w in worked)
    assert "regex: 40 of 40 answers end with a line '#### ' and a number" in got.reasons
    # no shared convention (or under 95% of the answers): no regex is guessed
    loose = worked[:30] + [f"free answer {i}" for i in range(10)]
    got = infer([{"question": f"q{i}", "answer": w} for i, w in enumerate(loose)])
    assert got.task == "format" and got.regex is None
    assert final_line_regex(["The answer (final) is 4.", "The answer (final) is 5"])[1] == (
        "The answer (final) is "
    )


def test_chat_rows_make_a_pilot_of_their_assistant_turns_and_system_turn():
    def chat(system, user, reply):
        turns = [{"role": "system", "content": system}] if system else []
        return {"messages": turns + [{"role": "user", "content": user},
                                     {"role": "assistant", "content": reply}]}  # fmt: skip

    rows = [chat("Name the intent.", f"query {i}", "ab"[i % 2]) for i in range(10)]
    rows += [chat("Other system.", "query x", "a"), chat(None, "query y", "b")]
    got = infer(rows)
    assert (got.messages, got.text, got.task) == ("messages", None, "classification")
    assert got.labels == ["a", "b"] and got.system == "Name the intent."
    assert "task.system: the data's own system turn (10 of 12 conversations)" in got.reasons
    assert any("2 different system turns" in w for w in got.warnings)
    assert value_kind(json.dumps(rows[0]["messages"])) == "messages"  # JSON text in a CSV cell


def test_conversations_answer_with_their_last_turn_and_origins_become_split_groups():
    def turns(*said):
        return [{"role": "user" if i % 2 == 0 else "assistant", "content": t}
                for i, t in enumerate(said)]  # fmt: skip

    rows = [{"dialogue_id": f"d{i // 2}", "customer_id": "c1", "shard": i % 3,
             "messages": turns("hi", "Yes?", f"a table for {i}", json.dumps({"party": str(i)}))}
            for i in range(24)]  # fmt: skip
    got = infer(rows)
    assert got.task == "extraction" and got.fields == [
        {"name": "party", "type": "string", "required": True}
    ]  # the last assistant turn, not the first
    assert got.most_turns == 3 and got.longest_inputs[0][:2] == (
        ("user", "hi"),
        ("assistant", "Yes?"),
    )
    assert re.fullmatch(r"a table for \d\d", got.longest_inputs[0][2][1])  # sized whole
    assert "conversations of up to 3 turns before the answer" in " ".join(got.reasons)
    # 12 dialogues of 2 rows: a group; one customer (a constant) and 3 shards are not
    assert got.group == "dialogue_id"
    assert "split.group: column 'dialogue_id' (12 values for 24 rows" in " ".join(got.reasons)
    few = infer([{**r, "dialogue_id": f"d{i % 5}"} for i, r in enumerate(rows)])
    assert few.group is None  # 5 values: a category, not origins
    unique = infer([{**r, "dialogue_id": f"d{i}"} for i, r in enumerate(rows)])
    assert unique.group is None and unique.id == "dialogue_id"
    coded = [{"text": f"message {i}", "label": "abcdefghijkl"[i % 12], "label_id": i % 12,
              "session": f"s{i // 3}"} for i in range(60)]  # fmt: skip
    assert infer(coded).group == "session"  # the answer's code is no origin


def test_a_column_of_image_paths_makes_an_image_classification():
    rows = [{"id": f"u{i}", "path": f"img/{i}.JPG", "kind": "ab"[i % 2], "shot_by": i % 3}
            for i in range(20)]  # fmt: skip
    got = infer(rows)
    assert (got.task, got.image, got.answer, got.id) == (
        "image_classification",
        "path",
        "kind",
        "id",
    )
    assert got.labels == ["a", "b"] and got.text is None
    assert value_kind("photos/x.webp") == "image" and value_kind("a photo of x") == "text"
    tagged = [{**r, "kind": ["a", "b"]} for r in rows]
    with pytest.raises(ValueError, match="holds list values: an image pilot gives each image one"):
        infer(tagged)
    texts = infer([{**r, "caption": f"caption number {i}"} for i, r in enumerate(rows)],
                  text="caption")  # fmt: skip
    assert texts.task == "classification" and texts.text == "caption"  # --text: as told
    with pytest.raises(ValueError, match="no column of image paths"):
        infer([{"text": "t", "label": "a"}] * 4, task="image_classification")
    captioned = [{**r, "text": f"a caption {i}"} for i, r in enumerate(rows)]
    got = infer(captioned)  # a text column by its name: a text pilot, the paths warned
    assert got.task == "classification" and got.text == "text"
    assert any("give --task image_classification" in w for w in got.warnings)
    assert infer(captioned, task="image_classification").image == "path"


def test_repeated_sentences_are_replies_to_write_not_labels():
    """FastChat's identity chats: 15 distinct replies over 500 rows, each a sentence."""
    replies = ["I am a language model trained by researchers at a lab.", "You too!",
               "Goodbye! If you have more questions, do not hesitate to ask."]  # fmt: skip
    got = infer([{"q": f"question {i}", "reply": replies[i % 3]} for i in range(30)],
                answer="reply")  # fmt: skip
    assert got.task == "format" and got.labels is None
    assert any("but sentences of" in r for r in got.reasons)
    short = infer([{"q": f"question {i}", "reply": ["yes", "no", "not sure"][i % 3]}
                   for i in range(30)], answer="reply")  # fmt: skip
    assert short.task == "classification"


def test_what_the_rows_cannot_say_is_warned_or_refused_with_the_fix():
    numbers = infer([{"text": f"t{i}", "label": i % 3} for i in range(12)])
    assert numbers.labels == ["0", "1", "2"]
    assert any("the labels are numbers" in w for w in numbers.warnings)
    rare = infer([{"text": f"t{i}", "label": "a" if i else "b"} for i in range(12)])
    assert any("1 label(s) have fewer than 3 examples (b)" in w for w in rare.warnings)
    gaps = infer([{"text": f"t{i}", "label": ("a", "b", None)[i % 3]} for i in range(12)])
    assert any("4 of 12 rows have no answer" in w for w in gaps.warnings)

    with pytest.raises(ValueError, match="holds no rows"):
        infer([])
    with pytest.raises(ValueError, match=r"--text 'body': no such column \(columns: text"):
        infer([{"text": "a", "label": "b"}], text="body")
    with pytest.raises(ValueError, match="no column of text to read as the input"):
        infer([{"a": 1, "b": 2}, {"a": 2, "b": 3}])
    with pytest.raises(ValueError, match="no column besides 'text' to read as the answer"):
        infer([{"text": "a"}, {"text": "b"}])
    with pytest.raises(ValueError, match="1 distinct label"):
        infer([{"text": f"t{i}", "label": "a"} for i in range(5)], task="classification")


def test_what_the_user_names_overrides_the_guess():
    rows = [{"id": str(i), "title": f"title {i}", "body": f"a much longer body {i} " * 3,
             "label": "ab"[i % 2], "topic": "xyz"[i % 3]} for i in range(12)]  # fmt: skip
    got = infer(rows, text="title", answer="topic")
    assert (got.text, got.answer, got.labels) == ("title", "topic", ["x", "y", "z"])
    said = "input: column 'title' (as given by --text), answer: column 'topic' (as given by "
    assert said + "--answer)" in got.reasons
    assert infer(rows, task="format").task == "format"
    assert "task: format (as given by --task)" in infer(rows, task="format").reasons


def test_values_of_several_types_are_named_by_their_path():
    """NLU++'s slots: `date.value` is a string in one target and an object in another."""
    targets = [{"date": {"text": "May", "value": "may"}, "n": [1]},
               {"date": {"text": "today", "value": {"day": 1}}, "n": ["x"]}]  # fmt: skip
    got = infer([{"text": f"t{i}", "slots": t} for i, t in enumerate(targets)])
    assert got.task == "extraction" and got.answer == "slots"
    (said,) = got.warnings
    assert said.startswith("target values of several types at date.value, n[]: typed string")
