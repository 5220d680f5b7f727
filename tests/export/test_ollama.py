"""The Modelfile asks what the pilot asked: its ChatML template renders the pilot's exact prompt
(checked against the real SmolLM2 chat template), and only the lines that apply are written."""

from __future__ import annotations

import pytest

from lorapilot.export import ollama


def test_chatml_prompt_is_the_tokenizers_own(default_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    assert ollama.template_for(None, tok.chat_template) == ollama.CHATML
    for system in ("Route tickets: {labels}.", None):
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": "Ticket:\nmy card\n\nCategory:"}
        ]
        want = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        if system is None:  # SmolLM2's template adds its own default system turn
            want = want[want.index("<|im_start|>user") :]
        assert ollama.chatml_prompt(system, "Ticket:\nmy card\n\nCategory:") == want


def test_plain_prompt_is_the_plain_chat_template_s_own(default_model_dir):
    """model.chat_template: plain gets the PLAIN Go template (whatever the base's own is), and
    it renders exactly the prompt the Jinja template renders, the bos token aside; a file of
    the user's own gets none (no Go template is known for it)."""
    from transformers import AutoTokenizer

    from lorapilot.base.chat_template import plain_template

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    assert ollama.template_for("plain", tok.chat_template) == ollama.PLAIN
    assert ollama.template_for("my.jinja", tok.chat_template) is None
    for with_bos in (False, True):
        tok.chat_template = plain_template(with_bos)
        for system in ("Route tickets: {labels}.", None):
            msgs = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": "Ticket:\nmy card\n\nCategory:"}
            ]
            want = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            if with_bos:
                assert want.startswith(tok.bos_token)
                want = want.removeprefix(tok.bos_token)
            got = ollama.prompt_of(ollama.PLAIN, system, "Ticket:\nmy card\n\nCategory:")
            assert got == want


def test_modelfile_lines():
    kw = dict(template=None, system="Be brief.", stops=["<|im_end|>"], num_ctx=256, header="h")
    with_adapter = ollama.modelfile(model_file="base.gguf", adapter_file="adapter.gguf", **kw)
    assert with_adapter.splitlines()[:3] == ["# h", "FROM ./base.gguf", "ADAPTER ./adapter.gguf"]
    assert 'SYSTEM """Be brief."""' in with_adapter and "TEMPLATE" not in with_adapter
    assert 'PARAMETER stop "<|im_end|>"' in with_adapter and "PARAMETER num_ctx 256" in with_adapter
    merged = ollama.modelfile(model_file="merged.gguf", adapter_file=None, **kw)
    assert "ADAPTER" not in merged and "FROM ./merged.gguf" in merged
    assert (
        ollama.template_for(None, "{{ '[INST]' }}") is None
    )  # not ChatML: Ollama reads the GGUF's
    with pytest.raises(ValueError, match="three double quotes"):
        ollama.modelfile(model_file="b", adapter_file=None, **(kw | {"system": 'say """'}))
