"""The shipped example pilots: valid specs, reproducible data, and data that poses a real task."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re
import subprocess
import sys
from collections import Counter, defaultdict
from itertools import combinations
from pathlib import Path

import pytest

from lorapilot.spec import load_spec_file

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TICKETS_DIR = EXAMPLES / "ticket-triage"
INVOICES_DIR = EXAMPLES / "invoice-fields"
TICKETS = TICKETS_DIR / "data" / "tickets.jsonl"
INVOICES = INVOICES_DIR / "data" / "invoices.jsonl"
INVOICE_KEYS = [
    "vendor", "invoice_number", "date", "total", "currency", "due_date", "po_number", "line_items",
]  # fmt: skip
ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
WORD_RE = re.compile(r"[a-z0-9']+")
NEAR_DUP_JACCARD = 0.8  # the default data.near_dup_threshold of a pilot spec


def _read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _words(text: str) -> set[str]:
    return set(WORD_RE.findall(text.lower()))


def _max_jaccard(texts: list[str]) -> tuple[float, str, str]:
    sets = [frozenset(_words(t)) for t in texts]
    best = (0.0, "", "")
    for i, j in combinations(range(len(sets)), 2):
        a, b = sets[i], sets[j]
        inter = len(a & b)
        if inter / (len(a) + len(b) - inter) > best[0]:
            best = (inter / (len(a) + len(b) - inter), texts[i], texts[j])
    return best


@pytest.fixture(scope="module")
def tickets() -> list[dict]:
    return _read_jsonl(TICKETS)


@pytest.fixture(scope="module")
def invoices() -> list[dict]:
    return _read_jsonl(INVOICES)


# --------------------------------------------------------------------------- both examples


@pytest.mark.parametrize("folder", [TICKETS_DIR, INVOICES_DIR], ids=lambda p: p.name)
def test_spec_is_valid_and_points_at_the_data(folder: Path) -> None:
    spec, raw = load_spec_file(folder / "pilot.yaml")
    assert spec.name == folder.name
    assert spec.data.file and (folder / spec.data.file).is_file()
    assert spec.model.base == "smollm2-135m-instruct"
    assert spec.success is not None and spec.success.min_gain > 0
    assert spec.guards


@pytest.mark.parametrize(
    "folder, data",
    [(TICKETS_DIR, TICKETS), (INVOICES_DIR, INVOICES)],
    ids=["ticket-triage", "invoice-fields"],
)
def test_generator_is_deterministic(folder: Path, data: Path, tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(folder / "generate.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert (tmp_path / data.name).read_bytes() == data.read_bytes(), (
        f"{data} is stale: rerun python {folder / 'generate.py'}"
    )


@pytest.mark.parametrize("path", [TICKETS, INVOICES], ids=["tickets", "invoices"])
def test_ids_unique_and_no_duplicate_texts(path: Path) -> None:
    rows = _read_jsonl(path)
    ids = [r["id"] for r in rows]
    assert len(set(ids)) == len(ids)
    texts = [r["text"] for r in rows]
    assert len(set(texts)) == len(texts)
    normalized = [" ".join(WORD_RE.findall(t.lower())) for t in texts]
    assert len(set(normalized)) == len(normalized), "texts differ only in case or punctuation"


@pytest.mark.parametrize("path", [TICKETS, INVOICES], ids=["tickets", "invoices"])
def test_no_near_duplicates(path: Path) -> None:
    score, a, b = _max_jaccard([r["text"] for r in _read_jsonl(path)])
    assert score < NEAR_DUP_JACCARD, f"near duplicates ({score:.2f}):\n{a}\n---\n{b}"


# --------------------------------------------------------------------------- ticket-triage


def test_ticket_counts(tickets: list[dict]) -> None:
    spec, _ = load_spec_file(TICKETS_DIR / "pilot.yaml")
    counts = Counter(r["label"] for r in tickets)
    assert len(tickets) >= 600
    assert set(counts) == set(spec.task.labels)
    assert len(counts) >= 5 and min(counts.values()) >= 80, counts
    assert all(set(r) == {"id", "text", "label"} for r in tickets)
    assert all(re.fullmatch(r"t\d{4}", r["id"]) for r in tickets)


def test_ticket_lengths_span_short_to_paragraph(tickets: list[dict]) -> None:
    n_words = [len(r["text"].split()) for r in tickets]
    assert min(n_words) < 12
    assert max(n_words) > 60
    assert max(n_words) <= 150
    assert sorted(n_words)[len(n_words) // 2] <= 80, "most tickets should stay under ~80 words"


def test_no_single_keyword_gives_the_label_away(tickets: list[dict]) -> None:
    """A word that is a strong cue for a category (precision >= 0.8) covers < 70% of it.

    In particular the category's most label-predictive word (among words in >= 20 tickets)
    leaves most of the category to be recognised by intent, not by one keyword.
    """
    n_label = Counter(r["label"] for r in tickets)
    df: Counter[str] = Counter()
    df_label: dict[str, Counter[str]] = defaultdict(Counter)
    for r in tickets:
        for w in _words(r["text"]):
            df[w] += 1
            df_label[w][r["label"]] += 1
    frequent = [w for w, n in df.items() if n >= 20]
    for label in n_label:
        scored = [
            (df_label[w][label] / df[w], df_label[w][label] / n_label[label], w) for w in frequent
        ]
        precision, coverage, word = max(scored)
        assert coverage < 0.7, f"{label}: the most predictive word {word!r} covers {coverage:.0%}"
        for precision, coverage, word in scored:
            if precision >= 0.8:
                assert coverage < 0.7, (
                    f"{label}: {word!r} has precision {precision:.0%} and covers {coverage:.0%}"
                )


def test_shared_vocabulary_across_categories(tickets: list[dict]) -> None:
    """Words that sound like one queue appear in several, so intent decides."""

    def labels_with(phrase: str) -> set[str]:
        return {r["label"] for r in tickets if phrase in r["text"].lower()}

    assert {"billing", "refund"} <= labels_with("charged")
    assert {"shipping", "refund"} <= labels_with("order")
    assert {"account", "technical"} <= labels_with("login") | labels_with("log in")
    assert {"feature_request", "technical", "account"} <= labels_with("can you add")
    assert {"refund", "billing", "shipping"} <= labels_with("refund")


# --------------------------------------------------------------------------- invoice-fields

_MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]


def _date_renderings(iso: str) -> set[str]:
    d = dt.date.fromisoformat(iso)
    mon = _MONTHS[d.month - 1]
    day_suffix = "th" if 11 <= d.day <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(d.day % 10, "th")
    return {
        iso,
        f"{mon} {d.day}, {d.year}",
        f"{mon[:3]} {d.day}, {d.year}",
        f"{d.day} {mon} {d.year}",
        f"{d.day} {mon[:3]} {d.year}",
        f"{d.day}{day_suffix} {mon} {d.year}",
        f"{d.day:02d}-{mon[:3]}-{d.year}",
        f"{d.month:02d}/{d.day:02d}/{d.year}",
        f"{d.day:02d}/{d.month:02d}/{d.year}",
        f"{d.day:02d}.{d.month:02d}.{d.year}",
        f"{d.year}/{d.month:02d}/{d.day:02d}",
    }


def _shows_date(text: str, iso: str) -> bool:
    low = text.lower()
    return any(r.lower() in low for r in _date_renderings(iso))


def _shows_amount(text: str, amount: float) -> bool:
    """The total's digits appear in the text, whatever the separators ('1.234,50', "1'234.50")."""
    digits = f"{amount:.2f}".replace(".", "") if amount != int(amount) else str(int(amount))
    cents = f"{amount:.2f}".replace(".", "")
    squeezed = re.sub(r"(?<=\d)[,.' ](?=\d)", "", text)
    return bool(re.search(rf"(?<!\d)({digits}|{cents})(?!\d)", squeezed))


def test_invoice_counts_and_shape(invoices: list[dict]) -> None:
    spec, _ = load_spec_file(INVOICES_DIR / "pilot.yaml")
    assert len(invoices) >= 400
    assert [f.name for f in spec.task.fields] == INVOICE_KEYS
    for r in invoices:
        assert set(r) == {"id", "text", "target"}
        assert re.fullmatch(r"inv\d{4}", r["id"])
        assert list(r["target"]) == INVOICE_KEYS, r["id"]


def test_invoice_targets_are_valid(invoices: list[dict]) -> None:
    for r in invoices:
        t, rid = r["target"], r["id"]
        for key in ["vendor", "invoice_number", "date", "total", "currency"]:
            assert t[key] is not None, (rid, key)
        for key in ["date", "due_date"]:
            if t[key] is not None:
                assert ISO_DATE.match(t[key]), (rid, key, t[key])
                dt.date.fromisoformat(t[key])
        if t["due_date"] is not None:
            assert t["due_date"] >= t["date"], rid
        assert isinstance(t["total"], int | float) and not isinstance(t["total"], bool), rid
        assert t["total"] > 0, rid
        assert re.fullmatch(r"[A-Z]{3}", t["currency"]), (rid, t["currency"])
        for key in ["vendor", "invoice_number", "po_number"]:
            assert t[key] is None or isinstance(t[key], str) and t[key].strip(), (rid, key)


def test_invoice_task_is_solvable_from_the_text(invoices: list[dict]) -> None:
    for r in invoices:
        text, t, rid = r["text"], r["target"], r["id"]
        assert t["vendor"].lower() in text.lower(), (rid, "vendor")
        assert t["invoice_number"] in text, (rid, "invoice_number")
        if t["po_number"] is not None:
            assert t["po_number"] in text, (rid, "po_number")
        assert _shows_date(text, t["date"]), (rid, "date")
        if t["due_date"] is not None:
            assert _shows_date(text, t["due_date"]), (rid, "due_date")
        assert _shows_amount(text, t["total"]), (rid, "total")
        for item in t["line_items"] or []:
            assert item["description"].lower() in text.lower(), (rid, "line_items")
            assert _shows_amount(text, item["amount"]), (rid, "line_items[].amount")


def test_invoice_line_items_exercise_the_nesting(invoices: list[dict]) -> None:
    from lorapilot.data.targets import validate_target

    spec, _ = load_spec_file(INVOICES_DIR / "pilot.yaml")
    with_items = [r for r in invoices if r["target"]["line_items"]]
    assert 0.1 < len(with_items) / len(invoices) < 0.5
    assert any(len(r["target"]["line_items"]) > 1 for r in with_items)
    assert any(i["quantity"] is None for r in with_items for i in r["target"]["line_items"])
    for r in invoices:
        assert validate_target(r["target"], spec.task) == [], r["id"]


def test_invoice_variety(invoices: list[dict]) -> None:
    n = len(invoices)
    for key in ["due_date", "po_number"]:
        present = sum(r["target"][key] is not None for r in invoices)
        assert 0.2 * n <= present <= 0.8 * n, (key, present)
    currencies = Counter(r["target"]["currency"] for r in invoices)
    assert len(currencies) >= 5 and {"USD", "EUR", "GBP"} <= set(currencies)
    n_lines = [len(r["text"].splitlines()) for r in invoices]
    n_words = [len(r["text"].split()) for r in invoices]
    assert min(n_lines) <= 2 and max(n_lines) >= 12
    assert max(n_words) <= 150
    # The invoice date is written in several formats, not only ISO.
    iso_only = sum(r["target"]["date"] in r["text"] for r in invoices)
    assert iso_only < 0.3 * n


# --------------------------------------------------------------------------- fashion-items


def build(example: Path, *args: object) -> None:
    """Run an example's build.py as a user does, in a fresh interpreter."""
    cmd = [sys.executable, str(example / "build.py"), *map(str, args)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)


def built_twice(example: Path, tmp_path: Path, *args: object) -> list[bytes]:
    """An example's build.py run twice into two folders: its train, val and test files, the
    same bytes both times (the selection depends only on the files and the seed)."""
    outs = []
    for run in ("a", "b"):
        build(example, *args, "--out", tmp_path / run)
        outs.append(
            [(tmp_path / run / f"{s}.jsonl").read_bytes() for s in ("train", "val", "test")]
        )
    assert outs[0] == outs[1]
    return outs[0]


FASHION_DIR = EXAMPLES / "fashion-items"


def _idx(path: Path, arr) -> None:
    import gzip
    import struct

    header = struct.pack(">HBB", 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.tobytes())


def test_fashion_build_script_writes_a_seeded_subset_per_class(tmp_path: Path) -> None:
    """build.py on a small IDX source shaped like the Debian package's files."""
    import numpy as np

    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10, dtype=np.uint8), 5)
    _idx(tmp_path / "train-images-idx3-ubyte.gz", rng.integers(0, 256, (50, 28, 28), np.uint8))
    _idx(tmp_path / "train-labels-idx1-ubyte.gz", labels)
    outs = []
    for run in ("a", "b"):
        out = tmp_path / run / "images"
        build(FASHION_DIR, "--source", tmp_path, "--per-class", 3, "--out", out)
        outs.append(sorted(p.relative_to(out).as_posix() for p in out.rglob("*.png")))
    assert outs[0] == outs[1] and len(outs[0]) == 30
    assert {p.split("/")[0] for p in outs[0]} == set(
        load_spec_file(FASHION_DIR / "pilot.yaml")[0].task.labels
    )


def test_fashion_example_data_is_balanced_clean_and_without_shortcuts(image_model_dir) -> None:
    from lorapilot.modality import modality_of
    from lorapilot.spec import load_pilot

    pilot = load_pilot(FASHION_DIR)
    modality = modality_of(pilot)
    prepared = modality.prepare()
    report = modality.data_report(prepared)
    assert report["n_examples"] == 1000 and report["skipped"] == []
    assert all(sum(c.values()) == 100 for c in report["per_category"].values())
    assert report["images"]["all"]["size"] == {"28x28": 1000}
    assert report["images"]["all"]["mode"] == {"L": 1000}
    assert report["duplicates"]["counts"]["exact"] == 0 and report["shortcuts"] == []
    assert report["warnings"] == []
    t = report["transforms"]  # size from the spec, the statistics from the model's processor
    assert (t["size"], t["mean"], t["source"]) == (112, [0.485, 0.456, 0.406], "model")


# --------------------------------------------------------------------------- gsm8k-format

GSM_DIR = EXAMPLES / "gsm8k-format"


def test_gsm8k_build_script_is_a_seeded_subset(tmp_path: Path) -> None:
    """build.py on a small source shaped like GSM8K's train.jsonl: the same rows every time."""
    src = tmp_path / "train.jsonl"
    src.write_text("".join(json.dumps({"question": f"q{i}", "answer": f"{i}\n#### {i}"}) + "\n"
                           for i in range(40)))  # fmt: skip
    outs = []
    for run in ("a", "b"):
        out = tmp_path / run / "gsm8k.jsonl"
        build(GSM_DIR, "--source", src, "--n", 10, "--out", out)
        outs.append(out.read_bytes())
    rows = [json.loads(line) for line in outs[0].decode().splitlines()]
    assert outs[0] == outs[1] and len(rows) == 10
    assert [r["id"] for r in rows] == [f"gsm-{i}" for i in range(10)]
    questions = [r["question"] for r in rows]
    assert len(set(questions)) == 10 and questions != [f"q{i}" for i in range(10)]  # shuffled


def test_gsm8k_example_targets_follow_the_format_and_fit(default_model_dir) -> None:
    from lorapilot.base.models import load_tokenizer
    from lorapilot.data.dataset import prepare_data
    from lorapilot.data.summary import data_report
    from lorapilot.spec import load_pilot

    pilot = load_pilot(GSM_DIR)
    task = pilot.spec.task
    assert task.answer_group
    rows = [json.loads(line) for line in (GSM_DIR / "data" / "gsm8k.jsonl").open()]
    assert len(rows) == 900 and len({r["id"] for r in rows}) == 900
    for r in rows:  # the answer group is GSM8K's final answer
        final = r["answer"].split("#### ")[-1]
        assert re.fullmatch(task.regex, r["answer"]).group("answer") == final
    _, tok = load_tokenizer(pilot, weights=False)
    prepared = prepare_data(pilot, tok)
    report = data_report(pilot, prepared, tok)
    assert report["splits"] == {"train": 720, "val": 90, "test": 90}
    assert report["truncation"]["n_truncated"] == 0 and report["mask_audit"]["ok"]
    assert report["truncation"]["fits_at"] <= pilot.spec.data.max_length


# --------------------------------------------------------------------------- clothing-photos

CLOTHING_DIR = EXAMPLES / "clothing-photos"


def test_clothing_build_script_is_a_seeded_subset_with_paths_and_groups(tmp_path: Path) -> None:
    """build.py on a small source shaped like clothing-dataset (images.csv + images/<id>.jpg,
    one row without its file): the same rows every time, photos made 128 px on the short side."""
    from PIL import Image

    src = tmp_path / "src"
    (src / "images").mkdir(parents=True)
    lines = ["image,sender_id,label,kids"]
    for i in range(30):
        lines.append(f"id{i:02d},{i % 4},{'Hat' if i % 3 else 'Not sure'},False")
        if i != 7:  # id07 has no file, as 5 rows of the real set
            Image.new("RGB", (300 + i, 400), (i, 2 * i, 3 * i)).save(
                src / "images" / f"id{i:02d}.jpg"
            )
    (src / "images.csv").write_text("\n".join(lines) + "\n")
    outs = []
    for run in ("a", "b"):
        out = tmp_path / run / "data"
        build(CLOTHING_DIR, "--source", src, "--n", 12, "--out", out)
        outs.append((out / "clothing.csv").read_text())
    assert outs[0] == outs[1]
    rows = list(csv.DictReader(io.StringIO(outs[0])))
    assert len(rows) == 12 and "id07" not in {r["id"] for r in rows}
    assert [r["id"] for r in rows] != [f"id{i:02d}" for i in range(12)]  # drawn, not the first
    for r in rows:
        assert r["image"] == f"data/images/{r['id']}.jpg"
        with Image.open(tmp_path / "a" / r["image"]) as img:
            assert min(img.size) == 128


def test_clothing_example_leaves_out_unlisted_labels_and_keeps_contributors_whole(
    image_model_dir,
) -> None:
    from lorapilot.modality import modality_of
    from lorapilot.spec import load_pilot

    pilot = load_pilot(CLOTHING_DIR)
    labels = set(pilot.spec.task.labels)
    rows = list(csv.DictReader((CLOTHING_DIR / "data" / "clothing.csv").open()))
    assert len(rows) == 400
    unlisted = [r for r in rows if r["label"] not in labels]
    modality = modality_of(pilot)
    report = modality.data_report(modality.prepare())
    assert report["skipped"] == [] and report["n_examples"] == 400 - len(unlisted)
    assert report["unlisted_labels"]["dropped"] == len(unlisted) > 0
    assert "Not sure" in report["unlisted_labels"]["per_label"]
    groups = report["groups"]
    assert groups["column"] == "sender_id" and groups["shared"] == []
    assert groups["n_groups"] == len({r["sender_id"] for r in rows if r["label"] in labels})
    assert all(report["splits"][s] > 0 for s in ("train", "val", "test"))


# --------------------------------------------------------------------------- reddit-emotions

EMOTIONS_DIR = EXAMPLES / "reddit-emotions"


def test_emotions_build_script_is_a_seeded_subset_with_label_names(tmp_path: Path) -> None:
    """build.py on small TSVs shaped like GoEmotions' (text, label indices, id; no header)."""
    src = tmp_path / "ekman"
    src.mkdir()
    (src / "labels.txt").write_text("anger\njoy\nneutral\n")
    for name, n in (("train", 30), ("dev", 8), ("test", 8)):
        (src / f"{name}.tsv").write_text(
            "".join(
                f"{name} comment {i}\t{i % 3}{',1' if i % 3 == 0 else ''}\t{name}{i}\n"
                for i in range(n)
            )  # fmt: skip
        )
    written = built_twice(EMOTIONS_DIR, tmp_path, "--source", src, "--n-train", 10, "--n-eval", 5)
    train = [json.loads(x) for x in written[0].decode().splitlines()]
    assert len(train) == 10 and [r["id"] for r in train] != [f"train{i}" for i in range(10)]
    for r in train:  # indices named, in labels.txt order
        i = int(r["id"].removeprefix("train"))
        assert r["emotions"] == (
            ["anger", "joy"] if i % 3 == 0 else [["joy", "neutral"][i % 3 - 1]]
        )
    val = [json.loads(x) for x in written[1].decode().splitlines()]
    assert [r["id"] for r in val] == [f"dev{i}" for i in range(5)]  # the first rows, in order
    assert val[0]["emotions"] == ["anger", "joy"] and val[1]["emotions"] == ["joy"]


def test_emotions_example_is_multi_label_and_every_label_is_in_every_split(
    default_model_dir,
) -> None:
    from lorapilot.base.models import load_tokenizer
    from lorapilot.data.dataset import prepare_data
    from lorapilot.data.summary import data_report
    from lorapilot.spec import load_pilot

    pilot = load_pilot(EMOTIONS_DIR)
    assert pilot.spec.task.multi_label and pilot.spec.eval.mode == "generate"
    _, tok = load_tokenizer(pilot, weights=False)
    report = data_report(pilot, prepare_data(pilot, tok), tok)
    assert report["splits"] == {"train": 1199, "val": 300, "test": 300}  # one leak dropped
    assert report["skipped"] == [] and report["mask_audit"]["ok"]
    for label, per in report["per_category"].items():
        assert min(per.values()) >= 4, label  # every emotion reaches val and test
    sets = report["label_sets"]
    assert all(1.05 < s["mean"] < 1.2 for s in sets["labels_per_example"].values())
    assert sets["commonest_combinations"][0]["labels"] == ["joy", "surprise"]


BANKING_DIR = EXAMPLES / "banking-chat"


def test_banking_build_script_writes_conversations_per_intent(tmp_path: Path) -> None:
    """build.py on small CSVs shaped like BANKING77's (text, category; a header): the same
    bytes twice, n per intent, each row a system, user and assistant turn."""
    src = tmp_path / "banking_data"
    src.mkdir()
    for name, n in (("train", 6), ("test", 5)):
        lines = ["text,category"] + [
            f"{name} query {i} about {intent},{intent}"
            for intent in ("card_arrival", "top_up_failed") for i in range(n)
        ]  # fmt: skip
        (src / f"{name}.csv").write_text("\n".join(lines) + "\n")
    written = built_twice(BANKING_DIR, tmp_path, "--source", src, "--n-train", 4, "--n-eval", 2)
    train, val, test = ([json.loads(x) for x in b.decode().splitlines()] for b in written)
    assert (len(train), len(val), len(test)) == (8, 4, 4)
    roles = {tuple(t["role"] for t in r["messages"]) for r in train + val + test}
    assert roles == {("system", "user", "assistant")}
    for rows in (train, val, test):
        assert Counter(r["messages"][2]["content"] for r in rows) == {
            "card_arrival": len(rows) // 2, "top_up_failed": len(rows) // 2,
        }  # fmt: skip
    queries = [r["messages"][1]["content"] for r in val + test]
    assert len(set(queries)) == len(queries) and all(q.startswith("test ") for q in queries)


def test_banking_example_reads_its_conversations_with_its_own_system_turn(
    default_model_dir,
) -> None:
    from lorapilot.base.models import load_tokenizer
    from lorapilot.data.dataset import prepare_data
    from lorapilot.data.summary import data_report
    from lorapilot.spec import load_pilot

    pilot = load_pilot(BANKING_DIR)
    assert pilot.spec.data.fields.messages == "messages" and len(pilot.spec.task.labels) == 77
    _, tok = load_tokenizer(pilot, weights=False)
    report = data_report(pilot, prepare_data(pilot, tok), tok)
    assert report["splits"] == {"train": 924, "val": 154, "test": 154}
    assert report["skipped"] == [] and report["mask_audit"]["ok"]
    assert report["messages"]["with_system"] == 1232 and report["messages"]["system_differs"] == 0
    assert all(per == {"train": 12, "val": 2, "test": 2} for per in report["per_category"].values())
