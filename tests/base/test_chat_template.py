"""model.chat_template: a base that ships no chat template (a pretrained, not instruction-tuned
model) is trained with `plain` or a template file of the user's; the format reaches every
step, the adapter folder and every export, and a changed format is caught."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import init_tiny_pilot, run_cli, run_json
from pydantic import ValidationError

from lorapilot.base import chat_template
from lorapilot.errors import UsageError
from lorapilot.spec import ModelSpec, PilotSpec

EOS = "<|endoftext|>"  # id 0 of the SmolLM2 vocabulary: the pretrained base's eos and bos


def bare_tokenizer(src: Path, dest: Path) -> Path:
    """The default model's vocabulary as a pretrained base ships it: no chat template, one
    `<|endoftext|>` for bos and eos, put before every text by the tokenizer (as Llama's)."""
    dest.mkdir(parents=True)
    config = json.loads((src / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    config.update(bos_token=EOS, eos_token=EOS, pad_token=None)
    (dest / "tokenizer_config.json").write_text(json.dumps(config))
    tok = json.loads((src / "tokenizer.json").read_text())
    bos = {"SpecialToken": {"id": EOS, "type_id": 0}}
    tok["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            bos,
            {"Sequence": {"id": "A", "type_id": 0}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {EOS: {"id": EOS, "ids": [0], "tokens": [EOS]}},
    }
    (dest / "tokenizer.json").write_text(json.dumps(tok))
    return dest


@pytest.fixture(scope="module")
def bare_base(tmp_path_factory, default_model_dir) -> Path:
    from lorapilot.base.models import make_tiny_model

    root = tmp_path_factory.mktemp("bare")
    tok_dir = bare_tokenizer(default_model_dir, root / "tokenizer")
    return make_tiny_model(root / "model", tokenizer_dir=tok_dir)


def test_plain_renders_sections_the_answer_ended_by_eos_and_bos_where_the_tokenizer_adds_it(
    bare_base, default_model_dir
):
    from transformers import AutoTokenizer

    bare = AutoTokenizer.from_pretrained(bare_base)
    assert bare.chat_template is None and chat_template.adds_bos(bare)
    chat_template.apply(bare, "plain", bare_base, "pilot.yaml")
    turns = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    prompt = bare.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    full = bare.apply_chat_template([*turns, {"role": "assistant", "content": "A"}], tokenize=False)
    assert prompt == f"{EOS}S\n\n### Input:\nU\n\n### Response:\n"
    assert full == prompt + f"A{EOS}\n\n"
    # SmolLM2's tokenizer adds no bos: the plain format starts with the text itself
    smol = AutoTokenizer.from_pretrained(default_model_dir)
    assert not chat_template.adds_bos(smol)
    chat_template.apply(smol, "plain", default_model_dir, "pilot.yaml")
    assert smol.apply_chat_template(turns, tokenize=False, add_generation_prompt=True) == (
        "S\n\n### Input:\nU\n\n### Response:\n"
    )
    assert chat_template.apply(smol, None, default_model_dir, "p.yaml") is smol  # kept as is


def test_bad_templates_are_refused_naming_the_key_and_file(tmp_path, default_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    with pytest.raises(UsageError, match=r"p.yaml: model.chat_template: 'none.jinja' is neither"):
        chat_template.apply(tok, "none.jinja", tmp_path, "p.yaml")
    (tmp_path / "empty.jinja").write_text("  \n")
    with pytest.raises(UsageError, match="empty.jinja is empty"):
        chat_template.apply(tok, "empty.jinja", tmp_path, "p.yaml")
    (tmp_path / "broken.jinja").write_text("{% for m in messages %}{{ m['content'] }}")
    with pytest.raises(UsageError, match="broken.jinja does not render a user and an"):
        chat_template.apply(tok, "broken.jinja", tmp_path, "p.yaml")
    no_eos = SimpleNamespace(eos_token=None)
    with pytest.raises(UsageError, match="has none"):
        chat_template.apply(no_eos, "plain", tmp_path, "p.yaml")
    with pytest.raises(ValidationError, match="chat_template"):
        ModelSpec(chat_template="")
    photos = Path(__file__).parents[2] / "examples" / "clothing-photos" / "pilot.yaml"
    image = yaml.safe_load(photos.read_text())
    image["model"] = {"chat_template": "plain"}
    with pytest.raises(ValidationError, match="an image pilot has no prompt"):
        PilotSpec.model_validate(image)


@pytest.fixture(scope="module")
def plain_pilot(tmp_path_factory, bare_base) -> Path:
    pilot = init_tiny_pilot(tmp_path_factory.mktemp("plain"), bare_base, max_steps=3)
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["model"]["chat_template"] = "plain"
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return pilot


def set_template(pilot: Path, value: str | None) -> None:
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    if value is None:
        spec["model"].pop("chat_template", None)
    else:
        spec["model"]["chat_template"] = value
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def test_a_base_without_a_chat_template_is_trained_verified_and_exported_with_plain(
    plain_pilot, tmp_path
):
    pilot = plain_pilot
    set_template(pilot, None)  # the base's own: it has none, and the error says what to set
    for verb in ("check", "inspect"):  # check reads the tokenizer when the base is here
        proc = run_cli(verb, str(pilot))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert "set `model.chat_template: plain`" in proc.stderr
    set_template(pilot, "plain")
    prompt = run_json("check", str(pilot))["prompt_format"]
    assert prompt == {"chat_template": "plain", "system_folded": False, "warnings": []}
    shown = run_json("inspect", str(pilot))
    example = shown["examples"][0]
    assert example["rendered"].startswith(EOS) and "### Response:\n" in example["rendered"]
    assert example["decoded_target"].endswith(EOS)  # the answer ends with eos, which carries loss
    trained = run_json("train", str(pilot))
    adapter = Path(trained["adapter_path"])
    manifest = json.loads((adapter / "lorapilot.json").read_text())
    saved = (adapter / chat_template.FILE).read_text()
    assert chat_template.FILE in manifest["files"] and saved.startswith("{{- bos_token }}")
    assert run_json("verify", str(pilot))["ok"] is True
    out = run_json("export", str(pilot), "--out", str(tmp_path / "adapter"))
    assert chat_template.FILE in out["files"]
    assert (tmp_path / "adapter" / chat_template.FILE).read_text() == saved
    # the merged model's own tokenizer prompts exactly as the pilot did
    from transformers import AutoTokenizer

    run_json("export", str(pilot), "--merge", "--out", str(tmp_path / "merged"))
    merged = AutoTokenizer.from_pretrained(tmp_path / "merged")
    assert merged.chat_template == saved
    report = run_json("report", str(pilot))
    assert "| chat template | plain |" in Path(report["markdown"]).read_text()


def test_a_template_file_is_the_prompt_and_a_changed_one_is_caught(plain_pilot, tmp_path):
    pilot = tmp_path / "p"
    shutil.copytree(plain_pilot, pilot, ignore=shutil.ignore_patterns("runs"))
    (pilot / "format.jinja").write_text(
        "{% for m in messages %}{% if m['role'] == 'assistant' %}<answer>{{ m['content'] }}"
        "{{ eos_token }}{% else %}[{{ m['role'] }}] {{ m['content'] }}\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<answer>{% endif %}"
    )
    set_template(pilot, "format.jinja")
    checked = run_json("check", str(pilot))
    assert checked["resolved"]["model"]["chat_template"] == "format.jinja"
    # this tokenizer puts <|endoftext|> first, and the file renders none: said at check
    (warning,) = checked["prompt_format"]["warnings"]
    assert "puts '<|endoftext|>' before every text, and the chat template renders none" in warning
    shown = run_json("inspect", str(pilot))["examples"][0]
    assert shown["rendered"].startswith("[system] ") and shown["decoded_target"].endswith(EOS)
    run_json("train", str(pilot))
    (pilot / "format.jinja").write_text(
        (pilot / "format.jinja").read_text().replace("<answer>", "<reply>")
    )
    proc = run_cli("verify", str(pilot), "--json")
    assert proc.returncode != 0 and "chat template" in proc.stdout + proc.stderr
    (pilot / "format.jinja").unlink()
    proc = run_cli("check", str(pilot))
    assert proc.returncode == 2 and "model.chat_template: 'format.jinja' is neither" in proc.stderr


NO_SYSTEM = (  # Gemma's rule (its instruct templates refuse a system turn), SmolLM2's tokens
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)


def test_a_template_that_refuses_a_system_turn_gets_it_in_the_first_user_turn(
    plain_pilot, tmp_path
):
    """Gemma's and older Mistral instruct templates raise on a system turn: the system text
    opens the first user turn instead (demonstrations after it), said by inspect."""
    from lorapilot.data.format import folds_system, render_messages
    from lorapilot.spec import TaskSpec

    task = TaskSpec(kind="classification", labels=["a", "b"], system="Pick: {labels}.",
                    template="Q: {text}")  # fmt: skip
    folded = render_messages(task, "x", (("s1", "a"),), fold_system=True)
    assert [m["role"] for m in folded] == ["user", "assistant", "user"]
    assert folded[0]["content"] == "Pick: a, b.\n\nQ: s1" and folded[2]["content"] == "Q: x"
    assert render_messages(task, "x")[0] == {"role": "system", "content": "Pick: a, b."}

    def refuses_system(msgs, **kw):
        if msgs[0]["role"] == "system":
            raise ValueError("System role not supported")
        return ""

    tok = SimpleNamespace(apply_chat_template=refuses_system)
    assert folds_system(tok, task)
    drops = SimpleNamespace(apply_chat_template=lambda msgs, **kw: msgs[-1]["content"])
    assert folds_system(drops, task)  # a template that renders no system text silently
    keeps = SimpleNamespace(apply_chat_template=lambda msgs, **kw: str(msgs))
    assert not folds_system(keeps, task)
    assert not folds_system(tok, task.model_copy(update={"system": None}))

    pilot = tmp_path / "p"
    shutil.copytree(plain_pilot, pilot, ignore=shutil.ignore_patterns("runs"))
    (pilot / "gemma.jinja").write_text(NO_SYSTEM)
    set_template(pilot, "gemma.jinja")
    assert run_json("check", str(pilot))["prompt_format"]["system_folded"] is True
    shown = run_json("inspect", str(pilot))
    system = yaml.safe_load((pilot / "pilot.yaml").read_text())["task"]["system"].split("{")[0]
    assert shown["system_folded"] is True
    rendered = shown["examples"][0]["rendered"]
    assert rendered.startswith("<|im_start|>user\n" + system)
    assert "<|im_start|>system" not in rendered
    assert "takes no system turn" in run_cli("inspect", str(pilot)).stdout
    assert run_json("train", str(pilot))["status"] == "completed"
