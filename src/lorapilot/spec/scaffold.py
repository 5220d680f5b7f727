"""`lorapilot init NAME --task ...`: a new pilot folder with a commented spec and a tiny data
file (for images, a folder of drawn shapes), so a user can run the whole protocol before
bringing their own data."""

from __future__ import annotations

import json
import random
from pathlib import Path

from lorapilot.errors import UsageError
from lorapilot.fsutil import atomic_write_text
from lorapilot.spec import _NAME_RE, load_spec_file

CLASSIFICATION_YAML = """\
# {name}: a lorapilot pilot. Edit, then: lorapilot check {name} && lorapilot run {name}
name: {name}
# The behaviour to improve, stated before any training (pre-registration).
hypothesis: >-
  A LoRA adapter on the base model classifies messages into the right category clearly
  better than the base model prompted zero-shot, without any category getting worse.
task:
  kind: classification
  labels: [praise, complaint, question]
  # The system turn; {{labels}} is replaced by the label list.
  system: "Classify the customer message. Answer with exactly one of: {{labels}}."
  # The user turn; {{text}} is the input text.
  template: "Message:\\n{{text}}\\n\\nCategory:"
model:
  base: smollm2-135m-instruct   # `lorapilot model fetch` installs it; or a local HF folder
  # chat_template: plain        # a base without a chat template (### Input / ### Response)
data:
  source: "Example messages written by lorapilot init (replace with your data)"
  permission: "Synthetic example data; free to use"
  file: data/examples.jsonl     # JSONL/CSV/Parquet; split into train/val/test by lorapilot
  fields: {{text: text, label: label, id: id}}   # an input in several columns: in place of
  #   text, text_template: "Subject: {{subject}}\\n\\n{{body}}"
  split: {{seed: 0, val: 0.2, test: 0.2}}   # add `group: customer` to keep each value of
  #                             # that column in one split (one customer's messages together)
  # unlisted_labels: drop       # leave out rows whose label is not in task.labels, counted
  max_length: 128
adapter: {{method: lora, r: 8, alpha: 16, dropout: 0.0, target_modules: all-linear}}
train: {{seed: 0, epochs: 6, lr: 0.001, micro_batch: 8, precision: auto}}
# GO when the adapter gains at least this much on the validation split...
success: {{metric: macro_f1, min_gain: 0.10}}
# ...and no guard fails.
guards:
  - {{metric: per_category.f1, max_drop: 0.05}}
limits: {{memory_gb: 8, time_hours: 1, usd_per_hour: 0, rental_days: 3}}
"""

EXTRACTION_YAML = """\
# {name}: a lorapilot pilot. Edit, then: lorapilot check {name} && lorapilot run {name}
name: {name}
hypothesis: >-
  A LoRA adapter on the base model extracts the order fields as valid JSON clearly better
  than the base model prompted zero-shot.
task:
  kind: extraction
  fields:
    - {{name: customer, type: string, required: true}}
    - {{name: quantity, type: integer, required: true}}
    - {{name: product, type: string, required: true}}
    - {{name: deadline, type: date, required: false}}
  system: "Extract the order as one JSON object with the keys {{fields}}.
    Use null when a field is absent."
  template: "Order:\\n{{text}}\\n\\nJSON:"
model:
  base: smollm2-135m-instruct
data:
  source: "Example orders written by lorapilot init (replace with your data)"
  permission: "Synthetic example data; free to use"
  file: data/examples.jsonl
  fields: {{text: text, target: target, id: id}}
  split: {{seed: 0, val: 0.2, test: 0.2}}
  max_length: 192
adapter: {{method: lora, r: 8, alpha: 16, dropout: 0.0, target_modules: all-linear}}
train: {{seed: 0, epochs: 3, lr: 0.0005, micro_batch: 8, precision: auto}}
eval: {{mode: generate, batch_size: 16}}
success: {{metric: field_f1, min_gain: 0.10}}
guards:
  - {{metric: json_valid_rate, min: 0.9}}
limits: {{memory_gb: 8, time_hours: 1, usd_per_hour: 0, rental_days: 3}}
"""


def _classification_rows(rng: random.Random) -> list[dict]:
    things = [
        "delivery",
        "support team",
        "app",
        "invoice",
        "new feature",
        "checkout",
        "refund",
        "manual",
    ]
    praise = [
        "I love the {t}, thank you!",
        "The {t} worked perfectly today.",
        "Great job on the {t}.",
        "Really happy with the {t} so far.",
    ]
    complaint = [
        "The {t} is broken again and I am annoyed.",
        "Your {t} wasted an hour of my day.",
        "Terrible experience with the {t}.",
        "The {t} failed twice, please fix it.",
    ]
    question = [
        "How do I change the {t}?",
        "Can you tell me where the {t} is?",
        "Is the {t} available on weekends?",
        "What does the {t} cost?",
    ]
    rows = []
    for label, pats in (("praise", praise), ("complaint", complaint), ("question", question)):
        for p in pats:
            for t in things:
                rows.append({"text": p.format(t=t), "label": label})
    return rows


MULTI_LABEL_YAML = """\
# {name}: a lorapilot pilot. Edit, then: lorapilot check {name} && lorapilot run {name}
name: {name}
hypothesis: >-
  A LoRA adapter on the base model names every topic a customer message raises (one or
  more) clearly better than the base model prompted zero-shot.
task:
  kind: multi_label_classification
  labels: [billing, delivery, product, account]
  # The answer is every label that applies, in this order, separated by ", ".
  system: "Name every topic the message raises, separated by commas, from: {{labels}}."
  template: "Message:\\n{{text}}\\n\\nTopics:"
model:
  base: smollm2-135m-instruct
data:
  source: "Example messages written by lorapilot init (replace with your data)"
  permission: "Synthetic example data; free to use"
  file: data/examples.jsonl
  # the label column: a JSON list, or text split on label_separator (a CSV cell "a|b")
  fields: {{text: text, label: labels, id: id}}   # label_separator: "|"
  split: {{seed: 0, val: 0.2, test: 0.2}}   # stratified on each example's rarest label
  max_length: 128
adapter: {{method: lora, r: 8, alpha: 16, dropout: 0.0, target_modules: all-linear}}
train: {{seed: 0, epochs: 4, lr: 0.001, micro_batch: 8, precision: auto}}
# micro_f1 pools every (message, topic) decision; macro_f1 averages the topics
success: {{metric: macro_f1, min_gain: 0.10}}
guards:
  - {{metric: per_category.f1, max_drop: 0.05}}
limits: {{memory_gb: 8, time_hours: 1, usd_per_hour: 0, rental_days: 3}}
"""


def _multi_label_rows(rng: random.Random) -> list[dict]:
    said = {
        "billing": ["I was charged twice this month", "the invoice shows the wrong amount",
                    "my refund has not arrived"],
        "delivery": ["the parcel came a week late", "the courier left the box in the rain",
                     "tracking has not moved since Monday"],
        "product": ["the blender leaks from the base", "the lid cracked on the first day",
                    "the charger stopped working"],
        "account": ["I cannot log in to my account", "the password reset email never came",
                    "please change the email on my account"],
    }  # fmt: skip
    topics = list(said)
    rows = []
    for first in topics:
        for a in said[first]:
            rows.append({"text": a[0].upper() + a[1:] + ".", "labels": [first]})
            for second in topics[topics.index(first) + 1 :]:
                for b in said[second]:
                    rows.append({"text": f"{a[0].upper() + a[1:]}, and {b}.",
                                 "labels": [first, second]})  # fmt: skip
    return rows


IMAGE_YAML = """\
# {name}: a lorapilot image pilot. Edit, then: lorapilot check {name} && lorapilot run {name}
name: {name}
hypothesis: >-
  A LoRA adapter (with a new classification head) on a small pretrained ImageNet model tells
  the shapes apart clearly better than a linear probe on its frozen features, and no class
  gets worse.
task:
  kind: image_classification
  labels: [circle, square, triangle]
  image:
    size: 64                  # side of the square input
    resize: shorter_side      # or stretch, pad
    crop: center              # or none
    mode: RGB
    augment: [hflip]          # training only
model:
  base: efficientnet-lite0    # `lorapilot model fetch --image` installs it; or a local HF folder
data:
  source: "Shapes drawn by lorapilot init (replace with your images)"
  permission: "Synthetic example images; free to use"
  file: data/images           # a folder per label: data/images/<label>/*.png
  # file: data/images.csv     # or a CSV/JSONL: image (a path from this folder), label, ...
  # unlisted_labels: drop     # leave out rows whose label is not in task.labels, counted
  split: {{seed: 0, val: 0.2, test: 0.2}}
  # split: {{seed: 0, val: 0.2, test: 0.2, group: owner}}   # a CSV column: each owner's
  #                           # images in one split (one person's photos share a room)
adapter: {{r: 8, alpha: 16}}
train: {{lr: 3.0e-3, epochs: 3, micro_batch: 8}}
success: {{metric: macro_f1, min_gain: 0.05}}
guards:
  - {{metric: per_category.f1, max_drop: 0.05}}
limits: {{memory_gb: 8, time_hours: 1, usd_per_hour: 0, rental_days: 3}}
"""
IMAGES_PER_LABEL = 15


def _shape_images(folder: Path, rng: random.Random) -> int:
    """Coloured circles, squares and triangles on a plain background, 64x64 PNG, written to
    data/images/<label>/: a pilot that runs end to end before the user's images arrive."""
    from PIL import Image, ImageDraw

    n = 0
    for label in ("circle", "square", "triangle"):
        for i in range(IMAGES_PER_LABEL):
            bg = tuple(rng.randint(200, 255) for _ in range(3))
            fg = tuple(rng.randint(0, 150) for _ in range(3))
            img = Image.new("RGB", (64, 64), bg)
            draw = ImageDraw.Draw(img)
            r = rng.randint(12, 22)
            cx, cy = rng.randint(r + 2, 62 - r), rng.randint(r + 2, 62 - r)
            if label == "circle":
                draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fg)
            elif label == "square":
                draw.rectangle((cx - r, cy - r, cx + r, cy + r), fill=fg)
            else:
                draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fg)
            path = folder / "data" / "images" / label / f"{label}-{i:02d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp.png")
            img.save(tmp)
            tmp.replace(path)  # atomic, as every write here
            n += 1
    return n


FORMAT_YAML = """\
# {name}: a lorapilot pilot. Edit, then: lorapilot check {name} && lorapilot run {name}
name: {name}
hypothesis: >-
  A LoRA adapter on the base model answers in the required format (the working on one
  line, then a last line '#### <number>') far more often than the base model prompted
  zero-shot, without answering worse.
task:
  kind: format
  # The whole output must match; the group named `answer` is compared with the same group
  # of the target (answer_match), so the working may differ from the target's.
  regex: '(?s).*\\n#### (?P<answer>-?[0-9]+)'
  system: "Solve the problem. Show the calculation, then end with a line '#### <answer>'."
  template: "{{text}}"
model:
  base: smollm2-135m-instruct
data:
  source: "Example problems written by lorapilot init (replace with your data)"
  permission: "Synthetic example data; free to use"
  file: data/examples.jsonl
  fields: {{text: text, target: target, id: id}}
  split: {{seed: 0, val: 0.2, test: 0.2}}
  max_length: 160
adapter: {{method: lora, r: 8, alpha: 16, dropout: 0.0, target_modules: all-linear}}
train: {{seed: 0, epochs: 3, lr: 0.0005, micro_batch: 8, precision: auto}}
eval: {{mode: generate, batch_size: 16}}
success: {{metric: format_valid_rate, min_gain: 0.2}}
guards:
  - {{metric: answer_match, max_drop: 0.05}}
limits: {{memory_gb: 8, time_hours: 1, usd_per_hour: 0, rental_days: 3}}
"""


def _format_rows(rng: random.Random) -> list[dict]:
    items = ["apples", "tickets", "boxes", "books", "chairs", "lamps"]
    rows = []
    for _ in range(48):
        a, b, item = rng.randint(2, 90), rng.randint(2, 90), rng.choice(items)
        if rng.random() < 0.5:
            text = (
                f"A shop sold {a} {item} in the morning and {b} in the afternoon. "
                f"How many {item} did it sell?"
            )
            target = f"{a} + {b} = {a + b}\n#### {a + b}"
        else:
            a, b = max(a, b), min(a, b)
            text = f"A store had {a} {item} and sold {b}. How many {item} are left?"
            target = f"{a} - {b} = {a - b}\n#### {a - b}"
        rows.append({"text": text, "target": target})
    return rows


def _extraction_rows(rng: random.Random) -> list[dict]:
    names = ["Acme Ltd", "Birch & Co", "Cobalt GmbH", "Delta Foods", "Evergreen Inc", "Fjord AS"]
    products = ["steel bolts", "paper rolls", "coffee beans", "LED panels", "copper wire"]
    pats = [
        "{c} orders {q} boxes of {p}{d}.",
        "Please ship {q} units of {p} to {c}{d}.",
        "New order from {c}: {p}, quantity {q}{d}.",
        "{c} needs {q} x {p}{d}.",
    ]
    rows = []
    for i in range(48):
        c, p, q = rng.choice(names), rng.choice(products), rng.randint(2, 500)
        deadline = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}" if i % 2 else None
        d = f" by {deadline}" if deadline else ""
        rows.append(
            {
                "text": rng.choice(pats).format(c=c, q=q, p=p, d=d),
                "target": {"customer": c, "quantity": q, "product": p, "deadline": deadline},
            }
        )
    return rows


TASKS = (
    "classification",
    "multi_label_classification",
    "extraction",
    "format",
    "image_classification",
)
_TEXT = {  # the spec and the rows of each text task
    "classification": (CLASSIFICATION_YAML, _classification_rows),
    "multi_label_classification": (MULTI_LABEL_YAML, _multi_label_rows),
    "extraction": (EXTRACTION_YAML, _extraction_rows),
    "format": (FORMAT_YAML, _format_rows),
}


def init_pilot(name: str, task: str, parent: Path) -> dict:
    if not _NAME_RE.match(name):
        raise UsageError(f"init {name!r}: a pilot name is 1-64 of letters, digits, '.', '_', '-'")
    if task not in TASKS:
        raise UsageError(f"--task {task!r}: must be one of {', '.join(TASKS)}")
    folder = Path(parent) / name
    if folder.exists() and any(folder.iterdir()):
        raise UsageError(f"{folder}: exists and is not empty")
    rng = random.Random(0)
    if task == "image_classification":
        n = _shape_images(folder, rng)
        atomic_write_text(folder / "pilot.yaml", IMAGE_YAML.format(name=name))
        load_spec_file(folder / "pilot.yaml")  # what we scaffold must validate
        return {"pilot": str(folder), "spec": str(folder / "pilot.yaml"), "n_examples": n,
                "task": task}  # fmt: skip
    yaml_template, make_rows = _TEXT[task]
    rows = make_rows(rng)
    rng.shuffle(rows)
    seen, data = set(), []
    for i, r in enumerate(rows):
        if r["text"] not in seen:
            seen.add(r["text"])
            data.append({"id": f"ex{i:03d}", **r})
    yaml_text = yaml_template.format(name=name)
    atomic_write_text(
        folder / "data" / "examples.jsonl", "".join(json.dumps(r) + "\n" for r in data)
    )
    atomic_write_text(folder / "pilot.yaml", yaml_text)
    load_spec_file(folder / "pilot.yaml")  # what we scaffold must validate
    return {
        "pilot": str(folder),
        "spec": str(folder / "pilot.yaml"),
        "n_examples": len(data),
        "task": task,
    }
