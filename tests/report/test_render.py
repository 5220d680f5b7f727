"""The report renderers on a hand-made pilot state (`state_fixture.json`: every key, a GO
decision, a failed and an interrupted run, a category label that is an HTML tag) and on
states where most phases have not run."""

from __future__ import annotations

import base64
import copy
import html
import json
import re
from pathlib import Path

import pytest

from lorapilot.report import plots
from lorapilot.report.render import NOT_RUN, SECTIONS, render_html, render_markdown

FIXTURE = Path(__file__).with_name("state_fixture.json")
XSS = '<script>alert("x")</script>'
FAILED_RUN = "20250301-100000-train"
FAILED_REASON = "CUDA out of memory: tried to allocate 2.00 GiB with micro_batch=32 <check>"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def state() -> dict:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def page(state) -> str:
    return render_html(state)


@pytest.fixture(scope="module")
def md(state) -> str:
    return render_markdown(state)


def section(page: str, sid: str) -> str:
    m = re.search(rf'<section id="{re.escape(sid)}">(.*?)</section>', page, re.S)
    assert m, f"no section {sid}"
    return m.group(1)


def md_section(md: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", md, re.S | re.M)
    assert m, f"no heading {title}"
    return m.group(1)


def sparse_state(state: dict) -> dict:
    """The spec part only: nothing has run yet."""
    keep = (
        "pilot",
        "name",
        "hypothesis",
        "task",
        "success",
        "guards",
        "limits",
        "model",
        "adapter",
        "train",
    )
    return {k: (v if k in keep else None) for k, v in state.items()}


# --------------------------------------------------------------------------- structure


def test_every_section_in_order_in_html(page):
    at = [page.find(f'<section id="{sid}">') for sid, _ in SECTIONS]
    assert all(i >= 0 for i in at), [sid for (sid, _), i in zip(SECTIONS, at, strict=True) if i < 0]
    assert at == sorted(at)
    for sid, title in SECTIONS:
        assert f"<h2>{html.escape(title)}</h2>" in section(page, sid)
        assert f'href="#{sid}"' in page  # table of contents


def test_every_heading_in_order_in_markdown(md):
    headings = re.findall(r"^## (.+)$", md, re.M)
    assert headings == [title for _, title in SECTIONS]


def test_no_section_failed_on_the_full_fixture(page, md):
    assert "could not be rendered" not in page
    assert "could not be rendered" not in md
    assert NOT_RUN not in page  # every phase has run in the fixture


def test_html_is_self_contained(page):
    assert "http://" not in page and "https://" not in page
    assert "<script" not in page.lower() and "<link" not in page.lower()
    assert "Content-Security-Policy" in page
    srcs = re.findall(r'src="([^"]*)"', page)
    assert len(srcs) >= 5  # lengths, per-category bars, 2 confusion matrices, loss curves
    for src in srcs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG_MAGIC)
    assert len(page.encode()) < 1_000_000


def test_user_text_is_escaped(page, md):
    assert XSS not in page
    assert html.escape(XSS) in page
    assert "&lt;b&gt;alone&lt;/b&gt;" in page  # the hypothesis's markup is shown, not applied
    assert "<script" not in md and "<b>" not in md
    assert "&lt;script>alert" in md


def test_decision_is_shown_big_with_reasons(state, page, md):
    dec = section(page, "decision")
    assert '<div class="banner GO">GO</div>' in dec
    for reason in state["decision"]["reasons"]:
        assert html.escape(reason) in dec
    assert "### GO" in md_section(md, "Decision")

    nogo = copy.deepcopy(state)
    nogo["decision"]["decision"] = "NO-GO"
    nogo["decision"]["reasons"] = ["guard failed: per_category.billing.f1 dropped 0.120 > 0.050"]
    out = render_html(nogo)
    assert '<div class="banner NO-GO">NO-GO</div>' in out
    assert "dropped 0.120 &gt; 0.050" in out
    assert "### NO-GO" in render_markdown(nogo)


def test_failed_and_interrupted_runs_are_listed_with_their_reason(page, md):
    runs = section(page, "runs")
    row = next(r for r in re.findall(r"<tr>.*?</tr>", runs, re.S) if FAILED_RUN in r)
    assert '<span class="bad">failed</span>' in row
    assert html.escape(FAILED_REASON) in row
    assert "SIGTERM received at step 40" in runs and ">interrupted<" in runs
    md_runs = md_section(md, "Runs")
    line = next(x for x in md_runs.splitlines() if FAILED_RUN in x)
    assert "| failed |" in line and "tried to allocate 2.00 GiB" in line


def test_results_sections_carry_the_numbers(page, md):
    res = section(page, "results")
    assert "macro_f1 (success metric)" in res
    assert "0.530" in res and "0.740" in res and "+0.210" in res
    assert "Confusion matrix: baseline" in res and "Confusion matrix: adapted" in res
    assert "fixed (wrong before, right after)" in res
    # Markdown has no images: the confusion matrix is a table there
    md_res = md_section(md, "Results: baseline vs adapted")
    assert "| gold \\ predicted |" in md_res
    assert "data:image" not in md


def test_other_sections_show_their_key_facts(state, page):
    sha = state["chosen_record"]["result"]["base"]["sha256"]
    assert sha in section(page, "base-model")
    assert "12fd25f77366fa6b3b4b768ec3050bf629380bac" in section(page, "base-model")
    assert "4,884,480" in section(page, "adapter")
    assert "NVIDIA H200" in section(page, "environment") and "2.13.0" in section(
        page, "environment"
    )
    probe = section(page, "probe")
    assert "out of memory" in probe and "3.00 GiB" in probe
    budget = section(page, "budget")
    assert "7 (chosen)" in budget and "Estimate vs actual" in budget and "+10.0%" in budget
    assert "same base as trained" in section(page, "verify")
    assert "uses of the test split" in section(page, "test")
    lims = section(page, "limitations")
    assert lims.count("<li>") == len(state["limitations"])
    assert "p50, p95 and max per split" in section(page, "data")


# --------------------------------------------------------------------------- partial states


@pytest.mark.parametrize("which", ["empty", "sparse", "none"])
def test_states_with_nothing_run_render_and_say_not_run_yet(state, which):
    s = {"empty": {}, "sparse": sparse_state(state), "none": None}[which]
    page, md = render_html(s), render_markdown(s)
    for sid in (
        "decision",
        "data",
        "environment",
        "probe",
        "budget",
        "results",
        "runs",
        "training-curves",
        "verify",
        "test",
    ):
        assert NOT_RUN in section(page, sid), sid
    assert "NO DECISION YET" in page
    assert md.count(NOT_RUN) >= 10
    assert "could not be rendered" not in page
    assert "https://" not in page and "http://" not in page


def test_a_baseline_without_a_train_run(state):
    s = sparse_state(state)
    s["baseline"] = state["baseline"]
    s["runs"] = state["runs"][:2]
    res = section(render_html(s), "results")
    assert "0.530" in res and NOT_RUN in res
    assert "Confusion matrix: baseline" in res and "Confusion matrix: adapted" not in res


def test_extraction_metrics_are_shown_per_field(state):
    def ext(f1s):
        return {
            "n": 50,
            "json_valid_rate": 0.9,
            "schema_valid_rate": 0.88,
            "required_fields_rate": 0.85,
            "field_f1": sum(f1s) / 2,
            "exact_match": 0.4,
            "per_field": {
                name: {"accuracy": f, "precision": f, "recall": f, "f1": f, "support": 50}
                for name, f in zip(("total", "due_date"), f1s, strict=True)
            },
        }

    s = sparse_state(state)
    s["task"] = {"kind": "extraction", "fields": [{"name": "total"}, {"name": "due_date"}]}
    s["success"] = {"metric": "field_f1", "min_gain": 0.05}
    s["baseline"] = {"id": "b1", "metrics": ext([0.5, 0.4])}
    s["chosen"] = {"id": "t1", "metrics": ext([0.8, 0.7]), "comparable": True}
    page = render_html(s)
    res = section(page, "results")
    assert "Per field" in res and "Confusion matrix" not in res
    assert "field_f1 (success metric)" in res and "due_date" in res
    assert "### Per field" in render_markdown(s)


@pytest.mark.parametrize("junk", ["x", 42, [], {}, [None, 1], {"a": None}])
def test_odd_values_never_crash_the_report(state, junk):
    # Without the keys that draw figures (matplotlib is the slow part), unless junked.
    light = {k: v for k, v in state.items() if k not in ("data", "curves", "baseline", "chosen")}
    for key in state:
        s = {**copy.deepcopy(light), key: junk}
        assert '<section id="limitations">' in render_html(s)
        assert "## Limitations" in render_markdown(s)
        assert "could not be" not in render_html(s), key


# --------------------------------------------------------------------------- plots


def _png(uri: str | None) -> bytes:
    assert uri and uri.startswith("data:image/png;base64,")
    return base64.b64decode(uri.split(",", 1)[1])


def test_plots_return_pngs_and_close_their_figures(state):
    import matplotlib.pyplot as plt

    per_b = state["baseline"]["metrics"]["per_category"]
    per_c = state["chosen"]["metrics"]["per_category"]
    conf = state["chosen"]["metrics"]["confusion"]
    uris = [
        plots.per_group_bars(per_b, per_c, "f1"),
        plots.per_group_bars(None, per_c, "f1"),
        plots.confusion(conf["matrix"], conf["labels"], "adapted"),
        plots.loss_curves(state["curves"]),
        plots.length_histogram(state["data"]),
        # user text that matplotlib would otherwise parse ($...$) or hide (leading _)
        plots.per_group_bars({"$x$ costs $5": {"f1": 0.5}}, {"_hidden": {"f1": 0.7}}, "f1"),
        plots.loss_curves({"r1": {"label": "_lr $1e-3", "train": [[1, 2.0], [2, 1.5]], "val": []}}),
    ]
    for uri in uris:
        assert _png(uri).startswith(PNG_MAGIC)
        assert len(_png(uri)) < 150_000
    assert plt.get_fignums() == []


def test_plots_with_nothing_to_draw_return_none():
    assert plots.per_group_bars({}, None, "f1") is None
    assert plots.per_group_bars({"a": {"f1": None}}, {}, "f1") is None
    assert plots.confusion([], [], "t") is None
    assert plots.confusion([[1, 2]], ["a", "b"], "t") is None  # rows and labels disagree
    assert plots.loss_curves({}) is None
    assert plots.loss_curves({"r": {"train": [], "val": []}}) is None
    assert plots.length_histogram(None) is None
    assert plots.length_histogram({"lengths": {}}) is None


# --------------------------------------------------------------------------- a real browser


# What the browser laid out and painted, per element: its box on the page, whether it is
# shown, and what is on top at its centre (nothing may cover it).
LAYOUT_JS = """(() => {
  const box = (el) => {
    el.scrollIntoView({block: 'center'});
    const r = el.getBoundingClientRect(), cs = getComputedStyle(el);
    const hit = document.elementFromPoint(r.left + Math.min(r.width / 2, 40), r.top + r.height / 2);
    return {x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height,
            shown: cs.display !== 'none' && cs.visibility === 'visible' && +cs.opacity > 0.5,
            on_top: !!hit && (el === hit || el.contains(hit)),
            text: el.innerText.trim().slice(0, 200)};
  };
  return {banner: [...document.querySelectorAll('.banner')].map(box),
          tables: [...document.querySelectorAll('section table')].map((t) => (
            {...box(t), section: t.closest('section').id, rows: t.rows.length})),
          page_w: document.documentElement.scrollWidth, view_w: innerWidth};
})()"""


def _ink(png: bytes, b: dict) -> int:
    """Distinct colours painted inside an element's box on the screenshot: a box with text
    drawn in it has dozens (glyphs, anti-aliasing); an empty or blank one has one or two."""
    from io import BytesIO

    from PIL import Image as PILImage

    img = PILImage.open(BytesIO(png)).convert("RGB")
    crop = img.crop((int(b["x"]), int(b["y"]), int(b["x"] + b["w"]), int(b["y"] + b["h"])))
    return len(crop.getcolors(maxcolors=1 << 16) or [])


def test_a_real_browser_shows_the_decision_and_every_table(page, tmp_path):
    """The ticket-triage report in headless Chromium: the GO banner and every table of every
    section are laid out with a size, shown, not covered, inside the page's width, and painted
    (pixels of the screenshot inside their boxes), not just present in the HTML."""
    import os

    from browser import Browser, chromium

    if chromium() is None:
        if os.environ.get("LORAPILOT_BROWSER_TEST") == "required":
            pytest.fail("chromium is not installed: `make test` installs Debian's chromium first")
        pytest.skip("Debian's chromium is not installed (`make test` installs it)")
    src = tmp_path / "index.html"
    src.write_text(page, encoding="utf-8")
    with Browser(tmp_path / "profile") as browser:
        browser.open(src.as_uri())
        facts = browser.evaluate(LAYOUT_JS)
        png = browser.screenshot()
    (tmp_path / "report.png").write_bytes(png)
    assert png.startswith(PNG_MAGIC)
    [banner] = facts["banner"]
    assert banner["text"] == "GO"
    assert banner["shown"] and banner["on_top"] and banner["w"] > 50 and banner["h"] > 30
    assert _ink(png, banner) > 10, banner
    tables = facts["tables"]
    with_tables = {t["section"] for t in tables}
    assert {"hypothesis", "data", "probe", "budget", "results", "runs", "test"} <= with_tables
    for t in tables:
        assert t["shown"] and t["on_top"] and t["w"] > 50 and t["h"] > 10, t
        assert t["x"] >= 0 and t["x"] + min(t["w"], facts["view_w"]) <= facts["page_w"] + 1, t
        assert _ink(png, t) > 10, t
    assert facts["page_w"] <= facts["view_w"]  # no sideways scrolling of the whole page


def test_many_labels_show_the_most_confused_pairs_instead_of_the_matrix(state):
    """77 labels: no unreadable heatmap; the top off-diagonal cells, largest first."""
    import copy

    labels = [f"intent_{i:02d}" for i in range(20)]
    matrix = [[10 if i == j else 0 for j in range(20)] for i in range(20)]
    matrix[3][7], matrix[5][1], matrix[9][2] = 6, 4, 1
    s = copy.deepcopy(state)
    s["chosen"]["metrics"]["confusion"] = {"labels": labels, "matrix": matrix}
    md = render_markdown(s)
    res = md_section(md, "Results: baseline vs adapted")
    assert "Most confused pairs: adapted" in res and "Confusion matrix: adapted" not in res
    rows = [ln for ln in res.splitlines() if ln.startswith("| intent_")]
    assert rows[0].startswith("| intent_03 | intent_07 | 6 | 38%")  # 6 of 16
    assert rows[1].startswith("| intent_05 | intent_01 | 4 | 29%")
    assert "deliverable/confusion_adapted.csv" in res
    assert "Confusion matrix: baseline" in res  # the fixture's small matrix stays a heatmap


def test_flipped_examples_show_text_gold_and_both_predictions(state):
    import copy

    s = copy.deepcopy(state)
    s["chosen"]["flips"]["examples"] = {
        "fixed": [
            {
                "id": "v7",
                "text": "refund my order please",
                "gold": "refund",
                "baseline": "shipping",
                "adapted": "refund",
            }
        ],  # fmt: skip
        "broken": [],
    }
    res = md_section(render_markdown(s), "Results: baseline vs adapted")
    assert "Fixed examples (first 1)" in res and "Broken examples" not in res
    assert "| v7 | refund my order please | refund | shipping | refund |" in res


def test_the_final_test_section_has_per_category_metrics_and_guards(state):
    import copy

    s = copy.deepcopy(state)
    s["test"]["metrics"]["per_category"] = {
        "billing": {"f1": 0.9, "support": 30},
        "shipping": {"f1": 0.7, "support": 25},
    }
    s["test"]["guards"] = [
        {"kind": "min", "metric": "invalid_rate", "status": "pass", "detail": "invalid_rate ok"}
    ]
    md = render_markdown(s)
    test = next(v for k, v in re.findall(r"^## (.*?)\n(.*?)(?=^## |\Z)", md, re.S | re.M)
                if "test" in k.lower())  # fmt: skip
    assert "Per category on test" in test and "| billing | 30 |" in test
    assert "Guards on test" in test and "invalid_rate ok" in test
    assert "1 relative guard(s)" in test  # per_category.f1 max_drop: checked on validation


def test_the_base_section_states_the_quantization_the_adapter_is_bound_to(state):
    import copy

    s = copy.deepcopy(state)
    base_md = md_section(render_markdown(s), "Base model and revision")
    assert "none (the base in its stored dtype)" in base_md
    s["chosen_record"]["result"]["base_identity"] = {
        "weights_sha256": "ab" * 32,
        "quantization": {
            "bits": 4,
            "type": "nf4",
            "double_quant": True,
            "compute_dtype": "bf16",
            "block_size": 64,
        },  # fmt: skip
        "bitsandbytes": "0.50.2",
    }
    base_md = md_section(render_markdown(s), "Base model and revision")
    assert "4-bit nf4, double quantization True, compute bf16, block 64" in base_md
    assert "0.50.2" in base_md


def test_the_budget_section_sets_the_pre_rental_estimate_beside_the_probe(state):
    s = copy.deepcopy(state)
    s["budget"]["pre_rental"] = {
        "gpu": "h200",
        "device": "NVIDIA H200",
        "estimated_step_s": 0.175,
        "measured_step_s": 0.204,
        "step_error": -0.142,
        "estimated_peak_gib": 2.08,
        "measured_peak_gib": 2.14,
        "calibration": "measured: h200 has calibration rows",
    }
    sec = md_section(render_markdown(s), "Budget: estimate, actual and rental plans")
    assert "Pre-rental estimate vs the probe" in sec
    assert "| step time (s) | 0.175 | 0.204 | -14.2% |" in sec
    s["budget"]["pre_rental"] = {
        "gpu": None,
        "why": "the probe ran on the CPU, not one of the GPU classes",
    }
    sec = md_section(render_markdown(s), "Budget: estimate, actual and rental plans")
    assert "No pre-rental estimate to compare: the probe ran on the CPU" in sec


def test_the_variants_table_names_the_group_its_worst_delta_is_over(state):
    """#35 item 9: an extraction pilot's worst delta is over fields, not categories."""
    s = copy.deepcopy(state)

    def variant(group: str) -> dict:
        worst = {"group": group, "name": "total", "delta": -0.02}
        return {"name": "base", "run_id": "r1", "status": "completed", "value": 0.4,
                "delta": 0.1, "worst": worst}  # fmt: skip

    s["selection"] = {"metric": "leaf_f1", "variants": [variant("per_field")], "n_tried": 1}
    dec = md_section(render_markdown(s), "Decision")
    assert "worst per-field delta" in dec and "worst per-category delta" not in dec
    s["selection"]["variants"] = [variant("per_category")]
    assert "worst per-category delta" in md_section(render_markdown(s), "Decision")


def test_the_report_says_which_run_each_sizing_and_base_figure_is_from(state):
    """#35 item 9: the probe section names the variant whose probe it shows and lists the
    other variants' probes; the base section lists each variant's base and quantization
    when they differ; measured limit values are rounded."""
    s = copy.deepcopy(state)
    s["probe"] = {**s["probe"], "variant": "base"}
    s["probes"] = [
        {"variant": "base", "run_id": "probe-1", "quantization": "none"},
        {"variant": "nf4", "run_id": "probe-2", "quantization": "4-bit nf4",
         "later_step_s": 1.25, "peak_memory_bytes": 470_000_000},
    ]  # fmt: skip
    s["selection"] = {"metric": "macro_f1", "n_tried": 2, "variants": [
        {"name": "base", "run_id": "train-1", "base": "smollm2-135m-instruct",
         "quantization": "none"},
        {"name": "nf4", "run_id": "train-2", "base": "smollm2-135m-instruct",
         "quantization": "4-bit nf4"},
    ]}  # fmt: skip
    memory = {"limit": 8, "value": 5.70591, "ok": True, "detail": "5.71 <= 8"}
    s["budget"] = {**(s.get("budget") or {}), "limits": {"memory_gb": memory}}
    md = render_markdown(s)
    probe = md_section(md, "Probe: time and memory")
    assert "the probe of variant `base`" in probe
    assert "`nf4` (probe-2, quantization 4-bit nf4): typical step 1.25 s, peak 448.2 MiB" in probe
    base = md_section(md, "Base model and revision")
    assert "| nf4 | train-2 | smollm2-135m-instruct | 4-bit nf4 |" in base
    budget = md_section(md, "Budget: estimate, actual and rental plans")
    assert "| memory_gb | 8 | 5.71 | yes |" in budget and "5.70591" not in budget
    s["selection"]["variants"] = s["selection"]["variants"][:1]  # one base: no table
    assert "Each variant's base" not in md_section(render_markdown(s), "Base model and revision")


def test_leaks_kept_under_warn_are_a_named_limitation(tmp_path):
    from conftest import EXAMPLES

    from lorapilot.report.limitations import limitations
    from lorapilot.spec import load_pilot

    pilot = load_pilot(EXAMPLES / "ticket-triage")
    pair = {"a_split": "val", "a_id": "t12", "b_split": "test", "b_id": "t80", "kind": "near",
            "similarity": 0.93}  # fmt: skip
    data = {"duplicates": {"cross_split": [pair], "leakage_policy": "warn"}}
    (line,) = [x for x in limitations(pilot, [], None, [], data) if "kept" in x]
    assert line.startswith("1 duplicate pair(s) across splits were kept (data.leakage: warn)")
    assert "val:t12 ~ test:t80 (near, 0.93)" in line


def test_the_results_say_how_labels_were_scored(state):
    s = copy.deepcopy(state)
    s["task"] = {**s["task"], "kind": "classification"}
    s["eval"] = {"mode": "score", "label_scoring": "calibrated"}
    results = md_section(render_markdown(s), "Results: baseline vs adapted")
    assert "calibrated: score + offset from the content-free inputs" in results
    s["eval"] = {"mode": "score", "label_scoring": "sum"}
    results = md_section(render_markdown(s), "Results: baseline vs adapted")
    assert "sum of each label's token log-probabilities" in results


def test_the_data_section_groups_skipped_rows_and_counts_labels_left_out(state):
    s = copy.deepcopy(state)
    d = s["data"]
    d["skipped_summary"] = [
        {"problem": "image …: no such file", "count": 4208, "first": "c.csv:3",
         "values": {"'images/a.jpg'": 1}, "n_values": 4208},
    ]  # fmt: skip
    d["unlisted_labels"] = {"policy": "drop", "dropped": 348, "per_label": {"Not sure": 228,
                            "Polo": 120}, "rows": []}  # fmt: skip
    d["groups"] = {"column": "sender_id", "n_groups": 328, "per_split": {}, "largest": [],
                   "shared": [{"group": "7", "splits": {"train": 2, "val": 1}}]}  # fmt: skip
    html = section(render_html(s), "data")
    assert "4,208" in html and "image …: no such file" in html and "c.csv:3" in html
    assert "left out: label not in task.labels" in html and "Not sure" in html and "228" in html
    assert "groups (sender_id)" in html and "328" in html
    md = render_markdown(s)
    assert "Polo" in md_section(md, "Data")


def test_the_results_set_generated_answers_beside_the_scored_ones(state):
    s = copy.deepcopy(state)
    results = md_section(render_markdown(s), "Results: baseline vs adapted")
    assert "As a chat server answers" not in results  # no generation check: no such table
    s["baseline"]["generation"] = {
        "agreement": 0.1, "n": 20, "n_same": 2, "n_labels": 5, "not_labels": [],
        "metrics": {"macro_f1": {"scored": 0.2, "generated": 0.05}},
    }  # fmt: skip
    s["chosen"]["generation"] = {
        "agreement": 0.95, "n": 20, "n_same": 19, "n_labels": 20, "not_labels": [],
        "metrics": {"macro_f1": {"scored": 0.9, "generated": 0.85}},
    }  # fmt: skip
    s["chosen"]["generation"]["constrained"] = {
        "agreement": 1.0, "n": 20, "n_same": 20, "n_labels": 20, "not_labels": [],
        "metrics": {"macro_f1": {"scored": 0.9, "generated": 0.9}},
    }  # fmt: skip
    results = md_section(render_markdown(s), "Results: baseline vs adapted")
    assert "As a chat server answers" in results
    assert "2 of 20 (10.0%)" in results and "19 of 20 (95.0%)" in results
    assert "0.900 \u2192 0.850" in results
    assert "| adapted | constrained to the labels | 20 of 20 (100.0%) | 20 of 20 |" in results
    assert results.count("constrained to the labels |") == 1  # the baseline had none
    html = render_html(s)
    assert "As a chat server answers" in html and "19 of 20 (95.0%)" in html


def test_the_deliverable_says_how_the_gguf_serves_the_labels(state):
    s = copy.deepcopy(state)
    check = {"ok": True, "serving_agreement": 1.0, "serving_agreement_min": 0.98,
             "n_examples": 154, "generation_agreement": 0.708, "generation_label_rate": 0.877,
             "constrained_agreement": 0.812, "constrained_label_rate": 1.0}  # fmt: skip
    s["exports"] = [{"format": "gguf", "folder": "deliverable/gguf", "serving_check": check}]
    deliverable = "Deliverable: formats and their checks"
    text = md_section(render_markdown(s), deliverable)
    assert "70.8% of the validation answers are the scored label, 87.7% are a label" in text
    assert (
        "constrained by labels.gbnf (`llama-server --grammar-file`, greedy): 81.2% of the "
        "validation answers are the scored label, 100.0% are a label"
    ) in text
    del check["constrained_agreement"]  # an export before labels.gbnf
    assert "labels.gbnf" not in md_section(render_markdown(s), deliverable)
