"""export.merge: a LoRA merged into its base and written one tensor at a time, as PEFT's own
merge gives it, in float32 or 16 bits, sharded as the base is, loadable by plain
transformers; a tiny random Llama with a random LoRA (big enough to move every weight)."""

from __future__ import annotations

import gc
import json
import weakref

import numpy as np
import pytest

from lorapilot.export import merge as mg
from lorapilot.export import weights as wt

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lora(tmp_path_factory, tiny_model_dir):
    """(root, adapter weights, adapter config, PEFT's merged state dict in float32)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("merge")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    for name, p in peft.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    peft.save_pretrained(root / "adapter")
    cfg = json.loads((root / "adapter" / "adapter_config.json").read_text())
    adapter_w = load_file(str(root / "adapter" / "adapter_model.safetensors"))
    merged = {k: v.detach().numpy().copy() for k, v in peft.merge_and_unload().state_dict().items()}
    return root, adapter_w, cfg, merged


def test_float32_is_pefts_merge_and_loads_in_transformers(lora, tiny_model_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    _, adapter_w, cfg, peft_merged = lora
    weights = mg.merged_weights(tiny_model_dir, adapter_w, cfg)
    ticks = []
    mg.write_model_folder(tiny_model_dir, tmp_path, weights, "float32", lambda: ticks.append(1))
    assert len(ticks) == len(weights)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "float32"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    state = loaded.state_dict()
    moved = 0
    for key, value in peft_merged.items():
        np.testing.assert_allclose(state[key].numpy(), value, rtol=0, atol=1e-6, err_msg=key)
        moved += "proj" in key
    assert moved >= 14  # every adapted linear compared


def test_16_bits_are_the_float32_merge_rounded(lora, tiny_model_dir, tmp_path):
    """Each written tensor is the float32 merged one rounded to the dtype, nothing else (and
    so PEFT's merge within that rounding)."""
    import torch
    from safetensors.torch import load_file

    _, adapter_w, cfg, peft_merged = lora
    weights = mg.merged_weights(tiny_model_dir, adapter_w, cfg)
    for dtype in ("bfloat16", "float16"):
        out = tmp_path / dtype
        out.mkdir()
        mg.write_model_folder(tiny_model_dir, out, weights, dtype, lambda: None)
        written = load_file(str(out / "model.safetensors"))
        assert set(written) == set(wt.of_folder(tiny_model_dir))
        for key, t in written.items():
            assert t.dtype == getattr(torch, dtype), key
            assert torch.equal(t, torch.from_numpy(weights[key]).to(t.dtype)), key
            close = torch.from_numpy(peft_merged[key]).to(t.dtype).float()
            assert (t.float() - close).abs().max() <= close.abs().max() * 2**-7, key


def test_sharded_base_keeps_its_shards_and_index_and_integers(tmp_path):
    """A base in two shards with an index (every 1-8B checkpoint) is written in the same two
    files with the index's total_size recomputed; an integer buffer is kept as it is."""
    import torch
    from safetensors.torch import load_file, save_file

    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir(), dest.mkdir()
    a = {"a.weight": torch.randn(4, 3, dtype=torch.bfloat16), "ids": torch.arange(5)}
    b = {"b.weight": torch.randn(2, 2, dtype=torch.bfloat16), "s": torch.tensor(1.5)}
    save_file(a, str(src / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    save_file(b, str(src / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    weight_map = {k: "model-00001-of-00002.safetensors" for k in a}
    weight_map |= {k: "model-00002-of-00002.safetensors" for k in b}
    index = {"metadata": {"total_size": 1}, "weight_map": weight_map}
    (src / mg.INDEX).write_text(json.dumps(index))
    (src / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16", "x": 1}))
    total = mg.write_model_folder(src, dest, wt.of_folder(src), "bfloat16", lambda: None)
    index = json.loads((dest / mg.INDEX).read_text())
    assert index["weight_map"] == weight_map and index["metadata"]["total_size"] == total
    assert total == (12 + 4 + 1) * 2 + 5 * 8
    first = load_file(str(dest / "model-00001-of-00002.safetensors"))
    assert torch.equal(first["a.weight"], a["a.weight"]) and torch.equal(first["ids"], a["ids"])
    second = load_file(str(dest / "model-00002-of-00002.safetensors"))
    assert torch.equal(second["s"], b["s"]) and second["s"].shape == ()
    config = json.loads((dest / "config.json").read_text())
    assert config == {"torch_dtype": "bfloat16", "x": 1, "dtype": "bfloat16"}


def test_one_tensor_is_held_at_a_time(tiny_model_dir, tmp_path):
    """The writer asks for a tensor, writes it and lets it go before reading the next: at
    most one of the tensors read is alive at any time (an 8B base is never whole)."""
    base = wt.of_folder(tiny_model_dir)
    alive: list[weakref.ref] = []
    most = 0

    class Tracked(np.ndarray):
        pass

    def read(key: str, stored) -> np.ndarray:
        nonlocal most
        gc.collect()
        most = max(most, sum(r() is not None for r in alive))
        a = stored().view(Tracked)
        alive.append(weakref.ref(a))
        return a

    mg.write_model_folder(tiny_model_dir, tmp_path, base.replaced(read), "bfloat16", lambda: None)
    assert most == 0 and len(alive) == len(base)


def test_only_lora_tells_pairs_from_whole_modules(lora):
    _, adapter_w, *_ = lora
    assert mg.only_lora(adapter_w)
    assert not mg.only_lora({**adapter_w, "base_model.model.model.norm.modules_to_save.weight": 0})
