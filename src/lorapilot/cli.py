"""The `lorapilot` command: parse -> load the spec -> call one step -> print. No logic.

Contract (see ../shared/DESIGN.md): every verb takes `--json` and then prints exactly one JSON
object on stdout, everything else on stderr. Exit codes: 0 ok, 1 a check failed, 2 bad input.
Steps are imported inside each command, so `lorapilot check` never pays for torch.
"""

from __future__ import annotations

import errno
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape as esc

from lorapilot import views
from lorapilot.errors import CheckFailed, LorapilotError, UsageError
from lorapilot.records import registry
from lorapilot.views import Shown, print_json, stderr

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
        "--set",
        help="Override a spec value for this run, e.g. --set train.lr=1e-4 (repeatable).",
    ),
]
NoProgress = Annotated[bool, typer.Option("--no-progress", help="Hide progress bars.")]
VariantOpt = Annotated[
    str | None,
    typer.Option(
        "--variant",
        help="Run one of the spec's pre-registered variants (`base`: the spec as written).",
    ),
]
RunOpt = Annotated[
    str | None, typer.Option("--run", help="Train run (default: the latest completed one).")
]
ShotSelectionOpt = Annotated[
    str | None,
    typer.Option(
        "--shot-selection",
        help="With --shots: fixed (the same K for every input) or similar (each input's K "
        "most similar training examples); default eval.few_shot_selection.",
    ),
]
LimitOpt = Annotated[
    int | None,
    typer.Option(
        "--limit", help="Evaluate only the first N examples (a quick look; not comparable)."
    ),
]


def log_console(as_json: bool) -> Console:
    """Human-readable output goes to stdout, unless stdout is reserved for JSON."""
    return stderr if as_json else views.stdout


def step_log(as_json: bool, dim: bool = True) -> Callable[[str], None]:
    """A step's log lines (dimmed) on the log console. It says whether that console is a
    terminal: where it is not, long phases write plain progress lines through it."""
    con = log_console(as_json)

    def log(m: str) -> None:
        con.print(f"[dim]{esc(m)}[/]" if dim else m, highlight=False)

    log.is_terminal = con.is_terminal  # type: ignore[attr-defined]
    return log


def verb(fn: Callable[..., Shown]) -> Callable[..., None]:
    """Map lorapilot errors to the contract's exit codes and messages; never a traceback.

    The wrapped command returns a `Shown`: its data is printed as JSON with `--json`, else its
    view prints it for a person; then the process exits with its exit code.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        as_json = bool(kwargs.get("as_json"))
        try:
            shown = fn(*args, **kwargs)
        except CheckFailed as e:
            if e.view is not None and not as_json:
                e.view(e.details)  # the figures that failed, as a success would show them
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
            if as_json:
                print_json(shown.data)
            elif shown.view is not None:
                shown.view(shown.data)
            if shown.exit_code:
                raise typer.Exit(shown.exit_code)

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
        print_json({"ok": False, "error": str(e), "exit_code": e.exit_code, **details})
    raise typer.Exit(e.exit_code)


def _pilot(pilot: str, sets: list[str] | None = None, variant: str | None = None):
    from lorapilot.spec import load_pilot

    return load_pilot(pilot, sets, variant)


def _selected(sets: list[str] | None, selection: str | None, shots: int) -> list[str] | None:
    """`--shot-selection` as the spec key it sets (for this command only)."""
    if selection is None:
        return sets
    if not shots:
        raise UsageError("--shot-selection chooses the demonstrations of --shots K; add --shots")
    if selection not in ("fixed", "similar"):
        raise UsageError(f"--shot-selection {selection!r}: must be fixed or similar")
    return [*(sets or []), f"eval.few_shot_selection={selection}"]


# --------------------------------------------------------------------------- verbs


@app.command()
@verb
def check(pilot: PilotArg, as_json: JsonFlag = False, sets: SetOpt = None) -> Shown:
    """Validate the pilot spec (hypothesis, task, guards, limits) and find its data source
    (files exist and are readable, an HF dataset is cached), without loading the model or
    reading records. Exit 2 names the bad key (and the resolved path)."""
    from lorapilot.steps.check import run_check

    return Shown(run_check(_pilot(pilot, sets)), views.check)


@app.command()
@verb
def schema(
    as_json: JsonFlag = False,
    reference: Annotated[
        bool,
        typer.Option(
            "--reference",
            help="Print docs/spec-reference.md instead: every key with its type, default and "
            "description, as Markdown (with --json: {markdown}).",
        ),
    ] = False,
) -> Shown:
    """Print the JSON Schema of pilot.yaml (the same with or without --json)."""
    from lorapilot.spec import json_schema

    if reference:
        from lorapilot.spec.reference import markdown

        text = markdown()
        return Shown({"markdown": text}, lambda data: print(data["markdown"], end=""))
    return Shown(json_schema(), print_json)


@model_app.command("fetch")
@verb
def model_fetch(
    as_json: JsonFlag = False,
    force: Annotated[
        bool, typer.Option("--force", help="Re-make the folder even if its hashes match.")
    ] = False,
    image: Annotated[
        bool,
        typer.Option(
            "--image", help="The default image model (EfficientNet-Lite0) instead of the text one."
        ),
    ] = False,
) -> Shown:
    """Install the default base model (SmolLM2-135M-Instruct; with --image EfficientNet-Lite0)
    as a safetensors folder with a hash manifest."""
    from lorapilot.base.models import fetch_default_model

    log_console(as_json).print(
        f"[dim]checking the default {'image' if image else 'base'} model...[/]"
    )
    if image:
        from lorapilot.base.image_models import fetch_image_model

        res = fetch_image_model(force=force)
    else:
        res = fetch_default_model(force=force)
    out = {
        "ok": True,
        "path": str(res.path),
        "sha256": res.sha256,
        "reused": res.reused,
        "seconds": round(res.seconds, 2),
        "source": res.source,
    }
    return Shown(out, views.model_fetch)


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
            help="With --watch: the run to follow (default: the running train run, "
            "else the latest).",
        ),
    ] = None,
    interval: Annotated[
        float, typer.Option("--interval", min=0.05, help="With --watch: seconds between refreshes.")
    ] = 1.0,
    last: Annotated[
        int,
        typer.Option("--last", min=1, help="With --watch: how many recent steps the table shows."),
    ] = 15,
) -> Shown:
    """List every run record of the pilot, failed and interrupted ones included; or, with
    --watch, follow a train run's steps live."""
    from lorapilot.spec import resolve_pilot
    from lorapilot.steps.runs import run_runs, run_watch

    if fmt not in ("table", "json", "csv"):
        raise UsageError(f"--format {fmt!r}: expected table, json or csv")
    if as_json and fmt == "csv":
        raise UsageError("--json and --format csv both claim stdout: give one of them")
    if run and not watch:
        raise UsageError("--run selects the run to --watch; add --watch")
    pilot_dir, _ = resolve_pilot(pilot)
    if watch:
        if fmt == "csv":
            raise UsageError(
                "--watch shows a live table; --format csv lists runs (drop one of them)"
            )
        console = log_console(as_json or fmt == "json")
        result = run_watch(pilot_dir, run, console, interval=interval, last=last)
        return Shown(result, print_json if fmt == "json" else views.watch_summary)
    view = {"json": print_json, "csv": views.runs_csv_view}.get(fmt, views.runs_table)
    return Shown(run_runs(pilot_dir, kind), view)


@app.command()
@verb
def data(pilot: PilotArg, as_json: JsonFlag = False, sets: SetOpt = None) -> Shown:
    """Load, validate, clean, version and split the data; find duplicates and leaks; measure
    lengths; audit the loss mask over every example. Exit 1 on a leak or a mask problem."""
    from lorapilot.steps.data import run_data

    p = _pilot(pilot, sets)
    log_console(as_json).print(f"[dim]data: {esc(p.dir.name)}: loading and checking...[/]")
    return Shown(run_data(p), views.data)


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
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Images: folder for the contact sheets (default PILOT/inspect)."
        ),
    ] = None,
    sets: SetOpt = None,
    shots: Annotated[
        int,
        typer.Option(
            "--shots",
            min=0,
            help="Show the prompts as `baseline --shots K` builds them: K training examples first.",
        ),
    ] = 0,
    shot_selection: ShotSelectionOpt = None,
) -> Shown:
    """Show examples of every category after the exact preprocessing, loss tokens highlighted.
    Each example's loss tokens are decoded and checked against its answer; a mismatch exits 1.
    Images: per category the size/mode statistics and a contact sheet PNG of originals beside
    what the model sees (de-normalised)."""
    from lorapilot.steps.inspect import run_inspect

    if split not in ("train", "val"):
        raise UsageError(
            f"--split {split!r}: inspect samples train or val (the test split is reserved)"
        )
    sets = _selected(sets, shot_selection, shots)
    result = run_inspect(_pilot(pilot, sets), per_category, split, seed, out, shots)
    if as_json:
        for ex in result["examples"]:
            ex.pop("pieces", None)
    shown = views.inspect_images if "transforms" in result else views.inspect
    return Shown(result, shown, exit_code=0 if result["ok"] else 1)


@app.command()
@verb
def baseline(
    pilot: PilotArg,
    as_json: JsonFlag = False,
    limit: LimitOpt = None,
    no_progress: NoProgress = False,
    sets: SetOpt = None,
    shots: Annotated[
        int,
        typer.Option(
            "--shots",
            min=0,
            help="Show the base K training examples (each category in turn) before every "
            "prompt: a few-shot baseline, the prompting alternative the report sets the "
            "adapter against. 0: zero-shot, the success criterion's baseline.",
        ),
    ] = 0,
    shot_selection: ShotSelectionOpt = None,
    linear_probe: Annotated[
        bool,
        typer.Option(
            "--linear-probe",
            help="Fit a logistic regression on the frozen base's features of each prompt "
            "(training split) and evaluate it on validation: the embedding-classifier "
            "alternative the report sets the adapter against (text classification, single- or "
            "multi-label).",
        ),
    ] = False,
) -> Shown:
    """Evaluate the unadapted base model on the validation split; keep its outputs and
    protocol. `--shots K`: the base prompted with K training examples first;
    `--linear-probe`: a linear classifier on the base's features instead."""
    from lorapilot.steps.baseline import run_baseline

    sets = _selected(sets, shot_selection, shots)
    result = run_baseline(
        _pilot(pilot, sets), limit=limit, progress=not no_progress, shots=shots,
        linear_probe=linear_probe,
    )  # fmt: skip
    return Shown(result, views.evaluation)


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
) -> Shown:
    """Evaluate an adapter (or the base) on val, or on the reserved test split with --final."""
    from lorapilot.steps.eval import run_eval

    result = run_eval(
        _pilot(pilot),
        run_id=run,
        base=base,
        split=split,
        final=final,
        limit=limit,
        progress=not no_progress,
    )
    return Shown(result, views.evaluation)


@app.command()
@verb
def predict(
    pilot: PilotArg,
    input_file: Annotated[
        Path,
        typer.Option(
            "--input",
            help="JSONL, CSV or Parquet file of inputs, read with the spec's data.fields (a "
            "label or target is optional: rows that have one are also scored).",
        ),
    ],
    as_json: JsonFlag = False,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Also write the predictions (JSONL) to this file."),
    ] = None,
    run: Annotated[
        str | None,
        typer.Option(
            "--run",
            help="Train run whose adapter predicts (default: the one the final test "
            "confirmed, else the latest completed).",
        ),
    ] = None,
    base: Annotated[
        bool, typer.Option("--base", help="Predict with the base model instead of an adapter.")
    ] = False,
    field_name: Annotated[
        str | None,
        typer.Option(
            "--field",
            help="The input's column (text, or an image path relative to the pilot folder) when "
            "it is not the one data.fields names.",
        ),
    ] = None,
    answer_field: Annotated[
        str | None,
        typer.Option(
            "--answer-field",
            help="The column holding a label or target to score the predictions against, when "
            "it is not the one data.fields names.",
        ),
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", help="Predict only the first N inputs.")
    ] = None,
    no_progress: NoProgress = False,
    shots: Annotated[
        int,
        typer.Option(
            "--shots",
            min=0,
            help="With --base: the base shown K training examples first, as `baseline "
            "--shots K` prompted it (the prompting alternative, when it serves).",
        ),
    ] = 0,
    shot_selection: ShotSelectionOpt = None,
    linear_probe: Annotated[
        bool,
        typer.Option(
            "--linear-probe",
            help="With --base: the logistic regression on the base's features that `baseline "
            "--linear-probe` fits on the training split (the embedding-classifier alternative, "
            "when it serves).",
        ),
    ] = False,
) -> Shown:
    """Apply an adapter (or the base) to new inputs: the pilot's prompts, truncation,
    decoding and parsing, every prediction kept in a `predict` run; inputs with an answer are
    scored, inputs that are examples of the pilot's splits named."""
    from lorapilot.steps.predict import run_predict

    result = run_predict(
        _pilot(pilot, _selected(None, shot_selection, shots)),
        input_file,
        run_id=run,
        base=base,
        out=out,
        field_name=field_name,
        answer_field=answer_field,
        limit=limit,
        progress=not no_progress,
        log=step_log(as_json),
        shots=shots,
        linear_probe=linear_probe,
    )
    return Shown(result, views.prediction)


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
    variant: VariantOpt = None,
    replicate: Annotated[
        int,
        typer.Option(
            "--replicate",
            min=0,
            help="With --variant: its seed replicate K of selection.seeds (train.seed + K); "
            "0, the default, is the variant as written.",
        ),
    ] = 0,
    no_progress: NoProgress = False,
) -> Shown:
    """One experiment: adapter, update audit, training, saved adapter, validation metrics.
    `--variant NAME` runs a pre-registered variant of the plan (`--replicate K`: its seed K
    of `selection.seeds`); `--set key=value` an ad-hoc one (labelled one_change or combined,
    shown but never chosen by the plan's selection). `--resume RUN` alone continues a run
    with its own variant and overrides."""
    from lorapilot.steps.train import pilot_for, run_train

    p = pilot_for(pilot, sets, variant, resume, replicate)
    result = run_train(p, resume=resume, progress=not no_progress, log=step_log(as_json))
    return Shown(result, views.train)


@app.command()
@verb
def smoke(
    pilot: PilotArg,
    as_json: JsonFlag = False,
    per_category: Annotated[
        int | None,
        typer.Option(
            "--per-category",
            min=1,
            help="Examples per category to overfit (default: the "
            "spec's smoke.per_category, 1; at least smoke.min_examples in all, 8).",
        ),
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option(
            "--steps",
            min=1,
            help="Optimizer steps at most (default: the spec's "
            "smoke.max_steps, auto: 20 passes over the examples, 40-300).",
        ),
    ] = None,
    no_progress: NoProgress = False,
    sets: SetOpt = None,
) -> Shown:
    """Overfit a few examples through the real train and eval code: proves wiring, not
    quality."""
    from lorapilot.steps.smoke import run_smoke

    result = run_smoke(
        _pilot(pilot, sets),
        per_category=per_category,
        max_steps=steps,
        progress=not no_progress,
        log=step_log(as_json),
    )
    return Shown(result, views.smoke, exit_code=0 if result["ok"] else 1)


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
    checkpointing: Annotated[
        str,
        typer.Option(
            "--checkpointing",
            help="both: each length with activation checkpointing off and on; spec: the spec's "
            "setting only (and the other when it does not fit), as `run` measures.",
        ),
    ] = "both",
    no_progress: NoProgress = False,
    sets: SetOpt = None,
    variant: VariantOpt = None,
) -> Shown:
    """Size a full training step (forward, backward, update) at typical and long lengths,
    checkpointing off and on: first/later step time and peak memory, beside an estimate.
    `--variant NAME` probes a variant whose step shape differs from the base's."""
    from lorapilot.steps.probe import run_probe

    result = run_probe(
        _pilot(pilot, sets, variant),
        search_batch=search_batch,
        estimate_only=estimate_only,
        steps=steps,
        checkpointing=checkpointing,
        progress=not no_progress,
        log=step_log(as_json),
    )
    return Shown(result, views.probe)


@app.command()
@verb
def budget(
    pilot: PilotArg,
    as_json: JsonFlag = False,
    sets: SetOpt = None,
    gpu: Annotated[
        str | None,
        typer.Option(
            "--gpu",
            help="Before renting: plan onto these GPU classes (comma-separated, or `all`) from "
            "the base's config.json and tokenizer alone, no probe and no weights needed.",
        ),
    ] = None,
    price: Annotated[
        list[str] | None,
        typer.Option(
            "--price",
            help="NAME=USD: the hourly price of a GPU class (repeatable; overrides "
            "limits.gpu_prices). Without one, no cost is shown for that class.",
        ),
    ] = None,
    gpu_spec: Annotated[
        Path | None,
        typer.Option(
            "--gpu-spec",
            help="A JSON file of more GPU classes (the form of lorapilot/sizing/gpus.json).",
        ),
    ] = None,
) -> Shown:
    """Time and cost of the run from the latest probe, a 3/7/30-day rental plan, and (after a
    train run) the estimate against what the run really took. With --gpu: which GPU fits the
    plan, how long it takes and what it costs, before renting anything."""
    from lorapilot.steps.budget import run_budget, run_pre_rental

    if gpu is None:
        if price or gpu_spec is not None:
            raise UsageError("--price and --gpu-spec go with --gpu (the pre-rental plan)")
        return Shown(run_budget(_pilot(pilot, sets)), views.budget)
    return Shown(run_pre_rental(_pilot(pilot, sets), gpu, price or [], gpu_spec), views.pre_rental)


@app.command()
@verb
def verify(pilot: PilotArg, as_json: JsonFlag = False, run: RunOpt = None) -> Shown:
    """Reload the adapter with its pinned base in a fresh process, re-evaluate, and compare
    with the in-process result. A changed base, adapter or tokenizer is refused (exit 1)."""
    from lorapilot.steps.verify import run_verify

    p = _pilot(pilot)
    log_console(as_json).print("[dim]verify: starting a fresh process...[/]")
    return Shown(run_verify(p, run), views.verify)


@app.command()
@verb
def export(
    pilot: PilotArg,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="New (or empty) folder for the adapter, merged model or GGUF."),
    ] = None,
    as_json: JsonFlag = False,
    run: RunOpt = None,
    merge: Annotated[
        bool,
        typer.Option(
            "--merge",
            help="Merge the adapter into the base weights and check the merged model's "
            "outputs against the adapter's (default: export the adapter with its manifest). "
            "With --gguf: also write merged.gguf and check it in llama.cpp.",
        ),
    ] = False,
    merge_dtype: Annotated[
        str | None,
        typer.Option(
            "--merge-dtype",
            help="With --merge: the merged weights' dtype. float32 (auto, the default): the "
            "exact merge, checked on the logits within 1e-3. float16 or bfloat16: half the "
            "size, written one tensor at a time and checked on the validation predictions "
            "(>= 99% the adapter's); bfloat16 rounds much of a LoRA update away.",
        ),
    ] = None,
    gguf: Annotated[
        bool,
        typer.Option(
            "--gguf",
            help="Write the files llama.cpp and Ollama serve (base.gguf, adapter.gguf, "
            "Modelfile) and check them: the validation split predicted in llama.cpp in a "
            "fresh process must agree with lorapilot's predictions (export.min_agreement). "
            "Needs the `serve` extra.",
        ),
    ] = False,
    gguf_base: Annotated[
        str | None,
        typer.Option(
            "--gguf-base",
            help="With --gguf: the base file: original (the GGUF the base was dequantized "
            "from), f32, f16 or q8_0 (converted from the safetensors), auto (original where "
            "there is one, else f16). Default: the spec's export.gguf_base.",
        ),
    ] = None,
    min_agreement: Annotated[
        float | None,
        typer.Option(
            "--min-agreement",
            min=0.0,
            max=1.0,
            help="With --gguf or --check: the least share of validation examples (of answer "
            "tokens, for generated answers) llama.cpp must predict as lorapilot did (default: "
            "the spec's export.min_agreement, 0.98).",
        ),
    ] = None,
    reference: Annotated[
        str | None,
        typer.Option(
            "--reference",
            help="With --gguf or --check: compare llama.cpp's predictions with the train run's "
            "recorded ones (recorded), or with the adapter evaluated again in fp32 (fp32: its "
            "exact arithmetic; a bf16 evaluation alone flips close generations). Default: the "
            "spec's export.reference.",
        ),
    ] = None,
    check: Annotated[
        Path | None,
        typer.Option(
            "--check",
            help="Check an existing GGUF export folder again: every file re-hashed against its "
            "manifest (a changed byte: exit 1, naming the file), the validation split "
            "predicted in llama.cpp again.",
        ),
    ] = None,
) -> Shown:
    """Export the adapter (files checked against its manifest); with --merge a merged model
    folder that loads without PEFT (outputs checked against the adapter); with --gguf the
    files llama.cpp and Ollama serve, checked by predicting the validation split in llama.cpp."""
    from lorapilot.steps.export import MERGE_DTYPES, run_export

    if gguf_base is not None and gguf_base not in ("auto", "original", "f32", "f16", "q8_0"):
        raise UsageError(f"--gguf-base {gguf_base}: use auto, original, f32, f16 or q8_0")
    if reference is not None and reference not in ("recorded", "fp32"):
        raise UsageError(f"--reference {reference}: use recorded or fp32")
    if (gguf_base, min_agreement, reference) != (None, None, None) and not (gguf or check):
        raise UsageError("--gguf-base, --min-agreement and --reference go with --gguf (or --check)")
    if check is None and out is None:
        raise UsageError("--out is required: a new (or empty) folder for the export")
    if merge_dtype is not None and merge_dtype not in MERGE_DTYPES:
        raise UsageError(f"--merge-dtype {merge_dtype}: use {', '.join(MERGE_DTYPES)}")
    if merge_dtype is not None and (not merge or gguf):
        raise UsageError("--merge-dtype goes with --merge (without --gguf: merged.gguf has "
                         "its own type, --gguf-base)")  # fmt: skip
    if check is not None and (out is not None or merge or gguf_base is not None):
        raise UsageError(
            "--check takes an existing export folder; it goes without --out, "
            "--merge and --gguf-base"
        )
    try:
        done = run_export(
            _pilot(pilot), run, out, merge, gguf=gguf, gguf_base=gguf_base,
            min_agreement=min_agreement, reference=reference, check=check,
            progress=lambda m: log_console(as_json).print(f"[dim]export: {esc(m)}[/]"),
            merge_dtype=merge_dtype,
        )  # fmt: skip
    except CheckFailed as e:
        if "serving_agreement" in e.details:  # a failed serving check: its figures
            e.view = views.export
        raise
    return Shown(done, views.export)


@app.command()
@verb
def compare(pilot: PilotArg, as_json: JsonFlag = False) -> Shown:
    """Every run side by side (failed ones too, with their reason): metrics and deltas against
    the baseline, guards, examples fixed and broken, and the decision so far."""
    from lorapilot.steps.compare import run_compare

    return Shown(run_compare(_pilot(pilot)), views.compare)


@app.command()
@verb
def report(pilot: PilotArg, as_json: JsonFlag = False) -> Shown:
    """Write report/index.html (self-contained) and report/report.md with the decision, and
    fill deliverable/ with what to hand over. A NO-GO is a result, not a failure (exit 0)."""
    from lorapilot.steps.report import run_report

    return Shown(run_report(_pilot(pilot)), views.report)


@app.command("run")
@verb
def run_cmd(
    pilot: PilotArg,
    as_json: JsonFlag = False,
    no_progress: NoProgress = False,
    only: Annotated[
        list[str] | None,
        typer.Option("--only", help="Run only this variant of the plan (repeatable)."),
    ] = None,
) -> Shown:
    """The whole plan: data, inspect, baseline, smoke, a probe per step shape, budget, every
    variant, then verify and the final test of the one the selection rule picks, report.
    Completed phases with unchanged inputs are reused; an interrupted variant is resumed."""
    from lorapilot.steps.run import run_pipeline

    result = run_pipeline(
        _pilot(pilot), only=only, progress=not no_progress, log=step_log(as_json, dim=False)
    )
    return Shown(result, views.run)


@app.command()
@verb
def sync(
    pilot: PilotArg,
    as_json: JsonFlag = False,
    to: Annotated[
        list[str] | None,
        typer.Option(
            "--to",
            help="mlflow or tensorboard (repeatable; default: the spec's tracking list).",
        ),
    ] = None,
) -> Shown:
    """Mirror the pilot's existing run records to MLflow / TensorBoard. Idempotent: an
    unchanged run is skipped, a changed one replaced, never duplicated."""
    from lorapilot.steps.sync import run_sync

    result = run_sync(_pilot(pilot), to, log=step_log(as_json))
    return Shown(result, views.sync, exit_code=0 if result["ok"] else 1)


@app.command()
@verb
def init(
    name: Annotated[str, typer.Argument(help="Name of the new pilot folder.")],
    as_json: JsonFlag = False,
    task: Annotated[
        str | None,
        typer.Option(
            "--task",
            help="classification, multi_label_classification, extraction, format or "
            "image_classification. Default: classification; with --from, inferred from the "
            "answers.",
        ),
    ] = None,
    directory: Annotated[Path, typer.Option("--dir", help="Where to create the folder.")] = Path(
        "."
    ),
    sources: Annotated[
        list[str] | None,
        typer.Option(
            "--from",
            help="Your data file (JSONL, JSON array, CSV, Parquet; chat rows of one or more "
            "exchanges, or a table of image paths and labels, too), or a folder of images in "
            "one folder per label: copied into the pilot, its input and answer "
            "columns, task, labels or fields inferred and commented in pilot.yaml. Several "
            "files: train=PATH val=PATH test=PATH (or named so).",
        ),
    ] = None,
    text: Annotated[
        str | None, typer.Option("--text", help="With --from: the input column (else inferred).")
    ] = None,
    answer: Annotated[
        str | None,
        typer.Option("--answer", help="With --from: the label or target column (else inferred)."),
    ] = None,
    base: Annotated[
        str | None,
        typer.Option(
            "--base",
            help="With --from: model.base, a default name or a folder (default: "
            "smollm2-135m-instruct; for images efficientnet-lite0).",
        ),
    ] = None,
    source: Annotated[
        str | None,
        typer.Option("--source", help="With --from: data.source, where the data comes from."),
    ] = None,
    permission: Annotated[
        str | None,
        typer.Option(
            "--permission",
            help="With --from: data.permission, the licence or approval to use the data.",
        ),
    ] = None,
) -> Shown:
    """Scaffold a pilot folder: a commented pilot.yaml and a tiny data file to start from, or,
    with --from, your own data file and a pilot.yaml inferred from it."""
    if sources:
        from lorapilot.steps.init import run_init_from

        result = run_init_from(
            name, sources, directory, text, answer, task, base, source, permission
        )
        return Shown(result, views.init)
    given = [f for f, v in (("--text", text), ("--answer", answer), ("--source", source),
                            ("--permission", permission), ("--base", base)) if v]  # fmt: skip
    if given:
        raise UsageError(f"{', '.join(given)}: for a pilot made from your data; give --from too")
    from lorapilot.spec.scaffold import init_pilot

    return Shown(init_pilot(name, task or "classification", directory), views.init)


def _one_line_summaries(*apps: typer.Typer) -> None:
    """`lorapilot --help` lists each verb by its docstring's first paragraph: typer's rich
    command list keeps the docstring's line breaks there (a sentence cut mid-line, then
    re-wrapped), so the paragraph is given as one line, re-wrapped to the terminal."""
    import inspect

    for a in apps:
        for info in a.registered_commands:
            doc = inspect.getdoc(info.callback) or ""
            info.short_help = info.short_help or " ".join(doc.split("\n\n")[0].split())


_one_line_summaries(app, model_app)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except UsageError as e:  # pragma: no cover - raised outside a verb (should not happen)
        stderr.print(f"[bold red]error:[/] {esc(str(e))}")
        sys.exit(2)


__all__ = ["app", "main", "Path"]
