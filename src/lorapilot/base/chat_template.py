"""The prompt format `model.chat_template` sets, put on the base's tokenizer as it is loaded.

lorapilot builds every prompt from a chat template (data/format.py). A base model that was
not instruction-tuned often ships none, and a user may want another format than the one a
base ships. `plain` is the format a base continues well without new tokens: the system text,
then `### Input:` and `### Response:` sections, the answer ended by the tokenizer's own eos
token (the token the base already ends documents with, so generation stops without new
embeddings), and the base's bos token first when its tokenizer adds one to every text. A file
is the user's own Jinja template. Either is set on the tokenizer when it is loaded, so every
step (and the tokenizer an export saves) uses the same prompt, and its text reaches the
template hash: the data version, the evaluation protocol and the adapter manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lorapilot.errors import UsageError

PLAIN = "plain"
FILE = "chat_template.jinja"
"""The name the template is saved under beside an adapter (transformers' own name for it)."""

_PLAIN_TURNS = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}{{ message['content'] + '\\n\\n' }}"
    "{%- elif message['role'] == 'user' %}{{ '### Input:\\n' + message['content'] + '\\n\\n' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{ '### Response:\\n' + message['content'] + eos_token + '\\n\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '### Response:\\n' }}{%- endif %}"
)


def missing(where: str = "") -> UsageError:
    """The refusal for a base whose tokenizer has no chat template and a spec that sets none."""
    return UsageError(
        f"{where + ': ' if where else ''}the base model's tokenizer has no chat template, and "
        "lorapilot builds prompts from one: set `model.chat_template: plain` in the spec "
        "(sections `### Input:` and `### Response:`, the answer ended by the eos token) or the "
        "path of a Jinja chat template file"
    )


def plain_template(with_bos: bool) -> str:
    """The `plain` format's Jinja text; `with_bos`: the base's bos token opens it."""
    return ("{{- bos_token }}" if with_bos else "") + _PLAIN_TURNS


def adds_bos(tokenizer: Any) -> bool:
    """Whether the tokenizer puts its bos token before every text it encodes (Llama and
    Mistral tokenizers do; a base trained so expects it first)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return bos is not None and tokenizer("x")["input_ids"][:1] == [bos]


def bos_warning(tokenizer: Any) -> str | None:
    """A tokenizer that puts its bos token before every text, with a chat template that
    renders none: prompts are tokenized as the template renders them (no special tokens
    added), so the base would train and be evaluated without the token it always saw first."""
    if not adds_bos(tokenizer):
        return None
    shown = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True
    )
    if shown.startswith(tokenizer.bos_token):
        return None
    return (
        f"the base's tokenizer puts {tokenizer.bos_token!r} before every text, and the chat "
        "template renders none: prompts are used as the template renders them, so the base "
        "is trained and evaluated without it; start the template with {{ bos_token }} (as "
        "`plain` does)"
    )


def template_text(value: str, pilot_dir: Path, tokenizer: Any, where: str) -> str:
    """The Jinja text `model.chat_template: value` names (`where`: the spec file, for
    messages): `plain`, built for this tokenizer, or the file's text."""
    if value == PLAIN:
        if getattr(tokenizer, "eos_token", None) is None:
            raise UsageError(
                f"{where}: model.chat_template: plain ends each answer with the tokenizer's eos "
                "token, and this base's tokenizer has none; give a template file that ends "
                "the answer with a special token of its vocabulary"
            )
        return plain_template(adds_bos(tokenizer))
    return read_template_file(value, pilot_dir, where)


def template_path(value: str, pilot_dir: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else pilot_dir / path


def read_template_file(value: str, pilot_dir: Path, where: str) -> str:
    """A template file's text, or a one-paragraph refusal naming the key and the file."""
    path = template_path(value, pilot_dir)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(
            f"{where}: model.chat_template: {value!r} is neither `plain` nor a file ({path} "
            "does not exist); give `plain` or the path of a Jinja chat template, relative to "
            "the pilot folder"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{where}: model.chat_template: {path} cannot be read: {e}") from None
    if not text.strip():
        raise UsageError(f"{where}: model.chat_template: {path} is empty")
    return text


def apply(tokenizer: Any, value: str | None, pilot_dir: Path, where: str) -> Any:
    """Set the pilot's chat template on `tokenizer` (None: keep the base's own) and check
    that it renders a user and an assistant turn (a system turn it may refuse: the prompt
    then folds the system text into the user turn, data/format.py); -> the tokenizer."""
    if value is None:
        return tokenizer
    tokenizer.chat_template = template_text(value, pilot_dir, tokenizer, where)
    probe = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    try:
        tokenizer.apply_chat_template(probe, tokenize=False)
        tokenizer.apply_chat_template(probe[:1], tokenize=False, add_generation_prompt=True)
    except Exception as e:  # jinja2's syntax and runtime errors, raise_exception() in templates
        raise UsageError(
            f"{where}: model.chat_template: {value} does not render a user and an assistant "
            f"turn ({type(e).__name__}: {e})"
        ) from None
    return tokenizer
