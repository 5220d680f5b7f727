"""lorapilot's constrained decoding (`evaluate.served.LabelChoice`) against llama.cpp's grammar
sampler over the same labels (`served.gbnf_choice`, the `labels.gbnf` that `export --gguf`
writes), token set by token set:

    .venv/bin/python bench/label_grammar.py [--pilot PILOT] [--json]

For every state an answer can reach on the way to a label (each prefix of each of the pilot's
labels, tokenized by the base's tokenizer and fed to llama.cpp's sampler), the tokens llama.cpp
leaves are compared with the ones `LabelChoice.allowed` gives. Needs the `serve` extra and a
base with its original GGUF (the default model). Any difference is printed with its tokens.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pilot", type=Path, default=HERE.parent / "examples" / "ticket-triage")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from llama_cpp import Llama

    from lorapilot.base.models import load_tokenizer, original_gguf
    from lorapilot.evaluate.served import LabelChoice, gbnf_choice, token_bytes
    from lorapilot.export.serving import GrammarSampler
    from lorapilot.spec import load_pilot

    pilot = load_pilot(args.pilot)
    labels = list(pilot.spec.task.labels or [])
    resolved, tok = load_tokenizer(pilot)
    gguf, _ = original_gguf(resolved.path)
    if gguf is None:
        raise SystemExit(f"{resolved.path}: no original GGUF installed for this base")
    llm = Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    grammar = gbnf_choice(labels).encode()
    probe = GrammarSampler(llm, grammar)
    eog = [i for i in range(llm.n_vocab()) if probe.ends(i)]
    probe.close()
    t0 = time.perf_counter()
    choice = LabelChoice(token_bytes(tok), labels, stop_ids=eog)
    states = sorted({lab[:k] for lab in labels for k in range(len(lab) + 1)})
    differing = []
    for said in states:
        ids = tok(said, add_special_tokens=False)["input_ids"] if said else []
        held = GrammarSampler(llm, grammar)
        for t in ids:
            held.accept(t)
        theirs = set(np.flatnonzero(np.isfinite(held.mask(np.zeros(llm.n_vocab())))).tolist())
        held.close()
        ours = set(choice.allowed(said.encode()))
        if theirs != ours:
            differing.append({
                "state": said,
                "only_llama_cpp": [tok.decode([i]) for i in sorted(theirs - ours)[:10]],
                "only_lorapilot": [tok.decode([i]) for i in sorted(ours - theirs)[:10]],
            })  # fmt: skip
    out = {
        "pilot": pilot.spec.name,
        "labels": len(labels),
        "gguf": gguf.name,
        "vocabulary": llm.n_vocab(),
        "states": len(states),
        "tokens_allowed_at_start": len(choice.allowed(b"")),
        "differing": differing,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"{out['pilot']}: {out['labels']} labels, {out['states']} states, "
            f"{len(differing)} differing ({out['tokens_allowed_at_start']} tokens allowed "
            f"first; {out['seconds']} s)"
        )
        for d in differing[:10]:
            print(f"  {d['state']!r}: llama.cpp only {d['only_llama_cpp']}, "
                  f"lorapilot only {d['only_lorapilot']}")  # fmt: skip


if __name__ == "__main__":
    main()
