"""Peak memory of `export --gguf`'s conversions (base.gguf and merged.gguf) on a 1-8B-shaped
base, each in a fresh process:

    .venv/bin/python bench/gguf_memory.py [--shape 1.7b] [--type f16] [--dir /tmp/gguf-mem] [--json]

A base of the shape is made once under --dir (random bf16 weights in safetensors shards, as
most 1-8B checkpoints ship; the default model's tokenizer) with a random LoRA r 16 adapter on
every linear layer. Then `_write_base` (base.gguf converted from the safetensors) and the
merged model (`_merged_weights` through `gf.convert_hf`) run each in a child process that
reports its peak resident memory (ru_maxrss) and the resident memory after its imports; the
difference is what the conversion holds. The bf16 weights' size is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

SHAPES = {
    # hidden, layers, heads, kv heads, intermediate, vocab (SmolLM2's tokenizer)
    "tiny": (256, 2, 4, 2, 512, 49152),
    "360m": (960, 32, 15, 5, 2560, 49152),
    "1.7b": (2048, 24, 32, 32, 8192, 49152),
    "8b": (4096, 32, 32, 8, 14336, 128256),  # Llama-3-8B's shape (vocab padded past the tokenizer)
}


def make_base(dest: Path, shape: str) -> None:
    """A llama-shaped base folder of random bf16 weights, sharded by layers, with an adapter."""
    import torch
    from safetensors.torch import save_file

    from lorapilot.base.models import default_model_dir

    hidden, layers, heads, kv, inter, vocab = SHAPES[shape]
    src = default_model_dir()
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / name).exists():
            shutil.copyfile(src / name, dest / name)
    config = json.loads((src / "config.json").read_text())
    config.update(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab,
        head_dim=hidden // heads, dtype="bfloat16", _model_name_or_path=f"synthetic-{shape}",
    )  # fmt: skip
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    g = torch.Generator().manual_seed(0)
    hd = hidden // heads

    def rand(*s):
        return (torch.randn(*s, generator=g) * 0.02).to(torch.bfloat16)

    shapes = {
        "self_attn.q_proj": (heads * hd, hidden),
        "self_attn.k_proj": (kv * hd, hidden),
        "self_attn.v_proj": (kv * hd, hidden),
        "self_attn.o_proj": (hidden, heads * hd),
        "mlp.gate_proj": (inter, hidden),
        "mlp.up_proj": (inter, hidden),
        "mlp.down_proj": (hidden, inter),
    }
    per_shard = max(1, layers // 4)
    shard: dict = {"model.embed_tokens.weight": rand(vocab, hidden)}
    index = 0
    adapter: dict = {}
    for i in range(layers):
        p = f"model.layers.{i}."
        shard[p + "input_layernorm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
        shard[p + "post_attention_layernorm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
        for mod, (o, n) in shapes.items():
            shard[p + mod + ".weight"] = rand(o, n)
            a = f"base_model.model.model.layers.{i}.{mod}"
            adapter[a + ".lora_A.weight"] = (torch.randn(16, n, generator=g) * 0.01).float()
            adapter[a + ".lora_B.weight"] = (torch.randn(o, 16, generator=g) * 0.01).float()
        if (i + 1) % per_shard == 0 or i == layers - 1:
            if i == layers - 1:
                shard["model.norm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
            index += 1
            save_file(shard, str(dest / f"model-{index:05d}.safetensors"))
            shard = {}
    write_index(dest)
    adir = dest / "adapter"
    adir.mkdir(exist_ok=True)
    save_file(adapter, str(adir / "adapter_model.safetensors"))
    targets = sorted({m.split(".")[-1] for m in shapes})
    (adir / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 16, "lora_alpha": 32, "target_modules": targets})
    )


def write_index(dest: Path) -> None:
    """model.safetensors.index.json, as a sharded Hugging Face checkpoint has (transformers
    loads the shards through it)."""
    from safetensors import safe_open

    weight_map, total = {}, 0
    for f in sorted(dest.glob("model-*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():  # noqa: SIM118 - safe_open is not a mapping
                weight_map[key] = f.name
                sl = st.get_slice(key)
                n = 1
                for d in sl.get_shape():
                    n *= d
                total += n * 2  # bf16
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (dest / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def child(folder: Path, what: str, kind: str, out: Path) -> None:
    """One conversion in this process; prints peak and after-imports resident memory (MiB)."""
    import resource

    from transformers import AutoTokenizer

    from lorapilot.export import gguf_export as ge
    from lorapilot.export import gguf_files as gf

    config = json.loads((folder / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(folder))
    adapter_w = ge.read_safetensors(folder / "adapter" / "adapter_model.safetensors")
    adapter_cfg = json.loads((folder / "adapter" / "adapter_config.json").read_text())
    pre = "smollm"
    rss0 = _rss_now()
    t0 = time.perf_counter()
    if what == "base":
        ge._write_base(out, kind, None, folder, config, tok, lambda m: None)
    else:
        merged = ge._merged_weights(folder, adapter_w, adapter_cfg, config)
        tensors = gf.model_tensors(merged, config, str(folder))
        gf.convert_hf(folder, tensors, out, kind, pre, "merged")
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "peak_mib": round(peak),
                "after_imports_mib": round(rss0),
                "seconds": round(seconds, 1),
            }
        )
    )


def _rss_now() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1.7b")
    ap.add_argument("--type", default="f16", choices=["f16", "f32", "q8_0"])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/gguf-mem"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    folder = args.dir / args.shape
    if args.child:
        child(folder, args.child[0], args.child[1], Path(args.child[2]))
        return
    if not (folder / "adapter" / "adapter_config.json").exists():
        print(f"making a {args.shape}-shaped base in {folder}", file=sys.stderr)
        make_base(folder, args.shape)
    weights_mib = sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 2**20
    rows = []
    for what in ("base", "merged"):
        out = args.dir / f"{args.shape}-{what}-{args.type}.gguf"
        p = subprocess.run(
            [sys.executable, __file__, "--shape", args.shape, "--dir", str(args.dir),
             "--child", what, args.type, str(out)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        row = json.loads(p.stdout.strip().splitlines()[-1])
        row |= {
            "what": what,
            "held_mib": row["peak_mib"] - row["after_imports_mib"],
            "gguf_mib": round(out.stat().st_size / 2**20),
        }
        out.unlink()
        rows.append(row)
    result = {
        "shape": args.shape,
        "type": args.type,
        "bf16_weights_mib": round(weights_mib),
        "rows": rows,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.shape} base, bf16 safetensors {weights_mib:,.0f} MiB, written as {args.type}")
    for r in rows:
        print(
            f"  {r['what']:6}  peak {r['peak_mib']:>7,} MiB  "
            f"(after imports {r['after_imports_mib']:,}; held by the conversion "
            f"{r['held_mib']:,})  {r['seconds']} s  -> {r['gguf_mib']:,} MiB file"
        )


if __name__ == "__main__":
    main()
