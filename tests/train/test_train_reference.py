"""lorapilot's training loss and update equal transformers' `Trainer` + PEFT on the same data.

The benchmark (bench/train_throughput.py) compares the speed of the two; these tests make sure
it compares the same computation: the same target tokens after collation, the same mean loss
per target token, and, through one real `Trainer.train()` step with gradient accumulation, the
same update. Tiny random Llama, fp32, CPU.
"""

from __future__ import annotations

import pytest
import torch
from test_loop import TASK  # the same four-queue task as the loop tests

from lorapilot.base.adapter import build_adapter
from lorapilot.base.models import load_model, resolve_base
from lorapilot.data.format import IGNORE_INDEX, PromptFormatter
from lorapilot.spec import AdapterSpec
from lorapilot.train.batches import collate, count_target_tokens
from lorapilot.train.loss import causal_lm_loss_sum
from lorapilot.train.step import train_step

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    # transformers' Trainer calls its own API deprecated for v6; not ours to act on
    pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning"),
]

TICKETS = [
    ("I was charged twice for my order.", "billing"),
    ("The app crashes when I log in, every single time, since the update.", "technical"),
    ("Please add a dark mode.", "feature_request"),
    ("Someone changed my password without asking.", "account_access_and_security"),
    ("My invoice shows the wrong VAT number, can you fix it?", "billing"),
    ("Error 500.", "technical"),
    ("Exporting to CSV would help our finance team a lot.", "feature_request"),
    ("Locked out.", "account_access_and_security"),
]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.padding_side = "right"  # as training recipes set it (load_model sets "left")
    return tok


@pytest.fixture(scope="module")
def examples(tok):
    fmt = PromptFormatter(tok, TASK, max_length=128)
    budget = fmt.answer_budget_for(TASK.labels)
    return [fmt.encode(text, label, budget) for text, label in TICKETS]


@pytest.fixture()
def fresh_accelerate():
    """The Trainer builds an Accelerator; accelerate's state is process-global."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()
    yield
    AcceleratorState._reset_state()


def features(examples) -> list[dict]:
    """What a Trainer recipe feeds its collator: token ids, attention mask, -100 labels."""
    return [
        {"input_ids": e.input_ids, "attention_mask": [1] * e.n_tokens, "labels": e.labels}
        for e in examples
    ]


def hf_collate(tok, examples):
    from transformers import DataCollatorForSeq2Seq

    return DataCollatorForSeq2Seq(tok, padding=True, label_pad_token_id=IGNORE_INDEX)(
        features(examples)
    )


def lora_model(tiny_model_dir):
    """The LoRA model with a non-zero B, so the adapter changes the loss and A has a gradient."""
    model, _ = load_model(resolve_base(str(tiny_model_dir)))
    model, _ = build_adapter(model, AdapterSpec(r=8, alpha=16, dropout=0.0), seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model.train()


def trainer_for(model, examples, tmp_path, optimizer=None, **args):
    from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments

    tok = args.pop("tok")
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0) if optimizer else None
    return Trainer(
        model=model,
        args=TrainingArguments(
            output_dir=str(tmp_path / "hf"),
            use_cpu=True,
            report_to="none",
            save_strategy="no",
            eval_strategy="no",
            disable_tqdm=True,
            **args,
        ),
        train_dataset=features(examples),
        data_collator=DataCollatorForSeq2Seq(tok, padding=True, label_pad_token_id=IGNORE_INDEX),
        optimizers=(optimizer, schedule),
    )


def test_trainer_collation_and_lorapilot_collation_see_the_same_targets(
    tok, examples, tiny_model_dir, tmp_path, fresh_accelerate
):
    batch = examples[:5]
    ours, theirs = collate(batch, tok.pad_token_id), hf_collate(tok, batch)
    assert (ours["attention_mask"] == 0).any()  # the batch has padding
    for key in ("input_ids", "attention_mask", "labels"):
        assert torch.equal(ours[key], theirs[key]), key
    # The Trainer's own count of the tokens its loss is normalised by (labels[..., 1:]).
    trainer = trainer_for(lora_model(tiny_model_dir), batch, tmp_path, tok=tok)
    assert trainer.model_accepts_loss_kwargs
    n_hf = trainer._get_num_items_in_batch([theirs], torch.device("cpu"))
    assert int(n_hf) == count_target_tokens(ours) == sum(len(e.loss_positions) for e in batch)


def test_loss_equals_the_trainers_loss_in_fp32(
    tok, examples, tiny_model_dir, tmp_path, fresh_accelerate
):
    model = lora_model(tiny_model_dir)
    batch = collate(examples[:6], tok.pad_token_id)
    n = count_target_tokens(batch)
    trainer = trainer_for(model, examples, tmp_path, tok=tok)
    with torch.no_grad():
        loss_sum, n_targets = causal_lm_loss_sum(model, batch)
        ours = float(loss_sum) / int(n_targets)
        plain = float(model(**batch).loss)  # transformers' mean over the batch's targets
        # ... and as the Trainer computes it, normalised by the step's target count
        hf = float(trainer.compute_loss(model, dict(batch), num_items_in_batch=n))
    assert int(n_targets) == n
    assert abs(ours - plain) < 1e-4 and abs(ours - hf) < 1e-4, (ours, plain, hf)


def test_one_accumulated_step_updates_like_the_trainer(
    tok, examples, tiny_model_dir, tmp_path, fresh_accelerate
):
    """Global batch 8 as 2 micro-batches of 4, SGD with lr 1 (the update is the gradient),
    no clipping. The two sides split the 8 examples into micro-batches differently (the
    Trainer shuffles), which must not matter: both normalise by the step's target count."""

    def trainable(model):
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    ours = lora_model(tiny_model_dir)
    before = trainable(ours)
    opt = torch.optim.SGD([p for p in ours.parameters() if p.requires_grad], lr=1.0)
    micro = [collate(examples[i : i + 4], tok.pad_token_id) for i in (0, 4)]
    total = sum(count_target_tokens(mb) for mb in micro)
    out = train_step(ours, opt, None, micro, total, "fp32", None)

    theirs = lora_model(tiny_model_dir)
    assert all(torch.equal(before[n], p) for n, p in trainable(theirs).items())
    sgd = torch.optim.SGD([p for p in theirs.parameters() if p.requires_grad], lr=1.0)
    trainer = trainer_for(
        theirs,
        examples,
        tmp_path,
        sgd,
        tok=tok,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=1,
        max_grad_norm=0.0,
    )
    result = trainer.train()

    assert abs(out["loss"] - result.training_loss) < 1e-4, (out["loss"], result.training_loss)
    after_ours, after_theirs = trainable(ours), trainable(theirs)
    moved = max(float((after_ours[n] - before[n]).abs().max()) for n in before)
    assert moved > 1e-3  # the step did something
    for name in before:
        torch.testing.assert_close(after_ours[name], after_theirs[name], atol=1e-5, rtol=0)


def test_short_sequences_use_eager_attention_on_cpu_with_the_same_loss(
    tok, examples, tiny_model_dir
):
    """train_step's CPU switch to eager attention (faster on short sequences) is scoped to
    the step and changes the loss only by rounding."""
    from lorapilot.train.step import EAGER_ATTENTION_MAX_WIDTH, short_sequence_attention

    model = lora_model(tiny_model_dir)
    base = model.get_base_model()
    batch = collate(examples[:6], tok.pad_token_id)
    assert (batch["attention_mask"] == 0).any()
    seen = []
    with torch.no_grad():
        sdpa, _ = causal_lm_loss_sum(model, batch)
        with short_sequence_attention(model, "cpu", batch["input_ids"].shape[1]):
            seen.append(base.config._attn_implementation)
            eager, _ = causal_lm_loss_sum(model, batch)
        with short_sequence_attention(model, "cpu", EAGER_ATTENTION_MAX_WIDTH + 1):
            seen.append(base.config._attn_implementation)
        with short_sequence_attention(model, "cuda", 8):
            seen.append(base.config._attn_implementation)
    assert seen == ["eager", "sdpa", "sdpa"]
    assert base.config._attn_implementation == "sdpa"  # restored
    assert abs(float(sdpa) - float(eager)) / float(sdpa) < 1e-5
