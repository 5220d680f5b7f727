"""Training through the shared prompt prefix once: loss and every LoRA gradient equal the
unshared computation (fp32, a tiny random Llama), for rows of different lengths, with the
loss on answers only or on every token, with gradient accumulation, and under activation
checkpointing (whose replays must not change the cache)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from lorapilot.base.adapter import set_checkpointing
from lorapilot.data.format import IGNORE_INDEX
from lorapilot.spec import TrainSpec
from lorapilot.train.loss import (
    causal_lm_loss_sum,
    loss_fn_for,
    prefix_path,
    shared_prefix_len,
    shared_prefix_loss_sum,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lora_model():
    return make_lora_model()


def make_lora_model():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    base = LlamaForCausalLM(config).float()
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    for name, p in model.named_parameters():  # LoRA B starts at 0: give it values to test
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    return model.train()


def batch_of(prefix: list[int], owns: list[list[int]], answer_from: list[int], loss_on_all=False):
    width = max(len(prefix) + len(o) for o in owns)
    rows = len(owns)
    ids = torch.zeros((rows, width), dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.long)
    labels = torch.full((rows, width), IGNORE_INDEX, dtype=torch.long)
    for i, own in enumerate(owns):
        seq = prefix + own
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
        start = 0 if loss_on_all else len(prefix) + answer_from[i]
        labels[i, start : len(seq)] = torch.tensor(seq[start:])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


PREFIX = [5, 17, 3, 44, 9, 12, 61, 2, 33, 8, 70, 21]


@contextlib.contextmanager
def checkpointed(model, on: bool = True):
    """Activation checkpointing as the loop enables it (non-reentrant), counting the calls of
    the first layer's attention: a checkpointed layer runs it again in backward."""
    calls = []
    attn = model.get_base_model().model.layers[0].self_attn
    hook = attn.register_forward_hook(lambda *_: calls.append(1))
    if on:
        set_checkpointing(model, True)
    try:
        yield calls
    finally:
        hook.remove()
        if on:
            set_checkpointing(model, False)


def grads(model, batch, fn):
    model.zero_grad(set_to_none=True)
    loss, n = fn(model, batch)
    loss.backward()
    out = {k: p.grad.clone() for k, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return float(loss), int(n), out


def accumulated(model, micro_batches, fn):
    """Loss and gradients summed over micro-batches, one backward each (accumulation)."""
    model.zero_grad(set_to_none=True)
    total = 0.0
    for mb in micro_batches:
        loss, _ = fn(model, mb)
        loss.backward()
        total += float(loss)
    out = {k: p.grad.clone() for k, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return total, 0, out


def assert_same(a, b):
    loss_a, n_a, g_a = a
    loss_b, n_b, g_b = b
    assert n_a == n_b and loss_a == pytest.approx(loss_b, rel=1e-5)
    assert set(g_a) == set(g_b) and g_a
    for k in g_a:
        scale = g_a[k].abs().max().clamp(min=1e-6)
        assert ((g_a[k] - g_b[k]).abs().max() / scale) < 1e-5, k


@pytest.mark.parametrize("loss_on_all", [False, True])
def test_loss_and_every_lora_gradient_equal_the_unshared_computation(lora_model, loss_on_all):
    owns = [[40, 41, 42, 43, 50, 51], [60, 61, 50], [80, 81, 82, 83, 84, 85, 86, 50, 52]]
    batch = batch_of(PREFIX, owns, answer_from=[4, 1, 7], loss_on_all=loss_on_all)
    assert shared_prefix_len(batch) == len(PREFIX)
    assert_same(
        grads(lora_model, batch, shared_prefix_loss_sum),
        grads(lora_model, batch, causal_lm_loss_sum),
    )


def test_the_first_answer_token_right_after_the_prefix_is_scored(lora_model):
    """The last prefix position predicts each row's first own token: a target there must be
    scored per row from the shared hidden state."""
    batch = batch_of(PREFIX, [[40, 41], [60, 61, 62]], answer_from=[0, 0])
    assert_same(
        grads(lora_model, batch, shared_prefix_loss_sum),
        grads(lora_model, batch, causal_lm_loss_sum),
    )


def test_accumulated_micro_batches_give_the_unshared_gradient(lora_model):
    a = batch_of(PREFIX, [[40, 41, 42], [60, 61]], answer_from=[1, 1])
    b = batch_of(PREFIX, [[70, 71, 72, 73], [75, 76, 77]], answer_from=[2, 1])

    assert_same(
        accumulated(lora_model, (a, b), shared_prefix_loss_sum),
        accumulated(lora_model, (a, b), causal_lm_loss_sum),
    )


@pytest.mark.parametrize("loss_on_all", [False, True])
def test_under_activation_checkpointing_the_replays_leave_loss_and_gradients_exact(
    lora_model, loss_on_all
):
    """Checkpointed layers replay their forward in backward, the prefix pass's and the rows'
    alike; the stock cache would append its keys a second time. Compared with the unshared
    loss without checkpointing: the reference the loop's arithmetic must equal."""
    owns = [[40, 41, 42, 43, 50, 51], [60, 61, 50], [80, 81, 82, 83, 84, 85, 86, 50, 52]]
    batch = batch_of(PREFIX, owns, answer_from=[4, 1, 7], loss_on_all=loss_on_all)
    with checkpointed(lora_model, on=False) as plain_calls:
        reference = grads(lora_model, batch, causal_lm_loss_sum)
    with checkpointed(lora_model) as calls:
        shared = grads(lora_model, batch, shared_prefix_loss_sum)
    assert len(plain_calls) == 1  # one forward, no replay
    assert len(calls) == 4  # the prefix pass and the rows' pass, each run and replayed
    assert_same(shared, reference)
    with checkpointed(lora_model):  # and the unshared path under checkpointing, as a control
        assert_same(grads(lora_model, batch, causal_lm_loss_sum), reference)


def test_accumulated_micro_batches_under_checkpointing_give_the_unshared_gradient(lora_model):
    a = batch_of(PREFIX, [[40, 41, 42], [60, 61]], answer_from=[1, 1])
    b = batch_of(PREFIX, [[70, 71, 72, 73], [75, 76, 77]], answer_from=[2, 1])

    reference = accumulated(lora_model, (a, b), causal_lm_loss_sum)
    with checkpointed(lora_model) as calls:
        assert_same(accumulated(lora_model, (a, b), shared_prefix_loss_sum), reference)
    assert len(calls) == 8  # shared, not fallen back: two passes, each replayed, twice


def test_too_short_a_prefix_or_one_row_falls_back_and_says_why(lora_model):
    short = batch_of(PREFIX[:3], [[40, 41, 42], [60, 61]], answer_from=[1, 1])
    assert shared_prefix_len(short) == 3
    assert prefix_path(lora_model, short) == ("unshared", "rows share 3 tokens (< 8)")
    assert_same(
        grads(lora_model, short, shared_prefix_loss_sum),
        grads(lora_model, short, causal_lm_loss_sum),
    )
    one = batch_of(PREFIX, [[40, 41, 42]], answer_from=[1])
    assert shared_prefix_len(one) == 0
    full = batch_of(PREFIX, [[40, 41], [60, 61]], answer_from=[1, 1])
    path, why = prefix_path(lora_model, full)
    assert path == "shared" and "12 shared prefix tokens" in why
    fn, (path, _) = loss_fn_for(TrainSpec(grad_checkpointing=True))
    assert path == "shared" and fn.func is shared_prefix_loss_sum
    assert fn.keywords == {"setting": "auto"}
    fn, _ = loss_fn_for(TrainSpec(shared_prefix="on"))
    assert fn.func is shared_prefix_loss_sum and fn.keywords == {"setting": "on"}
    fn, (path, why) = loss_fn_for(TrainSpec(shared_prefix="off"))
    assert path == "unshared" and fn is causal_lm_loss_sum and "off" in why


def test_a_model_whose_cache_is_not_plain_dynamic_takes_the_unshared_path_and_says_so():
    """Sliding-window layers keep their own cache arithmetic: not replayable as ours is."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=4,
    )  # fmt: skip
    model = MistralForCausalLM(config).float().train()
    batch = batch_of(PREFIX, [[40, 41, 42], [60, 61]], answer_from=[1, 1])
    path, why = prefix_path(model, batch)
    assert path == "unshared" and "sliding" in why
    assert_same(
        grads(model, batch, shared_prefix_loss_sum), grads(model, batch, causal_lm_loss_sum)
    )


def _meta_llama(**dims):
    """A Llama of real dimensions with no storage: `prefix_path` reads shapes, not values,
    and a model off the CPU is what it treats as a GPU's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        return LlamaForCausalLM(LlamaConfig(**dims, max_position_embeddings=1024))


@pytest.mark.parametrize(
    "dims, rows, prefix, shared",
    [  # bench/prefix_paths.py on an H200: unshared / shared step time, long-prompt case
        ("1.7b", 32, 450, True),  # 1.65x
        ("1.7b", 16, 450, False),  # 0.80x
        ("1.7b", 8, 450, False),  # 0.56x
        ("8b", 16, 450, True),  # 1.84x
        ("8b", 8, 450, False),  # 0.92x
        ("8b", 32, 38, False),  # ticket-triage's prefix: 0.73x
    ],
)
def test_auto_on_a_gpu_shares_only_where_the_h200_measured_it_faster(dims, rows, prefix, shared):
    dims = {
        "1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                     num_attention_heads=32, num_key_value_heads=32, vocab_size=49152),
        "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                   num_attention_heads=32, num_key_value_heads=8, vocab_size=128256),
    }[dims]  # fmt: skip
    model = _meta_llama(**dims)
    batch = batch_of(list(range(3, 3 + prefix)), [[7, 8, 9]] * rows, answer_from=[1] * rows)
    path, why = prefix_path(model, batch, "auto")
    assert (path == "shared") is shared, why
    if not shared:
        assert "on a GPU" in why and "train.shared_prefix: on" in why
    assert prefix_path(model, batch, "on")[0] == "shared"  # `on` forces it


def test_auto_on_a_cpu_shares_every_batch_with_a_prefix(lora_model):
    batch = batch_of(PREFIX, [[40, 41, 42], [60, 61]], answer_from=[1, 1])
    assert prefix_path(lora_model, batch, "auto")[0] == "shared"


def test_the_record_says_unshared_and_why_when_no_micro_batch_shared(tmp_path, monkeypatch):
    """`auto` resolved per micro-batch: when none took the shared path the run record says
    unshared, with the reason, not the mode's intent."""
    import lorapilot.train.loss as loss
    from lorapilot.data.format import Encoded
    from lorapilot.train.loop import train

    monkeypatch.setattr(loss, "MIN_SHARED_PREFIX", 10**6)  # no batch shares enough
    examples = [
        Encoded(input_ids=PREFIX + [40 + i, 41, 42], labels=[IGNORE_INDEX] * 13 + [41, 42],
                prompt_len=13, answer="x")
        for i in range(4)
    ]  # fmt: skip
    cfg = TrainSpec(max_steps=1, micro_batch=2, lr=1e-3, precision="fp32")
    out = train(make_lora_model(), examples, [], cfg, tmp_path / "r", pad_id=0, progress=False)
    assert out.prefix["path"] == "unshared" and out.prefix["shared_micro_batches"] == 0
    assert "rows share" in out.prefix["why"] and out.prefix["mode"] == "auto"


def test_padding_is_never_part_of_the_prefix():
    """Two rows that are all padding after a short text must not share the pad tokens."""
    batch = batch_of(PREFIX, [[40], [40, 41, 42, 43]], answer_from=[0, 0])
    assert shared_prefix_len(batch) == len(PREFIX)  # row 0 ends at 13 tokens: prefix <= 12
    same = batch_of(PREFIX, [[40, 41], [40, 41]], answer_from=[0, 0])
    assert shared_prefix_len(same) == len(PREFIX) + 1  # each row keeps one token of its own


def test_a_replay_of_the_prefix_pass_keeps_the_first_record_of_its_keys_and_values(lora_model):
    """A checkpointed prefix layer replays in backward and updates the cache again: the
    record stays the first call's (a replay's keys and values would keep the replay's whole
    graph alive until the step ends: 47 MB of the 77-label pilot's step, bench/README.md),
    while the replay's attention still gets its own keys and values."""
    from lorapilot.train.loss import _replayable_cache

    cache = _replayable_cache(None, 0, lora_model.get_base_model().config)
    first = (torch.randn(1, 2, 12, 8), torch.randn(1, 2, 12, 8))
    replay = (torch.randn(1, 2, 12, 8), torch.randn(1, 2, 12, 8))
    assert all(a is b for a, b in zip(cache.update(*first, 0), first, strict=True))
    assert all(a is b for a, b in zip(cache.update(*replay, 0), replay, strict=True))
    assert all(a is b for a, b in zip(cache.captured[0], first, strict=True))


def test_the_prefix_keys_are_kept_in_the_residual_dtype_and_the_values_in_bf16(lora_model):
    """What the memory model counts for the prefix's keys and values under checkpointing: over
    fp32 weights under bf16 autocast, RoPE's cos and sin are in the residual stream's dtype,
    so the keys it returns are fp32; the values are the projection's bf16 output."""
    from lorapilot.train.loss import _decoder_and_head, _replayable_cache

    decoder, _ = _decoder_and_head(lora_model)
    capture = _replayable_cache(None, 0, lora_model.get_base_model().config)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        decoder(input_ids=torch.tensor([PREFIX]), past_key_values=capture, use_cache=False)
    dtypes = {(k.dtype, v.dtype) for k, v in capture.captured.values()}
    assert dtypes == {(torch.float32, torch.bfloat16)}


@pytest.mark.parametrize("loss_on_all", [False, True])
def test_the_head_reads_the_prefix_and_the_rows_without_their_concatenation(loss_on_all):
    """The targets taken from the prefix's one row and the rows' own hidden states are those
    of the [rows, width, d] concatenation, in its order: the same loss, bit for bit, and the
    same gradients into both parts."""
    from lorapilot.train.loss import _head_loss_sum, _shared_head_loss_sum

    torch.manual_seed(0)
    owns = [[40, 41, 42, 43, 50, 51], [60, 61, 50], [80, 81, 82, 83, 84, 85, 86, 50, 52]]
    labels = batch_of(PREFIX, owns, answer_from=[4, 0, 7], loss_on_all=loss_on_all)["labels"]
    rows, width = labels.shape
    n = len(PREFIX)
    head = torch.nn.Linear(16, 97, bias=False)
    prefix = torch.randn(1, n, 16, requires_grad=True)
    own = torch.randn(rows, width - n, 16, requires_grad=True)
    loss, count = _shared_head_loss_sum(head, prefix, own, labels)
    grads = torch.autograd.grad(loss, (prefix, own))
    reference, ref_count = _head_loss_sum(
        head, torch.cat([prefix.expand(rows, -1, -1), own], dim=1), labels
    )
    assert torch.equal(loss, reference) and int(count) == int(ref_count)
    for a, b in zip(grads, torch.autograd.grad(reference, (prefix, own)), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-6)
    assert grads[0].abs().sum() > 0 if loss_on_all else torch.count_nonzero(grads[0][0, :-1]) == 0


def test_the_rows_cache_gives_the_prefix_length_without_a_copy_of_the_prefix(lora_model):
    """The rows' cache layers only tell the masks the prefix's length: they hold one-wide
    stand-ins, not a copy of every layer's prefix keys and values."""
    from lorapilot.train.loss import _replayable_cache

    config = lora_model.get_base_model().config
    layers = config.num_hidden_layers
    prefix_kv = [(torch.randn(1, 2, 12, 8), torch.randn(1, 2, 12, 8)) for _ in range(layers)]
    cache = _replayable_cache(prefix_kv, 3, config)
    assert cache.get_seq_length() == 12
    held = sum(layer.keys.numel() + layer.values.numel() for layer in cache.layers)
    assert held == layers * 2 * (2 * 12 * 1)
    own = torch.randn(3, 2, 5, 8)
    keys, values = cache.update(own, own, 1)
    assert keys.shape == (3, 2, 17, 8)
    assert torch.equal(keys[:, :, :12], prefix_kv[1][0].expand(3, -1, -1, -1))
    assert torch.equal(values[:, :, 12:], own)


def test_train_records_which_prefix_path_ran(tmp_path, tiny_model_dir):
    """`train` on the init pilot: the shared path ran and the record says what it spared;
    with `train.shared_prefix: off` the record says so."""
    from conftest import init_tiny_pilot, run_json

    pilot = init_tiny_pilot(tmp_path, tiny_model_dir, max_steps=2)
    out = run_json("train", str(pilot), "--no-progress")
    prefix = out["prefix"]
    assert prefix["path"] == "shared" and prefix["micro_batches"] == 2
    assert prefix["shared_micro_batches"] == 2 and prefix["tokens_saved"] > 0
    off = run_json("train", str(pilot), "--set", "train.shared_prefix=off", "--no-progress")
    assert off["prefix"]["path"] == "unshared" and off["prefix"]["tokens_saved"] == 0
    assert "off" in off["prefix"]["why"]


def test_on_the_default_model_with_real_prompts_loss_and_gradients_equal_unshared(
    default_model_dir,
):
    """The issue's second case: SmolLM2-135M in fp32 with ticket-triage's LoRA (r 16, every
    linear), three real training rows of different lengths encoded as training encodes them
    (chat template, system prompt with the label list: the shared prefix), loss on answers;
    without and with activation checkpointing."""
    from conftest import EXAMPLES

    from lorapilot.modality import modality_of
    from lorapilot.spec import load_pilot
    from lorapilot.train.batches import collate

    trainee = modality_of(load_pilot(EXAMPLES / "ticket-triage")).trainee()
    model = trainee.model.float().train()
    torch.manual_seed(0)
    for name, p in model.named_parameters():  # B starts at 0; give the gradient of A a value
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    rows = sorted(trainee.train_set.examples, key=lambda e: e.n_tokens)
    batch = collate([rows[0], rows[len(rows) // 2], rows[-1]], trainee.train_set.pad_id)
    assert shared_prefix_len(batch) >= 32 and prefix_path(model, batch)[0] == "shared"
    reference = grads(model, batch, causal_lm_loss_sum)
    assert_same(grads(model, batch, shared_prefix_loss_sum), reference)
    with checkpointed(model) as calls:  # and under activation checkpointing, replays included
        assert_same(grads(model, batch, shared_prefix_loss_sum), reference)
    assert len(calls) == 4


@pytest.mark.parametrize("fn", [causal_lm_loss_sum, shared_prefix_loss_sum])
def test_autocast_weight_copies_kept_for_backward_are_what_the_memory_model_counts(fn):
    """Under bf16 autocast over fp32 weights every matmul keeps a 16-bit copy of its frozen
    weight for backward. The shared path runs the decoder twice, and each pass casts anew:
    two copies of every decoder linear, the head's once (`memory.weight_cast_bytes`). A
    fresh model: checkpointing, once enabled, makes the embeddings' output require grad."""
    from lorapilot.sizing.memory import ModelShape, weight_cast_bytes

    lora_model = make_lora_model()

    frozen = {
        tuple(p.shape) for p in lora_model.parameters() if not p.requires_grad and p.dim() == 2
    }
    kept: dict[int, int] = {}

    def pack(t):
        if t.dtype == torch.bfloat16 and tuple(t.shape) in frozen | {s[::-1] for s in frozen}:
            kept[t.untyped_storage().data_ptr()] = t.numel() * t.element_size()
        return t

    owns = [[40, 41, 42, 43, 50, 51], [60, 61, 50], [80, 81, 82, 83, 84, 85, 86, 50, 52]]
    batch = batch_of(PREFIX, owns, answer_from=[4, 1, 7])
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fn(lora_model, batch)
    shape = ModelShape.from_config(lora_model.get_base_model().config.to_dict())
    passes = 2 if fn is shared_prefix_loss_sum else 1
    expected = weight_cast_bytes(
        shape, precision="bf16", weight_dtype_bytes=4, grad_checkpointing=False,
        decoder_passes=passes,
    )  # fmt: skip
    # Not kept, and left out of the model (1 MiB of SmolLM2's 255): the first layer's q, k
    # and v need no input gradient, since the embeddings are frozen; once per pass.
    cfg = lora_model.get_base_model().config
    first_qkv = cfg.hidden_size * (cfg.hidden_size + 2 * shape.kv_dim)
    assert sum(kept.values()) == expected - 2 * passes * first_qkv
    assert passes == 1 or expected > weight_cast_bytes(
        shape, precision="bf16", weight_dtype_bytes=4, grad_checkpointing=False
    )


def test_validation_through_the_shared_prefix_gives_the_plain_validation_loss(lora_model):
    """The loop validates on the path it trains on; the value is the plain one (fp32)."""
    from lorapilot.data.format import Encoded
    from lorapilot.train.examples import TextExamples
    from lorapilot.train.step import validation_loss

    owns = [[40, 41, 42, 43], [60, 61, 50], [80, 81, 82, 83, 84], [70, 71], [90, 91, 92]]
    encoded = []
    for own in owns:
        ids = PREFIX + own
        labels = [IGNORE_INDEX] * (len(PREFIX) + 1) + own[1:]
        encoded.append(Encoded(input_ids=ids, labels=labels, prompt_len=len(PREFIX), answer=""))
    val = TextExamples(encoded, pad_id=0)
    calls = []

    def shared(model, batch):
        calls.append(shared_prefix_len(batch))
        return shared_prefix_loss_sum(model, batch)

    plain = validation_loss(lora_model, val, 2, "fp32")
    through = validation_loss(lora_model, val, 2, "fp32", loss_fn=shared)
    assert through == pytest.approx(plain, rel=1e-6)
    assert calls and all(n == len(PREFIX) for n in calls[:2])  # micro-batches of 2 rows share it
