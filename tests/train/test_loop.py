"""The training loop on a 2-layer, 32-wide random Llama with the real SmolLM2 tokenizer:
the loss, gradient accumulation, the files a run writes, and exact resumption."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lorapilot.base.adapter import build_adapter
from lorapilot.base.models import load_model, resolve_base
from lorapilot.data.format import IGNORE_INDEX, PromptFormatter
from lorapilot.fsutil import read_jsonl
from lorapilot.records.registry import StoppedByLimit
from lorapilot.spec import AdapterSpec, TaskSpec, TrainSpec
from lorapilot.train.batches import (
    collate,
    count_target_tokens,
    length_grouped_batches,
    padding_efficiency,
)
from lorapilot.train.loop import train
from lorapilot.train.loss import causal_lm_loss_sum
from lorapilot.train.step import make_scheduler, train_step

TASK = TaskSpec(
    kind="classification",
    labels=["billing", "technical", "feature_request", "account_access_and_security"],
    system="Route the ticket. One of: {labels}.",
    template="Ticket:\n{text}\n\nCategory:",
)
TICKETS = [
    ("I was charged twice for my order.", "billing"),
    ("The app crashes when I log in.", "technical"),
    ("Please add a dark mode.", "feature_request"),
    ("Someone changed my password without asking.", "account_access_and_security"),
    ("My invoice shows the wrong VAT number, can you fix it?", "billing"),
    ("Error 500 when saving a draft.", "technical"),
    ("Exporting to CSV would help our finance team a lot.", "feature_request"),
    ("I cannot turn on two-factor authentication.", "account_access_and_security"),
    ("Refund please.", "billing"),
    ("Sync stopped working after the last update on Android.", "technical"),
    ("Could you support SSO with Okta?", "feature_request"),
    ("Locked out after too many attempts.", "account_access_and_security"),
]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def encoded_tickets(tok) -> list:
    """The 12 tickets encoded as training encodes them (other train tests share them)."""
    fmt = PromptFormatter(tok, TASK, max_length=128)
    budget = fmt.answer_budget_for(TASK.labels)
    return [fmt.encode(text, label, budget) for text, label in TICKETS]


@pytest.fixture(scope="module")
def examples(tok):
    return encoded_tickets(tok)


def lora_model(tiny_model_dir, dropout: float = 0.0):
    model, _ = load_model(resolve_base(str(tiny_model_dir)))
    model, _ = build_adapter(model, AdapterSpec(r=8, alpha=16, dropout=dropout), seed=0)
    return model


def full_logits_loss_sum(model, batch) -> torch.Tensor:
    """The textbook loss: logits everywhere, shift, cross-entropy with ignore_index."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
        batch["labels"][:, 1:].reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


def adapter_tensors(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run_dir / "adapter" / "adapter_model.safetensors")


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    differing = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differing, differing


# --------------------------------------------------------------------------- batches


def test_collate_pads_right_and_masks_padding(examples):
    batch = collate(examples[:3], pad_id=2)
    width = max(e.n_tokens for e in examples[:3])
    assert batch["input_ids"].shape == (3, width)
    for row, e in enumerate(examples[:3]):
        n = e.n_tokens
        assert batch["input_ids"][row, :n].tolist() == e.input_ids
        assert batch["labels"][row, :n].tolist() == e.labels
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (width - n)
        assert (batch["labels"][row, n:] == IGNORE_INDEX).all()
    assert count_target_tokens(batch) == sum(len(e.loss_positions) for e in examples[:3])


def test_length_grouped_batches_are_deterministic_and_pad_little():
    lengths = [(i * 37) % 500 + 10 for i in range(1000)]
    a = length_grouped_batches(lengths, 8, seed=1, epoch=0)
    assert a == length_grouped_batches(lengths, 8, seed=1, epoch=0)
    assert a != length_grouped_batches(lengths, 8, seed=1, epoch=1)
    assert sorted(i for b in a for i in b) == list(range(1000))  # every example once
    assert max(lengths[i] for i in a[0]) == max(lengths)  # the largest batch first
    shuffled = [list(range(1000))[j : j + 8] for j in range(0, 1000, 8)]
    assert padding_efficiency(lengths, a) > 0.95 > padding_efficiency(lengths, shuffled)


def test_scheduler_warms_up_then_decays():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = make_scheduler(opt, "cosine", warmup_steps=2, total_steps=10)
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:3] == [0.5, 1.0, 1.0]
    assert all(x > y for x, y in zip(lrs[2:], lrs[3:], strict=False)) and lrs[-1] > 0


# --------------------------------------------------------------------------- loss


def test_chunked_head_loss_equals_full_logits_loss(tiny_model_dir, examples):
    batch = collate(examples[:5], pad_id=2)
    assert (batch["attention_mask"] == 0).any()  # the batch has padding
    n = count_target_tokens(batch)
    plain, _ = load_model(resolve_base(str(tiny_model_dir)))
    peft_model = lora_model(tiny_model_dir)
    with torch.no_grad():
        for model in (plain, peft_model):
            loss_sum, n_targets = causal_lm_loss_sum(model, batch)
            assert loss_sum.dtype == torch.float32 and int(n_targets) == n
            want = full_logits_loss_sum(model, batch)
            assert abs(float(loss_sum) / n - float(want) / n) < 1e-5
            # and transformers' own shifted loss agrees
            hf = model(**batch).loss
            assert abs(float(loss_sum) / n - float(hf)) < 1e-5

        class NoHead(torch.nn.Module):  # no decoder/lm_head to reach: full-logits fallback
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, **kw):
                return self.inner(**kw)

        fallback, _ = causal_lm_loss_sum(NoHead(plain), batch)
        assert abs(float(fallback) / n - float(full_logits_loss_sum(plain, batch)) / n) < 1e-5


def test_gradient_accumulation_equals_one_big_batch(tiny_model_dir, examples):
    # Uneven answers: the 2 shortest answers in one micro-batch, the 2 longest in another.
    chosen = sorted(examples[:8], key=lambda e: len(e.loss_positions))
    micro = [collate(chosen[i : i + 2], pad_id=2) for i in range(0, 8, 2)]
    counts = [count_target_tokens(mb) for mb in micro]
    assert len(set(counts)) > 1, counts
    big = collate(chosen, pad_id=2)
    total = count_target_tokens(big)
    assert sum(counts) == total

    def fresh():
        model = lora_model(tiny_model_dir)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():  # non-zero B, so A gets a gradient on this very step
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        model.train()
        # SGD: the update is the gradient itself (Adam's first step, g/|g|, would turn
        # rounding noise on near-zero gradients into full-size sign flips).
        params = [p for p in model.parameters() if p.requires_grad]
        return model, torch.optim.SGD(params, lr=1.0)

    def lora_weights(model):
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    one, opt1 = fresh()
    out1 = train_step(one, opt1, None, [big], total, "fp32", None)
    accum, opt2 = fresh()
    out2 = train_step(accum, opt2, None, micro, total, "fp32", None)
    w1, w2 = lora_weights(one), lora_weights(accum)
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], atol=1e-5, rtol=0)
    assert abs(out1["loss"] - out2["loss"]) < 1e-5
    assert out1["target_tokens"] == out2["target_tokens"] == total

    # The naive mean of per-micro-batch means gives a different update: the test has teeth.
    def mean_per_micro_batch(model, batch):
        loss_sum, n = causal_lm_loss_sum(model, batch)
        return loss_sum / n * total / len(micro), n

    naive, opt3 = fresh()
    train_step(naive, opt3, None, micro, total, "fp32", None, loss_fn=mean_per_micro_batch)
    w3 = lora_weights(naive)
    assert max(float((w3[n] - w1[n]).abs().max()) for n in w1) > 1e-4


# --------------------------------------------------------------------------- train


def test_train_writes_the_expected_files_and_learns(tiny_model_dir, examples, tmp_path, tok):
    cfg = TrainSpec(
        max_steps=6,
        lr=1e-2,
        micro_batch=4,
        precision="fp32",
        warmup_ratio=0,
        eval_every=3,
        save_every=3,
    )
    calls = []

    def eval_fn(model):
        calls.append(model.training)
        return {"calls": len(calls)}

    out = tmp_path / "run"
    result = train(
        lora_model(tiny_model_dir),
        examples[:8],
        examples[:8],
        cfg,
        out,
        pad_id=tok.pad_token_id,
        eval_fn=eval_fn,
        progress=False,
        log=lambda m: None,
    )
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    ckpt = [
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
        "checksums.json",
        "optimizer.safetensors",
        "state.json",
    ]
    assert files == sorted(
        [
            "steps.jsonl",
            "val.jsonl",
            "adapter/README.md",
            "adapter/adapter_config.json",
            "adapter/adapter_model.safetensors",
            "checkpoints/latest.json",
        ]
        + [f"checkpoints/step-{s}/{f}" for s in (3, 6) for f in ckpt]
    )
    steps = read_jsonl(out / "steps.jsonl")
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    assert set(steps[0]) >= {
        "step",
        "epoch",
        "loss",
        "lr",
        "grad_norm",
        "tokens",
        "target_tokens",
        "step_time_s",
        "peak_memory_bytes",
        "padding_efficiency",
        "time",
    }
    assert all(0 < r["padding_efficiency"] <= 1 and r["peak_memory_bytes"] > 0 for r in steps)
    val = read_jsonl(out / "val.jsonl")
    assert [r["step"] for r in val] == [0, 3, 6]
    assert [r["eval"]["calls"] for r in val] == [1, 2, 3] and calls == [False] * 3
    assert val[-1]["val_loss"] < val[0]["val_loss"]
    assert json.loads((out / "checkpoints/latest.json").read_text()) == {"step": 6}
    state = json.loads((out / "checkpoints/step-6/state.json").read_text())
    assert state["step"] == 6 and "rng" in state and state["train_spec"]["lr"] == 1e-2
    assert result.steps == 6 and result.final_loss == steps[-1]["loss"]
    assert result.initial_val_loss == val[0]["val_loss"] > result.final_val_loss
    assert result.checkpoint == str(out / "checkpoints" / "step-6")
    assert result.tokens == sum(r["tokens"] for r in steps)
    assert 0 < result.padding_efficiency <= 1 and result.train_tokens_per_s > 0
    assert result.optimizer == {"name": "adamw", "implementation": "fused"}
    assert state["optimizer"]["param_groups"][0]["fused"] is True  # and it resumes fused
    # the final adapter reloads onto a fresh base with the trained weights
    from peft import PeftModel

    base, _ = load_model(resolve_base(str(tiny_model_dir)))
    reloaded = PeftModel.from_pretrained(base, out / "adapter")
    saved = adapter_tensors(out)
    assert len(saved) == 28
    for name, p in reloaded.named_parameters():
        if "lora_" in name:
            key = name.replace(".default", "")
            assert torch.equal(p.detach(), saved[key])

    with pytest.raises(Exception, match="already holds a training run"):
        train(lora_model(tiny_model_dir), examples[:8], [], cfg, out, pad_id=2, progress=False)


RESUME_CFG = TrainSpec(
    max_steps=8,
    save_every=4,
    eval_every=4,
    lr=1e-2,
    micro_batch=2,
    grad_accum=2,
    precision="fp32",
    warmup_ratio=0.25,
)  # 12 examples, 4 per step: the run crosses two epoch boundaries


def run(tiny_model_dir, examples, out, **kw):
    return train(
        lora_model(tiny_model_dir, dropout=0.1),
        examples,
        examples[:4],
        RESUME_CFG,
        out,
        pad_id=2,
        progress=False,
        log=kw.pop("log", lambda m: None),
        **kw,
    )


@pytest.fixture(scope="module")
def reference(tiny_model_dir, examples, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference") / "run"
    run(tiny_model_dir, examples, out)
    return out


def assert_matches_reference(out: Path, reference: Path) -> None:
    steps = read_jsonl(out / "steps.jsonl")
    assert [r["step"] for r in steps] == list(range(1, 9))
    ref = read_jsonl(reference / "steps.jsonl")
    assert [r["loss"] for r in steps] == [r["loss"] for r in ref]
    assert [r["lr"] for r in steps] == [r["lr"] for r in ref]
    assert [r["step"] for r in read_jsonl(out / "val.jsonl")] == [0, 4, 8]
    assert_same_tensors(adapter_tensors(out), adapter_tensors(reference))


def test_resume_after_a_limit_is_bitwise_identical(tiny_model_dir, examples, tmp_path, reference):
    out = tmp_path / "run"
    with pytest.raises(StoppedByLimit, match="cost cap after step 5") as stop:
        run(
            tiny_model_dir,
            examples,
            out,
            cost_check=lambda s: "cost cap" if s["step"] == 5 else None,
        )
    assert stop.value.checkpoint == out / "checkpoints" / "step-5"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "latest.json",
        "step-4",
        "step-5",
    ]
    result = run(tiny_model_dir, examples, out, resume=True)
    assert result.resumed_from == 5 and result.steps == 8
    assert_matches_reference(out, reference)


def test_resume_after_a_deadline_and_a_crash(tiny_model_dir, examples, tmp_path, reference):
    out = tmp_path / "run"
    with pytest.raises(StoppedByLimit, match="time limit"):
        run(tiny_model_dir, examples, out, deadline=time.time() - 1)  # stops after step 1
    assert [r["step"] for r in read_jsonl(out / "steps.jsonl")] == [1]

    def crash(status):
        if status["step"] == 6:
            raise RuntimeError("injected crash")

    with pytest.raises(RuntimeError, match="injected crash"):
        run(tiny_model_dir, examples, out, resume=True, cost_check=crash)
    # steps 5 and 6 were logged but never checkpointed: the resume drops and redoes them
    assert [r["step"] for r in read_jsonl(out / "steps.jsonl")] == list(range(1, 7))
    result = run(tiny_model_dir, examples, out, resume=True)
    assert result.resumed_from == 4
    assert_matches_reference(out, reference)


def test_corrupted_latest_checkpoint_falls_back_to_the_previous(
    tiny_model_dir, examples, tmp_path, reference
):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    shutil.rmtree(out / "adapter")
    target = out / "checkpoints" / "step-8" / "adapter_model.safetensors"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit
    target.write_bytes(bytes(data))
    messages: list[str] = []
    result = run(tiny_model_dir, examples, out, resume=True, log=messages.append)
    assert result.resumed_from == 4
    assert any("step-8" in m and "checksum" in m and "falling back" in m for m in messages)
    assert_matches_reference(out, reference)
    assert json.loads((out / "checkpoints" / "latest.json").read_text()) == {"step": 8}


def test_mixed_precision_steps_run_on_cpu(tiny_model_dir, examples):
    batch = collate(examples[:4], pad_id=2)
    total = count_target_tokens(batch)
    losses = {}
    for precision in ("fp32", "bf16", "fp16"):
        model = lora_model(tiny_model_dir).train()
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-2)
        scaler = torch.amp.GradScaler("cpu") if precision == "fp16" else None
        before = [p.detach().clone() for p in params]
        out = train_step(model, opt, None, [batch], total, precision, 1.0, scaler=scaler)
        losses[precision] = out["loss"]
        assert any(not torch.equal(a, p) for a, p in zip(before, params, strict=True))
        assert all(p.dtype == torch.float32 for p in params)  # master weights stay fp32
    assert abs(losses["bf16"] - losses["fp32"]) < 0.05
    assert abs(losses["fp16"] - losses["fp32"]) < 0.05


def test_full_fine_tuning_checkpoints_and_resumes_exactly(tiny_model_dir, examples, tmp_path):
    from safetensors.torch import load_file

    cfg = TrainSpec(
        max_steps=4,
        save_every=2,
        lr=1e-3,
        micro_batch=4,
        precision="fp32",
        weight_decay=0.1,
        warmup_ratio=0,
    )

    def full_run(out, **kw):
        model, _ = build_adapter(
            load_model(resolve_base(str(tiny_model_dir)))[0], AdapterSpec(method="full")
        )
        return train(
            model,
            examples[:8],
            examples[:4],
            cfg,
            out,
            pad_id=2,
            progress=False,
            log=lambda m: None,
            **kw,
        )

    full_run(tmp_path / "a")
    assert sorted(p.name for p in (tmp_path / "a" / "adapter").iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    with pytest.raises(StoppedByLimit):
        full_run(tmp_path / "b", cost_check=lambda s: "stop" if s["step"] == 3 else None)
    assert full_run(tmp_path / "b", resume=True).resumed_from == 3
    assert_same_tensors(
        load_file(tmp_path / "a" / "adapter" / "model.safetensors"),
        load_file(tmp_path / "b" / "adapter" / "model.safetensors"),
    )


def test_a_quantized_base_resumes_bit_for_bit(tiny_model_dir, examples, tmp_path):
    """QLoRA (4-bit NF4, fp32 compute): a run stopped at a limit and resumed ends with the
    same losses and adapter as an uninterrupted one; the 4-bit base is not moved or cast."""
    from lorapilot.spec import QuantizationSpec

    def q_model():
        q = QuantizationSpec(bits=4, compute_dtype="fp32")
        model, _ = load_model(resolve_base(str(tiny_model_dir)), "float32", False, q)
        model, _ = build_adapter(model, AdapterSpec(r=8, alpha=16, dropout=0.1), seed=0)
        return model

    def q_run(out, **kw):
        return train(q_model(), examples, examples[:4], RESUME_CFG, out, pad_id=2,
                     progress=False, log=lambda m: None, **kw)  # fmt: skip

    q_run(tmp_path / "ref")
    with pytest.raises(StoppedByLimit):
        q_run(tmp_path / "run", cost_check=lambda s: "cost cap" if s["step"] == 5 else None)
    result = q_run(tmp_path / "run", resume=True)
    assert result.resumed_from == 5 and result.steps == 8
    assert_matches_reference(tmp_path / "run", tmp_path / "ref")


def test_a_16_bit_run_on_a_cpu_without_fast_bf16_says_so(tiny_model_dir, examples, tmp_path,
                                                          monkeypatch):  # fmt: skip
    import lorapilot.train.loop as loop

    cfg = TrainSpec(max_steps=1, micro_batch=4, precision="bf16", eval_every=None)
    lines: list[str] = []
    monkeypatch.setattr(loop, "cpu_has_fast_bf16", lambda: False)
    train(lora_model(tiny_model_dir), examples[:4], [], cfg, tmp_path / "a", pad_id=2,
          progress=False, log=lines.append)  # fmt: skip
    assert any("no AMX or AVX512-BF16" in line for line in lines)
    monkeypatch.setattr(loop, "cpu_has_fast_bf16", lambda: True)
    lines.clear()
    train(lora_model(tiny_model_dir), examples[:4], [], cfg, tmp_path / "b", pad_id=2,
          progress=False, log=lines.append)  # fmt: skip
    assert not any("AMX" in line for line in lines)


def test_auto_precision_is_resolved_for_the_cpu_and_recorded(tiny_model_dir, examples, tmp_path,
                                                             monkeypatch):  # fmt: skip
    """`auto` trains in fp32 on a CPU without fast bf16 (no warning) and in bf16 on one with it;
    the result says which."""
    import lorapilot.base.precision as precision_mod
    import lorapilot.train.loop as loop

    cfg = TrainSpec(max_steps=1, micro_batch=4, precision="auto", eval_every=None)
    got = {}
    for fast in (False, True):
        monkeypatch.setattr(precision_mod, "cpu_has_fast_bf16", lambda fast=fast: fast)
        monkeypatch.setattr(loop, "cpu_has_fast_bf16", lambda fast=fast: fast)
        lines: list[str] = []
        out = train(lora_model(tiny_model_dir), examples[:4], [], cfg, tmp_path / str(fast),
                    pad_id=2, progress=False, log=lines.append)  # fmt: skip
        assert not any("AMX" in line for line in lines)
        got[fast] = out.precision
    assert got == {False: "fp32", True: "bf16"}


def test_stop_when_ends_the_run_early_like_its_last_step(tiny_model_dir, examples, tmp_path):
    """The smoke test's early stop: after the step the predicate accepts, training ends with
    the final validation, checkpoint and adapter of a normal end."""
    cfg = TrainSpec(max_steps=10, micro_batch=4, precision="fp32", eval_every=None)
    seen: list[int] = []

    def stop(rec: dict) -> bool:
        seen.append(rec["step"])
        return rec["step"] == 3

    out = train(lora_model(tiny_model_dir), examples[:8], examples[:4], cfg, tmp_path / "r",
                pad_id=2, stop_when=stop, progress=False, log=lambda m: None)  # fmt: skip
    assert seen == [1, 2, 3] and out.steps == 3 and out.total_steps == 10
    assert (
        out.final_val_loss is not None and Path(out.adapter, "adapter_model.safetensors").is_file()
    )
    steps = (tmp_path / "r" / "steps.jsonl").read_text().splitlines()
    assert len(steps) == 3 and out.checkpoint and out.checkpoint.endswith("step-3")
