"""Reading a pilot: YAML parsed safely, validation errors named by key and line, `--set`
overrides and pre-registered variants applied and recorded, and the `Pilot` the steps get."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import (
    ValidationError,
)

from lorapilot.errors import UsageError
from lorapilot.spec.common import SPEC_FILENAME
from lorapilot.spec.pilot import PilotSpec
from lorapilot.spec.plan import _KEY_PATH_RE

# --------------------------------------------------------------------------- loading


def _loc(loc: tuple) -> str:
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif p in ("function-after", "function-before") or str(p).startswith("function-"):
            continue
        else:
            parts.append(("." if parts else "") + str(p))
    return "".join(parts) or "(top level)"


_FRIENDLY = {
    "greater_than": "must be a positive number",
    "extra_forbidden": "unknown key",
    "missing": "required key is missing",
}


def _integer_field(loc: tuple) -> bool:
    """Whether the spec key at `loc` takes integers only (so `train.lr: -1` is told it must be
    a positive number, `adapter.r: -1` a positive integer): the field's annotation, found by
    walking the models along the path."""
    model: Any = PilotSpec
    ann: Any = None
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if isinstance(part, int) or fields is None:
            continue
        if part not in fields:
            return False
        ann = fields[part].annotation
        inner = [a for a in (ann, *get_args(ann)) for a in (a, *get_args(a))]
        model = next((a for a in inner if isinstance(a, type) and hasattr(a, "model_fields")), None)
    args = {a for a in (ann, *get_args(ann)) if isinstance(a, type)}
    return int in args and float not in args


def format_validation_error(err: ValidationError, source: str) -> str:
    """One paragraph naming every bad key path, e.g. `adapter.r: must be a positive integer`."""
    lines = []
    for e in err.errors():
        loc = _loc(e["loc"])
        typ = e["type"]
        msg = e["msg"]
        if typ == "greater_than" and e.get("ctx", {}).get("gt") == 0:
            kind = "integer" if _integer_field(e["loc"]) else "number"
            msg = f"must be a positive {kind} (got {e.get('input')!r})"
        elif typ == "less_than_equal":
            msg = f"must be at most {e.get('ctx', {}).get('le')} (got {e.get('input')!r})"
        elif typ == "finite_number":
            msg = f"must be a finite number (got {e.get('input')!r})"
        elif typ in _FRIENDLY:
            msg = _FRIENDLY[typ]
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        lines.append(f"{loc}: {msg}")
    return f"{source}: invalid pilot spec: " + "; ".join(lines)


class _SafeLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases: a billion-laughs YAML must not expand in memory."""

    def compose_node(self, parent, index):  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases (*name) are not allowed in a pilot spec", event.start_mark
            )
        return super().compose_node(parent, index)


def parse_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_SafeLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UsageError(f"{source}:{where} is not valid YAML: {problem}") from None
    except RecursionError:
        raise UsageError(f"{source}: is not valid YAML: nested too deeply") from None
    except ValueError as e:  # a constructor's own error: an impossible date, `!!int x`
        raise UsageError(f"{source}: is not valid YAML: a value cannot be read ({e})") from None


def spec_from_dict(raw: Any, source: str = "pilot.yaml") -> PilotSpec:
    if not isinstance(raw, dict):
        raise UsageError(
            f"{source}: the pilot spec must be a YAML mapping (key: value), got "
            f"{type(raw).__name__}"
        )
    try:
        return PilotSpec.model_validate(raw)
    except ValidationError as e:
        raise UsageError(format_validation_error(e, source)) from None


def resolve_pilot(path: str | Path) -> tuple[Path, Path]:
    """PILOT is a folder holding pilot.yaml or the YAML file itself -> (pilot_dir, spec_path)."""
    p = Path(path)
    if p.is_dir():
        spec = p / SPEC_FILENAME
        if not spec.is_file():
            raise UsageError(
                f"{p}: no {SPEC_FILENAME} in this folder (PILOT is a pilot folder or its YAML file)"
            )
        return p.resolve(), spec.resolve()
    if p.is_file():
        return p.parent.resolve(), p.resolve()
    raise UsageError(f"{p}: no such pilot folder or spec file")


MAX_SPEC_BYTES = 1 << 20


def load_spec_file(spec_path: Path) -> tuple[PilotSpec, dict]:
    """Read, parse and validate a spec file -> (spec, raw dict as written)."""
    try:
        size = spec_path.stat().st_size
        if size > MAX_SPEC_BYTES:
            raise UsageError(f"{spec_path}: {size} bytes is too large for a pilot spec (max 1 MiB)")
        text = spec_path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UsageError(f"{spec_path}: not valid UTF-8 (byte {e.start})") from None
    except OSError as e:
        raise UsageError(f"{spec_path}: cannot read: {e.strerror}") from None
    if "\x00" in text:
        raise UsageError(f"{spec_path}: contains a NUL byte; a pilot spec is a text file")
    raw = parse_yaml(text, str(spec_path))
    spec = spec_from_dict(raw, str(spec_path))
    for i in range(len(spec.variants)):  # every variant is refused now, not when it trains
        variant_of(spec, raw, i, str(spec_path))
    return spec, raw


# --------------------------------------------------------------------------- variants

# Parameter groups for the one-change rule: a variant touching two groups is `combined`.
PARAM_GROUPS = {
    "adapter.r": "rank",
    "adapter.alpha": "rank",
    "adapter.target_modules": "target_modules",
    "adapter.modules_to_save": "target_modules",
    "adapter.dropout": "regularisation",
    "train.weight_decay": "regularisation",
    "train.lr": "learning_rate",
    "train.schedule": "learning_rate",
    "train.warmup_ratio": "learning_rate",
    "train.epochs": "duration",
    "train.max_steps": "duration",
    # when to stop: with train.early_stopping the validation points decide the duration
    "train.eval_every": "duration",
}


def param_group(key: str) -> str:
    if key.startswith("model.quantization"):  # bits, type, compute dtype: one idea, the base
        return "model"
    if key.startswith("train.early_stopping"):  # patience, min_delta, restore_best
        return "duration"
    return PARAM_GROUPS.get(key, key)


def _parse_value(text: str) -> Any:
    try:
        return yaml.load(text, Loader=_SafeLoader)
    except (yaml.YAMLError, ValueError, RecursionError):
        return text


def parse_sets(sets: list[str], source: str = "--set") -> list[tuple[str, Any]]:
    """`key.path=value` strings -> (key, value) pairs, the value read as YAML."""
    pairs = []
    for item in sets:
        if "=" not in item:
            raise UsageError(f"{source} {item!r}: expected KEY=VALUE, e.g. train.lr=1e-4")
        key, _, value = item.partition("=")
        key = key.strip()
        if not _KEY_PATH_RE.fullmatch(key):
            raise UsageError(f"{source} {item!r}: {key!r} is not a key path like train.lr")
        pairs.append((key, _parse_value(value)))
    return pairs


def apply_values(raw: dict, pairs: list[tuple[str, Any]], source: str = "--set") -> dict:
    """A copy of a raw spec dict with each dotted key set to its value."""
    import copy

    out = copy.deepcopy(raw)
    for key, new in pairs:
        parts = key.split(".")
        node = out
        for p in parts[:-1]:
            child = node.get(p)
            if child is None:
                child = node[p] = {}
            if not isinstance(child, dict):
                raise UsageError(f"{source} {key}: {p!r} is not a section")
            node = child
        node[parts[-1]] = copy.deepcopy(new)
    return out


def apply_overrides(raw: dict, sets: list[str], source: str = "--set") -> tuple[dict, dict]:
    """Apply `key.path=value` overrides to a raw spec dict -> (new raw, diff {key: [old, new]})."""
    pairs = parse_sets(sets, source)
    diff = {key: [_dotted(raw, key), new] for key, new in pairs}
    return apply_values(raw, pairs, source), diff


def resolved_diff(old: PilotSpec, new: PilotSpec, keys: list[str]) -> dict:
    """{key: [old, new]} for each key whose *resolved* value (defaults included) changed; a
    mirror (tracking) is not a change of the recipe."""
    old_d, new_d = old.model_dump(mode="json"), new.model_dump(mode="json")
    diff = {}
    for key in dict.fromkeys(keys):
        a, b = _dotted(old_d, key), _dotted(new_d, key)
        if a != b and key.split(".")[0] != "tracking":
            diff[key] = [a, b]
    return diff


def variant_of(spec: PilotSpec, raw: dict, index: int, source: str) -> tuple[PilotSpec, dict, dict]:
    """Variant `index` of a spec applied -> (its spec, its raw dict, its resolved diff).
    Refused (exit 2, naming `variants[i]`) when it does not validate, changes nothing, or
    changes two parameter groups without a `why:`."""
    v = spec.variants[index]
    where = f"{source}: variants[{index}] ({v.name})"
    raw2 = apply_values(raw, list(v.set.items()), where)
    new = spec_from_dict(raw2, where)
    diff = resolved_diff(spec, new, list(v.set))
    if not diff:
        raise UsageError(f"{where}: changes nothing: every key it sets already has that value")
    if variant_label(diff) == "combined" and not (v.why or "").strip():
        groups = sorted({param_group(k) for k in diff})
        raise UsageError(
            f"{where}: changes {len(groups)} parameter groups ({', '.join(groups)}): a combined "
            "variant must say why in `why:`, or be split into one-change variants"
        )
    return new, raw2, diff


def variant_label(diff: dict) -> str:
    """`base` (no change), `one_change` (one parameter group) or `combined`."""
    if not diff:
        return "base"
    groups = {param_group(k) for k in diff}
    return "one_change" if len(groups) == 1 else "combined"


def json_schema() -> dict:
    schema = PilotSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "lorapilot pilot.yaml"
    return schema


class Pilot:
    """A loaded pilot: its folder, spec file, validated spec and the raw mapping as written."""

    def __init__(
        self,
        dir: Path,
        spec_path: Path,
        spec: PilotSpec,
        raw: dict,
        diff: dict | None = None,
        variant: str | None = "base",
        replicate: int = 0,
    ):
        self.dir = dir
        self.spec_path = spec_path
        self.spec = spec
        self.raw = raw
        self.diff = diff or {}
        self.variant = variant
        """The plan's variant this pilot runs (`base`: the spec as written), or None for
        ad-hoc `--set` overrides, which no plan pre-registered."""
        self.replicate = replicate
        """Which of the variant's `selection.seeds` this is: 0 the variant as written, k its
        recipe with train.seed + k."""

    @property
    def runs_dir(self) -> Path:
        return self.dir / "runs"

    def path(self, relative: str, key: str) -> Path:
        """Resolve a data path from the spec; it must stay inside the pilot folder."""
        p = Path(relative)
        if p.is_absolute():
            raise UsageError(
                f"{self.spec_path}: {key}: {relative!r} must be a path relative to the pilot folder"
            )
        full = (self.dir / p).resolve()
        if not full.is_relative_to(self.dir):
            raise UsageError(
                f"{self.spec_path}: {key}: {relative!r} points outside the pilot folder {self.dir}"
            )
        return full


def _dotted(d: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def load_pilot(
    path: str | Path,
    sets: list[str] | None = None,
    variant: str | None = None,
    replicate: int = 0,
) -> Pilot:
    """PILOT (folder or YAML) -> validated Pilot, with `--set` overrides applied and recorded,
    or one of the spec's pre-registered `variants` (`base`: the spec as written); `replicate`
    k > 0: that variant's seed k of `selection.seeds` (train.seed + k, the same diff)."""
    pilot_dir, spec_path = resolve_pilot(path)
    spec, raw = load_spec_file(spec_path)
    diff: dict = {}
    name: str | None = "base"
    if variant is not None:
        if sets:
            raise UsageError(
                f"--variant {variant} with --set: a pre-registered variant runs as written; "
                "add another variant to pilot.yaml instead"
            )
        names = spec.variant_names()
        if variant not in names:
            raise UsageError(
                f"--variant {variant!r}: {spec_path} has no such variant (plan: {', '.join(names)})"
            )
        if variant != "base":
            spec, raw, diff = variant_of(spec, raw, names.index(variant) - 1, str(spec_path))
        name = variant
        if replicate:
            spec, raw = replicate_of(spec, raw, variant, replicate, str(spec_path))
    elif sets:
        pairs = parse_sets(sets)
        raw2 = apply_values(raw, pairs)
        new_spec = spec_from_dict(raw2, f"{spec_path} with --set {' '.join(sets)}")
        diff = resolved_diff(spec, new_spec, [key for key, _ in pairs])
        spec, raw = new_spec, raw2
        name = None if diff else "base"
    if replicate and variant is None:
        raise UsageError(
            f"--replicate {replicate}: a seed replicate is of a plan variant; name it "
            "with --variant (base: the spec as written)"
        )
    if spec.model.quantization is not None:  # refused now, not after the data is prepared
        from lorapilot.spec.requirements import require_quantization

        require_quantization(spec.model.quantization, str(spec_path))
    if spec.tracking:  # a tracker whose package is missing is refused now, not after training
        from lorapilot.spec.requirements import require_trackers

        require_trackers(spec.tracking, str(spec_path))
    if "gguf" in spec.export.formats:  # refused now, not after the whole plan has run
        from lorapilot.spec.requirements import require_serving

        require_serving(f"{spec_path}: export.formats")
    return Pilot(pilot_dir, spec_path, spec, raw, diff, name, replicate)


def replicate_of(
    spec: PilotSpec, raw: dict, variant: str, k: int, source: str
) -> tuple[PilotSpec, dict]:
    """Seed replicate `k` of a variant: its recipe with train.seed + k. Refused (exit 2) past
    the spec's `selection.seeds`, so no run can add seeds the plan did not register."""
    n = spec.selection.seeds
    if not 0 < k < n:
        raise UsageError(
            f"--replicate {k}: {source} registers selection.seeds: {n} (replicates 0 to "
            f"{n - 1}; 0 is the variant as written)"
        )
    seed = spec.train.seed + k
    raw2 = apply_values(raw, [("train.seed", seed)], f"{source}: variant {variant} seed {k}")
    return spec_from_dict(raw2, f"{source}: variant {variant} seed {k}"), raw2


def require_text(pilot: Pilot, what: str) -> None:
    """What is not built for images (export, a text model) refuses an image pilot up front
    instead of reading its image paths as text."""
    if pilot.spec.task.modality == "image":
        raise UsageError(
            f"{pilot.spec_path}: task.kind: image_classification: {what} is not available for "
            "image pilots yet (check, data, inspect, baseline, smoke, probe, budget, train, "
            "verify, eval, compare, report and run are)"
        )
