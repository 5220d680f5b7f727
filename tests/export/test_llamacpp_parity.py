"""The converted files computed by llama.cpp itself: a tiny random Llama (SmolLM2's tokenizer)
converted to an f32 GGUF, a random LoRA as a GGUF LoRA, and llama.cpp's logits against PEFT's
on the same tokens. A wrong name, rotary permutation or scale shows up as a logit gap far
beyond llama.cpp's f16 KV-cache rounding (checked: breaking the permutation fails)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import need_llama_cpp

from lorapilot.export import gguf_files as gf
from lorapilot.export.weights import of_folder

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def converted(tmp_path_factory, tiny_model_dir):
    need_llama_cpp()
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lorapilot.export.gguf_export import choose_pre_tokenizer

    root = tmp_path_factory.mktemp("gguf")
    config = json.loads((tiny_model_dir / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    for name, p in peft.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)  # big enough to move every logit
    peft.save_pretrained(root / "adapter")
    adapter_w = load_file(str(root / "adapter" / "adapter_model.safetensors"))
    adapter_cfg = json.loads((root / "adapter" / "adapter_config.json").read_text())
    base_w = of_folder(tiny_model_dir)
    pre = choose_pre_tokenizer(tiny_model_dir, config, tok, lambda m: None)
    gf.convert_hf(
        tiny_model_dir, gf.model_tensors(base_w, config, "b"), root / "base.gguf", "f32", pre, "t"
    )
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Route this: my invoice 4711 is wrong, 12.50 EUR!"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tok(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        adapted = peft(input_ids=torch.tensor([ids])).logits[0].numpy()
        with peft.disable_adapter():
            plain = peft(input_ids=torch.tensor([ids])).logits[0].numpy()
    return {
        "root": root, "config": config, "adapter_w": adapter_w, "adapter_cfg": adapter_cfg,
        "text": text, "ids": ids, "adapted": adapted, "plain": plain, "pre": pre,
    }  # fmt: skip


def _llama_logits(base, lora, ids, text=None):
    from llama_cpp import Llama

    llm = Llama(
        model_path=str(base), lora_path=str(lora) if lora else None, n_ctx=128,
        logits_all=True, verbose=False, n_threads=1,
    )  # fmt: skip
    if text is not None:
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == ids
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)])


def _write_adapter(c, path):
    alpha, tensors = gf.lora_tensors(c["adapter_w"], c["adapter_cfg"], c["config"], "a")
    gf.write_adapter_gguf(path, "llama", alpha, tensors, "t")
    return path


def test_llama_cpp_tokenizes_and_computes_base_plus_adapter_as_peft_does(converted):
    c = converted
    lora = _write_adapter(c, c["root"] / "adapter.gguf")
    served = _llama_logits(c["root"] / "base.gguf", lora, c["ids"], c["text"])
    gap = np.abs(served - c["adapted"]).max()
    moved = np.abs(c["adapted"] - c["plain"]).max()
    assert moved > 0.5  # the adapter matters, so ignoring it could not pass
    assert gap < 0.02 * moved, (gap, moved)
    assert (served.argmax(-1) == c["adapted"].argmax(-1)).all()


def test_a_wrong_rotary_permutation_is_caught(converted, monkeypatch):
    c = converted
    monkeypatch.setattr(gf, "_permute_rows", lambda w, n_head: w)
    lora = _write_adapter(c, c["root"] / "adapter-unpermuted.gguf")
    served = _llama_logits(c["root"] / "base.gguf", lora, c["ids"])
    moved = np.abs(c["adapted"] - c["plain"]).max()
    assert np.abs(served - c["adapted"]).max() > 0.02 * moved


def test_merged_gguf_computes_the_adapted_model(converted, tiny_model_dir):
    from lorapilot.export.merge import merged_weights

    c = converted
    merged = merged_weights(tiny_model_dir, c["adapter_w"], c["adapter_cfg"])
    path = c["root"] / "merged.gguf"
    gf.convert_hf(
        tiny_model_dir, gf.model_tensors(merged, c["config"], "m"), path, "f32", c["pre"], "m"
    )
    served = _llama_logits(path, None, c["ids"])
    moved = np.abs(c["adapted"] - c["plain"]).max()
    assert np.abs(served - c["adapted"]).max() < 0.02 * moved


def test_a_q8_0_base_computes_the_base_in_llama_cpp(converted, tiny_model_dir):
    """`--gguf-base q8_0` (it stopped with a ValueError before): llama.cpp loads the file and
    computes the base's logits up to 8-bit rounding, far inside what the adapter moves."""
    c = converted
    path = c["root"] / "base-q8_0.gguf"
    tensors = gf.model_tensors(of_folder(tiny_model_dir), c["config"], "q")
    gf.convert_hf(tiny_model_dir, tensors, path, "q8_0", c["pre"], "q")
    served = _llama_logits(path, None, c["ids"])
    moved = np.abs(c["adapted"] - c["plain"]).max()
    assert np.abs(served - c["plain"]).max() < 0.05 * moved, (
        np.abs(served - c["plain"]).max(),
        moved,
    )


def test_label_scores_in_llama_cpp_are_lorapilots_scoring_rule(converted, tiny_model_dir):
    """The serving check's scoring (export.serving.Runtime) against lorapilot's own
    (evaluate.predict.score_labels, fp32) on the same adapted model: the same sums of label
    log-probabilities, and best-first search picks what scoring every label picks."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lorapilot.evaluate.predict import score_labels
    from lorapilot.export.serving import Runtime

    c = converted
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    names = ["billing", "technical support", "account", "refund request", "shipping"]
    labels = [tok(n, add_special_tokens=False)["input_ids"] + [end] for n in names]
    assert max(len(x) for x in labels) >= 3  # multi-token labels exercise the later logits
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(c["root"] / "adapter")).eval()
    prompts = [c["ids"], c["ids"][:-3], c["ids"][:20] + c["ids"][-5:]]
    ours = score_labels(model, prompts, labels, search="all", precision="fp32")
    lora = _write_adapter(c, c["root"] / "adapter-scores.gguf")
    rt = Runtime(c["root"] / "base.gguf", lora, n_ctx=128, threads=1)
    for i, p in enumerate(prompts):
        every = rt.score(p, labels, best_first=False)
        np.testing.assert_allclose(every, ours[i], atol=0.05)
        best = rt.score(p, labels, best_first=True)
        scored = [j for j, v in enumerate(best) if v is not None]
        assert int(np.argmax(every)) in scored
        assert max(scored, key=lambda j: best[j]) == int(np.argmax(every))
        for j in scored:
            assert best[j] == pytest.approx(every[j], abs=1e-4)


def test_teacher_forced_agreement_counts_tokens_from_the_same_prefix(converted, tiny_model_dir):
    """The serving check's per-token agreement (Runtime.forced): llama.cpp's own greedy answer
    fed back agrees on every token (and its stop); one token changed is one disagreement at
    that place, the tokens after it still compared from the same (changed) prefix."""
    from lorapilot.export.serving import Runtime

    c = converted
    lora = _write_adapter(c, c["root"] / "adapter-forced.gguf")
    rt = Runtime(c["root"] / "base.gguf", lora, n_ctx=128, threads=1)
    prompt = c["ids"]
    greedy = rt.generate(prompt, stop=set(), max_new=12)
    assert len(greedy) == 12
    assert rt.forced(prompt, greedy, ended=False, stop=set()) == [12, 12]
    stop = {greedy[8]}  # as if the answer had ended before that token
    ended = rt.generate(prompt, stop=stop, max_new=12)
    assert rt.forced(prompt, ended, ended=True, stop=stop) == [len(ended) + 1, len(ended) + 1]
    changed = list(greedy)
    changed[4] = (changed[4] + 1) % 100
    same, compared = rt.forced(prompt, changed, ended=False, stop=set())
    assert compared == 12 and same <= 11
    # the prefix up to the change is untouched: the first four agree as before
    assert rt.forced(prompt, changed[:4], ended=False, stop=set()) == [4, 4]


def test_the_pilot_s_prompt_format_goes_into_converted_and_rewritten_files(
    converted, tiny_model_dir
):
    """model.chat_template's text in place of the base's, in a file converted from the
    folder and in one rewritten from another GGUF's metadata (llama-server's chat endpoint
    reads it from there); without it each keeps the base's."""
    import gguf

    def template_of(path):
        field = gguf.GGUFReader(str(path)).fields.get(gf.CHAT_TEMPLATE_KEY)
        return None if field is None else str(field.contents())

    c = converted
    base_own = template_of(c["root"] / "base.gguf")
    assert base_own and "<|im_start|>" in base_own  # the tiny base's SmolLM2 template
    tensors = gf.model_tensors(of_folder(tiny_model_dir), c["config"], "t")
    mine = "{{ messages[0]['content'] }}### Response:\n"
    gf.convert_hf(tiny_model_dir, tensors, c["root"] / "own.gguf", "f32", c["pre"], "t",
                  chat_template=mine)  # fmt: skip
    assert template_of(c["root"] / "own.gguf") == mine
    gf.rewrite_gguf(c["root"] / "base.gguf", tensors, c["root"] / "re.gguf", "f32",
                    chat_template=mine)  # fmt: skip
    assert template_of(c["root"] / "re.gguf") == mine
    gf.rewrite_gguf(c["root"] / "base.gguf", tensors, c["root"] / "kept.gguf", "f32")
    assert template_of(c["root"] / "kept.gguf") == base_own
