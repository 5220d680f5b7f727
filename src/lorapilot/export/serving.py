"""The serving check's fresh process: `python -m lorapilot.export.serving CASES OUT`.

It imports llama.cpp (llama-cpp-python) and numpy, never torch or transformers: what it
predicts is what llama.cpp computes from the exported files alone. Every file is re-hashed
against the export's manifest first (a changed byte refuses the check, naming the file); then,
for each served configuration (base + adapter, merged), every validation prompt is tokenized
by llama.cpp and compared with the pilot's token ids, and predicted with the pilot's rule:
label scoring (the sum of the label tokens' log-probabilities, from llama.cpp's logits) or
greedy decoding until a stop token. Where the folder holds `classify.py` (label scoring), that
very file builds each prompt from the input text and scores the labels. A scored label is also
generated freely (greedy, to the stop token), as the Modelfile serves it: what `ollama run`
would answer; and greedily under the folder's `labels.gbnf` in llama.cpp's own grammar
sampler: what `llama-server --grammar-file labels.gbnf --temp 0` would answer. An extraction's
answers are decoded under its `fields.gbnf` the same way, and under its `schema.json` as
llama-cpp-python's server converts a `response_format` schema (`json_schema_to_gbnf`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from lorapilot.export.classify import LabelScorer
from lorapilot.fsutil import atomic_write_json, sha256_file


class Runtime:
    """One llama.cpp context over a model (and an adapter), reusing the KV cache of the
    longest prefix the next input shares with what it holds, as a server's prompt cache does."""

    def __init__(self, model: Path, lora: Path | None, n_ctx: int, threads: int):
        from llama_cpp import Llama

        self.llm = Llama(
            model_path=str(model),
            lora_path=str(lora) if lora else None,
            n_ctx=n_ctx,
            n_batch=min(n_ctx, 512),
            n_threads=threads,
            n_threads_batch=threads,
            logits_all=True,  # generate and forced read each position's logits
            verbose=False,
            seed=0,
        )
        self.scorer = LabelScorer(self.llm)

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def feed(self, ids: list[int]) -> None:
        """Make the context hold exactly `ids`, with the logits of its last position fresh."""
        self.scorer.feed(ids)

    def score(
        self, prompt: list[int], labels: list[list[int]], best_first: bool = True
    ) -> list[float | None]:
        """Each label's summed log-probability after the prompt (classify.LabelScorer: the
        code the exported classify.py runs)."""
        return self.scorer.score(prompt, labels, best_first)

    def generate(
        self, prompt: list[int], stop: set[int], max_new: int, grammar: bytes | None = None
    ) -> list[int]:
        """Greedy decoding to a stop token. With `grammar`, where llama.cpp's grammar sampler
        allows: each step it masks the tokens the grammar forbids after the answer so far (the
        end of the turn only once the answer is complete), the likeliest left is taken and
        fed to the grammar."""
        held = GrammarSampler(self.llm, grammar) if grammar is not None else None
        out: list[int] = []
        try:
            self.feed(prompt)
            while len(out) < max_new:
                logits = self.llm.scores[self.llm.n_tokens - 1]
                tok = int(np.argmax(logits))
                # the grammar masks the whole vocabulary only where the likeliest token is
                # not allowed (as llama.cpp's own sampling does): the same greedy answer
                if held is not None and not held.allows(tok):
                    logits = held.mask(logits)
                    tok = int(np.argmax(logits))
                if tok in stop:
                    break
                if held is not None:
                    if not np.isfinite(logits[tok]) or held.ends(tok):
                        break  # the end of the turn (or nothing allowed: the grammar is stuck)
                    held.accept(tok)
                out.append(tok)
                if len(out) < max_new:
                    self.llm.eval([tok])
        finally:
            if held is not None:
                held.close()
        return out

    def forced(self, prompt: list[int], ref: list[int], ended: bool, stop: set[int]) -> list[int]:
        """lorapilot's output `ref` fed after the prompt -> [tokens llama.cpp predicts the
        same, tokens compared]: at each position its argmax against `ref`'s next token (and,
        where `ref` `ended`, a stop token after it). Each token is predicted from the same
        preceding tokens, so one near-tie does not make the rest of a long answer differ."""
        self.feed(prompt + ref if ref else prompt)
        n = len(prompt)
        same = sum(int(np.argmax(self.llm.scores[n - 1 + k])) == t for k, t in enumerate(ref))
        if ended:
            same += int(np.argmax(self.llm.scores[n - 1 + len(ref)])) in stop
        return [same, len(ref) + int(ended)]

    def detokenize(self, ids: list[int]) -> str:
        return self.llm.detokenize(ids).decode("utf-8", errors="replace")


class GrammarSampler:
    """llama.cpp's own grammar sampler (what llama-server's `--grammar-file` runs) over a GBNF
    text, for one answer: `mask` sets the logits of the tokens the grammar forbids next to
    -inf, `accept` moves it past a token."""

    _ROW = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)

    def __init__(self, llm, grammar: bytes):
        import llama_cpp

        self._lib = llama_cpp
        self.vocab = llama_cpp.llama_model_get_vocab(llm.model)
        self.smpl = llama_cpp.llama_sampler_init_grammar(self.vocab, grammar, b"root")
        if not self.smpl:
            raise ValueError(f"llama.cpp cannot parse the grammar {grammar[:200]!r}")
        n = llm.n_vocab()
        self.rows = np.zeros(n, dtype=self._ROW)
        self.rows["id"] = np.arange(n, dtype=np.intc)
        self.array = llama_cpp.llama_token_data_array(
            data=self.rows.ctypes.data_as(llama_cpp.llama_token_data_p),
            size=n,
            selected=-1,
            sorted=False,
        )

    def mask(self, logits: np.ndarray) -> np.ndarray:
        import ctypes

        self.rows["logit"] = logits
        self.array.size, self.array.selected, self.array.sorted = len(self.rows), -1, False
        self._lib.llama_sampler_apply(self.smpl, ctypes.byref(self.array))
        out = np.full(len(self.rows), -np.inf, dtype=np.float32)
        kept = self.rows[: self.array.size]
        out[kept["id"]] = kept["logit"]
        return out

    def allows(self, tok: int) -> bool:
        """Whether the grammar allows `tok` next (one token checked, not the vocabulary)."""
        import ctypes

        one = np.zeros(1, dtype=self._ROW)
        one["id"] = tok
        arr = self._lib.llama_token_data_array(
            data=one.ctypes.data_as(self._lib.llama_token_data_p), size=1, selected=-1,
            sorted=False,
        )  # fmt: skip
        self._lib.llama_sampler_apply(self.smpl, ctypes.byref(arr))
        return bool(arr.size == 1 and np.isfinite(one["logit"][0]))

    def ends(self, tok: int) -> bool:
        """Whether `tok` ends the turn (llama.cpp's end-of-generation tokens)."""
        return bool(self._lib.llama_vocab_is_eog(self.vocab, tok))

    def accept(self, tok: int) -> None:
        self._lib.llama_sampler_accept(self.smpl, tok)

    def close(self) -> None:
        if self.smpl:
            self._lib.llama_sampler_free(self.smpl)
            self.smpl = None


def file_problems(folder: Path, files: dict[str, str]) -> list[str]:
    """Each exported file whose bytes differ from the manifest, named with both hashes."""
    problems = []
    for name, want in sorted(files.items()):
        path = folder / name
        got = sha256_file(path) if path.is_file() else None
        if got != want:
            problems.append(
                f"{path}: sha256 {got or 'missing'} is not the exported {want}"
                + ("" if got is None else " (the file was changed after export)")
            )
    return problems


CLASSIFY_FILE = "classify.py"
"""The exported classifier script (a copy of lorapilot/export/classify.py)."""
GRAMMAR_FILE = "labels.gbnf"
"""The labels as a llama.cpp grammar (served.gbnf_choice), for a label-scoring pilot."""
FIELDS_GRAMMAR_FILE = "fields.gbnf"
"""An extraction pilot's answers as a grammar (export.target_grammar), beside schema.json."""
SCHEMA_FILE = "schema.json"
"""An extraction pilot's answers as a JSON Schema (data.targets.answer_schema)."""


def schema_grammar(schema_text: str) -> bytes:
    """schema.json as llama-cpp-python's OpenAI-style server holds an answer to it
    (`response_format={"type": "json_object", "schema": ...}`): its own converter's GBNF. The
    server falls back to any JSON where the conversion fails; here that is a ValueError."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return json_schema_to_gbnf(schema_text).encode("utf-8")
    except Exception as e:  # the converter raises what it meets (KeyError, ValueError...)
        raise ValueError(f"{type(e).__name__}: {e}") from None


def _grammars(folder: Path, cases: dict, llm) -> tuple[dict[str, bytes], list[str]]:
    """The grammars the answers are decoded under, by result key: the folder's grammar file
    as --grammar-file serves it (`constrained`), and for an extraction its schema.json as a
    server converts it (`schema_constrained`); with what could not be used, said."""
    out, problems = {}, []
    if cases.get("grammar"):
        out["constrained"] = (folder / cases.get("grammar_file", GRAMMAR_FILE)).read_bytes()
    if cases.get("schema_file") and cases["mode"] == "generate":
        try:
            grammar = schema_grammar((folder / cases["schema_file"]).read_text(encoding="utf-8"))
            GrammarSampler(llm, grammar).close()  # llama.cpp parses it, or says why not
            out["schema_constrained"] = grammar
        except ValueError as e:
            problems.append(
                f"{cases['schema_file']} as llama-cpp-python's json_schema_to_gbnf converts it "
                f"is not a grammar llama.cpp decodes ({str(e)[:300]}); its server would fall "
                "back to any JSON object"
            )
    return out, problems


def _module(path: Path):
    """The exported file as a module: the check runs the bytes that were delivered."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lorapilot_exported_classify", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PROGRESS = "lorapilot-serving-progress"
"""The stderr line prefix of `PROGRESS done total`, one line per prompt served."""


def check(cases: dict) -> dict:
    """Re-hash, then predict every prompt in every served configuration."""
    import llama_cpp

    folder = Path(cases["folder"])
    result: dict = {"llama_cpp_python": llama_cpp.__version__, "configs": []}
    problems = file_problems(folder, cases["files"])
    if problems:
        return result | {"ok": False, "refused": True, "problems": problems}
    threads = int(cases.get("threads") or os.cpu_count() or 1)
    prompts = cases["prompts"]
    # generated answers: lorapilot's own, fed back token by token after the generation pass
    refs = (cases.get("references") or []) if cases["mode"] != "score" else []
    passes = 2 if refs else 1
    total, done = len(prompts) * len(cases["configs"]) * passes, 0

    def tick() -> None:  # one prompt served: the parent shows the count
        nonlocal done
        done += 1
        print(f"{PROGRESS} {done} {total}", file=sys.stderr, flush=True)

    delivered = _module(folder / CLASSIFY_FILE) if cases.get("classifier") else None
    grammars: dict[str, bytes] | None = None
    for conf in cases["configs"]:
        t_load = time.perf_counter()
        rt = Runtime(
            folder / conf["model"],
            folder / conf["lora"] if conf.get("lora") else None,
            int(cases["n_ctx"]),
            threads,
        )
        load_s = time.perf_counter() - t_load
        if grammars is None:  # parsed against the first model's vocabulary (they share it)
            grammars, result["grammar_problems"] = _grammars(folder, cases, rt.llm)
        grammar = grammars.get("constrained")
        # label scoring: the exported classify.py itself builds each prompt from the input
        # text and scores the labels, over this context
        clf = delivered.Classifier(folder, llm=rt.llm) if delivered else None
        scorer = clf.scorer if clf else rt
        mismatches = []
        for i, p in enumerate(prompts):
            got = clf.prompt_ids(p["input"]) if clf else rt.tokenize(p["text"])
            if got != p["ids"]:
                at = next(
                    (k for k, (a, b) in enumerate(zip(got, p["ids"], strict=False)) if a != b),
                    min(len(got), len(p["ids"])),
                )
                mismatches.append(
                    {
                        "index": i,
                        "id": p["id"],
                        "first_difference_at": at,
                        "lorapilot": p["ids"][at : at + 8],
                        "llama_cpp": got[at : at + 8],
                    }
                )
        entry: dict = {"name": conf["name"], "load_s": round(load_s, 3)}
        if mismatches:
            entry.update(tokenization_mismatches=mismatches)
            result["configs"].append(entry)
            for _ in range(len(prompts) * passes):
                tick()
            continue
        t0 = time.perf_counter()
        stop = set(cases["stop_ids"])
        if cases["mode"] == "score":
            best_first = cases.get("label_search", "best_first") == "best_first"
            # and as the Modelfile serves it: free greedy generation to the stop token
            free_max = int(cases.get("label_max_new") or 0)
            entry["scores"], entry["reference_scores"], gens, gen_s = [], [], [], 0.0
            # and under the folder's labels.gbnf, as llama-server --grammar-file serves it
            held_max = int(cases.get("constrained_max_new") or 0)
            held, held_s = [], 0.0
            for p in prompts:
                got = scorer.score(p["ids"], cases["labels"], best_first)
                entry["scores"].append(got)
                # lorapilot's label scored whole here too: how far the served model puts it
                # from its own choice (kept apart: it must not change the served argmax)
                ref = p.get("reference_label")
                ref_score = None if ref is None else got[ref]
                if ref is not None and ref_score is None:  # best-first left it partial
                    (ref_score,) = scorer.score(p["ids"], [cases["labels"][ref]], False)
                entry["reference_scores"].append(ref_score)
                if free_max:
                    t_gen = time.perf_counter()
                    gens.append(rt.generate(p["ids"], stop, free_max))
                    gen_s += time.perf_counter() - t_gen
                if grammar is not None:
                    t_held = time.perf_counter()
                    held.append(rt.generate(p["ids"], stop, held_max, grammar))
                    held_s += time.perf_counter() - t_held
                tick()
            if free_max:
                entry["generated"] = [rt.detokenize(g) for g in gens]
                entry["generation_seconds"] = round(gen_s, 3)
            if grammar is not None:
                entry["constrained"] = [rt.detokenize(g) for g in held]
                entry["constrained_seconds"] = round(held_s, 3)
            free = cases.get("content_free") or []
            if free:  # calibrated scoring: every label after each content-free input
                entry["content_free_scores"] = [
                    rt.score(p["ids"], cases["labels"], False) for p in free
                ]
        else:
            max_new = int(cases["max_new_tokens"])
            gens = []
            held = {k: [] for k in grammars}  # the answers held to each grammar, and the time
            held_s = dict.fromkeys(grammars, 0.0)
            for p in prompts:
                gens.append(rt.generate(p["ids"], stop, max_new))
                for key, g in grammars.items():
                    t_held = time.perf_counter()
                    held[key].append(rt.generate(p["ids"], stop, max_new, g))
                    held_s[key] += time.perf_counter() - t_held
                tick()
            entry["output_ids"] = gens
            entry["outputs"] = [rt.detokenize(g) for g in gens]
            for key in grammars:
                entry[key] = [rt.detokenize(g) for g in held[key]]
                entry[f"{key}_seconds"] = round(held_s[key], 3)
        # serving the split by the pilot's rule: its rate is the one shown
        seconds = (
            time.perf_counter()
            - t0
            - entry.get("generation_seconds", 0.0)
            - entry.get("constrained_seconds", 0.0)
            - entry.get("schema_constrained_seconds", 0.0)
        )
        if refs:  # lorapilot's answers, teacher-forced
            t1 = time.perf_counter()
            entry["forced"] = []
            for p, r in zip(prompts, refs, strict=True):
                entry["forced"].append(rt.forced(p["ids"], r["ids"], r["ended"], stop))
                tick()
            entry["forced_seconds"] = round(time.perf_counter() - t1, 3)
        entry.update(
            tokenization_mismatches=[],
            seconds=round(seconds, 3),
            examples_per_s=round(len(prompts) / max(seconds, 1e-9), 3),
        )
        result["configs"].append(entry)
        del rt, clf, scorer
    return result | {"ok": True, "refused": False, "problems": [], "threads": threads}


def main(argv: list[str]) -> int:
    cases_path, out_path = (Path(a) for a in argv)
    cases = json.loads(cases_path.read_text(encoding="utf-8"))
    try:
        res = check(cases)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which names the step
        res = {"ok": False, "refused": True, "problems": [f"llama.cpp: {type(e).__name__}: {e}"]}
    atomic_write_json(out_path, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
