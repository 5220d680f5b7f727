"""pilot.yaml for what `lorapilot init --from` found in the user's data: every inferred key
with its reason as a comment beside it, the rest the defaults a first pilot wants. Pure text
rendering (the step reads the data, counts tokens and validates what is written)."""

from __future__ import annotations

import json
import textwrap
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:  # annotations only: the spec layer does not import the data layer
    from lorapilot.data.image_folder import ImageFolder
    from lorapilot.data.infer import Inferred

_SUCCESS = {
    "classification": ("macro_f1", "{metric: per_category.f1, max_drop: 0.05}"),
    "multi_label_classification": ("macro_f1", "{metric: per_category.f1, max_drop: 0.05}"),
    "extraction": ("field_f1", "{metric: json_valid_rate, min: 0.9}"),
    "format": ("exact_match", "{metric: format_valid_rate, max_drop: 0.05}"),
}
_SYSTEM = {
    "classification": "Classify the text. Answer with exactly one of: {labels}.",
    "multi_label_classification": "Name every label that applies, separated by commas, from: "
    "{labels}.",
    "extraction": "Extract one JSON object with the keys {fields}. Use null when a field is "
    "absent.",
    "format": "Answer the request.",
}
_DOES = {
    "classification": "labels each text with the right one of its {n} labels",
    "multi_label_classification": "names every one of its {n} labels that applies to a text",
    "extraction": "extracts the fields ({fields}) as valid JSON",
    "format": "answers like the data's targets",
}


def val_fraction(n_rows: int) -> float:
    """data.split.val (and test) for a file lorapilot splits: 0.2 of a small set, else 0.1."""
    return 0.2 if n_rows < 1000 else 0.1


def image_val_fraction(n_images: int) -> float:
    """data.split.val (and test) for images lorapilot splits: 0.2 of a small set, else 0.15."""
    return 0.2 if n_images < 1000 else 0.15


def field_map(found: Inferred) -> dict:
    if found.image:  # a table of image paths, or of ids the template makes paths
        key = "image_template" if found.image_template else "image"
        return {key: found.image_template or found.image, "label": found.answer, "id": found.id}
    if found.messages:
        return {"messages": found.messages, "id": found.id}
    key = "target" if found.task in ("extraction", "format") else "label"
    return {"text": found.text, key: found.answer, "id": found.id}


def _q(value: str) -> str:
    """A YAML scalar for any string: JSON's double-quoted form is YAML's too."""
    return json.dumps(value, ensure_ascii=False)


def _wrapped(items: list[str], indent: str, width: int = 92) -> str:
    """A YAML flow list over as many lines as it needs."""
    lines, line = [], "["
    for i, item in enumerate(items):
        piece = _q(item) + ("]" if i == len(items) - 1 else ", ")
        if len(line) + len(piece) > width and line.strip() != "[":
            lines.append(line.rstrip())
            line = indent + "  "
        line += piece
    lines.append(line)
    return "\n".join(lines)


def _not_worse(found: Inferred) -> str:
    if not found.labels:
        return "."
    if found.thin_validation:
        return ", without losing accuracy."
    return ", without any label getting worse."


def system_prompt(found: Inferred) -> str:
    """task.system: the data's own system turn, else one that says the task (and, for a
    format task with a final-line convention, asks for it)."""
    if found.system:
        return found.system
    if found.task == "format" and found.regex:
        return f"Answer the request. End with a line '{found.final_line}<number>'."
    return _SYSTEM[found.task]


def text_yaml(
    name: str,
    found: Inferred,
    names: dict[str, str],
    base: str,
    length: tuple[int, str],
    source: str | None = None,
    permission: str | None = None,
) -> str:
    """pilot.yaml for what the data holds, each inference commented beside its key;
    `names`: split -> the copied file's name in data/; `length`: data.max_length and how
    it was found."""
    kind = found.task
    system = system_prompt(found)
    metric, guard = _SUCCESS[kind]
    if kind == "format" and found.regex:  # the format is the gain; the answers must hold
        metric, guard = "format_valid_rate", "{metric: answer_match, max_drop: 0.05}"
    why_guard = []
    if found.thin_validation:  # per label, some could not be judged: a pooled guard
        pooled = "micro_f1" if kind == "multi_label_classification" else "accuracy"
        guard = f"{{metric: {pooled}, max_drop: 0.02}}"
        n_thin = len(found.thin_validation)
        why_guard = [
            f"# per-label guards: {n_thin} labels have too few validation examples to judge "
            "(see the warnings); a pooled guard instead"
        ]
    does = _DOES[kind].format(
        n=len(found.labels or []), fields=", ".join(f["name"] for f in found.fields or [])
    )
    out = [
        f"# {name}: scaffolded by `lorapilot init --from` from your data. Read every line",
        f"# marked `inferred`, then: lorapilot check {name} && lorapilot run {name}",
        f"name: {name}",
        "# The behaviour to improve, stated before any training: write what you expect.",
        "hypothesis: >-",
        *textwrap.wrap(
            f"A LoRA adapter on the base model {does} clearly better than the base model "
            "prompted zero-shot" + _not_worse(found),
            width=90,
            initial_indent="  ",
            subsequent_indent="  ",
        ),
        "task:",
        f"  kind: {kind}   # inferred: {_reason(found, 'task')}",
    ]
    if found.labels:
        (most, n_most), *_, (least, n_least) = found.label_counts.items()
        spread = (
            f"{n_most} examples each"
            if n_most == n_least
            else f"the most examples: {most} ({n_most}), the fewest: {least} ({n_least})"
        )
        out.append(f"  # inferred: {len(found.labels)} labels; {spread}")  # fmt: skip
        out.append(f"  labels: {_wrapped(found.labels, '  ')}")
    if found.fields:
        out.append("  # inferred from the targets: every key, its type, required when every "
                   "target fills it")  # fmt: skip
        out.append("  fields:")
        block = yaml.safe_dump(
            found.fields, sort_keys=False, default_flow_style=None, allow_unicode=True, width=88
        )  # a field of scalars on one line, a nested one in blocks
        out += ["    " + line for line in block.splitlines()]
    if kind == "format" and found.regex:
        out.append(f"  # inferred: {_reason(found, 'regex')}; the group `answer` is compared "
                   "(answer_match)")  # fmt: skip
        out.append(f"  regex: {_q(found.regex)}")
    elif kind == "format":
        out.append("  # EDIT: the format every answer must follow; as written any non-empty "
                   "answer is valid.")  # fmt: skip
        out.append("  # A named group `answer` marks the part compared (answer_match).")
        out.append("  regex: '(?s).+'")
    why = "the data's own system turn" if found.system else "a default: say what the task is"
    out.append(f"  system: {_q(system)}   # {why}")
    out.append('  template: "{text}"   # the user turn; {text} is the input')
    out += [
        "model:",
        f"  base: {base}   # `lorapilot model fetch` installs the default; or a local HF folder",
        "  # chat_template: plain   # for a base without a chat template",
        "data:",
        f"  source: {_q(source)}"
        if source
        else "  # source: where the data comes from (a URL, a system, a date): `data` needs it",
        f"  permission: {_q(permission)}"
        if permission
        else "  # permission: the licence or internal approval to use it: `data` needs it",
    ]
    out.append(_files_line(names, "file, split by lorapilot"))
    out.append(_fields_line(field_map(found), found))
    if found.other_text_columns:
        cols = ", ".join(found.other_text_columns[:4])
        out.append(f"  # other text columns: {cols}; to read several as the input, use")
        out.append('  # text_template: "Subject: {subject}\\n\\n{body}" in place of text')
    if "val" not in names:
        out.append(_split_line(found, names, val_fraction(found.n_rows)))
        out.append("  leakage: together   # copies of a text are kept in one split, never "
                   "across (where lorapilot splits)")  # fmt: skip
    if found.no_answer:
        out.append(f"  # on_error: skip   # {found.no_answer} rows have no answer: set aside, "
                   "counted and named by `data` (without it, `data` refuses them)")  # fmt: skip
    max_length, how = length
    out.append(f"  max_length: {max_length}   # {how}; `lorapilot data` names any input it cuts")
    generate = kind in ("extraction", "format")
    out += [
        "adapter: {method: lora, r: 16, alpha: 32, dropout: 0.0, target_modules: all-linear}",
        "train: {seed: 0, epochs: "
        + ("3" if found.n_rows < 2000 else "1")
        + ", lr: 0.0005, micro_batch: 8, precision: auto}",
        *(["eval: {mode: generate, batch_size: 16}"] if generate else []),
        "# GO when the adapter gains at least this much on the validation split...",
        f"success: {{metric: {metric}, min_gain: 0.10}}",
        "# ...and no guard fails.",
        *why_guard,
        "guards:",
        f"  - {guard}",
        "limits: {memory_gb: 8, time_hours: 1, usd_per_hour: 0, rental_days: 3}",
    ]
    if found.warnings:
        out.append("# Warnings when this was written:")
        out += [f"#   - {w}" for w in found.warnings]
    return "\n".join(out) + "\n"


def _files_line(names: dict[str, str], what: str) -> str:
    """data.file (one file lorapilot splits, `what` it is) or data.files, as copied."""
    if "file" in names:
        return f"  file: {_q('data/' + names['file'])}   # a copy of your {what}"
    files = ", ".join(f"{s}: {_q('data/' + n)}" for s, n in names.items())
    return f"  files: {{{files}}}"


def _fields_line(fields: dict, found: Inferred) -> str:
    said = ", ".join(f"{k}: {_q(v) if v else 'null'}" for k, v in fields.items())
    return f"  fields: {{{said}}}   # inferred: {_fields_reason(found)}"


def _split_line(found: Inferred, names: dict[str, str], frac: float) -> str:
    """data.split where lorapilot splits: val (and test, for one file) at `frac`, the
    inferred group."""
    test = f", test: {frac}" if "file" in names else ""  # else: the test file, or none
    group = f", group: {_q(found.group)}" if found.group else ""
    why = (
        f"   # inferred: {_reason(found, 'split.group')}" if found.group
        else "   # stratified by label" if found.labels else ""
    )  # fmt: skip
    return f"  split: {{seed: 0, val: {frac}{test}{group}}}{why}"


def _fields_reason(found: Inferred) -> str:
    said = [r for r in found.reasons if r.startswith(("input: ", "chat rows: "))]
    return said[0] if said else ""


def _reason(found: Inferred, key: str) -> str:
    """The reason given for `key` ("task: format (...)" -> "format (...)")."""
    return next((r.split(": ", 1)[1] for r in found.reasons if r.startswith(key + ": ")), "")


def image_yaml(
    name: str,
    image: ImageFolder,
    base: str,
    source: str | None,
    permission: str | None,
    table: tuple[Inferred, dict[str, str]] | None = None,
) -> str:
    """pilot.yaml for an image classification: from a folder per label (`image`), or from a
    table of image paths and labels (`table`: what was inferred from its rows, and split ->
    the copied table's name in data/; `image` then holds the labels counted and the sizes
    sampled)."""
    labels = image.labels
    counts = sorted(image.counts.values())
    found, names = table if table is not None else (None, {})
    where = (
        f"column {found.answer!r}" if found is not None else "folder names"
    )  # fmt: skip
    out = [
        f"# {name}: scaffolded by `lorapilot init --from` from your images. Read every line",
        f"# marked `inferred`, then: lorapilot check {name} && lorapilot run {name}",
        f"name: {name}",
        "# The behaviour to improve, stated before any training: write what you expect.",
        "hypothesis: >-",
        *textwrap.wrap(
            "A LoRA adapter (with a new classification head) on the base model tells the "
            f"{len(labels)} classes apart clearly better than a linear probe on its frozen "
            "features, and no class gets worse.",
            width=90, initial_indent="  ", subsequent_indent="  ",
        ),
        "task:",
        "  kind: image_classification   # inferred: "
        + (
            "a folder per label" if found is None
            else f"column {found.image!r} names image files" if found.image_template
            else f"column {found.image!r} holds image paths"
        ),
        f"  # inferred: {len(labels)} labels ({where}), "
        + (f"{counts[0]} images each" if counts[0] == counts[-1] else
           f"{counts[0]} to {counts[-1]} images each"),
        f"  labels: {_wrapped(labels, '  ')}",
        f"  # the model's input, {image.size} px a side (smaller is faster)"
        + (f"; inferred from {image.seen}" if image.seen else ""),
        f"  image: {{size: {image.size}, resize: shorter_side, crop: center, mode: RGB, "
        "augment: [hflip]}",
        "model:",
        f"  base: {base}   # `lorapilot model fetch --image` installs the default",
        "data:",
        f"  source: {_q(source)}" if source else
        "  # source: where the images come from (a URL, a system, a date): `data` needs it",
        f"  permission: {_q(permission)}" if permission else
        "  # permission: the licence or internal approval to use them: `data` needs it",
    ]  # fmt: skip
    if found is not None:
        out += _table_data(found, names)
    elif image.splits:
        files = ", ".join(f"{s}: data/images/{d}" for s, d in image.splits.items())
        out.append(f"  files: {{{files}}}   # inferred: your split folders")
        if "val" not in image.splits:
            out.append("  split: {seed: 0, val: 0.15}")
    else:
        out.append("  file: data/images   # a copy of your folder, split by lorapilot")
        frac = image_val_fraction(sum(counts))
        out.append(f"  split: {{seed: 0, val: {frac}, test: {frac}}}   # stratified by label")
        out.append("  leakage: together   # copies of an image are kept in one split")
    refused = [w for w in image.warnings if "on_error" in w] if found else image.warnings
    if refused:
        out.append("  # on_error: skip   # set aside what is not a labelled image, counted")
    thin = found is not None and found.thin_validation  # labels too rare to judge one by one
    out += [
        "adapter: {r: 16, alpha: 32}",
        "train: {lr: 3.0e-3, epochs: 3, micro_batch: 16}",
        "success: {metric: macro_f1, min_gain: 0.05}",
        "guards:",
        "  - {metric: accuracy, max_drop: 0.02}"
        if thin
        else "  - {metric: per_category.f1, max_drop: 0.05}",
        "limits: {memory_gb: 8, time_hours: 1, usd_per_hour: 0, rental_days: 3}",
    ]
    if image.warnings:
        out.append("# Warnings when this was written:")
        out += [f"#   - {w}" for w in image.warnings]
    return "\n".join(out) + "\n"


def _table_data(found: Inferred, names: dict[str, str]) -> list[str]:
    """data: for a table of image paths: the copied table(s), its columns, the split."""
    out = [_files_line(names, "table, split by lorapilot; the images copied beside it")]
    out.append(_fields_line(field_map(found), found))
    if "val" not in names:
        out.append(_split_line(found, names, image_val_fraction(found.n_rows)))
        out.append("  leakage: together   # copies of an image are kept in one split")
    return out
