"""Prompt rendering and the loss mask, on two chat templates (ChatML and a Zephyr-style one)."""

from __future__ import annotations

import copy
import json

import pytest

from lorapilot.data.format import IGNORE_INDEX, PromptFormatter, answer_text
from lorapilot.errors import UsageError
from lorapilot.spec import FieldSpec, TaskSpec

ZEPHYR = (
    "{% for m in messages %}{% if m['role'] == 'system' %}<|system|>\n{{ m['content'] }}{{ "
    "eos_token }}\n"
    "{% elif m['role'] == 'user' %}<|user|>\n{{ m['content'] }}{{ eos_token }}\n"
    "{% else %}<|assistant|>\n{{ m['content'] }}{{ eos_token }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

TASK = TaskSpec(
    kind="classification",
    labels=["billing", "technical", "feature_request"],
    system="Route the ticket. One of: {labels}.",
    template="Ticket:\n{text}\n\nCategory:",
)


@pytest.fixture(scope="module")
def chatml(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture(scope="module", params=["chatml", "zephyr"])
def tok(request, chatml):
    if request.param == "chatml":
        return chatml
    t = copy.deepcopy(chatml)
    t.chat_template = ZEPHYR
    return t


def test_loss_tokens_are_the_answer_and_end_of_turn(tok):
    fmt = PromptFormatter(tok, TASK, max_length=256)
    budget = fmt.answer_budget_for(TASK.labels)
    enc = fmt.encode("I was charged twice {weird braces} for my order.", "billing", budget)
    pos = enc.loss_positions
    assert pos == list(range(enc.prompt_len, enc.n_tokens))  # the answer closes the sequence
    assert tok.decode([enc.input_ids[i] for i in pos]) == "billing" + tok.eos_token
    assert all(lab == IGNORE_INDEX for lab in enc.labels[: enc.prompt_len])
    assert enc.labels[-1] == enc.end_of_turn_id == tok.eos_token_id
    # the eval prompt is the training prefix, token for token
    assert (
        fmt.encode_prompt("I was charged twice {weird braces} for my order.", budget)
        == enc.prompt_ids
    )
    rendered = tok.decode(enc.input_ids)
    assert (
        "{weird braces}" in rendered and "One of: billing, technical, feature_request." in rendered
    )
    assert not rendered.endswith("\n")  # what follows end-of-turn is not trained


def test_multi_token_label_and_budget(tok):
    fmt = PromptFormatter(tok, TASK, max_length=256)
    budget = fmt.answer_budget_for(TASK.labels)
    lens = [len(fmt.encode("x", lab, budget).loss_positions) for lab in TASK.labels]
    assert budget == max(lens) and len(set(lens)) > 1


def test_loss_on_all(tok):
    fmt = PromptFormatter(tok, TASK, max_length=256, loss_on="all")
    enc = fmt.encode("hello", "technical", 8)
    assert enc.labels == enc.input_ids


@pytest.mark.parametrize("side", ["left", "right"])
def test_truncation_cuts_the_input_never_the_answer(tok, side):
    text = " ".join(f"word{i}" for i in range(400))
    fmt = PromptFormatter(tok, TASK, max_length=96, truncation_side=side)
    budget = fmt.answer_budget_for(TASK.labels)
    enc = fmt.encode(text, "feature_request", budget)
    assert enc.truncated and enc.n_text_tokens_cut > 0 and not enc.target_truncated
    assert enc.n_tokens <= 96
    assert (
        tok.decode([enc.input_ids[i] for i in enc.loss_positions])
        == "feature_request" + tok.eos_token
    )
    kept = enc.extra["text"]
    assert ("word399" in kept) == (side == "left") and ("word0 " in kept) == (side == "right")
    assert fmt.encode_prompt(text, budget) == enc.prompt_ids


CONTEXT = (
    ("user", "My card was declined at the shop."),
    ("assistant", "Which card was it?"),
    ("user", "The debit card, " + " ".join(f"detail{i}" for i in range(60))),
    ("assistant", "Thanks, checking."),
)


def test_a_conversations_earlier_turns_come_before_its_last_user_turn_as_said(tok):
    fmt = PromptFormatter(tok, TASK, max_length=512)
    budget = fmt.answer_budget_for(TASK.labels)
    enc = fmt.encode("Still declined.", "billing", budget, CONTEXT)
    shown = tok.decode(enc.input_ids)
    said = [shown.index(t) for _, t in CONTEXT] + [shown.index("Ticket:\nStill declined.")]
    assert said == sorted(said) and shown.index("Route the ticket") < said[0]
    assert shown.count("Ticket:") == 1  # the template frames the last user turn only
    assert tok.decode([enc.input_ids[i] for i in enc.loss_positions]) == "billing" + (
        tok.eos_token
    )  # the loss is on the last answer alone, not on the earlier assistant turns
    assert fmt.encode_prompt("Still declined.", budget, CONTEXT) == enc.prompt_ids
    assert not enc.truncated and enc.extra["context"] == CONTEXT


def test_a_conversation_too_long_loses_its_oldest_exchanges_whole_then_its_text(tok):
    whole = PromptFormatter(tok, TASK, max_length=512)
    budget = whole.answer_budget_for(TASK.labels)
    uncut = whole.encode("Still declined.", "billing", budget, CONTEXT)
    later = whole.encode("Still declined.", "billing", budget, CONTEXT[2:])
    # room for the last exchange, not for both: the oldest one goes, whole
    fmt = PromptFormatter(tok, TASK, max_length=later.n_tokens + 2)
    enc = fmt.encode("Still declined.", "billing", budget, CONTEXT)
    assert enc.extra["context"] == CONTEXT[2:] and enc.extra["turns_dropped"] == 2
    assert enc.input_ids == later.input_ids and enc.truncated
    assert enc.n_text_tokens_cut == uncut.prompt_len - later.prompt_len
    assert fmt.encode_prompt("Still declined.", budget, CONTEXT) == enc.prompt_ids
    # no room for any earlier turn: all go, then the last user turn is cut
    short = PromptFormatter(tok, TASK, max_length=uncut.n_tokens - later.prompt_len + 40)
    text = "Still declined " + " ".join(f"again{i}" for i in range(80))
    enc = short.encode(text, "billing", budget, CONTEXT)
    assert enc.extra["context"] == () and enc.extra["turns_dropped"] == 4
    assert enc.extra["text"] != text and enc.n_tokens <= short.max_length
    alone = short.encode(text, "billing", budget)
    assert enc.input_ids == alone.input_ids
    assert enc.n_text_tokens_cut > alone.n_text_tokens_cut


def test_target_that_cannot_fit_is_flagged(chatml):
    fmt = PromptFormatter(chatml, TASK, max_length=20)
    enc = fmt.encode("hi", "billing", 3)
    assert enc.target_truncated


def test_extraction_answer_is_compact_json_in_field_order():
    task = TaskSpec(kind="extraction", fields=[{"name": "b"}, {"name": "a", "required": False}])
    ans = answer_text(task, None, {"a": None, "b": "Ünïcode"})
    assert ans == '{"b": "Ünïcode", "a": null}' and json.loads(ans) == {"a": None, "b": "Ünïcode"}


NESTED = TaskSpec(
    kind="extraction",
    system="Answer with the keys {fields}.",
    fields=[
        {"name": "intent"},
        {"name": "slots", "type": "map", "values": "string"},
        {"name": "lines", "type": "list", "required": False,
         "items": {"type": "object",
                   "fields": [{"name": "desc"}, {"name": "n", "type": "integer"}]}},
        {"name": "tags", "type": "list", "items": "string", "ordered": True},
    ],
)  # fmt: skip


def test_nested_fields_render_their_shape_in_the_prompt_and_order_in_the_answer():
    from lorapilot.data.format import render_messages

    [system, _] = render_messages(NESTED, "x")
    assert system["content"] == (
        "Answer with the keys intent, slots (map of name to string), "
        "lines (list of objects: desc, n), tags (ordered list of string)."
    )
    ans = answer_text(NESTED, None, {"tags": ["b"], "lines": [{"n": 2, "desc": "pen"}],
                                     "slots": {"z": "1"}, "intent": "i"})  # fmt: skip
    assert (
        ans
        == '{"intent": "i", "slots": {"z": "1"}, "lines": [{"desc": "pen", "n": 2}], "tags": ["b"]}'
    )


def test_flat_specs_keep_their_prompt_and_hash_nested_shapes_change_the_hash(chatml):
    from lorapilot.data.format import render_messages, template_hash

    flat = TaskSpec(
        kind="extraction", system="{fields}", fields=[{"name": "a"}, {"name": "b", "type": "list"}]
    )
    assert render_messages(flat, "x")[0]["content"] == "a, b"
    # the hash of a flat spec is the one it had before nesting existed (names only)
    assert "shapes" not in json.dumps(flat.model_dump(mode="json"))
    assert flat.model_dump(mode="json")["fields"][1] == {
        "name": "b", "type": "list", "required": True, "description": ""
    }  # fmt: skip
    ordered = NESTED.model_copy(deep=True)
    ordered.fields[3].ordered = False
    assert template_hash(chatml, NESTED) != template_hash(chatml, ordered)


def test_template_that_is_not_prefix_consistent_is_refused(chatml):
    t = copy.deepcopy(chatml)
    # a template whose generation prompt differs from how it renders an answered turn
    t.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}ASSISTANT>{% endif %}"
    )
    with pytest.raises(UsageError, match="prefix"):
        PromptFormatter(t, TASK, max_length=64)


def test_missing_chat_template_is_refused(chatml):
    t = copy.deepcopy(chatml)
    t.chat_template = None
    with pytest.raises(UsageError, match="no chat template"):
        PromptFormatter(t, TASK, max_length=64)


def test_a_scalar_or_list_value_says_so_in_the_prompt():
    from lorapilot.data.format import render_messages

    task = NESTED.model_copy(update={"fields": [
        FieldSpec(name="slots", type="map", values="string | list")]})  # fmt: skip
    [system, _] = render_messages(task, "x")
    assert (
        system["content"]
        == "Answer with the keys slots (map of name to string or list of strings)."
    )


def test_label_descriptions_are_shown_where_the_prompt_asks_and_enter_the_hash(chatml):
    from pydantic import ValidationError

    from lorapilot.data.format import render_messages, template_hash

    said = {"billing": "charges, invoices, refunds", "feature_request": "something new"}
    task = TASK.model_copy(
        update={"system": "Route the ticket.\n{label_descriptions}", "label_descriptions": said}
    )
    task = TaskSpec.model_validate(task.model_dump())
    [system, _] = render_messages(task, "x")
    assert system["content"] == (
        "Route the ticket.\nbilling: charges, invoices, refunds\ntechnical\n"
        "feature_request: something new"
    )
    assert template_hash(chatml, task) != template_hash(chatml, TASK)
    assert "label_descriptions" not in TASK.model_dump()  # older specs: the same dump, hash
    base = TASK.model_dump()
    with pytest.raises(ValidationError, match="'refunds' is not one of task.labels"):
        TaskSpec.model_validate({**base, "label_descriptions": {"refunds": "x"},
                                 "system": "{label_descriptions}"})  # fmt: skip
    with pytest.raises(ValidationError, match="no prompt shows it"):
        TaskSpec.model_validate({**base, "label_descriptions": said})
    with pytest.raises(ValidationError, match="is not set"):
        TaskSpec.model_validate({**base, "system": "{label_descriptions}"})
    with pytest.raises(ValidationError, match="empty description"):
        TaskSpec.model_validate({**base, "label_descriptions": {"billing": " "},
                                 "system": "{label_descriptions}"})  # fmt: skip
    with pytest.raises(ValidationError, match="a text task with task.labels"):
        TaskSpec.model_validate({"kind": "extraction", "fields": [{"name": "a"}],
                                 "label_descriptions": {"a": "x"},
                                 "system": "{label_descriptions}"})  # fmt: skip
