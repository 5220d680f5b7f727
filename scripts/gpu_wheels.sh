#!/usr/bin/env bash
# gpu_wheels.sh [DIR]: the wheels an offline GPU machine needs to run lorapilot, fetched here.
#
# A rented or lent GPU machine often has its own CUDA torch and many of lorapilot's packages
# but no route to a package index. This downloads, for that machine's Python and platform,
# lorapilot's pinned dependencies that such an image usually lacks or holds in another
# version (never torch), each without its dependencies, into DIR (default .whl, which git
# ignores). On the GPU machine:
#
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site:src GPU_CHECK_PYTHON=python3 bash scripts/gpu_check.sh --targets
#
# Environment: GPU_WHEELS_PYTHON_VERSION (default 3.12), GPU_WHEELS_EXTRA (more NAME==VERSION
# requirements, space-separated: e.g. bitsandbytes==0.50.2 for the 4-bit check). Prints the
# wheels and their total size; exit 1 if one could not be found.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/.whl}"
PYV="${GPU_WHEELS_PYTHON_VERSION:-3.12}"
PY="${PYTHON:-python3}"
case "${1:-}" in -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac

# The packages lorapilot imports at run time beyond what a CUDA image usually holds (numpy,
# pyarrow, matplotlib, PyYAML, rich, typer, psutil, tokenizers and huggingface-hub are there),
# and their own dependencies that such an image lacks, at the versions this repository's
# venv resolved and tested (pydantic-core must match pydantic exactly).
VENV_PY="$ROOT/.venv/bin/python"
[ -x "$VENV_PY" ] || { echo "gpu_wheels: no $VENV_PY: run make first (the versions come from it)" >&2; exit 2; }
mapfile -t REQS < <("$VENV_PY" - <<'PYEOF'
import importlib.metadata as md
for name in ("transformers", "peft", "accelerate", "safetensors", "pydantic", "pydantic-core",
             "annotated-types", "typing-inspection", "jsonschema", "jsonschema-specifications",
             "referencing", "rpds-py", "gguf"):
    print(f"{name}=={md.version(name)}")
PYEOF
)
read -r -a EXTRA <<<"${GPU_WHEELS_EXTRA:-}"

mkdir -p "$DIR"
fail=0
for req in "${REQS[@]}" "${EXTRA[@]}"; do
  [ -n "$req" ] || continue
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$DIR" "$req" >&2 \
    || { echo "gpu_wheels: no wheel for $req (Python $PYV, manylinux x86_64)" >&2; fail=1; }
done
ls -1 "$DIR"
du -sh "$DIR" | awk '{print "total " $1}'
exit "$fail"
