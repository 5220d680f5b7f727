"""Prompt rendering and the loss mask: the one place model inputs are built.

Training, evaluation, inspection and the fresh-process reload all call `encode_example`, so
the evaluation prompt is the training prompt minus the answer, byte for byte and token for
token. The prompt comes from a chat template (the base model's own, or the one the spec's
`model.chat_template` sets, base/chat_template.py): the task's system text and user template
fill the system and user turns, the answer is the assistant turn.

Token layout of one example::

    [ prompt tokens (template up to the assistant header) ][ answer tokens ][ end-of-turn ]
      labels = -100 (no loss)                               labels = ids (loss)

The prompt and the completion are tokenized separately and concatenated, so the prompt ids
are an exact prefix of the training ids (tokenizing the joined string could merge tokens
across the boundary and make the evaluation prompt differ from the training one). What the
template renders after the end-of-turn token (ChatML's trailing newline) is dropped: it is
not part of the answer and would only teach the model to emit a newline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from lorapilot.base import chat_template
from lorapilot.data.rows import Turns
from lorapilot.errors import UsageError
from lorapilot.fsutil import sha256_bytes, sha256_json
from lorapilot.spec import FieldSpec, TaskSpec, ValueSpec
from lorapilot.spec.task import LABEL_SEPARATOR

IGNORE_INDEX = -100


def _field_list(task: TaskSpec) -> str:
    """`{fields}`: the field names, with the shape of nested ones, e.g. `intent, slots (map
    of name to string), line_items (list of objects: description, amount)`."""
    return ", ".join(_field_text(f) for f in task.fields or [])


def _field_text(f: FieldSpec) -> str:
    return f"{f.name} ({_shape_text(f)})" if f.nested else f.name


def _shape_text(v: ValueSpec) -> str:
    if v.type == "object":
        return "object: " + ", ".join(_field_text(c) for c in v.fields or [])
    if v.type == "map":
        return "map of name to " + (_shape_text(v.values) if v.values is not None else "value")
    if v.type == "list" and v.items is not None:
        item = v.items
        shape = (
            "objects: " + ", ".join(_field_text(c) for c in item.fields or [])
            if (item.type == "object")
            else _shape_text(item)
        )
        return ("ordered " if v.ordered else "") + "list of " + shape
    return f"{v.type} or list of {v.type}s" if v.or_list else v.type


def _fill(text: str, task: TaskSpec) -> str:
    # str.replace, not str.format: user texts and JSON examples contain braces.
    if "{label_descriptions}" in text:
        text = text.replace("{label_descriptions}", _label_lines(task))
    return text.replace("{labels}", ", ".join(task.labels or [])).replace(
        "{fields}", _field_list(task)
    )


def _label_lines(task: TaskSpec) -> str:
    """`{label_descriptions}`: one line per label, `label: description` or the name alone."""
    said = task.label_descriptions or {}
    return "\n".join(f"{lab}: {said[lab]}" if lab in said else lab for lab in task.labels or [])


def rendered_system(task: TaskSpec) -> str | None:
    """task.system as prompts show it (its {labels}, {fields}, {label_descriptions} filled)."""
    return _fill(task.system, task) if task.system else None


def render_messages(
    task: TaskSpec,
    text: str,
    shots: tuple[tuple[str, str], ...] = (),
    fold_system: bool = False,
    context: Turns = (),
) -> list[dict[str, str]]:
    """System + user turns for one input text; `shots` (input text, answer) pairs come first
    as earlier user and assistant turns of the same template (few-shot prompting); a
    conversation's earlier turns (`context`) come next, as they were said: the template
    frames the last user turn only, the one the answer replies to.
    `fold_system`: the chat template takes no system turn (see `folds_system`), so the system
    text opens the first user turn, separated by a blank line."""
    msgs = []
    system = rendered_system(task)
    if system and not fold_system:
        msgs.append({"role": "system", "content": system})
    user = _fill(task.template, task)
    for shot_text, shot_answer in shots:
        msgs.append({"role": "user", "content": user.replace("{text}", shot_text)})
        msgs.append({"role": "assistant", "content": shot_answer})
    msgs.extend({"role": role, "content": said} for role, said in context)
    msgs.append({"role": "user", "content": user.replace("{text}", text)})
    if system and fold_system:
        msgs[0] = {"role": "user", "content": f"{system}{SYSTEM_FOLD}{msgs[0]['content']}"}
    return msgs


SYSTEM_FOLD = "\n\n"
"""Between the system text and the first user turn's, where a template takes no system turn."""


def folds_system(tokenizer: Any, task: TaskSpec) -> bool:
    """Whether the system text must go into the first user turn: the task has one and the
    chat template refuses a system turn (Gemma's and older Mistral instruct templates raise
    on one) or drops it (renders no system text), but renders the user turn alone."""
    if not task.system:
        return False
    probe = [{"role": "user", "content": "x"}]
    marker = "lorapilot-system-probe"
    try:
        shown = tokenizer.apply_chat_template(
            [{"role": "system", "content": marker}, *probe], tokenize=False,
            add_generation_prompt=True,
        )  # fmt: skip
        if marker in shown:
            return False
    except Exception:  # jinja2's TemplateError, raised by the template's raise_exception()
        pass
    try:
        tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    except Exception as e:
        raise UsageError(
            f"the chat template does not render a user turn ({type(e).__name__}: {e}); set "
            "model.chat_template to a template that does (`plain` or a Jinja file)"
        ) from None
    return True


def answer_text(task: TaskSpec, label: str | None, target: dict | None) -> str:
    """The assistant turn: the label (a multi-label example's labels, comma-separated), or
    the target as compact JSON in the spec's field order."""
    if task.kind == "classification":
        if label is None:
            raise ValueError("classification example without a label")
        return label
    if task.multi_label:  # the labels that apply, in task.labels order
        if not target:
            raise ValueError("multi-label example without a label")
        return LABEL_SEPARATOR.join(target)
    if target is None:
        raise ValueError("extraction example without a target")
    if isinstance(target, str):  # a regex-only format task: the target is the text itself
        return target
    if task.fields:
        target = _in_order(target, task.fields)
    return json.dumps(target, ensure_ascii=False, separators=(", ", ": "))


def _in_order(obj: dict, fields: list[FieldSpec]) -> dict:
    """An object's keys in the spec's field order (absent optional fields as null), then any
    others; nested objects (also inside lists and maps) likewise."""
    ordered = {f.name: _value_in_order(obj.get(f.name), f) for f in fields}
    for k, v in obj.items():
        ordered.setdefault(k, v)
    return ordered


def _value_in_order(value: Any, spec: ValueSpec) -> Any:
    if spec.type == "object" and isinstance(value, dict):
        return _in_order(value, spec.fields or [])
    if spec.type == "list" and spec.items is not None and isinstance(value, list):
        return [_value_in_order(v, spec.items) for v in value]
    if spec.type == "map" and spec.values is not None and isinstance(value, dict):
        return {k: _value_in_order(v, spec.values) for k, v in value.items()}
    return value


def template_hash(tokenizer: Any, task: TaskSpec) -> str:
    """Hash of everything that shapes the prompt: chat template, system text, user template."""
    return sha256_json(
        {
            "chat_template": getattr(tokenizer, "chat_template", None),
            "system": task.system,
            "template": task.template,
            "labels": task.labels,
            "fields": [f.name for f in task.fields or []],
            # what the labels mean reaches the prompt; specs without keep their hash
            **({"label_descriptions": task.label_descriptions} if task.label_descriptions else {}),
            # nested shapes reach the prompt too; flat specs keep the hash they had
            **(
                {"shapes": [f.model_dump(mode="json") for f in task.fields or []]}
                if task.nested
                else {}
            ),
        }
    )


def tokenizer_hash(tokenizer: Any) -> str:
    """Identity of a tokenizer for cache keys: vocabulary, special tokens, chat template."""
    try:
        backend = tokenizer.backend_tokenizer.to_str()
    except AttributeError:  # slow tokenizer: the vocab is the best identity we have
        backend = json.dumps(sorted(tokenizer.get_vocab().items()))
    return sha256_bytes(
        (
            backend
            + json.dumps(tokenizer.all_special_tokens)
            + str(getattr(tokenizer, "chat_template", ""))
        ).encode()
    )


@dataclass
class Encoded:
    """One example as the model sees it."""

    input_ids: list[int]
    labels: list[int]
    prompt_len: int
    answer: str
    truncated: bool = False  # the input text was cut to fit max_length
    target_truncated: bool = False  # prompt template + answer alone exceed max_length
    n_text_tokens_cut: int = 0
    end_of_turn_id: int | None = None
    extra: dict = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def loss_positions(self) -> list[int]:
        return [i for i, t in enumerate(self.labels) if t != IGNORE_INDEX]

    @property
    def prompt_ids(self) -> list[int]:
        return self.input_ids[: self.prompt_len]


class PromptFormatter:
    """Builds prompts and training examples for one task with one tokenizer."""

    def __init__(
        self,
        tokenizer: Any,
        task: TaskSpec,
        max_length: int,
        truncation_side: str = "left",
        loss_on: str = "completion",
        shots: tuple[tuple[str, str], ...] = (),
    ):
        """`shots`: demonstrations before every prompt (a few-shot baseline's prompt; see
        `with_shots`), never in training examples."""
        if not getattr(tokenizer, "chat_template", None):
            raise chat_template.missing()
        self.tok = tokenizer
        self.task = task
        self.max_length = max_length
        self.truncation_side = truncation_side
        self.loss_on = loss_on
        self.shots = tuple(shots)
        # the tokens that can end a turn: the named special tokens, and the added tokens
        # marked special (a pretrained base's <|im_end|> or <end_of_turn> is often only that)
        self.special_ids = set(tokenizer.all_special_ids) | {
            i for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()
            if getattr(t, "special", False)
        }  # fmt: skip
        self.fold_system = folds_system(tokenizer, task)
        self._check_template()

    def with_shots(self, shots: list[tuple[str, str]], answer_budget: int) -> PromptFormatter:
        """This formatter with `shots` (input text, answer) before every prompt: each
        demonstration's text cut as this formatter cuts an input, and max_length grown by
        what the demonstrations add, so every input keeps the room it has without them."""
        fitted = tuple((self.fit_text(t, answer_budget)[0], a) for t, a in shots)
        out = PromptFormatter(
            self.tok, self.task, self.max_length, self.truncation_side, self.loss_on, fitted
        )
        out.max_length += len(out._ids(out.prompt_text("x"))) - len(
            self._ids(self.prompt_text("x"))
        )
        return out

    # -- rendering ---------------------------------------------------------------

    def prompt_text(self, text: str, context: Turns = ()) -> str:
        return self.tok.apply_chat_template(
            render_messages(self.task, text, self.shots, self.fold_system, context),
            tokenize=False,
            add_generation_prompt=True,
        )

    def full_text(self, text: str, answer: str, context: Turns = ()) -> str:
        msgs = render_messages(self.task, text, self.shots, self.fold_system, context)
        msgs.append({"role": "assistant", "content": answer})
        return self.tok.apply_chat_template(msgs, tokenize=False)

    def _ids(self, s: str) -> list[int]:
        return self.tok(s, add_special_tokens=False)["input_ids"]

    def _check_template(self) -> None:
        """The evaluation prompt must be a prefix of the training text, else masks lie."""
        probe_text, probe_answer = "Example input.", "example answer"
        prompt, full = self.prompt_text(probe_text), self.full_text(probe_text, probe_answer)
        if not full.startswith(prompt):
            raise UsageError(
                "the chat template renders the prompt differently with and without the answer "
                f"(generation prompt {prompt[-40:]!r} is not a prefix of the training text); "
                "lorapilot cannot build a consistent loss mask for it"
            )
        if probe_answer not in full[len(prompt) :]:
            raise UsageError("the chat template drops the assistant answer; cannot train on it")

    def completion_ids(self, prompt: str, full: str, answer: str) -> tuple[list[int], int | None]:
        """Answer tokens + the end-of-turn token; what follows end-of-turn is dropped."""
        completion = full[len(prompt) :]
        ids = self._ids(completion)
        # The end-of-turn token is the first special token after the answer text.
        n_answer = (
            len(self._ids(completion[: completion.index(answer) + len(answer)])) if answer else 0
        )
        for i in range(max(n_answer, 0), len(ids)):
            if ids[i] in self.special_ids:
                return ids[: i + 1], ids[i]
        return ids, None  # a template without an end-of-turn token: train what it renders

    # -- encoding ----------------------------------------------------------------

    def answer_budget_for(self, answers: list[str]) -> int:
        """Completion tokens (answer + end-of-turn) of the longest answer: the room the input
        text leaves free, whatever the example's own answer is."""
        text = "x"
        prompt = self.prompt_text(text)
        return max(len(self.completion_ids(prompt, self.full_text(text, a), a)[0]) for a in answers)

    def uncut_prompt_tokens(self, text: str, context: Turns = ()) -> int:
        """The prompt's tokens with the whole input text (what no cut would give)."""
        return len(self._ids(self.prompt_text(text, context)))

    def fit_text(self, text: str, answer_budget: int) -> tuple[str, int]:
        """Cut the input text (never the template or the answer) so that the prompt plus
        `answer_budget` tokens fit in max_length. Depends only on the text, not on the example's
        answer, so the evaluation prompt equals the training prompt. Returns (text, tokens cut)."""
        short, cut, _, _ = self._fit(text, answer_budget)
        return short, cut

    def _fit(
        self, text: str, answer_budget: int, context: Turns = ()
    ) -> tuple[str, int, list[int], Turns]:
        """fit_text's (text, tokens cut), the prompt's ids for that text, which it had to
        tokenize to know it fits (a prompt listing 77 labels is 600 tokens: tokenizing it once
        per example, not twice, is a third of `data`'s time), and the earlier turns kept.
        A conversation too long loses its oldest exchanges (a user turn and its reply) first,
        whole, and its last user turn is cut only when none is left: what was said last is
        what the answer replies to."""
        limit = self.max_length - answer_budget
        whole = prompt_ids = self._ids(self.prompt_text(text, context))
        kept = context
        while len(prompt_ids) > limit and kept:
            kept = kept[2:]
            prompt_ids = self._ids(self.prompt_text(text, kept))
        dropped = len(whole) - len(prompt_ids)  # the earlier turns' tokens let go
        if len(prompt_ids) <= limit:
            return text, dropped, prompt_ids, kept
        short, cut, prompt_ids = self._cut_text(text, prompt_ids, limit)
        return short, dropped + cut, prompt_ids, ()

    def _cut_text(self, text: str, whole: list[int], limit: int) -> tuple[str, int, list[int]]:
        """The input text cut on `truncation_side` until its prompt (`whole` uncut) holds
        `limit` tokens."""
        ids = self._ids(text)
        keep = len(ids) - (len(whole) - limit)
        while keep > 0:
            kept = ids[len(ids) - keep :] if self.truncation_side == "left" else ids[:keep]
            short = self.tok.decode(kept)
            prompt_ids = self._ids(self.prompt_text(short))
            over = len(prompt_ids) - limit
            if over <= 0:
                return short, len(ids) - keep, prompt_ids
            keep -= over  # re-tokenizing a decoded cut can differ by a token or two
        return "", len(ids), self._ids(self.prompt_text(""))

    def encode_prompt(self, text: str, answer_budget: int, context: Turns = ()) -> list[int]:
        """Evaluation prompt ids: the training input minus the answer, token for token."""
        return self.prompt_and_cut(text, answer_budget, context)[0]

    def prompt_and_cut(
        self, text: str, answer_budget: int, context: Turns = ()
    ) -> tuple[list[int], int]:
        """(encode_prompt's ids, the input's tokens cut to fit): what a prediction row says."""
        _, cut, prompt_ids, _ = self._fit(text, answer_budget, context)
        return prompt_ids, cut

    def encode(self, text: str, answer: str, answer_budget: int, context: Turns = ()) -> Encoded:
        short, cut, prompt_ids, kept = self._fit(text, answer_budget, context)
        prompt = self.prompt_text(short, kept)
        full = self.full_text(short, answer, kept)
        comp_ids, eot = self.completion_ids(prompt, full, answer)
        input_ids = prompt_ids + comp_ids
        if self.loss_on == "all":
            labels = list(input_ids)
        else:
            labels = [IGNORE_INDEX] * len(prompt_ids) + list(comp_ids)
        return Encoded(
            input_ids=input_ids,
            labels=labels,
            prompt_len=len(prompt_ids),
            answer=answer,
            truncated=cut > 0,
            target_truncated=len(input_ids) > self.max_length,
            n_text_tokens_cut=cut,
            end_of_turn_id=eot,
            extra={"text": short, "context": kept, "turns_dropped": len(context) - len(kept)},
        )
