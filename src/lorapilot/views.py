"""Console views: how each verb's result is printed without `--json` (with `--json` the
result dict itself is printed). Each view takes the result dict the step returned."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape as esc
from rich.table import Table

from lorapilot.evaluate.metrics import per_group
from lorapilot.evaluate.served import GENERATION_AGREEMENT_MIN
from lorapilot.export.ollama import agreement_of
from lorapilot.records.progress import format_gib
from lorapilot.records.runs_view import STATUS_COLOUR, runs_csv

# Not a terminal (a file, a pipe): rich would lay tables out at 80 columns and cut their
# headers; a wide layout keeps every column readable in a log (COLUMNS still wins).
_WIDTH = None if os.isatty(1) or os.environ.get("COLUMNS") else 160
stdout = Console(highlight=False, soft_wrap=True, width=_WIDTH)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)


@dataclass
class Shown:
    """What a verb hands back to the CLI: the --json object, the view that prints it for a
    person, and the exit code (1: a check failed)."""

    data: dict[str, Any]
    view: Callable[[dict], None] | None = None
    exit_code: int = 0


def print_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def check(r: dict) -> None:
    stdout.print(f"[green]ok[/] {esc(r['spec'])}: pilot [bold]{r['name']}[/] ({r['task']})")
    stdout.print(f"  hypothesis: {esc(r['hypothesis'])}")
    if r["success"]:
        stdout.print(
            f"  success: {esc(r['success']['metric'])} gains at least {r['success']['min_gain']}"
        )
    for g in r["guards"]:
        stdout.print(f"  guard: {esc(str(g))}")
    plan = r.get("plan") or {}
    if plan.get("train_runs", 1) > 1:
        seeds = f", {plan['seeds']} seeds each" if plan["seeds"] > 1 else ""
        stdout.print(
            f"  plan: {esc(', '.join(plan['variants']))}{seeds} ({plan['train_runs']} train runs)"
        )
    for src in r["data_source"]["sources"]:
        what = src.get("format") or src["type"]
        if src["type"] == "hf_cache":
            what = ", ".join(f"{x['source']}: {x['rows']} rows" for x in src["splits"])
        stdout.print(
            f"  data: {esc(src['key'])} {esc(src.get('path') or src['name'])} ({esc(what)}, "
            f"{src['n_files']} file(s), {src['bytes']} bytes)"
        )
    prompt = r.get("prompt_format")
    if prompt and (prompt["chat_template"] != "base" or prompt["system_folded"]):
        what = prompt["chat_template"]
        what = "the base's chat template" if what == "base" else f"model.chat_template {what}"
        folded = ", task.system in the first user turn" if prompt["system_folded"] else ""
        stdout.print(f"  prompt format: {esc(what)}{folded}")
    for w in (prompt or {}).get("warnings", []):
        stdout.print(f"  [yellow]warning:[/] {esc(w)}")
    stdout.print(f"  spec hash: {r['spec_hash'][:16]}")


def model_fetch(r: dict) -> None:
    what = "already installed, hashes verified" if r["reused"] else "installed"
    stdout.print(f"[green]ok[/] {r['path']} ({what}, {r['seconds']} s)")
    stdout.print(f"  model.safetensors sha256 {r['sha256']}")


def runs_table(r: dict) -> None:
    rows = r["runs"]
    if not rows:
        stdout.print(f"no runs yet in {esc(str(Path(r['pilot']) / 'runs'))}")
        return
    t = Table(title=f"runs of {esc(Path(r['pilot']).name)}")
    t.add_column("id", no_wrap=True)
    for col in ("kind", "status", "duration", "variant"):
        t.add_column(col)
    for row in rows:
        dur = f"{row['duration_s']:.1f}s" if row["duration_s"] is not None else "-"
        colour = STATUS_COLOUR.get(row["status"], "white")
        t.add_row(
            row["id"],
            row["kind"],
            f"[{colour}]{row['status']}[/]",
            dur,
            " ".join(
                x
                for x in (
                    row.get("variant_name"),
                    row.get("replicate") and f"seed+{row['replicate']}",
                    row.get("variant") and f"({row['variant']})",
                )
                if x
            ),
        )
    stdout.print(t)
    for row in rows:  # reasons in full, below the table, where they are readable
        if row["error"]:
            stdout.print(f"{row['id']}: {esc(row['error'])}")


def runs_csv_view(r: dict) -> None:
    sys.stdout.write(runs_csv(r["runs"]))


def watch_summary(r: dict) -> None:
    stdout.print(f"run {r['run_id']}: {r['status']} after {r['steps_done']} steps")


def smoke(r: dict) -> None:
    verdict = "[green]ok[/]" if r["ok"] else "[red]FAILED[/]"
    stdout.print(
        f"smoke {verdict}: loss {r['initial_loss']:.3f} -> {r['final_loss']:.4f}, "
        f"{r['n_correct']}/{r['n_examples']} memorised examples predicted right ({r['note']})"
    )


def verify(r: dict) -> None:
    stdout.print(
        f"[green]verify ok[/]: a fresh process reloading {r['train_run']} on base sha256 "
        f"{r['base_sha256'][:16]} reproduces all predictions "
        f"({r['n_mismatched_predictions']} differ) and metrics (match: {r['metrics_match']})"
    )


def _serving(r: dict) -> None:
    """The GGUF export's serving check: agreement and the task metric in both runtimes."""
    agree = r.get("serving_agreement")
    head = "[green]served as evaluated[/]" if r.get("ok") else "[red]serving check FAILED[/]"
    shown = f"{agree:.1%}" if isinstance(agree, float) else "n/a"
    stdout.print(
        f"{head}: llama.cpp agrees with lorapilot {shown} {agreement_of(r)} (minimum "
        f"{r.get('serving_agreement_min', 0):.0%}"
        f"{'' if r.get('gated', True) else ', reported, not gated'})"
    )
    base = r.get("base_gguf") or {}
    if base.get("trained_on") is False:  # why the figure is reported, not gated
        stdout.print(f"  base.gguf: {esc(str(base.get('note')))}")
    for p in r.get("problems") or []:
        stdout.print(f"  - {esc(p)}")
    for c in r.get("configs") or []:
        metrics = ", ".join(
            f"{k} {v['lorapilot']:.3f} -> {v['llama_cpp']:.3f}"
            for k, v in (c.get("metrics") or {}).items()
            if isinstance(v.get("lorapilot"), (int, float))
        )
        rate = c.get("examples_per_s")
        stdout.print(
            f"  {esc(c['name'])}: {c.get('n_differing', 0)} answers differ; {metrics}"
            + (f"; {rate:.1f} ex/s in llama.cpp" if rate else "")
        )
        t = c.get("ties")
        if t and c.get("n_differing"):
            stdout.print(
                f"  {esc(c['name'])}: {t['near_ties']} of the {c['n_differing']} differing are "
                f"near-ties (served margin within the runtimes' score noise, "
                f"{t['score_noise_max']:.3f} nats; median {t['score_noise_median'] or 0:.3f})"
            )
        g = c.get("generation")
        if g:
            stdout.print(
                f"  {esc(c['name'])}, generated as the Modelfile serves it: "
                f"{g['agreement']:.1%} the scored label, {g['label_rate']:.1%} a label"
            )
        h = (g or {}).get("constrained")
        if h:
            own = h.get("lorapilot_constrained") or {}
            mine = (
                f"; lorapilot's constrained check answered the same for {own['n_same']} of "
                f"{own['n']}"
                if own.get("n")
                else ""
            )
            stdout.print(
                f"  {esc(c['name'])}, constrained by labels.gbnf (llama.cpp's grammar sampler): "
                f"{h['agreement']:.1%} the scored label, {h['label_rate']:.1%} a label{mine}"
            )
        # an extraction's answers held to fields.gbnf, and to schema.json as converted
        for key, how in (
            ("constrained", "llama.cpp's grammar sampler"),
            ("schema_constrained", "llama-cpp-python's converter, as its server's response_format"),
        ):
            f = c.get(key)
            if not f:
                continue
            shown = "; ".join(
                f"{k} {v['llama_cpp_constrained']:.3f} (free {v['llama_cpp']:.3f})"
                for k, v in f["metrics"].items()
                if isinstance(v.get("llama_cpp_constrained"), int | float)
                and isinstance(v.get("llama_cpp"), int | float)
            )
            stdout.print(
                f"  {esc(c['name'])}, constrained by {esc(f['file'])} ({how}): {f['n_same']} of "
                f"{f['n']} lorapilot's answer, {f['n_same_as_free']} the free one; {esc(shown)}"
            )
    for w in r.get("warnings") or []:
        stdout.print(f"[yellow]warning[/]: {esc(w)}")


def export(r: dict) -> None:
    if r.get("format") == "gguf" or "serving_agreement" in r:
        if r.get("format") == "gguf":
            stdout.print(f"[green]exported[/] {esc(r['out'])}: {', '.join(r['files'])}")
        _serving(r)
        return
    if not r.get("merged"):
        q = r.get("needs_quantization")
        needs = f"; needs the base quantized as {q}" if q else ""
        stdout.print(f"[green]exported the adapter[/] to {esc(r['out'])}{esc(needs)}")
        return
    agree = r.get("merge_agreement")
    also = ""
    if agree is not None:
        also = f", agreement {agree:.1%} of {r['merge_agreement_examples']}"
    if r.get("merge_token_agreement") is not None:
        also += f" ({r['merge_token_agreement']:.2%} of {r['merge_tokens_compared']} tokens)"
    dtype = f"{r['merged_dtype']}, " if r.get("merged_dtype") else ""
    stdout.print(
        f"[green]exported[/] {esc(r['out'])} ({dtype}max logit diff "
        f"{r['max_logit_diff']:.1e}{also})"
    )
    moved = [
        f"{k} {v['merged']:.3f} (adapter {v['adapter']:.3f})"
        for k, v in (r.get("merge_metrics") or {}).items()
        if isinstance(v.get("merged"), float) and v["merged"] != v["adapter"]  # scores, not counts
    ]
    if moved:
        stdout.print(f"  merged, on the validation split: {esc('; '.join(moved))}")


def _decision(r: dict) -> None:
    for reason in r["reasons"]:
        stdout.print(f"  - {esc(str(reason))}")
    _prompting(r.get("prompting"))
    _probe(r.get("linear_probe"))


def _probe(p: dict | None) -> None:
    """The adapter against the linear probe (`baseline --linear-probe`), beside the decision."""
    if p:
        head = f"  against a linear probe on the base's features ({p['run_id']}): "
        _against(p, head, "probe", "adapter_beats_probe")


def _prompting(p: dict | None) -> None:
    """The adapter against the few-shot prompt (`baseline --shots`), beside the decision."""
    if p:
        similar = " similar" if p.get("selection") == "similar" else ""
        head = f"  against prompting ({p['shots']}-shot{similar} base, {p['run_id']}): "
        _against(p, head, "few_shot", "adapter_beats_prompting")


def _against(p: dict, head: str, value: str, beats: str) -> None:
    """One alternative to adapting against the chosen adapter (report/prompting.py)."""
    if p.get("why_not"):
        stdout.print(head + f"not compared: {esc(p['why_not'])}")
        return
    ci = f" [{p['ci_low']:+.3f}, {p['ci_high']:+.3f}]" if p.get("ci_low") is not None else ""
    stdout.print(
        head
        + f"{p['metric']} {p[value]:.3f} -> {p['adapted']:.3f} ({p['gain']:+.3f}{ci}); "
        + ("the adapter beats it" if p[beats] else "[yellow]not clearly[/]")
    )


def _limitations(r: dict, shown: tuple[str, ...] = ()) -> None:
    """What the report's Limitations section says (a leak kept, a weak baseline, a chosen
    classifier that generates other labels): shown where the decision is, not only in the
    report; those holding a warning `shown` already are left out."""
    for lim in r.get("limitations") or []:
        if not any(w in str(lim) for w in shown):
            stdout.print(f"[yellow]limitation[/]: {esc(str(lim))}")


def report(r: dict) -> None:
    stdout.print(f"decision: [bold]{r['decision']}[/]")
    _decision(r)
    _limitations(r)
    stdout.print(f"report: {r['html']}\n        {r['markdown']}\ndeliverable: {r['deliverable']}")


def _seeded(v: dict) -> str:
    """A seeded variant's value: the mean, its spread and how many seeds it has."""
    mean, sd, done = v.get("value"), v.get("sd"), v.get("seeds_done")
    if not isinstance(mean, (int, float)):
        return ""
    spread = f" ± {sd:.3f}" if isinstance(sd, (int, float)) else ""
    return f"{mean:.3f}{spread} ({v['low']:.3f}-{v['high']:.3f}, {done} seeds)"


def _seed_noise(noise: dict | None) -> None:
    """selection.seeds: the chosen variant's range against the runner-up's, and the seeds
    that fall short of the success criterion on their own."""
    if not noise:
        return
    line = f"seeds: {esc(noise['variant'])} {noise['low']:.3f}-{noise['high']:.3f}"
    if noise.get("runner_up") is not None:
        apart = "separated" if noise["separated"] else "[yellow]overlapping: within seed noise[/]"
        line += (
            f", runner-up {esc(noise['runner_up'])} {noise['runner_up_low']:.3f}-"
            f"{noise['runner_up_high']:.3f} ({apart})"
        )
    short = noise.get("short_of_criterion") or []
    line += (
        f"; [yellow]{len(short)} of {noise['seeds']} seeds short of the success criterion[/]"
        if short
        else f"; every seed meets the success criterion (+{noise['min_gain']:g})"
    )
    stdout.print(line)


def _variants(rows: list[dict], metric: str) -> None:
    seeded = any("seeds_done" in v for v in rows)
    t = Table(title=f"variants (selected on validation {metric}"
              + (", mean over seeds)" if seeded else ")"))  # fmt: skip
    for col in ("variant", "run", "status", metric, "seconds", "step s", "peak memory", "note"):
        t.add_column(col)
    for v in rows:
        value, secs, step = v.get("value"), v.get("seconds"), v.get("median_step_s")
        mark = " [bold green]<- selected[/]" if v.get("selected") else ""
        t.add_row(
            esc(str(v["name"])) + mark,
            str(v.get("run_id") or ""),
            str(v.get("status")),
            _seeded(v) if seeded else f"{value:.3f}" if isinstance(value, (int, float)) else "",
            f"{secs:.0f}" if isinstance(secs, (int, float)) else "",
            f"{step:.2f}" if isinstance(step, (int, float)) else "",
            format_gib(v["peak_memory_bytes"]) if v.get("peak_memory_bytes") else "",
            esc(str(v.get("reason") or "")[:60]),
        )
    stdout.print(t)


def run(r: dict) -> None:
    vs = r.get("variants") or []
    if len(vs) > 1 or any("seeds_done" in v for v in vs):
        selected = r.get("selected")
        _variants([{**v, "selected": v["name"] == selected} for v in r["variants"]],
                  r.get("selection_metric") or "")  # fmt: skip
        _seed_noise(r.get("seed_noise"))
    stdout.print(
        f"decision: [bold]{r['decision']}[/] (variant {r.get('selected')}, train run "
        f"{r['train_run']}, {r['wall_s']:.0f} s)"
    )
    _decision(r)
    exported = tuple(w for e in r.get("exports") or [] for w in e.get("warnings") or [])
    _limitations(r, exported)
    for e in r.get("exports") or []:
        for w in e.get("warnings") or []:
            stdout.print(f"[yellow]warning[/] ({esc(str(e.get('format')))} export): {esc(w)}")
    stdout.print(f"report: {r['html']}")


def sync(r: dict) -> None:
    for t, counts in r["counts"].items():
        stdout.print(
            f"[green]{t}[/]: " + (", ".join(f"{n} {k}" for k, n in counts.items()) or "no runs")
        )
    for row in r["runs"]:
        for t in r["targets"]:
            if row[t].startswith("failed"):
                stdout.print(f"[red]{row['id']}[/] {t}: {esc(row[t])}")
    if "mlflow_uri" in r:
        stdout.print(f"  mlflow: {esc(r['mlflow_uri'])}")
    if "tensorboard_dir" in r:
        stdout.print(f"  tensorboard --logdir {esc(r['tensorboard_dir'])}")


def init(r: dict) -> None:
    stdout.print(f"[green]created[/] {esc(r['pilot'])} ({r['task']}, {r['n_examples']} examples)")
    for split, copied in (r.get("copied") or {}).items():  # --from: the user's own files
        stdout.print(f"  {esc(r['from'][split])} -> {esc(copied)}")
    if r.get("images_copied"):  # a table of image paths: its images, under those paths
        stdout.print(f"  {r['images_copied']} images it names -> the same paths in the pilot")
    for line in r.get("inferred") or []:
        stdout.print(f"  inferred {esc(line)}")
    for w in r.get("warnings") or []:
        stdout.print(f"  [yellow]warning[/] {esc(w)}")
    nxt = "read pilot.yaml, then " if r.get("inferred") else ""
    if r.get("to_state"):
        nxt = f"read pilot.yaml, state {' and '.join(r['to_state'])} in it, then "
    stdout.print(f"Next: {nxt}lorapilot check {esc(r['pilot'])} && lorapilot run {esc(r['pilot'])}")


def data(r: dict) -> None:
    stdout.print(f"[green]data ok[/] version [bold]{r['version']}[/]  run {r['run_id']}")
    stdout.print(f"  source: {esc(str(r['source']))}\n  permission: {esc(str(r['permission']))}")
    conv = r.get("messages")  # data.fields.messages: conversations, and their system turns
    if conv:
        stdout.print(
            f"  conversations in {esc(conv['column'])!r}: the last user turn is the input, "
            f"the last assistant turn the answer; {conv['with_system']} of {conv['n_examples']} "
            f"carry a system turn ({conv['system_differs']} other than task.system, which "
            "prompts every example)"
        )
        if conv.get("with_earlier_turns"):
            stdout.print(
                f"  {conv['with_earlier_turns']} conversation(s) have earlier turns (up to "
                f"{conv['most_earlier_turns']}), in the prompt as they were said; the loss is on "
                "the last assistant turn only"
            )
    sets = r.get("label_sets")  # a multi-label task: examples carrying each label
    t = Table(title="examples per split and " + ("label" if sets else "category"))
    splits = list(r["splits"])
    t.add_column("label" if sets else "category")
    for s in splits:
        t.add_column(s, justify="right")
    for cat, row in sorted(r["per_category"].items()):
        t.add_row(esc(cat), *(str(row.get(s, 0)) for s in splits))
    t.add_row("[bold]examples[/]", *(f"[bold]{r['splits'][s]}[/]" for s in splits))
    if sets:
        per = sets["labels_per_example"]
        t.add_row("labels per example", *(f"{per[s]['mean']:.2f}" for s in splits))
    stdout.print(t)
    if sets and sets["commonest_combinations"]:
        shown = ", ".join(
            f"{esc(' + '.join(c['labels']))} ({c['examples']})"
            for c in sets["commonest_combinations"][:5]
        )
        stdout.print(f"  commonest label combinations: {shown}")
    if "images" in r:
        _image_data(r)
    lt = Table(title="tokens per example (template + answer)")
    for col in ("split", "p50", "p95", "max", "input cut", "target cut"):
        lt.add_column(col, justify="right")
    for s, st in r.get("lengths", {}).items():
        lt.add_row(
            s,
            str(st["p50"]),
            str(st["p95"]),
            str(st["max"]),
            str(st["n_truncated"]),
            str(st["n_target_truncated"]),
        )
    if "lengths" in r:
        stdout.print(lt)
    d = r["duplicates"]
    c = d["counts"]
    stdout.print(
        f"  duplicates: {c['exact']} exact, {c['near']} near pairs; "
        f"{d['n_cross_split']} across splits (policy {d['leakage_policy']}); "
        f"{len(d['dropped_from_train'])} dropped from train"
    )
    ma = r.get("mask_audit")
    if ma is not None:
        stdout.print(
            f"  mask audit: {'[green]ok[/]' if ma['ok'] else '[red]FAILED[/]'}: "
            f"{ma['loss_token_fraction']:.1%} of tokens carry the loss ({ma['loss_on']}), "
            f"end-of-turn trained: {ma['end_of_turn_trained']}, eval prompt = train prefix: "
            f"{ma['eval_prompt_is_train_prefix']}"
        )
    if r["skipped"]:
        stdout.print(f"  [yellow]skipped {len(r['skipped'])} invalid record(s) (data.on_error):[/]")
        for g in r.get("skipped_summary") or []:
            vals = ", ".join(f"{v} {n}" for v, n in g["values"].items())
            more = g["n_values"] - len(g["values"])
            vals += f" and {more} more" if more > 0 else ""
            stdout.print(esc(f"    {g['count']} x {g['problem']} (first {g['first']}; {vals})"))
    groups = r.get("groups")
    if groups:
        per = ", ".join(f"{s} {n}" for s, n in groups["per_split"].items())
        big = ", ".join(f"{g['group']!r} {g['n']}" for g in groups["largest"][:3])
        stdout.print(
            f"  groups of {groups['column']}: {groups['n_groups']} (per split: {per}); largest "
            f"{big}; {len(groups['shared'])} in more than one split"
        )
    for w in r.get("warnings", []):
        stdout.print(f"  [yellow]warning:[/] {esc(w)}")


def inspect(r: dict) -> None:
    from rich.text import Text

    for ex in r["examples"]:
        flag = "[green]match[/]" if ex["match"] else "[red]MISMATCH[/]"
        cut = f", input cut by {ex['tokens_cut']} tokens" if ex["truncated"] else ""
        stdout.rule(
            esc(f"{ex['category']} / {ex['id']} ({ex['source']}): {ex['n_tokens']} tokens{cut}")
        )
        text = Text()
        loss = set(ex["loss_positions"])
        for i, piece in enumerate(ex["pieces"]):
            style = (
                "bold black on green" if i in loss else ("cyan" if piece.startswith("<|") else "")
            )
            text.append(piece, style=style)
        stdout.print(text)
        stdout.print(
            f"loss tokens decode to {esc(repr(ex['decoded_target']))}; expected "
            f"{esc(repr(ex['expected_target']))}: {flag}"
        )
    stdout.print(
        f"\ncategories: {esc(', '.join(r['categories']))}  (green = tokens that carry the loss)"
    )
    if r.get("chat_template", "base") != "base":
        stdout.print(f"prompt format: model.chat_template {esc(r['chat_template'])}")
    if r.get("system_folded"):
        stdout.print(
            "the chat template takes no system turn: task.system opens the first user turn"
        )
    if r.get("shots"):  # inspect --shots: the few-shot baseline's prompts
        sh = r["shots"]
        stdout.print(f"as the few-shot baseline prompts: {_shots_text(sh)}")
    if not r["ok"]:
        stdout.print("[red]some examples' loss tokens do not decode to their answer[/]")


def _image_data(r: dict) -> None:
    t = Table(title="images per category (all splits)")
    for col in ("category", "n", "width", "height", "modes", "formats", "bytes (median)"):
        t.add_column(col)
    for cat, c in r["images"]["per_category"].items():
        t.add_row(
            esc(cat),
            str(c["n"]),
            _range(c.get("width")),
            _range(c.get("height")),
            esc(_counts(c.get("mode"))),
            esc(_counts(c.get("format"))),
            f"{c['bytes']['median']:g}" if "bytes" in c else "-",
        )
    stdout.print(t)
    tr = r["transforms"]
    stdout.print(
        f"  transforms: mode {tr['mode']}, resize {tr['resize']} to {tr['size']}, crop "
        f"{tr['crop']}, mean {tr['mean']}, std {tr['std']} (from {tr['source']})"
    )


def inspect_images(r: dict) -> None:
    t = r["transforms"]
    stdout.print(
        f"transforms: mode {t['mode']}, resize {t['resize']} to {t['size']}, crop {t['crop']}, "
        f"mean {t['mean']}, std {t['std']}, augment {t['augment'] or 'none'} (from {t['source']})"
    )
    table = Table("category", "n", "width", "height", "modes", "formats", "contact sheet")
    for cat, c in r["per_category"].items():
        table.add_row(
            esc(cat),
            str(c.get("n", 0)),
            _range(c.get("width")),
            _range(c.get("height")),
            esc(_counts(c.get("mode"))),
            esc(_counts(c.get("format"))),
            esc(c["contact_sheet"]),
        )
    stdout.print(table)
    for w in r["warnings"]:
        stdout.print(f"[yellow]warning:[/] {esc(w)}")
    if not r["ok"]:
        stdout.print("[red]some images did not transform to the model's input shape[/]")


def _range(s: dict | None) -> str:
    if not s:
        return "-"
    return f"{s['min']:g}" if s["min"] == s["max"] else f"{s['min']:g}-{s['max']:g}"


def _shots_text(sh: dict) -> str:
    """A few-shot prompt's demonstrations in a line: fixed ones named, or the rule."""
    if sh.get("selection") == "similar":
        return (
            f"each input's {sh['k']} most similar training examples first ({sh['similarity']}; "
            f"up to +{sh['prompt_tokens_added_max']} tokens; `shot_ids` in predictions.jsonl)"
        )
    return (
        f"{sh['k']} training examples first (+{sh['prompt_tokens_added']} tokens; "
        f"{', '.join(map(esc, sh['ids']))})"
    )


def _counts(c: dict | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in (c or {}).items())


# The metrics a terminal line shows, where the task has them (every one is in --json).
EVALUATION_METRICS = (
    "accuracy", "macro_f1", "micro_f1", "json_valid_rate", "schema_valid_rate",
    "required_fields_rate", "field_f1", "leaf_f1", "exact_match", "format_valid_rate",
    "answer_match", "ungrounded_value_rate",
)  # fmt: skip
MAIN_METRICS = (
    "accuracy", "macro_f1", "micro_f1", "json_valid_rate", "field_f1", "leaf_f1",
    "format_valid_rate", "answer_match",
)  # fmt: skip
DELTA_METRICS = ("macro_f1", "field_f1", "leaf_f1", "format_valid_rate", "answer_match")


def evaluation(r: dict) -> None:
    m = r["metrics"]
    stdout.print(
        f"[green]{r['split']}[/] n={r['n']}  run {r['run_id']}  protocol {r['eval_protocol']}  "
        f"({r['examples_per_s']:.1f} ex/s)"
    )
    shots = r.get("shots")
    if shots:  # baseline --shots: the prompting alternative, not the zero-shot baseline
        stdout.print(f"  few-shot: the base shown {_shots_text(shots)}")
    probe = r.get("linear_probe")
    if probe:  # baseline --linear-probe: the embedding-classifier alternative
        stdout.print(
            f"  linear probe: logistic regression on the base's features of each prompt, "
            f"fitted on {probe['fitted_on']['n']} training examples ({probe['iterations']} "
            "L-BFGS iterations)"
        )
    headline = [k for k in EVALUATION_METRICS if k in m]
    stdout.print("  " + "  ".join(f"{k}={m[k]:.3f}" for k in headline))
    group, per = per_group(m)
    if per:
        t = Table(title=group.replace("_", " "))
        cols = [
            c
            for c in ("precision", "recall", "f1", "accuracy", "support")
            if any(c in v for v in per.values())
        ]
        t.add_column("name")
        for c in cols:
            t.add_column(c, justify="right")
        for name, v in per.items():
            t.add_row(
                esc(name),
                *(
                    f"{v[c]:.3f}" if isinstance(v.get(c), float) else str(v.get(c, ""))
                    for c in cols
                ),
            )
        stdout.print(t)
    _generated(r.get("generation"))
    _label_issues(r.get("label_issues"))
    stdout.print(f"  predictions: {esc(r['predictions'])}")


def _label_issues(li: dict | None) -> None:
    """A probe baseline's review of the training labels: how many, the commonest pairs and
    the first suspects."""
    if not li:
        return
    if li.get("skipped"):
        stdout.print(f"  training labels not reviewed: {esc(li['skipped'])}")
        return
    pairs = ", ".join(
        f"{esc(p['label'])} -> {esc(p['suggested'])} {p['count']}" for p in li["pairs"][:4]
    )
    stdout.print(
        f"  suspect training labels: {li['n_suspects']} of {li['n']} ({li['rate']:.1%}; "
        f"out-of-fold probe accuracy {li['out_of_fold_accuracy']:.3f})"
        + (f": {pairs}" if pairs else "")
    )
    if li.get("note"):
        stdout.print(f"    [yellow]{esc(li['note'])}[/]")
    for s in li["suspects"][:3]:
        text = " ".join(str(s.get("text") or "").split())[:70]
        stdout.print(
            f"    {esc(str(s['id']))} labelled {esc(s['label'])} (p {s['p_label']:.2f}), the "
            f"features say {esc(s['suggested'])} (p {s['p_suggested']:.2f}): {esc(text)}"
        )
    if li.get("file"):
        stdout.print(f"    every suspect, to review (nothing is changed): {esc(li['file'])}")


def prediction(r: dict) -> None:
    s = r["summary"]
    who = f"run {r['train_run']}" if r["train_run"] else "the base model"
    if r.get("shots"):  # predict --base --shots K: the few-shot prompt
        who += f" shown {_shots_text(r['shots'])}"
    if r.get("linear_probe"):  # predict --base --linear-probe: the embedding classifier
        who += " read by the linear probe fitted on the training split"
    stdout.print(
        f"[green]predict[/] {r['n']} inputs of {esc(r['input']['file'])} with {who}  "
        f"run {r['run_id']}  protocol {r['eval_protocol']}  ({r['examples_per_s']:.1f} ex/s)"
    )
    if "predicted" in s:
        ranked = sorted(s["predicted"].items(), key=lambda kv: -kv[1])
        shown = [(k, v) for k, v in ranked if v][:10]
        rest = sum(1 for _, v in ranked if v) - len(shown)
        line = "  ".join(f"{esc(k)} {v}" for k, v in shown)
        line += f"  (+{rest} more labels)" * bool(rest)
        never = sum(1 for _, v in ranked if not v)
        line += f"; {never} labels never predicted" * bool(never)
        stdout.print(
            f"  predicted: {line}" + f"  (not a label: {s['not_a_label']})" * bool(s["not_a_label"])
        )
    else:
        rates = [
            k
            for k in (
                "json_valid_rate",
                "schema_valid_rate",
                "format_valid_rate",
                "ungrounded_value_rate",
            )
            if k in s
        ]
        stdout.print("  " + "  ".join(f"{k}={s[k]:.3f}" for k in rates))
    if r["metrics"]:
        m = r["metrics"]
        headline = [k for k in EVALUATION_METRICS if isinstance(m.get(k), int | float)]
        stdout.print(
            f"  {r['n_scored']} inputs carried an answer: "
            + "  ".join(f"{k}={m[k]:.3f}" for k in headline)
        )
    for w in r["warnings"]:
        stdout.print(f"  [yellow]warning:[/] {esc(w)}")
    stdout.print(f"  predictions: {esc(r['out'] or r['predictions'])}")


def _generated(g: dict | None) -> None:
    """eval.generation_check: the scored classifier's answers as a chat server generates them."""
    if not g:
        return
    metrics = ", ".join(
        f"{k} {v['generated']:.3f}"
        for k, v in g["metrics"].items()
        if isinstance(v.get("generated"), int | float)
    )
    colour = "green" if g["agreement"] >= GENERATION_AGREEMENT_MIN else "yellow"
    stdout.print(
        f"  generated (as a chat server answers): [{colour}]{g['n_same']} of {g['n']} the "
        f"scored label[/] ({g['agreement']:.1%}), {g['n_labels']} a label"
        + (f"; {metrics}" if metrics else "")
    )
    c = g.get("constrained")
    if c:
        colour = "green" if c["agreement"] >= GENERATION_AGREEMENT_MIN else "yellow"
        stdout.print(
            f"  constrained to the labels (as a server with a choice or grammar answers): "
            f"[{colour}]{c['n_same']} of {c['n']} the scored label[/] ({c['agreement']:.1%})"
        )


def train(r: dict) -> None:
    a = r["update_audit"] or {}
    stdout.print(
        f"[green]train {r['status']}[/] run {r['run_id']} ({r['variant']}"
        + (f", seed replicate {r['replicate']}: seed {r['seed']}" if r.get("replicate") else "")
        + f") in {r['wall_s']:.0f} s, {r['steps']} steps"
    )
    stdout.print(
        f"  trainable params: {r['trainable_params']:,} of {r['total_params']:,}; "
        f"{len(r['target_modules'])} adapted modules; update audit: "
        f"{'ok' if a.get('ok') else a or 'n/a (resumed)'}"
    )
    stdout.print(f"  val loss {r['initial_val_loss']:.4f} -> {r['final_val_loss']:.4f}")
    _early_stopping(r.get("early_stopping"), r.get("total_steps"))
    _sampling(r.get("sampling"))
    m = r["metrics"]
    stdout.print("  " + "  ".join(f"{k}={m[k]:.3f}" for k in MAIN_METRICS if k in m))
    _generated(r.get("generation"))
    stdout.print(f"  adapter: {esc(r['adapter_path'])}")


def _early_stopping(es: dict | None, total: int | None) -> None:
    """train.early_stopping's line: where it stopped, and whose weights the adapter holds."""
    if not es:
        return
    of = f" of {total}" if total else ""
    head = (
        f"stopped early at step {es['stopped_at_step']}{of}"
        if es["stopped_early"]
        else f"ran every step{of}"
    )
    best = es.get("best_step")
    if best is None:
        tail = "no validation point beat the others"
    elif es["restored"]:
        tail = f"adapter from step {best} (val loss {es['best_val_loss']:.4f}), the best point"
    else:
        tail = f"best point step {best} (val loss {es['best_val_loss']:.4f})" + (
            "; the adapter is the last step's (restore_best: false)"
            if best != es["stopped_at_step"]
            else ", the last"
        )
    stdout.print(f"  early stopping: {head}; {tail}")


def _sampling(sampling: dict | None) -> None:
    """train.category_sampling's line: the categories drawn most above and below once each."""
    if not sampling:
        return
    per = sampling["per_category"]
    by = sorted(per, key=lambda c: -per[c]["per_example"])
    shown = by if len(by) <= 4 else [*by[:2], *by[-2:]]
    parts = []
    for c in shown:
        k = per[c]
        draws = f"{k['draws_per_epoch']:g} ({k['per_example']:g}x)"
        parts.append(f"{esc(c)} {k['examples']} -> {draws}")
    stdout.print(
        f"  category sampling {sampling['mode']}: examples -> draws per epoch: "
        + ", ".join(parts)
        + (f" ({len(by) - 4} more in the record)" if len(by) > 4 else "")
    )


def probe(r: dict) -> None:
    t = Table(title=f"probe {r['run_id']}" + (" (estimate only)" if r.get("estimate_only") else ""))
    for col in (
        "seq_len",
        "micro_batch",
        "ckpt",
        "first step",
        "later step",
        "tokens/s",
        "peak mem",
        "estimate",
        "error",
        "ok",
    ):
        t.add_column(col, justify="right")
    for m in r["measurements"]:
        f = lambda v, fmt: fmt.format(v) if isinstance(v, (int, float)) else "-"  # noqa: E731
        t.add_row(
            str(m.get("seq_len")),
            str(m.get("micro_batch")),
            "on" if m.get("grad_checkpointing") else "off",
            f(m.get("first_step_s"), "{:.2f}s"),
            f(m.get("later_step_s"), "{:.2f}s"),
            f(m.get("tokens_per_s"), "{:,.0f}"),
            format_gib(m.get("peak_memory_bytes")),
            format_gib(m.get("estimated_peak_memory_bytes")),
            f(m.get("estimate_error"), "{:+.0%}"),
            "yes" if m.get("ok", True) else f"[red]{(m.get('error') or 'no')[:40]}[/]",
        )
    stdout.print(t)


def budget(r: dict) -> None:
    e = r["estimate"]
    stdout.print(
        f"[bold]estimate[/] (probe {r['probe_run']}): {e['steps']} steps, total "
        f"{e['total_s'] / 60:.1f} min, "
        f"${e['cost_usd']:.2f}"
    )
    for k in ("train_s", "eval_s", "checkpoint_s", "setup_s", "margin_s"):
        stdout.print(f"  {k[:-2]:<11} {e[k]:>9.1f} s")
    p = r.get("pilot")
    if p:
        phases = [k for k in p if k.endswith("_s") and k != "total_s"]
        parts = ", ".join(f"{k[:-2]} {p[k] / 60:.1f}" for k in phases)
        stdout.print(f"[bold]whole pilot[/]: {p['total_s'] / 60:.1f} min ({parts} min)")
    f = r.get("figures") or {}
    if f.get("eval_peak_memory_bytes"):
        stdout.print(
            f"  peak memory: training {format_gib(f.get('peak_memory_bytes') or 0)}, "
            f"evaluation {format_gib(f['eval_peak_memory_bytes'])} (the limit takes the larger)"
        )
    for name, lim in (r.get("limits") or {}).items():
        if isinstance(lim, dict):
            stdout.print(
                f"  limit {name}: {lim.get('value')} vs {lim.get('limit')}: "
                f"{'ok' if lim.get('ok') else '[red]exceeded[/]'}"
            )
    t = Table(title="rental plans")
    for col in ("days", "experiment hours", "variants that fit", "cost"):
        t.add_column(col, justify="right")
    for days, plan in r["rental"].items():
        t.add_row(
            days,
            f"{plan['phases']['experiments']:.1f}",
            str(plan["variants_fit"]),
            f"${plan['cost_usd']:.0f}",
        )
    stdout.print(t)
    _plan(r)
    if r.get("actual"):
        stdout.print("[bold]estimate vs actual[/] (train run " + str(r.get("train_run")) + ")")
        for k, v in (r.get("errors") or {}).items():
            rel = v.get("rel_error")
            stdout.print(
                f"  {k}: estimate {v['estimate']:.1f}, actual {v['actual']:.1f}"
                + (f" ({rel:+.0%})" if rel is not None else "")
            )


def pre_rental(r: dict) -> None:
    """`budget --gpu`: one row per GPU class, best value first."""
    t = Table(title="the plan on each GPU class, before renting (an estimate until a probe)")
    cols = ("gpu", "memory", "fits", "micro x accum", "ckpt", "peak train/eval GiB", "step s",
            "plan h", "3/7/30 days", "cost", "calibration")  # fmt: skip
    for col in cols:
        t.add_column(col)
    for g in r["gpus"]:
        days = "/".join("yes" if g["fits_days"][d] else "no" for d in ("3", "7", "30"))
        peak = g["peak_gib"]
        t.add_row(
            esc(g["name"]),
            f"{g['memory_gib']:g} GiB",
            "yes" if g["fits"] else "[red]no[/]",
            f"{g['micro_batch']} x {g['grad_accum']}" if g["fits"] else "-",
            ("on" if g["checkpointing"] else "off") if g["fits"] else "-",
            f"{peak.get('train', 0):.1f} / {peak.get('eval', 0):.1f}",
            f"{g['step_s']:.3f}" if g.get("step_s") else "-",
            f"{g['plan_hours']:.2f}" if g.get("plan_hours") is not None else "-",
            days,
            f"${g['cost_usd']:.2f}" if g.get("cost_usd") is not None else "no price",
            g["calibration"].split(":", 1)[0],
        )
    stdout.print(t)
    i = r["inputs"]
    stdout.print(
        f"lengths: typical {i['lengths']['typical']}, long {i['lengths']['long']} tokens "
        f"(shared prefix {i['lengths']['shared_prefix']}); data {i['data']}; variants "
        f"{', '.join(i['variants'])}"
    )
    stdout.print(f"[dim]{esc(r['method'])}[/]")


def _plan(r: dict) -> None:
    plan, rows = r.get("plan"), r.get("variants") or []
    if not plan or not rows:
        return
    seeds = max((v.get("seeds") or 1 for v in rows), default=1)
    t = Table(title="the plan: every variant" + (f", {seeds} seeds each" if seeds > 1 else ""))
    for col in ("variant", "change", "probe", "steps", "minutes", "cost", "peak", "limits"):
        t.add_column(col)
    for v in rows:
        change = ", ".join(f"{k}={b}" for k, (_, b) in (v.get("diff") or {}).items()) or "-"
        mins = v.get("total_s")
        over = v.get("over_limits")
        t.add_row(
            esc(v["name"]),
            esc(f"{change} ({v['label']})" if v["label"] != "base" else change),
            str(v.get("probe_run") or "[yellow]not probed[/]"),
            str(v.get("steps") or ""),
            f"{mins / 60:.1f}" if mins is not None else "",
            f"${v['cost_usd']:.2f}" if v.get("cost_usd") is not None else "",
            format_gib(v["peak_memory_bytes"]) if v.get("peak_memory_bytes") else "",
            ("[red]over: " + ", ".join(over) + "[/]") if over else ("ok" if mins else ""),
        )
    stdout.print(t)
    fits = ", ".join(
        f"{d} days {'yes' if f['fits'] else 'no'} ({f['variants_fit']} fit)"
        for d, f in plan["fits"].items()
    )
    total = plan.get("total_s")
    stdout.print(
        "[bold]whole plan[/]: "
        + (f"{total / 3600:.2f} h, ${plan['cost_usd']:.2f}; " if total is not None else "")
        + f"fits: {fits}; chosen rental {plan['rental_days']} days"
    )
    for v in rows:
        if v.get("note"):
            stdout.print(f"  [yellow]{esc(v['name'])}[/]: {esc(v['note'])}")


def _agreement(g: dict | None) -> str:
    """Free generation's agreement with scoring, and the labels-constrained one's after it."""
    if not g:
        return ""
    c = g.get("constrained")
    return f"{g['n_same']}/{g['n']} ({g['agreement']:.0%})" + (
        f" | {c['n_same']}/{c['n']}" if c else ""
    )


def compare(r: dict) -> None:
    t = Table(title="runs compared with the baseline " + str(r["baseline"]))
    generated = any(row.get("generation") for row in r["runs"])  # eval.generation_check
    cols = ("id", "kind", "status", "variant", "main metrics", "delta", "fixed/broken")
    gen_col = ("generated = scored (free | constrained)",) if generated else ()
    for col in (*cols, *gen_col, "note"):
        t.add_column(col)
    for row in r["runs"]:
        m = row.get("metrics") or {}
        main = " ".join(
            f"{k}={m[k]:.3f}" for k in MAIN_METRICS if isinstance(m.get(k), (int, float))
        )
        d = (row.get("deltas") or {}).get("overall", {})
        delta = " ".join(f"{k}{d[k]:+.3f}" for k in DELTA_METRICS if k in d)
        fl = row.get("flips") or {}
        fb = f"{len(fl.get('fixed', []))}/{len(fl.get('broken', []))}" if fl else ""
        note = row.get("not_comparable_reason") or row.get("reason") or ""
        t.add_row(
            row["id"],
            row["kind"],
            row["status"],
            (row.get("name") or ("ad hoc " if row["kind"] == "train" else ""))
            + (f" ({row['variant']})" if row.get("variant") else ""),
            main,
            delta,
            fb,
            *((_agreement(row.get("generation")),) if generated else ()),
            esc(note[:50]),
        )
    stdout.print(t)
    sel = r.get("selection") or {}
    if len(sel.get("variants") or []) > 1 or (sel.get("seeds") or 1) > 1:
        _variants(sel["variants"], sel.get("metric") or "")
    _seed_noise(sel.get("seed_noise"))
    if r["decision"]:
        stdout.print(f"decision so far ({r['chosen']}): [bold]{r['decision']}[/]")
        _decision(r)
