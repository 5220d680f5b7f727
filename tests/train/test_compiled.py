"""`train.compile: on`: the compiled decoder trains as the eager one does (fp32 loss and
gradients within 1e-5), through the shared prefix and with checkpointing, and a compiler
failure leaves the training eager with the reason recorded. `compile_mode: reduce-overhead`
(CUDA graphs on a GPU) compiles without graphs on a CPU and says so; its replay check
catches gradients a replay overwrote; `pad_to_multiple_of` pads widths and trains the
same."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from test_loop import encoded_tickets, lora_model

from lorapilot.fsutil import read_jsonl
from lorapilot.spec import TrainSpec
from lorapilot.train import compiled
from lorapilot.train.loop import train

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def examples(tiny_model_dir):
    from transformers import AutoTokenizer

    return encoded_tickets(AutoTokenizer.from_pretrained(tiny_model_dir))


def run(tiny_model_dir, examples, out, eval_fn=None, model=None, **cfg):
    spec = TrainSpec(precision="fp32", max_steps=3, micro_batch=4, lr=1e-2, warmup_ratio=0.0, **cfg)
    logs: list[str] = []
    result = train(
        model or lora_model(tiny_model_dir), examples, examples[:4], spec, out,
        pad_id=2, progress=False, log=logs.append, eval_fn=eval_fn,
    )  # fmt: skip
    losses = [r["loss"] for r in read_jsonl(out / "steps.jsonl")]
    return result, losses, load_file(out / "adapter" / "adapter_model.safetensors"), logs


@pytest.mark.parametrize(
    "backend, kw",
    [
        # the graphs of both passes of the shared prefix (on on a CPU) and of checkpointing's
        # recomputation, captured and differentiated, without code generation
        ("aot_eager", dict(grad_checkpointing=True)),
        # the real backend end to end (C++ kernels here), on the plain path: ~1-2 min cold;
        # with LoRA dropout, whose masks inductor must draw as eager draws them
        ("inductor", dict(shared_prefix="off", dropout=0.1)),
    ],
)
def test_the_compiled_decoder_trains_as_the_eager_one(
    tiny_model_dir, examples, tmp_path, monkeypatch, backend, kw
):
    monkeypatch.setattr(compiled, "BACKEND", backend)
    dropout = kw.pop("dropout", 0.0)
    eager, eager_losses, eager_adapter, _ = run(
        tiny_model_dir, examples, tmp_path / "e", model=lora_model(tiny_model_dir, dropout), **kw
    )
    assert eager.compile is None
    before = compiled._dynamo_counts()[0]
    model = lora_model(tiny_model_dir, dropout)
    evaluated = []

    def eval_fn(m):  # evaluation's own calls (a KV cache, one row): they run eagerly
        evaluated.append(compiled.is_compiled(m))
        ids = torch.tensor([examples[0].input_ids])
        with torch.no_grad():
            m(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True)
        return {}

    result, losses, adapter, logs = run(
        tiny_model_dir, examples, tmp_path / "c", eval_fn=eval_fn, model=model,
        compile="on", **kw,
    )  # fmt: skip
    assert result.compile["compiled"] is True and result.compile["seconds"] > 0
    # training compiled nothing after the trial (it ran under the attention the steps take:
    # a CPU's eager attention for short batches); validation and evaluation (at each
    # validation point, while the decoder was compiled) run eagerly: no graph either
    assert evaluated == [True, True]
    assert compiled._dynamo_counts()[0] - before == result.compile["graphs"]
    assert not compiled.is_compiled(model)  # the caller evaluates the adapter eagerly
    assert "forward" not in model.get_base_model().model.__dict__
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
        "mode": "default",
        "compiled": False,
        "reason": "torch.compile failed: RuntimeError: backend refused the graph",
    }
    assert any("training eagerly" in line for line in logs)
    assert losses == eager_losses  # the eager forward was restored: the same run exactly


def test_compile_is_off_by_default_and_off_keeps_the_spec_hash():
    assert TrainSpec().compile == "off"
    assert "compile" not in TrainSpec().model_dump()
    assert TrainSpec(compile="on").model_dump()["compile"] == "on"


def test_pad_multiple_pads_only_where_asked_or_where_cuda_graphs_replay():
    ro = TrainSpec(compile="on", compile_mode="reduce-overhead")
    assert compiled.pad_multiple(TrainSpec(), "cuda") == 1
    assert compiled.pad_multiple(TrainSpec(compile="on"), "cuda") == 1
    assert compiled.pad_multiple(ro, "cuda") == compiled.CUDAGRAPH_PAD_MULTIPLE == 64
    assert compiled.pad_multiple(ro, "cpu") == 1  # no CUDA graphs on a CPU: no padding
    assert compiled.pad_multiple(TrainSpec(pad_to_multiple_of=16), "cpu") == 16
    assert compiled.pad_multiple(ro.model_copy(update={"pad_to_multiple_of": 8}), "cuda") == 8


def test_padded_micro_batches_train_as_unpadded_ones(tiny_model_dir, examples, tmp_path):
    """Right padding carries no loss and no attention: the same losses and adapter (fp32,
    within rounding), with the padding counted in the padding efficiency."""
    plain, plain_losses, plain_adapter, _ = run(tiny_model_dir, examples, tmp_path / "p")
    padded, losses, adapter, _ = run(
        tiny_model_dir, examples, tmp_path / "q", pad_to_multiple_of=64
    )
    assert plain.pad_to_multiple_of == 1 and padded.pad_to_multiple_of == 64
    widths = [max(e.n_tokens for e in examples[i : i + 4]) for i in range(0, len(examples), 4)]
    assert all(w < 64 for w in widths)  # so the padded batches are really wider
    assert padded.padding_efficiency < plain.padding_efficiency
    assert losses == pytest.approx(plain_losses, abs=1e-5)
    assert padded.final_val_loss == pytest.approx(plain.final_val_loss, abs=1e-5)
    for name in adapter:
        assert torch.allclose(adapter[name], plain_adapter[name], rtol=0, atol=1e-5), name


def test_reduce_overhead_on_a_cpu_compiles_without_cuda_graphs_and_says_so(
    tiny_model_dir, examples, tmp_path, monkeypatch
):
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    eager, eager_losses, _, _ = run(tiny_model_dir, examples, tmp_path / "e", shared_prefix="off")
    result, losses, _, logs = run(
        tiny_model_dir, examples, tmp_path / "c", shared_prefix="off",
        compile="on", compile_mode="reduce-overhead",
    )  # fmt: skip
    assert result.compile["compiled"] is True and result.compile["mode"] == "reduce-overhead"
    assert result.compile["cudagraphs"] is False
    assert result.compile["cudagraphs_reason"] == "CUDA graphs need a CUDA device (this is cpu)"
    assert result.pad_to_multiple_of == 1  # padding only where graphs replay
    assert any("compiled without them" in line for line in logs)
    assert losses == pytest.approx(eager_losses, abs=1e-5)


def test_the_replay_check_measures_accumulated_against_repeated_gradients(tiny_model_dir, examples):
    """The trial's check: three forward/backward passes of one batch from the same RNG state
    (dropout on) accumulate three times the first gradient; a pass that loses what was
    accumulated before it (what a replay overwriting a kept gradient would do) is caught."""
    from lorapilot.train.batches import collate
    from lorapilot.train.loss import causal_lm_loss_sum

    model = lora_model(tiny_model_dir, dropout=0.1)
    model.train()
    assert any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
    batch = collate(examples[:4], pad_id=2)
    cpu = torch.device("cpu")
    error = compiled._trial(model, causal_lm_loss_sum, batch, "fp32", cpu, 3)
    assert error is not None and error < 1e-6
    model.zero_grad(set_to_none=True)
    calls = []

    def overwrites(m, b):  # the second pass finds the kept gradients overwritten
        calls.append(1)
        if len(calls) == 2:
            for p in m.parameters():
                if p.grad is not None:
                    p.grad.zero_()
        return causal_lm_loss_sum(m, b)

    error = compiled._trial(model, overwrites, batch, "fp32", cpu, 3)
    assert error == pytest.approx(1 / 3, rel=1e-3)  # 2 x g against 3 x g
    assert error > compiled.REPLAY_TOLERANCE
    model.zero_grad(set_to_none=True)
    assert compiled._trial(model, causal_lm_loss_sum, batch, "fp32", cpu, 1) is None
