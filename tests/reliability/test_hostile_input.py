"""Hostile input to the data loader and the spec parser: every case is a clear exit 2 (or,
for data under `on_error: skip`, a counted skip), never a traceback, a hang or a memory blow-up.

In-process property tests (hypothesis) compose files from hostile lines whose fate is known
in advance (must be rejected / may be accepted) and check the loader and the spec parser
against it; a few whole-CLI cases (`check`, `data`) measure wall time and the subprocess's
own peak RSS (os.wait4). Already covered elsewhere: one test per loader rule and random
bytes/lines never crashing (tests/data/test_load.py); bad keys named and the YAML
alias bomb refused by parse_yaml (tests/test_spec.py).

Counts: the property tests tally what they tried; set LORAPILOT_RELIABILITY_COUNTS=FILE to
get them as JSON (bench/README.md records a run), or see the printed line with `-s`.
"""

from __future__ import annotations

import json
import os
import string
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rel_helpers import LABELS, cli_args, run_measured, small_pilot, small_records, small_spec

from lorapilot.data.load import MAX_LINE_BYTES, load_records
from lorapilot.errors import UsageError
from lorapilot.spec import AdapterSpec, DataSpec, PilotSpec, TaskSpec, TrainSpec, load_spec_file

TASK = TaskSpec(kind="classification", labels=LABELS)
TIME_LIMIT_S = 10
RSS_LIMIT = 1 << 30
COUNTS: Counter = Counter()

# The spec's sections an unknown key is put in, by their models (whose fields are the keys).
SPEC_SECTIONS = {None: PilotSpec, "train": TrainSpec, "adapter": AdapterSpec, "data": DataSpec}


@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    yield
    line = json.dumps(dict(sorted(COUNTS.items())))
    print(f"\nhostile-input counts: {line}")
    if os.environ.get("LORAPILOT_RELIABILITY_COUNTS"):
        Path(os.environ["LORAPILOT_RELIABILITY_COUNTS"]).write_text(line + "\n")


# --------------------------------------------------------------------------- hostile lines


def _rec(i: int, **over) -> dict:
    return {"id": f"h{i}", "text": f"some ticket text number {i}", "label": LABELS[i % 3], **over}


def _dump(obj) -> bytes:
    return json.dumps(obj).encode()


# Each kind builds one line from (i, draw): (bytes, must_reject).
@st.composite
def hostile_line(draw, i: int):
    kind = draw(
        st.sampled_from(
            [
                "valid",
                "unknown_keys",
                "truncated",
                "bad_utf8",
                "nul_raw",
                "nul_escaped",
                "bom_mid",
                "deep",
                "wrong_type",
                "control_label",
                "control_text",
                "surrogate",
                "random_bytes",
                "long",
            ]
        )
    )
    good = _dump(_rec(i))
    if kind == "valid":
        return kind, good, False
    if kind == "unknown_keys":
        extra = draw(
            st.dictionaries(
                st.text(min_size=1, max_size=5).filter(lambda k: k not in ("id", "text", "label")),
                st.one_of(st.none(), st.integers(), st.text(max_size=5)),
                min_size=1,
                max_size=3,
            )
        )
        return kind, _dump({**_rec(i), **extra}), False
    if kind == "truncated":
        return kind, good[: draw(st.integers(1, len(good) - 1))], True
    if kind == "bad_utf8":
        at = draw(st.integers(0, len(good)))
        return (
            kind,
            good[:at]
            + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80"]))
            + good[at:],
            True,
        )
    if kind == "nul_raw":
        at = draw(st.integers(0, len(good)))
        return kind, good[:at] + b"\x00" + good[at:], True
    if kind == "nul_escaped":
        return kind, _dump(_rec(i, text="before\x00after")), True
    if kind == "bom_mid":  # a BOM is only allowed at the very start of the file
        return kind, b"\xef\xbb\xbf" + good, True
    if kind == "deep":
        depth = draw(st.sampled_from([2_000, 100_000]))
        return kind, good[:-1] + b', "x": ' + b"[" * depth + b"]" * depth + b"}", True
    if kind == "wrong_type":
        field = draw(st.sampled_from(["text", "label", "id"]))
        value = draw(st.sampled_from([None, 5, 1.5, True, [], ["alpha"], {"a": 1}, ""]))
        if field == "id" and value is None:
            value = []  # a null id means "no id" (the line number is used): not wrong
        if field == "id" and value == 5:
            value = 5.5
        return kind, _dump(_rec(i, **{field: value})), True
    if kind == "control_label":
        ch = draw(st.sampled_from([chr(c) for c in range(32)] + ["\x7f", "\x1b[31m"]))
        return kind, _dump(_rec(i, label=LABELS[0] + ch)), True
    if kind == "control_text":  # control characters in a text are data, not an attack
        ch = draw(st.sampled_from(["\x07", "\x1b[2J", "\r", "\t", "\x7f"]))
        return kind, _dump(_rec(i, text=f"text {ch} more")), False
    if kind == "surrogate":
        return kind, good.replace(b'"some', b'"\\udc80some'), True
    if kind == "random_bytes":
        raw = draw(
            st.binary(min_size=1, max_size=40).filter(
                lambda b: b"\n" not in b and b.strip() and not b.startswith(b"\xef\xbb\xbf")
            )
        )
        return kind, raw, True  # cannot be a valid record: it would need "text" and "label"
    return kind, LONG, True  # expanded when the file is written: hypothesis prints its draws


LONG = b"<a line over MAX_LINE_BYTES>"


def _expand(raw: bytes, i: int) -> bytes:
    return _dump(_rec(i, text="x" * (MAX_LINE_BYTES + 1))) if raw == LONG else raw


@st.composite
def hostile_file(draw):
    n = draw(st.integers(1, 6))
    lines = [draw(hostile_line(i)) for i in range(n)]
    bom = draw(st.booleans())
    return lines, bom


def _printable(msg: str) -> bool:
    return all(ch.isprintable() for ch in msg)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(f=hostile_file())
def test_hostile_data_lines_are_each_rejected_or_counted(tmp_path, f):
    lines, bom = f
    path = tmp_path / "data.jsonl"
    path.write_bytes(
        (b"\xef\xbb\xbf" if bom else b"")
        + b"\n".join(_expand(raw, i) for i, (_, raw, _) in enumerate(lines))
        + b"\n"
    )
    COUNTS["data_files_tried"] += 1
    COUNTS["data_lines_tried"] += len(lines)
    if not bom and lines[0][0] == "bom_mid":  # a BOM that starts the file is allowed
        lines[0] = (*lines[0][:2], False)
    must = [n for n, (_, _, reject) in enumerate(lines, start=1) if reject]
    COUNTS["data_lines_hostile"] += len(must)
    t0 = time.monotonic()
    try:
        records, skipped = load_records(path, TASK, DataSpec(file="data.jsonl", on_error="skip"))
    except UsageError as e:  # only when no line holds a record at all
        assert "no records" in str(e)
        return
    assert time.monotonic() - t0 < TIME_LIMIT_S
    assert sorted(s.line for s in skipped) == must, (
        [k for k, _, _ in lines],
        [(s.line, s.problem) for s in skipped],
    )
    assert len(records) == len(lines) - len(must)
    COUNTS["data_lines_skipped"] += len(skipped)
    assert all(_printable(s.problem) for s in skipped), [s.problem for s in skipped]
    assert all(r.label in LABELS and "\x00" not in r.text for r in records)
    if must:  # under `fail` the first bad line stops the load, named file:line
        with pytest.raises(UsageError, match=rf"^{path}:{must[0]}: "):
            load_records(path, TASK, DataSpec(file="data.jsonl", on_error="fail"))
        COUNTS["data_files_failed_cleanly"] += 1


def test_a_bom_does_not_split_a_line_just_over_the_limit(tmp_path):
    """Regression: the BOM used to count towards line 1's length, so a first line just over
    the limit was read as two lines: wrong line numbers, and its tail parsed as a record."""
    tail = b'{"id": "smuggled", "text": "tail", "label": "alpha"}'
    head = b'{"id": "h", "text": "' + b"x" * (MAX_LINE_BYTES - len(tail) - 20) + b'", "pad": "'
    line = head + b"y" * (MAX_LINE_BYTES - len(head) - len(tail) + 1) + tail  # MAX + 1 bytes
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + line + b"\n" + _dump(_rec(2)) + b"\n")
    records, skipped = load_records(path, TASK, DataSpec(file="data.jsonl", on_error="skip"))
    assert [(s.line, s.problem) for s in skipped] == [
        (1, f"line too long (over {MAX_LINE_BYTES} bytes)")
    ]
    assert [r.id for r in records] == ["h2"]
    exact = b'{"id": "e", "label": "beta", "text": "' + b"z" * (MAX_LINE_BYTES - 38 - 2) + b'"}'
    assert len(exact) == MAX_LINE_BYTES
    path.write_bytes(b"\xef\xbb\xbf" + exact + b"\n")
    records, skipped = load_records(path, TASK, DataSpec(file="data.jsonl", on_error="fail"))
    assert [r.id for r in records] == ["e"] and not skipped


# --------------------------------------------------------------------------- hostile specs

GOOD_SPEC = yaml.safe_dump(small_spec(Path("model")), sort_keys=False).encode()


def _bomb(levels: int = 12) -> bytes:
    out = "a: &a [x, x, x, x, x, x, x, x, x]\n"
    for i in range(levels):
        prev, cur = chr(97 + i), chr(98 + i)
        out += f"{cur}: &{cur} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
    return out.encode()


@st.composite
def hostile_spec(draw):
    kind = draw(
        st.sampled_from(
            [
                "random_bytes",
                "truncated",
                "bad_utf8",
                "bom",
                "nul",
                "deep_flow",
                "deep_block",
                "bomb",
                "wrong_type",
                "unknown_key",
                "control_label",
                "not_mapping",
            ]
        )
    )
    if kind == "random_bytes":
        return kind, draw(st.binary(max_size=200))
    if kind == "truncated":
        return kind, GOOD_SPEC[: draw(st.integers(0, len(GOOD_SPEC) - 1))]
    if kind == "bad_utf8":
        at = draw(st.integers(0, len(GOOD_SPEC)))
        return kind, GOOD_SPEC[:at] + b"\xff" + GOOD_SPEC[at:]
    if kind == "bom":
        return kind, b"\xef\xbb\xbf" + GOOD_SPEC
    if kind == "nul":
        at = draw(st.integers(0, len(GOOD_SPEC)))
        return kind, GOOD_SPEC[:at] + b"\x00" + GOOD_SPEC[at:]
    if kind == "deep_flow":
        depth = draw(st.sampled_from([500, 5_000, 100_000]))
        return kind, GOOD_SPEC + b"extra: " + b"[" * depth + b"]" * depth + b"\n"
    if kind == "deep_block":
        depth = draw(st.sampled_from([200, 2_000]))
        return kind, GOOD_SPEC + b"extra:\n" + b"".join(
            b" " * (d + 1) + b"k:\n" for d in range(depth)
        )
    if kind == "bomb":
        return kind, GOOD_SPEC + _bomb()
    if kind == "wrong_type":
        key = draw(
            st.sampled_from(
                [
                    "adapter.r",
                    "train.lr",
                    "task.labels",
                    "name",
                    "data.max_length",
                    "train.precision",
                ]
            )
        )
        value = draw(
            st.sampled_from(
                [
                    "[1, 2]",
                    "{a: 1}",
                    "-1",
                    "yes",
                    "''",
                    "null",
                    "1e999",
                    ".inf",
                    # values whose YAML constructor itself fails
                    "2001-02-30",
                    "!!int x",
                    "!!float x",
                    "!!timestamp 2020-99-99",
                    "!!python/object:os.system x",
                    "!!binary '@@@'",
                ]
            )
        )
        section, _, leaf = key.rpartition(".")
        text = GOOD_SPEC.decode()
        if section:
            text += f"{section}: {{{leaf}: {value}}}\n"  # a duplicate key: the last one wins
        else:
            text += f"{leaf}: {value}\n"
        return kind, text.encode()
    if kind == "unknown_key":
        section = draw(st.sampled_from([None, "train", "adapter", "data"]))
        known = SPEC_SECTIONS[section].model_fields  # a real key the spec lacks is no error
        key = draw(
            st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=8).filter(
                lambda k: k not in known
            )
        )
        raw = yaml.safe_load(GOOD_SPEC)
        target = raw if section is None else raw[section]
        target[key] = 1
        return kind, yaml.safe_dump(raw).encode()
    if kind == "control_label":
        raw = yaml.safe_load(GOOD_SPEC)
        raw["task"]["labels"][0] = "alpha" + draw(
            st.sampled_from(["\x07", "\x1b[31m", "\x00", "\n", "\t"])
        )
        return kind, yaml.safe_dump(raw).encode()
    return kind, draw(st.sampled_from([b"- a\n- b\n", b"42\n", b"just text\n", b"", b"~\n"]))


# Kinds that may legitimately load: a BOM is stripped; a wrong value can still be valid
# ('yes' for a string name, e.g.); a truncation can end on a complete spec.
MAY_LOAD = {"bom", "wrong_type", "truncated"}


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=hostile_spec())
def test_hostile_specs_are_refused_with_a_message_naming_the_file(tmp_path, case):
    kind, content = case
    path = tmp_path / "pilot.yaml"
    path.write_bytes(content)
    COUNTS["spec_files_tried"] += 1
    t0 = time.monotonic()
    try:
        load_spec_file(path)
    except UsageError as e:
        msg = str(e)
        assert msg.startswith(str(path)), msg
        assert "Traceback" not in msg
        COUNTS["spec_files_refused"] += 1
    else:
        assert kind in MAY_LOAD, kind
        COUNTS["spec_files_loaded"] += 1
    assert time.monotonic() - t0 < TIME_LIMIT_S


# --------------------------------------------------------------------------- whole CLI


def _cli(*args: str, timeout: float = 60):
    res = run_measured(cli_args(*args), timeout=timeout)
    assert "Traceback" not in res.stderr, res.stderr
    assert res.peak_rss_bytes < RSS_LIMIT, res.peak_rss_bytes
    return res


SPEC_CASES = {
    "random_bytes": bytes(range(256)) * 4,
    "invalid_utf8": GOOD_SPEC.replace(b"tiny pilot", b"tiny \xff pilot"),
    "nul": GOOD_SPEC.replace(b"tiny pilot", b"tiny \x00 pilot"),
    "deep_100k": GOOD_SPEC + b"extra: " + b"[" * 100_000 + b"]" * 100_000 + b"\n",
    "yaml_bomb": GOOD_SPEC + _bomb(20),  # 9 * 6**20 leaves if it were expanded
    "50MB": GOOD_SPEC + b"# " + b"x" * (50 << 20) + b"\n",
    "wrong_type": GOOD_SPEC.replace(b"r: 4", b"r: [4]"),
    "unknown_key": GOOD_SPEC + b"trian: {lr: 1}\n",
    "control_label": GOOD_SPEC.replace(b"- alpha", b'- "alpha\\e[31m"'),
}
SPEC_NEEDLES = {
    "random_bytes": "not valid UTF-8",
    "invalid_utf8": "not valid UTF-8",
    "nul": "NUL byte",
    "deep_100k": "nested too deeply",
    "yaml_bomb": "aliases",
    "50MB": "too large",
    "wrong_type": "adapter.r",
    "unknown_key": "trian: unknown key",
    "control_label": "control characters",
}


@pytest.mark.parametrize("case", list(SPEC_CASES))
def test_check_refuses_a_hostile_spec_with_exit_2_quickly(case, tmp_path):
    (tmp_path / "pilot.yaml").write_bytes(SPEC_CASES[case])
    res = _cli("check", str(tmp_path), "--json", timeout=TIME_LIMIT_S)
    assert res.returncode == 2, res.stderr
    out = res.json()
    assert SPEC_NEEDLES[case] in out["error"] and str(tmp_path / "pilot.yaml") in out["error"], out[
        "error"
    ]
    COUNTS[f"cli_check_{case}_s"] = round(res.seconds, 2)


def _hostile_data(tmp_path) -> tuple[bytes, list[int]]:
    """36 good records with every hostile line kind between them -> (file, bad line numbers)."""
    good = [json.dumps(r).encode() for r in small_records()]
    bad = [
        b'{"id": "x0", "text": "markup", "label": "[/x][red]"}',  # rich markup in a label
        b'{"id": "x1", "text": "cut here',  # truncated JSON
        b'{"id": "x2", "text": "caf\xe9", "label": "alpha"}',  # invalid UTF-8
        b"\xef\xbb\xbf" + good[0].replace(b'"r0"', b'"x3"'),  # BOM mid-file
        b'{"id": "x4", "text": "a\\u0000b", "label": "alpha"}',  # NUL
        b'{"id": "x5", "text": "' + b"y" * (50 << 20) + b'", "label": "beta"}',  # a 50 MB line
        b'{"id": "x6", "text": "deep", "label": "beta", "n": '
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}",
        b'{"id": "x7", "text": ["not", "a", "string"], "label": "gamma"}',  # wrong type
        b'{"id": "x8", "text": "bell", "label": "gamma\\u0007\\u001b[2J"}',  # control chars
        bytes(range(1, 10)) + bytes(range(11, 256)),  # random bytes
    ]
    lines, bad_at = [], []
    for i, g in enumerate(good):
        lines.append(g)
        if i % 3 == 1 and bad:
            lines.append(bad.pop(0))
            bad_at.append(len(lines))
    assert not bad
    return b"\xef\xbb\xbf" + b"\n".join(lines) + b"\n", bad_at


@pytest.mark.parametrize("policy", ["skip", "fail"])
def test_data_verb_on_a_hostile_file_counts_skips_or_exits_2(policy, tmp_path, tiny_model_dir):
    spec = small_spec(tiny_model_dir)
    spec["data"]["on_error"] = policy
    pilot = small_pilot(tmp_path / "pilot", tiny_model_dir, records=[], spec=spec)
    content, bad_at = _hostile_data(tmp_path)
    (pilot / "data.jsonl").write_bytes(content)

    t0 = time.monotonic()  # the loader alone, without the CLI's start-up (imports ~5 s here)
    task, data = (
        TaskSpec(kind="classification", labels=LABELS),
        DataSpec(file="data.jsonl", on_error="skip"),
    )
    load_records(pilot / "data.jsonl", task, data)
    assert time.monotonic() - t0 < TIME_LIMIT_S

    # `fail` without --json: the error goes through the human path (rich markup escaped)
    res = _cli("data", str(pilot), *(["--json"] if policy == "skip" else []))
    COUNTS[f"cli_data_{policy}_s"] = round(res.seconds, 2)
    COUNTS[f"cli_data_{policy}_peak_rss_mb"] = res.peak_rss_bytes >> 20
    if policy == "skip":
        assert res.returncode == 0, res.stderr
        out = res.json()
        assert [s["line"] for s in out["skipped"]] == bad_at
        assert out["n_examples"] == 36
        assert all(_printable(s["problem"]) for s in out["skipped"])
    else:
        assert res.returncode == 2, res.stderr
        assert (
            f"data.jsonl:{bad_at[0]}: label '[/x][red]' is not one of the task labels"
            in " ".join(res.stderr.split())
        )


def test_markup_in_user_text_is_shown_literally_not_interpreted(tmp_path):
    """The human output uses rich markup; text from the user (spec keys, hypothesis, run
    errors) containing "[/x]" used to crash the error path with a traceback (MarkupError),
    and "[red]" silently vanished from the message."""
    from lorapilot.records import registry

    spec = yaml.safe_load(GOOD_SPEC)
    spec["hypothesis"] = "Tickets tagged [/x] and [red]urgent get routed."
    (tmp_path / "pilot.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "data.jsonl").write_text(
        '{"text": "t", "label": "alpha"}\n'
    )  # check finds the data
    res = _cli("check", str(tmp_path), timeout=TIME_LIMIT_S)
    assert res.returncode == 0 and "tagged [/x] and [red]urgent" in res.stdout, res.stderr

    spec["[/x]"] = 1
    (tmp_path / "pilot.yaml").write_text(yaml.safe_dump(spec))
    for flags in ([], ["--json"]):
        res = _cli("check", str(tmp_path), *flags, timeout=TIME_LIMIT_S)
        assert res.returncode == 2 and "[/x]: unknown key" in res.stderr, res.stderr

    with pytest.raises(ValueError), registry.open_run(tmp_path, "data"):
        raise ValueError("bad [/x] and [red]value")
    res = _cli("runs", str(tmp_path), timeout=TIME_LIMIT_S)
    assert res.returncode == 0 and "[/x]" in res.stdout and "[red]value" in res.stdout, res.stdout
