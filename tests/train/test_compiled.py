"""`train.compile: on`: the compiled decoder trains as the eager one does (fp32 loss and
gradients within 1e-5), through the shared prefix and with checkpointing, and a compiler
failure leaves the training eager with the reason recorded."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from test_loop import TASK, TICKETS, lora_model

from lorapilot.data.format import PromptFormatter
from lorapilot.fsutil import read_jsonl
from lorapilot.spec import TrainSpec
from lorapilot.train import compiled
from lorapilot.train.loop import train

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def examples(tiny_model_dir):
    from transformers import AutoTokenizer

    fmt = PromptFormatter(AutoTokenizer.from_pretrained(tiny_model_dir), TASK, max_length=128)
    budget = fmt.answer_budget_for(TASK.labels)
    return [fmt.encode(text, label, budget) for text, label in TICKETS]


def run(tiny_model_dir, examples, out, **cfg):
    spec = TrainSpec(precision="fp32", max_steps=3, micro_batch=4, lr=1e-2, warmup_ratio=0.0, **cfg)
    logs: list[str] = []
    result = train(
        lora_model(tiny_model_dir), examples, examples[:4], spec, out,
        pad_id=2, progress=False, log=logs.append,
    )  # fmt: skip
    losses = [r["loss"] for r in read_jsonl(out / "steps.jsonl")]
    return result, losses, load_file(out / "adapter" / "adapter_model.safetensors"), logs


@pytest.mark.parametrize(
    "backend, kw",
    [
        # the graphs of both passes of the shared prefix (on on a CPU) and of checkpointing's
        # recomputation, captured and differentiated, without code generation
        ("aot_eager", dict(grad_checkpointing=True)),
        # the real backend end to end (C++ kernels here), on the plain path: ~1-2 min cold
        ("inductor", dict(shared_prefix="off")),
    ],
)
def test_the_compiled_decoder_trains_as_the_eager_one(
    tiny_model_dir, examples, tmp_path, monkeypatch, backend, kw
):
    monkeypatch.setattr(compiled, "BACKEND", backend)
    eager, eager_losses, eager_adapter, _ = run(tiny_model_dir, examples, tmp_path / "e", **kw)
    assert eager.compile is None
    result, losses, adapter, logs = run(
        tiny_model_dir, examples, tmp_path / "c", compile="on", **kw
    )
    assert result.compile["compiled"] is True and result.compile["seconds"] > 0
    # the whole decoder pass in one graph: no part of it left eager by a graph break (under
    # checkpointing transformers' input-grad hook and use_cache warning were breaks, and each
    # checkpointed layer then recompiled until torch's recompile limit left the rest eager)
    assert result.compile["graph_breaks"] == 0, result.compile.get("graph_break_reasons")
    assert result.compile["graphs"] == 1
    assert result.prefix["path"] == ("unshared" if kw.get("shared_prefix") else "shared")
    assert any("the decoder is compiled" in line for line in logs)
    assert losses == pytest.approx(eager_losses, abs=1e-5)
    assert result.final_val_loss == pytest.approx(eager.final_val_loss, abs=1e-5)
    assert adapter.keys() == eager_adapter.keys()
    for name in adapter:
        assert torch.allclose(adapter[name], eager_adapter[name], rtol=0, atol=1e-5), name


def test_a_compiler_failure_trains_eagerly_and_says_why(
    tiny_model_dir, examples, tmp_path, monkeypatch
):
    def refuses(fn, **kw):
        def compiled_fn(*a, **k):
            raise RuntimeError("backend refused the graph\nmore detail")

        return compiled_fn

    monkeypatch.setattr(compiled.torch, "compile", refuses)
    eager, eager_losses, _, _ = run(tiny_model_dir, examples, tmp_path / "e")
    result, losses, _, logs = run(tiny_model_dir, examples, tmp_path / "c", compile="on")
    assert result.compile == {
        "requested": "on",
        "compiled": False,
        "reason": "torch.compile failed: RuntimeError: backend refused the graph",
    }
    assert any("training eagerly" in line for line in logs)
    assert losses == eager_losses  # the eager forward was restored: the same run exactly


def test_compile_is_off_by_default_and_off_keeps_the_spec_hash():
    assert TrainSpec().compile == "off"
    assert "compile" not in TrainSpec().model_dump()
    assert TrainSpec(compile="on").model_dump()["compile"] == "on"
