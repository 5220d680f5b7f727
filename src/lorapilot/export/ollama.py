"""The texts beside the GGUF files: an Ollama Modelfile that asks the served model exactly as the
pilot asked it (system prompt, chat template, stop token, greedy), and a README with the
llama.cpp, Ollama and Python commands. Pure: strings in, strings out."""

from __future__ import annotations

CHATML = (
    "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
    "{{ if .Prompt }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n{{ end }}"
    "<|im_start|>assistant\n{{ .Response }}<|im_end|>\n"
)
"""Ollama's Go template for ChatML chat templates (SmolLM2, Qwen2)."""


def chatml_prompt(system: str | None, user: str) -> str:
    """What the CHATML template renders before the model answers: compared with the pilot's
    own prompt text, so the Modelfile is known to ask exactly what the pilot asked."""
    head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return f"{head}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


PLAIN = (
    "{{ if .System }}{{ .System }}\n\n{{ end }}"
    "{{ if .Prompt }}### Input:\n{{ .Prompt }}\n\n{{ end }}"
    "### Response:\n{{ .Response }}"
)
"""Ollama's Go template for lorapilot's `plain` format (model.chat_template: plain); the bos
token, where the base's tokenizer adds one, is added by llama.cpp from the GGUF's metadata."""


def plain_prompt(system: str | None, user: str) -> str:
    """What the PLAIN template renders before the model answers (bos token excluded)."""
    head = f"{system}\n\n" if system else ""
    return f"{head}### Input:\n{user}\n\n### Response:\n"


def template_for(setting: str | None, chat_template: str | None) -> str | None:
    """The Go template for the pilot's prompt format: `setting` is model.chat_template (None:
    the base's own, given when it is ChatML; `plain`: PLAIN). None: no Go template is known
    for it (Ollama derives one from the GGUF's own chat template, the base's)."""
    if setting == "plain":
        return PLAIN
    if setting is None and chat_template and "<|im_start|>" in chat_template:
        return CHATML
    return None


def prompt_of(template: str, system: str | None, user: str) -> str:
    """What a Go template of this module renders before the model answers."""
    return (chatml_prompt if template == CHATML else plain_prompt)(system, user)


def _quoted(text: str) -> str:
    if '"""' in text:
        raise ValueError("a Modelfile string cannot hold three double quotes")
    return f'"""{text}"""'


def modelfile(
    *,
    model_file: str,
    adapter_file: str | None,
    template: str | None,
    system: str | None,
    stops: list[str],
    num_ctx: int,
    header: str,
) -> str:
    optional = {
        "ADAPTER": adapter_file and f"./{adapter_file}",
        "TEMPLATE": template and _quoted(template),
        "SYSTEM": system and _quoted(system),
    }
    lines = [f"# {header}", f"FROM ./{model_file}"]
    lines += [f"{key} {value}" for key, value in optional.items() if value]
    lines += [f'PARAMETER stop "{s}"' for s in stops]
    lines += ["PARAMETER temperature 0", "PARAMETER top_k 1", f"PARAMETER num_ctx {num_ctx}"]
    return "\n".join(lines) + "\n"


def readme(
    *,
    pilot: str,
    train_run: str,
    base_file: str,
    base_note: str,
    adapter_file: str,
    merged_file: str | None,
    system: str | None,
    user_template: str,
    check: dict,
    classifier: str | None = None,
    grammar: str | None = None,
    schema: str | None = None,
    label_sets: bool = False,
    chat_template: str | None = None,
    ollama_template: bool = True,
    base_has_template: bool = True,
) -> str:
    """How to serve the export, and what its serving check found (`label_sets`: a
    multi-label pilot, whose grammar holds lists of labels; `chat_template`: the file of the
    pilot's own prompt format, model.chat_template; `ollama_template`: whether the Modelfile
    has a TEMPLATE for it; `base_has_template`: whether base.gguf carries it, false for a
    copied original GGUF, which keeps the base's)."""
    name = f"{pilot}-{train_run}".lower().replace("_", "-")
    sys_flag = f' -sys "{system}"' if system else ""
    # a copied original GGUF carries the base's own chat template: llama.cpp is given the
    # pilot's (harmless where the file carries it too)
    tmpl_flag = f" --jinja --chat-template-file {chat_template}" if chat_template else ""
    verdict = "passed" if check.get("ok") else "FAILED"
    out = [
        f"# {pilot}: the adapter of train run {train_run}, for llama.cpp and Ollama",
        "",
        f"Written by `lorapilot export --gguf`. Serving check: **{verdict}** "
        f"(agreement with lorapilot's predictions {check.get('serving_agreement', 0):.1%} "
        f"{agreement_of(check)}; minimum "
        f"{check.get('serving_agreement_min', 0):.0%}"
        f"{'' if check.get('gated', True) else ', reported, not gated'}).",
        *_generation_lines(check),
        "",
        f"- `{base_file}`: the base model ({base_note})",
        f"- `{adapter_file}`: the LoRA adapter as a GGUF LoRA",
    ]
    if merged_file:
        out.append(f"- `{merged_file}`: the base with the adapter merged in")
    if classifier:
        out.append(
            f"- `{classifier}` and `classifier.json`: classify as the pilot did (label scoring)"
        )
    if grammar and schema:
        out.append(f"- `{grammar}`: the answer's fields as a llama.cpp grammar (as trained)")
    if schema:
        out.append(f"- `{schema}`: the answer's JSON Schema (Ollama's `format`)")
    elif grammar and label_sets:
        out.append(
            f"- `{grammar}`: the labels as a llama.cpp grammar (answers one or more labels, "
            "in the pilot's order, separated by `, `)"
        )
    elif grammar:
        out.append(f"- `{grammar}`: the labels as a llama.cpp grammar (answers only a label)")
    if chat_template:
        carried = (
            "the GGUF files carry it as their chat template too"
            if base_has_template
            else f"`{base_file}` is the base's own GGUF and carries the base's chat template, "
            "so give llama.cpp this one (`--jinja --chat-template-file`)"
        )
        out.append(
            f"- `{chat_template}`: the prompt format the pilot trained with (its "
            f"`model.chat_template`); {carried}"
            + ("" if ollama_template else "; the Modelfile has no TEMPLATE for it: write one")
        )
    out += [
        "- `Modelfile`: Ollama (base + adapter)"
        + (", `Modelfile.merged`: Ollama (merged)" if merged_file else ""),
        "- `lorapilot.json`: every file's sha256, the base the adapter is bound to, the check",
        "",
        "The model was asked with this system prompt and user message (`{text}` is the input):",
        "",
        "```text",
        f"system: {system or '(none)'}",
        f"user: {user_template}",
        "```",
        "",
        "## llama.cpp",
        "",
        "```bash",
        f"llama-cli -m {base_file} --lora {adapter_file}{sys_flag}{tmpl_flag} --temp 0",
        f"llama-server -m {base_file} --lora {adapter_file}{tmpl_flag} --temp 0",
        "```",
        "",
        "## Ollama",
        "",
        "```bash",
        f"ollama create {name} -f Modelfile",
        f"ollama run {name}",
        "```",
        "",
        "## Python (llama-cpp-python)",
        "",
        "```python",
        "from llama_cpp import Llama",
        f'llm = Llama(model_path="{base_file}", lora_path="{adapter_file}")',
        "```",
        "",
        *(
            _fields_lines(grammar, schema, check, base_file, adapter_file)
            if schema
            else _grammar_lines(grammar, check, base_file, adapter_file, label_sets)
        ),
        *_classifier_lines(classifier, check, merged_file),
        "Check it again (the files re-hashed, the validation split predicted in llama.cpp):",
        f"`lorapilot export PILOT --gguf --check {'THIS_FOLDER'}`.",
        "",
    ]
    return "\n".join(out)


def _classifier_lines(classifier: str | None, check: dict, merged_file: str | None) -> list[str]:
    """How to classify as the pilot did: the exported script, which the check ran."""
    if not classifier:
        return []
    configs = check.get("configs") or []
    same = [c["example_agreement"] for c in configs if c.get("example_agreement") is not None]
    shown = f"{min(same):.1%}" if same else "n/a"
    ties = near_ties_of(check)
    differing = sum(c.get("n_differing", 0) for c in configs)
    tied = (
        "" if not ties
        else ", the others near-ties within the two runtimes' score noise" if ties == differing
        else f"; {ties} of the {differing} others are near-ties within the runtimes' score noise"
    )  # fmt: skip
    lines = [
        "## Classify as the pilot did",
        "",
        f"`{classifier}` builds the pilot's prompt around a text (its chat template, its cut of "
        "a too-long input) and scores every label that can still win, as lorapilot does; "
        "every answer is a label. The serving check ran this very file on the validation "
        f"split: it predicts what lorapilot predicted for {shown} of the examples{tied}.",
        "",
        "```bash",
        "pip install llama-cpp-python numpy",
        f'python {classifier} "a text to classify"        # {{"text": ..., "label": ...}}',
        f"python {classifier} < texts.txt                # one text per line",
        f'python {classifier} --jsonl < in.jsonl         # {{"id": ..., "text": ...}} a line',
    ]
    if merged_file:
        lines.append(f'python {classifier} --model {merged_file} --lora none "..."')
    lines += [
        "```",
        "",
        "```python",
        "from classify import Classifier",
        'label = Classifier(".").classify("a text to classify")',
        "```",
        "",
    ]
    return lines


def _grammar_lines(
    grammar: str | None, check: dict, base_file: str, adapter_file: str, label_sets: bool = False
):
    """How to serve the labels constrained to their text, and what that answered in the check."""
    if not grammar:
        return []
    allows = (
        "one or more of the labels' exact texts, each once, in the pilot's order and separated "
        "by `, ` (as the adapter was trained to answer)"
        if label_sets
        else "only the labels' exact text"
    )
    rate = check.get("constrained_agreement")
    scored = check.get("constrained_label_rate") is not None  # label scoring, not generation
    measured = (
        "The serving check decoded the validation split this way (greedy, in llama.cpp's "
        f"grammar sampler over this very file): {rate:.1%} of the answers are the "
        + (
            "label lorapilot scored. A grammar makes every answer a label, not the scored one: it "
            "lets the model pick the likeliest allowed token one at a time, which can commit "
            "to the first token of another label."
            if scored
            else ("labels" if label_sets else "label") + " lorapilot generated."
        )
        if rate is not None
        else ""
    )
    return [
        "## Constrained to the labels",
        "",
        f"`{grammar}` allows {allows}, then the end of the turn. {measured}",
        "",
        "```bash",
        f"llama-server -m {base_file} --lora {adapter_file} --grammar-file {grammar} --temp 0",
        f"llama-cli -m {base_file} --lora {adapter_file} --grammar-file {grammar} --temp 0",
        "```",
        "",
        "Ollama takes no grammar file: its `format` (a JSON schema) answers in JSON, through "
        "another grammar, which this check does not decode.",
        "",
    ]


def _fields_lines(grammar, schema: str, check: dict, base_file: str, adapter_file: str):
    """How to serve an extraction's answers held to their fields or schema, and what the
    serving check's decoding under each gave."""
    configs = check.get("configs") or []
    by_schema = next(
        (c["schema_constrained"] for c in configs if c.get("schema_constrained")), None
    )
    outside = [
        f"`{schema}` states the answer as a JSON Schema, for llama-cpp-python's server "
        f'(`response_format={{"type": "json_object", "schema": <{schema}>}}`), Ollama '
        f'(`"format": <{schema}>` in /api/chat) or another OpenAI-style `response_format`. '
        "Each server converts it to a grammar by its own rules (whitespace, key order).",
        "",
    ]
    if by_schema:
        outside += [
            f"The serving check decoded the validation split under `{schema}` as "
            f"llama-cpp-python's `json_schema_to_gbnf` converts it (greedy, llama.cpp's grammar "
            f"sampler): {_held(by_schema)}. Ollama's and vLLM's conversions are not decoded here.",
            "",
        ]
    if not grammar:
        return ["## Constrained to the schema", "", *outside]
    held = next((c["constrained"] for c in configs if c.get("constrained")), None)
    measured = (
        [
            f"The serving check decoded the validation split under `{grammar}` (greedy, in "
            f"llama.cpp's grammar sampler over this very file): {_held(held)}.",
            "",
        ]
        if held
        else []
    )
    return [
        "## Constrained to the fields",
        "",
        f"`{grammar}` allows one JSON object with the pilot's fields in the order, types and "
        "layout the adapter was trained on (an absent optional field as null). The pilot was "
        "decided on free generation; a grammar changes no answer the model already writes "
        "validly, and forces the others into shape.",
        "",
        *measured,
        "```bash",
        f"llama-server -m {base_file} --lora {adapter_file} --grammar-file {grammar} --temp 0",
        "```",
        "",
        *outside,
    ]


def _held(h: dict) -> str:
    """One constrained decoding's figures: answers as lorapilot's and as the free ones, and
    the pilot's metrics under it beside free decoding and lorapilot."""
    shown = "; ".join(
        f"{k} {v['llama_cpp_constrained']:.3f} (free {v['llama_cpp']:.3f}, lorapilot "
        f"{v['lorapilot']:.3f})"
        for k, v in h["metrics"].items()
        if all(isinstance(v.get(x), int | float) for x in ("lorapilot", "llama_cpp"))
        and isinstance(v.get("llama_cpp_constrained"), int | float)
    )
    return (
        f"{h['n_same']} of {h['n']} answers are lorapilot's, {h['n_same_as_free']} the free "
        f"answer; {shown}"
    )


def _generation_lines(check: dict) -> list[str]:
    """Label scoring: how the labels fare generated freely, as this Modelfile serves them."""
    rate = check.get("generation_agreement")
    if rate is None:
        return []
    lines = [
        "",
        "lorapilot predicts a label by scoring the labels; this Modelfile (and `llama-cli`) "
        "generates the answer instead. Generated greedily on the validation split, "
        f"{rate:.1%} of the answers are the label lorapilot scored and "
        f"{check.get('generation_label_rate', 0):.1%} are one of the labels.",
    ]
    held = check.get("constrained_agreement")
    if held is not None:
        lines[-1] += (
            " Constrained to the labels (`labels.gbnf`, below), "
            f"{held:.1%} are the scored label and {check.get('constrained_label_rate', 0):.1%} "
            "a label."
        )
    for w in check.get("warnings") or []:
        lines += ["", f"**Warning**: {w}."]
    return lines


def near_ties_of(check: dict) -> int:
    """Label scoring: the served answers that differ only within the runtimes' score noise,
    counted as agreeing (over the served configurations)."""
    return sum((c.get("ties") or {}).get("near_ties", 0) for c in check.get("configs") or [])


def agreement_of(check: dict) -> str:
    """What the serving check's agreement counts: examples, or for a generation task output
    tokens, each predicted from lorapilot's preceding tokens."""
    n = check.get("n_examples", 0)
    if check.get("agreement_unit") == "tokens":
        return (
            f"of the output tokens of {n} validation answers, each from the same preceding tokens"
        )
    if near_ties_of(check):
        return (
            f"on {n} validation examples, near-ties within the two runtimes' score noise "
            "counted as agreeing"
        )
    return f"on {n} validation examples"
