"""A label-scoring classifier's answers as a generating server gives them.

lorapilot decides a classification pilot on label scoring (`eval.mode: score`): every label's
log-probability, the argmax. A chat server (vLLM, TGI, Ollama, a transformers pipeline)
does not score: it generates greedily to the end of the turn, and what it answers can be
another label or no label at all (measured on BANKING77: 104 of 154 answers the scored label).
These figures say how far the served classifier is from the decided one; they are reported,
never gated, and are not part of the evaluation protocol (they change no prediction).
Pure: the generated texts come from the caller (torch here, llama.cpp in the GGUF check).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict

GENERATION_AGREEMENT_MIN = 0.98
"""Below this share of answers that are the scored label, the report says the classifier a
generating server serves is not the one decided on (the GGUF check's default gate)."""

WHAT = "greedy generation to the end of the turn, as a chat server answers"
CONSTRAINED = (
    "greedy decoding constrained to the labels' exact text, as a server given the labels as "
    "a choice answers (vLLM guided_choice, a TGI or llama.cpp grammar)"
)


def could_be_label(text: str, labels: set[str]) -> bool:
    """Whether a generated text, continued, can still parse to one of `labels` (casefolded)
    by the rule for generated labels (stripped, compared casefolded): the generation check
    stops an answer once it cannot, which parses the same as generating it to the end. A
    text ending in an incomplete character (a byte token decoded alone) is not judged yet."""
    said = text.lstrip().casefold()
    if not said or said.endswith("\ufffd"):
        return True
    return said.rstrip() in labels or any(lab.startswith(said) for lab in labels)


def generation_figures(
    scored: list[dict],
    generated: list[dict],
    scored_metrics: dict,
    generated_metrics: dict,
    keys: list[str],
    *,
    what: str = WHAT,
    theirs: str = "scored",
    ours: str = "generated",
) -> dict:
    """`scored` and `generated`: prediction rows of the same examples in the same order (`id`,
    `gold`, `parsed`; the generated ones with `raw_output`, `parsed` None when the text is no
    label). -> how often generation answers the scored label (`agreement`), any label
    (`label_rate`), the texts that were none, the main metrics both ways (`metrics`, keyed by
    `theirs` / `ours`) and the first examples that differ."""
    n = len(generated)
    same = [s.get("parsed") == g["parsed"] for s, g in zip(scored, generated, strict=True)]
    labelled = sum(g["parsed"] is not None for g in generated)
    not_labels = Counter(g["raw_output"].strip() for g in generated if g["parsed"] is None)
    return {
        "what": what,
        "agreement": sum(same) / n if n else 1.0,
        "label_rate": labelled / n if n else 1.0,
        "n": n,
        "n_same": sum(same),
        "n_labels": labelled,
        "not_labels": [[text, k] for text, k in not_labels.most_common(10)],
        "metrics": {
            k: {theirs: scored_metrics.get(k), ours: generated_metrics.get(k)} for k in keys
        },
        "differing": [
            {
                "id": g["id"],
                "gold": g["gold"],
                theirs: s.get("parsed"),
                "generated": g["raw_output"],
            }
            for s, g, ok in zip(scored, generated, same, strict=True)
            if not ok
        ][:20],
    }


def generation_warning(
    who: str,
    figures: dict,
    minimum: float = GENERATION_AGREEMENT_MIN,
    *,
    served_as: str = "served by a runtime that generates (vLLM, TGI, Ollama, a transformers "
    "pipeline)",
    scorer: str = "",
    theirs: str = "scored",
    ours: str = "generated",
    serve_by: str = "serve it by label scoring (`export --gguf` writes classify.py, the "
    "pilot's rule in llama.cpp), ",
    held_as: str = "Constrained to the labels' text (vLLM guided_choice, a TGI or llama.cpp "
    "grammar)",
    constrain_by: str = "serve it constrained to the labels, ",
) -> str:
    """One paragraph for when a generating server would serve another classifier than the one
    decided on; '' when generation agrees well enough. The torch evaluation's figures by
    default; the GGUF check names its runtimes (`theirs`, `ours`: the figures' metric keys;
    `scorer`: who scored), how its folder serves label scoring and constrains the answers."""
    if figures["agreement"] >= minimum:
        return ""
    n, odd = figures["n"], ", ".join(f"{t!r} x{k}" for t, k in figures["not_labels"][:3])
    by = f" {scorer}" if scorer else ""
    metrics = "; ".join(
        f"{k} {v[theirs]:.3f} scored{f' in {scorer}' if scorer else ''}, {v[ours]:.3f} generated"
        for k, v in figures["metrics"].items()
        if isinstance(v.get(theirs), int | float) and isinstance(v.get(ours), int | float)
    )
    held, held_text, constrain = figures.get("constrained"), "", ""
    if held:
        held_text = f" {held_as}, {held['n_same']} of {held['n']} are ({held['agreement']:.1%})."
        if held["agreement"] >= minimum:
            constrain = constrain_by
    return (
        f"{who}: {served_as}, {figures['n_same']} of {n} validation answers are the label"
        f"{by} scored ({figures['agreement']:.1%} < {minimum:.0%}) and "
        f"{n - figures['n_labels']} are no label at all{f' ({odd})' if odd else ''}; "
        f"{metrics}.{held_text} The decision was made on label scoring: to "
        f"serve what was decided, {constrain}{serve_by}train until the adapter answers in the "
        "label set (more steps, a higher train.lr), or decide on what generation serves "
        "(eval.mode: generate)"
    )


def _byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2's table: printable Latin-1
    bytes stand for themselves, the others are shifted past 255) -> byte value."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    shifted = [b for b in range(256) if b not in keep]
    table = {chr(b): b for b in keep}
    table.update({chr(256 + k): b for k, b in enumerate(shifted)})
    return table


_SP_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def token_bytes(tokenizer) -> list[bytes | None]:
    """Each token id's bytes, as a grammar engine (xgrammar, outlines, llama.cpp) matches them
    against the allowed text; None for special tokens, which are never part of an answer.
    Byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM2) maps its pieces back through its byte
    table; SentencePiece (Llama 2, Mistral) writes a space as U+2581 and bytes as <0xNN>;
    any other vocabulary is taken as the text each piece decodes to."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    special |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    decoder = ""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        decoder = json.dumps(json.loads(backend.to_str()).get("decoder"))
    table = _byte_alphabet() if '"ByteLevel"' in decoder else None
    out: list[bytes | None] = []
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            out.append(None)
        elif table is not None:
            out.append(bytes(table[c] for c in piece) if all(c in table for c in piece) else None)
        elif m := _SP_BYTE.match(piece):
            out.append(bytes([int(m.group(1), 16)]))
        elif "\u2581" in piece or '"Metaspace"' in decoder:
            out.append(piece.replace("\u2581", " ").encode())
        else:
            out.append(tokenizer.decode([i]).encode())
    return out


class LabelChoice:
    """The tokens a server given the labels as a choice lets the model pick next: any token
    whose bytes continue the answer so far towards one of the labels' exact texts (not only
    the labels' own tokenization), and the end of the turn once the answer is a label. A
    grammar engine allows exactly these; greedy decoding then takes the likeliest of them,
    token by token, which can end in another label than scoring whole labels picks."""

    def __init__(self, vocab: list[bytes | None], labels: list[str], stop_ids: list[int]):
        self.vocab = vocab
        self.labels = {lab.encode(): lab for lab in labels}
        self.stop_ids = sorted(set(stop_ids))
        self._by_first: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
        for i, b in enumerate(vocab):
            if b:
                self._by_first[b[0]].append((i, b))
        self._memo: dict[bytes, list[int]] = {}

    def allowed(self, said: bytes) -> list[int]:
        """Token ids allowed after the answer's bytes `said` (memoised: rows share states)."""
        if said not in self._memo:
            rests = [lab[len(said) :] for lab in self.labels if lab.startswith(said)]
            ok = {
                i
                for first in {r[0] for r in rests if r}
                for i, b in self._by_first.get(first, ())
                if any(r.startswith(b) for r in rests)
            }
            if said in self.labels:
                ok.update(self.stop_ids)
            self._memo[said] = sorted(ok)
        return self._memo[said]

    def complete(self, said: bytes) -> bool:
        """Whether `said` is a label that no other label continues: the turn must end."""
        return said in self.labels and self.allowed(said) == self.stop_ids

    def answer(self, ids: list[int]) -> bytes:
        return b"".join(self.vocab[i] or b"" for i in ids)

    def to_decode(self, free: list[list[int]], stopped: list[bool]) -> list[bool]:
        """Which answers the constrained pass must decode: not a free answer that spells a
        label and ended at a stop token, since every one of its tokens was allowed and the
        likeliest, so constrained decoding takes the same path (a trained adapter's answers,
        most of the time: that pass then costs nothing)."""
        return [
            not (ended and self.answer(ids) in self.labels)
            for ids, ended in zip(free, stopped, strict=True)
        ]


def gbnf_literal(text: str) -> str:
    """A GBNF literal of `text`: quotes, backslashes and control characters escaped; any other
    character stands for itself (GBNF literals are UTF-8)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ch == "\x7f":
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def gbnf_choice(labels: list[str]) -> str:
    """A GBNF grammar (llama.cpp's: `llama-server --grammar-file`, `llama-cli --grammar-file`)
    whose only sentences are the labels' exact texts: what a server constrained to the labels
    lets the model write."""
    if not labels or any(not lab for lab in labels):
        raise ValueError("a grammar of labels needs labels, none of them empty")
    return "root ::= " + " | ".join(gbnf_literal(lab) for lab in labels) + "\n"


def gbnf_label_set(labels: list[str], separator: str = ", ") -> str:
    """A GBNF grammar whose sentences are the multi-label answers the adapter was trained to
    write: one or more of the labels, each once, in task.labels order, `separator` between.
    Rule `l<i>` is label i followed, optionally, by a later label's rule."""
    if not labels or any(not lab for lab in labels):
        raise ValueError("a grammar of labels needs labels, none of them empty")
    n = len(labels)
    lines = ["root ::= " + " | ".join(f"l{i}" for i in range(n))]
    for i, lab in enumerate(labels):
        later = " | ".join(f"l{j}" for j in range(i + 1, n))
        rest = f" ({gbnf_literal(separator)} ({later}))?" if later else ""
        lines.append(f"l{i} ::= {gbnf_literal(lab)}{rest}")
    return "\n".join(lines) + "\n"
