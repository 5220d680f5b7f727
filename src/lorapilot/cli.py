"""The `lorapilot` command: parse -> load spec -> call one stage function -> print. No logic.

Contract (see ../shared/DESIGN.md): every verb takes `--json` and then prints exactly one JSON
object on stdout, everything else on stderr. Exit codes: 0 ok, 1 a check failed, 2 bad input.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape as esc
from rich.table import Table

from lorapilot import registry
from lorapilot.errors import CheckFailed, LorapilotError, UsageError

app = typer.Typer(
    name="lorapilot",
    help="Run a LoRA / PEFT fine-tuning pilot on one task and end it with a reproducible "
    "result and a GO / NO-GO decision.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
model_app = typer.Typer(help="The base model: fetch the default one.", no_args_is_help=True)
app.add_typer(model_app, name="model")

JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print exactly one JSON object on stdout; logs go to stderr.")
]
PilotArg = Annotated[
    str, typer.Argument(help="Pilot folder holding pilot.yaml, or the pilot YAML file.")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="Override a spec value for this run, e.g. --set train.lr=1e-4 (repeatable)."
    ),
]

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def log_console(as_json: bool) -> Console:
    """Human-readable output goes to stdout, unless stdout is reserved for JSON."""
    return stderr if as_json else stdout


def _print_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def verb(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map lorapilot errors to the contract's exit codes and messages; never a traceback.

    The wrapped function returns the JSON-able result dict; `show` in it is popped and called
    to print the human view when `--json` is off.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        as_json = bool(kwargs.get("as_json"))
        try:
            result = fn(*args, **kwargs) or {}
        except CheckFailed as e:
            _fail(e, as_json, e.details)
        except LorapilotError as e:
            _fail(e, as_json, {})
        except OSError as e:  # disk full, read-only folder, permissions: a message, not a traceback
            _fail(LorapilotError(_os_error_message(e)), as_json, {}, label="error")
        except KeyboardInterrupt:
            stderr.print("[yellow]interrupted[/]")
            raise typer.Exit(130) from None
        except registry.Interrupted as e:  # SIGTERM: the run record already says interrupted
            stderr.print(f"[yellow]interrupted:[/] {esc(str(e))}")
            raise typer.Exit(143) from None
        except typer.Exit:
            raise
        except Exception as e:  # a bug in lorapilot: say so plainly, traceback on request
            if os.environ.get("LORAPILOT_DEBUG"):
                raise
            _fail(
                LorapilotError(
                    f"internal error: {type(e).__name__}: {e}. This is a lorapilot bug; "
                    "rerun with LORAPILOT_DEBUG=1 for the traceback and report it."
                ),
                as_json,
                {},
            )
        else:
            show = result.pop("_show", None)
            exit_code = int(result.pop("_exit_code", 0))
            if as_json:
                _print_json(result)
            elif show is not None:
                show(result)
            if exit_code:
                raise typer.Exit(exit_code)

    return wrapper


# errno values that mean "the disk/folder would not take the write"
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}


def _os_error_message(e: OSError) -> str:
    """One line for a file-system failure: what could not be done, where, and why."""
    why = e.strerror or str(e)
    where = f" {e.filename}" if e.filename is not None else ""
    if e.errno in _WRITE_ERRNOS:
        return f"cannot write{where}: {why}"
    return f"file system error on{where or ' a file'}: {why}"


def _fail(e: LorapilotError, as_json: bool, details: dict, label: str | None = None) -> None:
    label = label or ("check failed" if e.exit_code == 1 else "error")
    # user text (spec keys, data, paths) is escaped: "[/x]" in a key must not be read as markup
    stderr.print(f"[bold red]{label}:[/] {esc(str(e))}", markup=True, highlight=False)
    if as_json:
        _print_json({"ok": False, "error": str(e), "exit_code": e.exit_code, **details})
    raise typer.Exit(e.exit_code)


# --------------------------------------------------------------------------- verbs


@app.command()
@verb
def check(pilot: PilotArg, as_json: JsonFlag = False, sets: SetOpt = None) -> dict:
    """Validate the pilot spec (hypothesis, task, guards, limits) and find its data source
    (files exist and are readable, an HF dataset is cached), without loading the model or
    reading records. Exit 2 names the bad key (and the resolved path)."""
    from lorapilot.data.source import check_data_source
    from lorapilot.spec import load_pilot

    p = load_pilot(pilot, sets)
    s = p.spec
    data_source = check_data_source(p)
    result = {
        "ok": True,
        "pilot": str(p.dir),
        "spec": str(p.spec_path),
        "name": s.name,
        "spec_hash": s.spec_hash(),
        "task": s.task.kind,
        "success": s.success.model_dump() if s.success else None,
        "guards": [g.model_dump(exclude_none=True) for g in s.guards],
        "resolved": s.model_dump(mode="json"),
        "data_source": data_source,
    }

    def show(r: dict) -> None:
        stdout.print(f"[green]ok[/] {esc(r['spec'])}: pilot [bold]{r['name']}[/] ({r['task']})")
        stdout.print(f"  hypothesis: {esc(s.hypothesis.strip())}")
        stdout.print(f"  success: {esc(s.success.metric)} gains at least {s.success.min_gain}")
        for g in r["guards"]:
            stdout.print(f"  guard: {esc(str(g))}")
        for src in r["data_source"]["sources"]:
            what = src.get("format") or src["type"]
            if src["type"] == "hf_cache":
                what = ", ".join(f"{x['source']}: {x['rows']} rows" for x in src["splits"])
            stdout.print(
                f"  data: {esc(src['key'])} {esc(src.get('path') or src['name'])} ({esc(what)}, "
                f"{src['n_files']} file(s), {src['bytes']} bytes)"
            )
        stdout.print(f"  spec hash: {r['spec_hash'][:16]}")

    result["_show"] = show
    return result


@app.command()
@verb
def schema(as_json: JsonFlag = False) -> dict:
    """Print the JSON Schema of pilot.yaml (the same with or without --json)."""
    from lorapilot.spec import json_schema

    sch = json_schema()
    sch["_show"] = lambda r: _print_json(r)
    return sch


@model_app.command("fetch")
@verb
def model_fetch(
    as_json: JsonFlag = False,
    force: Annotated[
        bool, typer.Option("--force", help="Re-make the folder even if its hashes match.")
    ] = False,
) -> dict:
    """Install the default base model (SmolLM2-135M-Instruct) as an HF folder with a hash manifest."""
    from lorapilot.models import fetch_default_model

    con = log_console(as_json)
    con.print("[dim]checking the default base model...[/]")
    res = fetch_default_model(force=force)
    out = {
        "ok": True,
        "path": str(res.path),
        "sha256": res.sha256,
        "reused": res.reused,
        "seconds": round(res.seconds, 2),
        "source": res.source,
    }

    def show(r: dict) -> None:
        what = "already installed, hashes verified" if r["reused"] else "installed"
        stdout.print(f"[green]ok[/] {r['path']} ({what}, {r['seconds']} s)")
        stdout.print(f"  model.safetensors sha256 {r['sha256']}")

    out["_show"] = show
    return out


@app.command()
@verb
def runs(
    pilot: PilotArg,
    as_json: JsonFlag = False,
    kind: Annotated[
        str | None, typer.Option("--kind", help="Only runs of this kind (data, train, ...).")
    ] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="table, json (the --json object) or csv (one row per run, fixed columns).",
        ),
    ] = "table",
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            help="Follow a train run live (its steps.jsonl) until it is no longer running.",
        ),
    ] = False,
    run: Annotated[
        str | None,
        typer.Option(
            "--run",
            help="With --watch: the run to follow (default: the running train run, else the latest).",
        ),
    ] = None,
    interval: Annotated[
        float, typer.Option("--interval", min=0.05, help="With --watch: seconds between refreshes.")
    ] = 1.0,
    last: Annotated[
        int,
        typer.Option("--last", min=1, help="With --watch: how many recent steps the table shows."),
    ] = 15,
) -> dict:
    """List every run record of the pilot, failed and interrupted ones included; or, with
    --watch, follow a train run's steps live."""
    from lorapilot.registry import list_runs
    from lorapilot.runs_view import STATUS_COLOUR, runs_csv
    from lorapilot.spec import resolve_pilot

    if fmt not in ("table", "json", "csv"):
        raise UsageError(f"--format {fmt!r}: expected table, json or csv")
    if as_json and fmt == "csv":
        raise UsageError("--json and --format csv both claim stdout: give one of them")
    if run and not watch:
        raise UsageError("--run selects the run to --watch; add --watch")
    pilot_dir, _ = resolve_pilot(pilot)
    if watch:
        return _watch_run(pilot_dir, run, as_json or fmt == "json", fmt, interval, last)
    records = list_runs(pilot_dir, kind)
    rows = [
        {
            "id": r.id,
            "kind": r.kind,
            "status": r.status,
            "parent": r.parent,
            "started_at": r.started_at,
            "ended_at": r.ended_at,
            "duration_s": r.duration_s,
            "data_version": r.data_version,
            "variant": (r.variant or {}).get("label"),
            "error": r.error,
        }
        for r in records
    ]

    def show(res: dict) -> None:
        if fmt == "json":
            _print_json(res)
            return
        if fmt == "csv":
            sys.stdout.write(runs_csv(rows))
            return
        if not rows:
            stdout.print(f"no runs yet in {esc(str(pilot_dir / 'runs'))}")
            return
        t = Table(title=f"runs of {esc(pilot_dir.name)}")
        t.add_column("id", no_wrap=True)
        for col in ("kind", "status", "duration", "variant"):
            t.add_column(col)
        for r in rows:
            dur = f"{r['duration_s']:.1f}s" if r["duration_s"] is not None else "-"
            t.add_row(
                r["id"],
                r["kind"],
                f"[{STATUS_COLOUR.get(r['status'], 'white')}]{r['status']}[/]",
                dur,
                r["variant"] or "",
            )
        stdout.print(t)
        for r in rows:  # reasons in full, below the table, where they are readable
            if r["error"]:
                stdout.print(f"{r['id']}: {esc(r['error'])}")

    return {"pilot": str(pilot_dir), "runs": rows, "_show": show}


def _watch_run(
    pilot_dir: Path, run: str | None, as_json: bool, fmt: str, interval: float, last: int
) -> dict:
    """`runs --watch`: the live table on the console (stderr under JSON), the summary as result."""
    from lorapilot.runs_view import watch

    if fmt == "csv":
        raise UsageError("--watch shows a live table; --format csv lists runs (drop one of them)")
    summary = watch(pilot_dir, run, log_console(as_json), interval=interval, last=last)
    result: dict[str, Any] = {"pilot": str(pilot_dir), **summary}
    if fmt == "json":
        result["_show"] = _print_json
    else:
        result["_show"] = lambda r: stdout.print(
            f"run {r['run_id']}: {r['status']} after {r['steps_done']} steps"
        )
    return result


@app.command()
@verb
def data(pilot: PilotArg, as_json: JsonFlag = False, sets: SetOpt = None) -> dict:
    """Load, validate, clean, version and split the data; find duplicates and leaks; measure
    lengths; audit the loss mask over every example. Exit 1 on a leak or a mask problem."""
    from lorapilot.data.stage import run_data
    from lorapilot.spec import load_pilot

    p = load_pilot(pilot, sets)
    log_console(as_json).print(f"[dim]data: {esc(p.dir.name)}: loading and checking...[/]")
    result = run_data(p)
    result["_show"] = _show_data
    return result


def _show_data(r: dict) -> None:
    stdout.print(f"[green]data ok[/] version [bold]{r['version']}[/]  run {r['run_id']}")
    stdout.print(f"  source: {esc(str(r['source']))}\n  permission: {esc(str(r['permission']))}")
    t = Table(title="examples per split and category")
    splits = list(r["splits"])
    t.add_column("category")
    for s in splits:
        t.add_column(s, justify="right")
    for cat, row in sorted(r["per_category"].items()):
        t.add_row(esc(cat), *(str(row.get(s, 0)) for s in splits))
    t.add_row("[bold]total[/]", *(f"[bold]{r['splits'][s]}[/]" for s in splits))
    stdout.print(t)
    lt = Table(title="tokens per example (template + answer)")
    for col in ("split", "p50", "p95", "max", "input cut", "target cut"):
        lt.add_column(col, justify="right")
    for s, st in r["lengths"].items():
        lt.add_row(
            s,
            str(st["p50"]),
            str(st["p95"]),
            str(st["max"]),
            str(st["n_truncated"]),
            str(st["n_target_truncated"]),
        )
    stdout.print(lt)
    d = r["duplicates"]
    c = d["counts"]
    stdout.print(
        f"  duplicates: {c['exact']} exact, {c['near']} near pairs; "
        f"{d['n_cross_split']} across splits (policy {d['leakage_policy']}); "
        f"{len(d['dropped_from_train'])} dropped from train"
    )
    ma = r["mask_audit"]
    stdout.print(
        f"  mask audit: {'[green]ok[/]' if ma['ok'] else '[red]FAILED[/]'}: "
        f"{ma['loss_token_fraction']:.1%} of tokens carry the loss ({ma['loss_on']}), "
        f"end-of-turn trained: {ma['end_of_turn_trained']}, eval prompt = train prefix: "
        f"{ma['eval_prompt_is_train_prefix']}"
    )
    if r["skipped"]:
        stdout.print(f"  [yellow]skipped {len(r['skipped'])} record(s):[/]")
        for s in r["skipped"][:20]:
            stdout.print(esc(f"    {s['file']}:{s['line']}: {s['problem']}"))


@app.command()
@verb
def inspect(
    pilot: PilotArg,
    as_json: JsonFlag = False,
    per_category: Annotated[
        int, typer.Option("--per-category", min=1, help="Examples shown per category.")
    ] = 2,
    split: Annotated[
        str, typer.Option("--split", help="Split to sample from (train or val; test is reserved).")
    ] = "train",
    seed: Annotated[int, typer.Option("--seed", help="Sampling seed.")] = 0,
    sets: SetOpt = None,
) -> dict:
    """Show examples of every category after the exact preprocessing, loss tokens highlighted.
    Each example's loss tokens are decoded and checked against its answer; a mismatch exits 1."""
    from lorapilot.data.stage import run_inspect
    from lorapilot.spec import load_pilot

    if split not in ("train", "val"):
        raise UsageError(
            f"--split {split!r}: inspect samples train or val (the test split is reserved)"
        )
    p = load_pilot(pilot, sets)
    result = run_inspect(p, per_category, split, seed)
    if not result["ok"]:
        result["_exit_code"] = 1
    result["_show"] = _show_inspect
    if as_json:
        for ex in result["examples"]:
            ex.pop("pieces", None)
    return result


def _show_inspect(r: dict) -> None:
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
    if not r["ok"]:
        stdout.print("[red]some examples' loss tokens do not decode to their answer[/]")


LimitOpt = Annotated[
    int | None,
    typer.Option(
        "--limit", help="Evaluate only the first N examples (a quick look; not comparable)."
    ),
]
NoProgress = Annotated[bool, typer.Option("--no-progress", help="Hide progress bars.")]


@app.command()
@verb
def baseline(
    pilot: PilotArg,
    as_json: JsonFlag = False,
    limit: LimitOpt = None,
    no_progress: NoProgress = False,
    sets: SetOpt = None,
) -> dict:
    """Evaluate the unadapted base model on the validation split; keep its outputs and protocol."""
    from lorapilot.evaluate.stage import run_evaluation
    from lorapilot.spec import load_pilot

    p = load_pilot(pilot, sets)
    result = run_evaluation(p, "baseline", split="val", limit=limit, progress=not no_progress)
    result["_show"] = _show_eval
    return result


@app.command("eval")
@verb
def eval_cmd(
    pilot: PilotArg,
    as_json: JsonFlag = False,
    run: Annotated[
        str | None,
        typer.Option(
            "--run", help="Train run whose adapter to evaluate (default: latest completed)."
        ),
    ] = None,
    split: Annotated[
        str, typer.Option("--split", help="val, or test together with --final.")
    ] = "val",
    final: Annotated[
        bool, typer.Option("--final", help="Allow the reserved test split (the access is logged).")
    ] = False,
    base: Annotated[
        bool, typer.Option("--base", help="Evaluate the base model instead of an adapter.")
    ] = False,
    limit: LimitOpt = None,
    no_progress: NoProgress = False,
) -> dict:
    """Evaluate an adapter (or the base) on val, or on the reserved test split with --final."""
    from lorapilot.evaluate.stage import adapter_of, run_evaluation
    from lorapilot.spec import load_pilot

    p = load_pilot(pilot)
    parent, adapter = (None, None) if base else adapter_of(p, run)
    result = run_evaluation(
        p,
        "eval",
        split=split,
        adapter_dir=adapter,
        parent=parent,
        limit=limit,
        progress=not no_progress,
        final=final,
    )
    result["_show"] = _show_eval
    return result


def _show_eval(r: dict) -> None:
    m = r["metrics"]
    stdout.print(
        f"[green]{r['split']}[/] n={r['n']}  run {r['run_id']}  protocol {r['eval_protocol']}  "
        f"({r['examples_per_s']:.1f} ex/s)"
    )
    headline = [
        k
        for k in (
            "accuracy",
            "macro_f1",
            "json_valid_rate",
            "schema_valid_rate",
            "required_fields_rate",
            "field_f1",
            "exact_match",
            "format_valid_rate",
        )
        if k in m
    ]
    stdout.print("  " + "  ".join(f"{k}={m[k]:.3f}" for k in headline))
    per = m.get("per_category") if "per_field" not in m else m.get("per_field")
    if per:
        t = Table(title="per category" if "per_field" not in m else "per field")
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
    stdout.print(f"  predictions: {esc(r['predictions'])}")


@app.command("train")
@verb
def train_cmd(
    pilot: PilotArg,
    as_json: JsonFlag = False,
    sets: SetOpt = None,
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume", help="Continue this interrupted train run from its last checkpoint."
        ),
    ] = None,
    no_progress: NoProgress = False,
) -> dict:
    """One experiment: adapter, update audit, training, saved adapter, validation metrics.
    `--set key=value` makes it a variant (labelled one_change or combined)."""
    from lorapilot.experiment import run_train
    from lorapilot.spec import load_pilot

    p = load_pilot(pilot, sets)
    con = log_console(as_json)
    result = run_train(
        p, resume=resume, progress=not no_progress, log=lambda m: con.print(f"[dim]{esc(m)}[/]")
    )
    result["_show"] = _show_train
    return result


def _show_train(r: dict) -> None:
    a = r["update_audit"] or {}
    stdout.print(
        f"[green]train {r['status']}[/] run {r['run_id']} ({r['variant']}) in {r['wall_s']:.0f} s, {r['steps']} steps"
    )
    stdout.print(
        f"  trainable params: {r['trainable_params']:,} of {r['total_params']:,}; "
        f"{len(r['target_modules'])} adapted modules; update audit: {'ok' if a.get('ok') else a or 'n/a (resumed)'}"
    )
    stdout.print(f"  val loss {r['initial_val_loss']:.4f} -> {r['final_val_loss']:.4f}")
    m = r["metrics"]
    stdout.print(
        "  "
        + "  ".join(
            f"{k}={m[k]:.3f}"
            for k in ("accuracy", "macro_f1", "json_valid_rate", "field_f1")
            if k in m
        )
    )
    stdout.print(f"  adapter: {esc(r['adapter_path'])}")


@app.command()
@verb
def smoke(
    pilot: PilotArg,
    as_json: JsonFlag = False,
    per_category: Annotated[
        int, typer.Option("--per-category", min=1, help="Examples per category to overfit.")
    ] = 2,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Optimizer steps.")] = 40,
    no_progress: NoProgress = False,
    sets: SetOpt = None,
) -> dict:
    """Overfit a few examples through the real train and eval code: proves wiring, not quality."""
    from lorapilot.experiment import run_smoke
    from lorapilot.spec import load_pilot

    p = load_pilot(pilot, sets)
    con = log_console(as_json)
    result = run_smoke(
        p,
        per_category=per_category,
        max_steps=steps,
        progress=not no_progress,
        log=lambda m: con.print(f"[dim]{esc(m)}[/]"),
    )
    if not result["ok"]:
        result["_exit_code"] = 1

    def show(r: dict) -> None:
        verdict = "[green]ok[/]" if r["ok"] else "[red]FAILED[/]"
        stdout.print(
            f"smoke {verdict}: loss {r['initial_loss']:.3f} -> {r['final_loss']:.4f}, "
            f"{r['n_correct']}/{r['n_examples']} memorised examples predicted right ({r['note']})"
        )

    result["_show"] = show
    return result


@app.command()
@verb
def probe(
    pilot: PilotArg,
    as_json: JsonFlag = False,
    search_batch: Annotated[
        bool,
        typer.Option(
            "--search-batch", help="Double the micro-batch until the memory limit or out-of-memory."
        ),
    ] = False,
    estimate_only: Annotated[
        bool,
        typer.Option(
            "--estimate-only",
            help="Only the analytic memory estimate: no weights loaded, no steps run.",
        ),
    ] = False,
    steps: Annotated[
        int,
        typer.Option("--steps", min=5, help="Measured steps per configuration (after 1 warm-up)."),
    ] = 5,
    no_progress: NoProgress = False,
    sets: SetOpt = None,
) -> dict:
    """Size a full training step (forward, backward, update) at typical and long lengths,
    checkpointing off and on: first/later step time and peak memory, beside an estimate."""
    from lorapilot.probe import run_probe
    from lorapilot.spec import load_pilot

    p = load_pilot(pilot, sets)
    con = log_console(as_json)
    result = run_probe(
        p,
        search_batch=search_batch,
        estimate_only=estimate_only,
        steps=steps,
        progress=not no_progress,
        log=lambda m: con.print(f"[dim]{esc(m)}[/]"),
    )
    result["_show"] = _show_probe
    return result


def _gib(b) -> str:
    return f"{b / 2**30:.2f} GiB" if isinstance(b, (int, float)) else "-"


def _show_probe(r: dict) -> None:
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
            _gib(m.get("peak_memory_bytes")),
            _gib(m.get("estimated_peak_memory_bytes")),
            f(m.get("estimate_error"), "{:+.0%}"),
            "yes" if m.get("ok", True) else f"[red]{(m.get('error') or 'no')[:40]}[/]",
        )
    stdout.print(t)


@app.command()
@verb
def budget(pilot: PilotArg, as_json: JsonFlag = False, sets: SetOpt = None) -> dict:
    """Time and cost of the run from the latest probe, a 3/7/30-day rental plan, and (after a
    train run) the estimate against what the run really took."""
    from lorapilot.plan import run_budget
    from lorapilot.spec import load_pilot

    result = run_budget(load_pilot(pilot, sets))
    result["_show"] = _show_budget
    return result


def _show_budget(r: dict) -> None:
    e = r["estimate"]
    stdout.print(
        f"[bold]estimate[/] (probe {r['probe_run']}): {e['steps']} steps, total {e['total_s'] / 60:.1f} min, "
        f"${e['cost_usd']:.2f}"
    )
    for k in ("train_s", "eval_s", "checkpoint_s", "setup_s", "margin_s"):
        stdout.print(f"  {k[:-2]:<11} {e[k]:>9.1f} s")
    for name, lim in (r.get("limits") or {}).items():
        if isinstance(lim, dict):
            stdout.print(
                f"  limit {name}: {lim.get('value')} vs {lim.get('limit')}: {'ok' if lim.get('ok') else '[red]exceeded[/]'}"
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
    if r.get("actual"):
        stdout.print("[bold]estimate vs actual[/] (train run " + str(r.get("train_run")) + ")")
        for k, v in (r.get("errors") or {}).items():
            rel = v.get("rel_error")
            stdout.print(
                f"  {k}: estimate {v['estimate']:.1f}, actual {v['actual']:.1f}"
                + (f" ({rel:+.0%})" if rel is not None else "")
            )


RunOpt = Annotated[
    str | None, typer.Option("--run", help="Train run (default: the latest completed one).")
]


@app.command()
@verb
def verify(pilot: PilotArg, as_json: JsonFlag = False, run: RunOpt = None) -> dict:
    """Reload the adapter with its pinned base in a fresh process, re-evaluate, and compare
    with the in-process result. A changed base, adapter or tokenizer is refused (exit 1)."""
    from lorapilot.export import run_verify
    from lorapilot.spec import load_pilot

    log_console(as_json).print("[dim]verify: starting a fresh process...[/]")
    result = run_verify(load_pilot(pilot), run)

    def show(r: dict) -> None:
        stdout.print(
            f"[green]verify ok[/]: a fresh process reloading {r['train_run']} on base sha256 "
            f"{r['base_sha256'][:16]} reproduces all predictions ({r['n_mismatched_predictions']} differ) "
            f"and metrics (match: {r['metrics_match']})"
        )

    result["_show"] = show
    return result


@app.command()
@verb
def export(
    pilot: PilotArg,
    out: Annotated[Path, typer.Option("--out", help="New folder for the merged model.")],
    as_json: JsonFlag = False,
    run: RunOpt = None,
    merge: Annotated[
        bool, typer.Option("--merge", help="Merge the adapter into the base weights.")
    ] = False,
) -> dict:
    """Write a merged model folder that plain transformers loads (outputs checked)."""
    from lorapilot.export import run_export
    from lorapilot.spec import load_pilot

    result = run_export(load_pilot(pilot), run, out, merge)
    result["_show"] = lambda r: stdout.print(
        f"[green]exported[/] {r['out']} (max logit diff {r['max_logit_diff']:.1e})"
    )
    return result


@app.command()
@verb
def compare(pilot: PilotArg, as_json: JsonFlag = False) -> dict:
    """Every run side by side (failed ones too, with their reason): metrics and deltas against
    the baseline, guards, examples fixed and broken, and the decision so far."""
    from lorapilot.report.write import run_compare
    from lorapilot.spec import load_pilot

    result = run_compare(load_pilot(pilot))
    result["_show"] = _show_compare
    return result


def _show_compare(r: dict) -> None:
    t = Table(title="runs compared with the baseline " + str(r["baseline"]))
    for col in ("id", "kind", "status", "variant", "main metrics", "delta", "fixed/broken", "note"):
        t.add_column(col)
    for row in r["runs"]:
        m = row.get("metrics") or {}
        main = " ".join(
            f"{k}={m[k]:.3f}"
            for k in ("accuracy", "macro_f1", "field_f1", "json_valid_rate")
            if isinstance(m.get(k), (int, float))
        )
        d = (row.get("deltas") or {}).get("overall", {})
        delta = " ".join(f"{k}{d[k]:+.3f}" for k in ("macro_f1", "field_f1") if k in d)
        fl = row.get("flips") or {}
        fb = f"{len(fl.get('fixed', []))}/{len(fl.get('broken', []))}" if fl else ""
        note = row.get("not_comparable_reason") or row.get("reason") or ""
        t.add_row(
            row["id"],
            row["kind"],
            row["status"],
            row.get("variant") or "",
            main,
            delta,
            fb,
            esc(note[:50]),
        )
    stdout.print(t)
    if r["decision"]:
        stdout.print(f"decision so far ({r['chosen']}): [bold]{r['decision']}[/]")
        for reason in r["reasons"]:
            stdout.print(f"  - {esc(str(reason))}")


@app.command()
@verb
def report(pilot: PilotArg, as_json: JsonFlag = False) -> dict:
    """Write report/index.html (self-contained) and report/report.md with the decision, and
    fill deliverable/ with what to hand over. A NO-GO is a result, not a failure (exit 0)."""
    from lorapilot.report.write import run_report
    from lorapilot.spec import load_pilot

    result = run_report(load_pilot(pilot))

    def show(r: dict) -> None:
        stdout.print(f"decision: [bold]{r['decision']}[/]")
        for reason in r["reasons"]:
            stdout.print(f"  - {esc(str(reason))}")
        stdout.print(
            f"report: {r['html']}\n        {r['markdown']}\ndeliverable: {r['deliverable']}"
        )

    result["_show"] = show
    return result


@app.command("run")
@verb
def run_cmd(pilot: PilotArg, as_json: JsonFlag = False, no_progress: NoProgress = False) -> dict:
    """The whole pilot: data, inspect, baseline, smoke, probe, budget, train, verify, final
    test, report. Completed phases with unchanged inputs are reused."""
    from lorapilot.pipeline import run_pipeline
    from lorapilot.spec import load_pilot

    con = log_console(as_json)
    result = run_pipeline(
        load_pilot(pilot), progress=not no_progress, log=lambda m: con.print(m, highlight=False)
    )

    def show(r: dict) -> None:
        stdout.print(
            f"decision: [bold]{r['decision']}[/] (train run {r['train_run']}, {r['wall_s']:.0f} s)"
        )
        for reason in r["reasons"]:
            stdout.print(f"  - {esc(str(reason))}")
        stdout.print(f"report: {r['html']}")

    result["_show"] = show
    return result


@app.command()
@verb
def sync(
    pilot: PilotArg,
    as_json: JsonFlag = False,
    to: Annotated[
        list[str] | None,
        typer.Option(
            "--to", help="mlflow or tensorboard (repeatable; default: the spec's tracking list)."
        ),
    ] = None,
) -> dict:
    """Mirror the pilot's existing run records to MLflow / TensorBoard. Idempotent: an
    unchanged run is skipped, a changed one replaced, never duplicated."""
    from lorapilot import tracking
    from lorapilot.spec import load_pilot

    p = load_pilot(pilot)
    targets = list(dict.fromkeys(to or p.spec.tracking))
    if not targets:
        raise UsageError(
            f"{p.spec_path}: nothing to sync to: give --to mlflow or --to tensorboard, "
            "or list them under tracking in the spec"
        )
    unknown = [t for t in targets if t not in tracking.TARGETS]
    if unknown:
        raise UsageError(
            f"--to {unknown[0]!r}: unknown tracker; known: {', '.join(tracking.TARGETS)}"
        )
    tracking.require(targets, "--to")
    log_console(as_json).print(
        f"[dim]sync: mirroring the runs of {esc(p.dir.name)} to {', '.join(targets)}...[/]"
    )
    result = tracking.sync(p.dir, targets)
    if not result["ok"]:
        result["_exit_code"] = 1

    def show(r: dict) -> None:
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

    result["_show"] = show
    return result


@app.command()
@verb
def init(
    name: Annotated[str, typer.Argument(help="Name of the new pilot folder.")],
    as_json: JsonFlag = False,
    task: Annotated[
        str, typer.Option("--task", help="classification or extraction.")
    ] = "classification",
    directory: Annotated[Path, typer.Option("--dir", help="Where to create the folder.")] = Path(
        "."
    ),
) -> dict:
    """Scaffold a pilot folder: a commented pilot.yaml and a tiny data file to start from."""
    from lorapilot.scaffold import init_pilot

    result = init_pilot(name, task, directory)
    result["_show"] = lambda r: stdout.print(
        f"[green]created[/] {r['pilot']} ({r['task']}, {r['n_examples']} examples). Next: lorapilot run {r['pilot']}"
    )
    return result


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except UsageError as e:  # pragma: no cover - raised outside a verb (should not happen)
        stderr.print(f"[bold red]error:[/] {esc(str(e))}")
        sys.exit(2)


__all__ = ["app", "main", "Path"]
