"""The pilot spec: defaults, every kind of bad input names its key, overrides and variants."""

from __future__ import annotations

import pytest
from conftest import EXAMPLES

from lorapilot.errors import UsageError
from lorapilot.spec import (
    TrainSpec,
    apply_overrides,
    json_schema,
    load_pilot,
    parse_yaml,
    spec_from_dict,
    variant_label,
)

BASE = {
    "name": "t",
    "hypothesis": "the adapter routes tickets better",
    "task": {"kind": "classification", "labels": ["a", "b"]},
    "data": {"file": "d.jsonl"},
}


def bad(raw: dict) -> str:
    with pytest.raises(UsageError) as e:
        spec_from_dict(raw, "pilot.yaml")
    return str(e.value)


def test_defaults_fill_everything_but_the_required_four():
    s = spec_from_dict(BASE)
    assert s.model.base == "smollm2-135m-instruct"
    assert s.adapter.method == "lora" and s.adapter.r > 0
    assert s.train.precision == "auto" and s.eval.precision == "auto"
    assert s.train.loss_on == "completion"
    assert s.success.metric == "macro_f1"
    assert s.data.leakage == "fail" and s.data.on_error == "fail"


def test_extraction_default_success_metric():
    raw = {**BASE, "task": {"kind": "extraction", "fields": [{"name": "x"}]}}
    assert spec_from_dict(raw).success.metric == "field_f1"


@pytest.mark.parametrize(
    "raw, needle",
    [
        ({**BASE, "adapter": {"r": -1}}, "adapter.r: must be a positive integer"),
        ({**BASE, "adapter": {"r": 0}}, "adapter.r: must be a positive integer"),
        ({**BASE, "adapter": {"r": "big"}}, "adapter.r"),
        ({**BASE, "train": {"lr": -0.1}}, "train.lr: must be a positive number"),
        ({**BASE, "trian": {}}, "trian: unknown key"),
        ({**BASE, "adapter": {"rank": 8}}, "adapter.rank: unknown key"),
        (
            {k: v for k, v in BASE.items() if k != "hypothesis"},
            "hypothesis: required key is missing",
        ),
        ({**BASE, "hypothesis": "   "}, "hypothesis: must state the behaviour"),
        ({**BASE, "task": {"kind": "classification"}}, "task.labels is required"),
        ({**BASE, "task": {"kind": "regression"}}, "task.kind"),
        ({**BASE, "task": {"kind": "classification", "labels": ["a", "a"]}}, "unique"),
        (
            {**BASE, "task": {"kind": "classification", "labels": ["a", "b\x07"]}},
            "control characters",
        ),
        ({**BASE, "task": {**BASE["task"], "template": "no placeholder"}}, "task.template"),
        ({**BASE, "data": {}}, "exactly one of data.file"),
        ({**BASE, "data": {"file": "x", "cleaning": ["scrub"]}}, "unknown cleaning rule 'scrub'"),
        ({**BASE, "guards": [{"metric": "accuracy"}]}, "guards[0]"),
        ({**BASE, "name": "../escape"}, "name:"),
        ({**BASE, "limits": {"rental_days": 5}}, "limits.rental_days"),
        (
            {**BASE, "eval": {"mode": "generate", "label_scoring": "calibrated"}},
            "eval.label_scoring: calibrated re-weights the scores",
        ),
        ({**BASE, "eval": {"label_scoring": "softmax"}}, "eval.label_scoring"),
    ],
)
def test_bad_specs_name_the_key(raw, needle):
    msg = bad(raw)
    assert needle in msg, msg
    assert msg.startswith("pilot.yaml: invalid pilot spec")
    assert "Traceback" not in msg


def test_not_a_mapping():
    with pytest.raises(UsageError, match="must be a YAML mapping"):
        spec_from_dict(["a", "b"])


def test_yaml_errors_name_the_line():
    with pytest.raises(UsageError, match=r"line 2"):
        parse_yaml("a: [1, 2\nb: 3\n", "p.yaml")


def test_yaml_bomb_is_refused_without_expanding():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}]\n"
        for i in range(20)
    )
    with pytest.raises(UsageError, match="aliases"):
        parse_yaml(bomb, "bomb.yaml")


def test_overrides_and_variant_labels():
    raw, diff = apply_overrides(BASE, ["adapter.r=32"])
    assert raw["adapter"]["r"] == 32 and diff == {"adapter.r": [None, 32]}
    assert BASE.get("adapter") is None  # the original is untouched
    assert variant_label(diff) == "one_change"
    _, diff2 = apply_overrides(BASE, ["adapter.r=32", "adapter.alpha=64"])
    assert variant_label(diff2) == "one_change"  # rank and alpha are one parameter group
    _, diff3 = apply_overrides(BASE, ["adapter.r=32", "train.lr=1e-4"])
    assert variant_label(diff3) == "combined"
    assert variant_label({}) == "base"


@pytest.mark.parametrize("item", ["noequals", "../x=1", "a..b=1", "=3"])
def test_bad_overrides(item):
    with pytest.raises(UsageError, match="--set"):
        apply_overrides(BASE, [item])


def test_override_validation_names_the_key(tmp_path):
    import yaml

    (tmp_path / "pilot.yaml").write_text(yaml.safe_dump(BASE))
    with pytest.raises(UsageError, match="adapter.r: must be a positive integer"):
        load_pilot(tmp_path, ["adapter.r=-3"])


def test_data_paths_cannot_escape_the_pilot(tmp_path):
    import yaml

    (tmp_path / "pilot.yaml").write_text(yaml.safe_dump(BASE))
    p = load_pilot(tmp_path)
    assert p.path("d.jsonl", "data.file") == tmp_path.resolve() / "d.jsonl"
    with pytest.raises(UsageError, match="outside the pilot folder"):
        p.path("../secret.jsonl", "data.file")
    with pytest.raises(UsageError, match="relative"):
        p.path("/etc/passwd", "data.file")


def test_spec_hash_is_stable_and_sensitive():
    a, b = spec_from_dict(BASE), spec_from_dict(dict(BASE))
    assert a.spec_hash() == b.spec_hash()
    assert spec_from_dict({**BASE, "adapter": {"r": 4}}).spec_hash() != a.spec_hash()


def test_label_search_default_keeps_older_spec_hashes():
    """best_first gives the predictions of scoring every label: the default is left out of
    the dump, so a pilot hashed before the key existed keeps its hash (and its results)."""
    a = spec_from_dict(BASE)
    assert a.eval.label_search == "best_first"
    assert "label_search" not in a.model_dump()["eval"]
    every = spec_from_dict({**BASE, "eval": {"label_search": "all"}})
    assert every.model_dump()["eval"]["label_search"] == "all"
    assert every.spec_hash() != a.spec_hash()
    assert "eval.label_search" in bad({**BASE, "eval": {"label_search": "greedy"}})


def test_export_formats_change_no_hash_and_are_checked():
    """What is exported changes no result: the spec hash (and run's reuse) ignore it."""
    a = spec_from_dict(BASE)
    assert a.export.formats == ["peft"] and a.export.min_agreement == 0.98
    b = spec_from_dict({**BASE, "export": {"formats": ["peft", "gguf"], "gguf_base": "q8_0"}})
    assert b.spec_hash() == a.spec_hash()
    assert "export.formats" in bad({**BASE, "export": {"formats": ["onnx"]}})
    assert "listed twice" in bad({**BASE, "export": {"formats": ["gguf", "gguf"]}})
    assert "export.min_agreement" in bad({**BASE, "export": {"min_agreement": 1.5}})


def test_few_shot_changes_no_hash_and_is_bounded():
    """eval.few_shot only adds the prompting alternative's own run: no other result changes,
    so the spec hash (reuse, resume, the smoke gate) and every protocol ignore it."""
    a = spec_from_dict(BASE)
    assert a.eval.few_shot is None and "few_shot" not in a.model_dump()["eval"]
    b = spec_from_dict({**BASE, "eval": {"few_shot": 5}})
    assert b.eval.few_shot == 5 and b.spec_hash() == a.spec_hash()
    assert "eval.few_shot" in bad({**BASE, "eval": {"few_shot": 0}})
    assert "eval.few_shot" in bad({**BASE, "eval": {"few_shot": 65}})


def test_json_schema_describes_the_spec():
    sch = json_schema()
    assert {"name", "hypothesis", "task", "data"} <= set(sch["required"])
    assert "adapter" in sch["properties"]


# --------------------------------------------------------------------------- non-finite numbers


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize(
    "section, key",
    [
        ("train", "lr"),
        ("train", "epochs"),
        ("train", "weight_decay"),
        ("train", "max_grad_norm"),
        ("adapter", "alpha"),
        ("adapter", "dropout"),
        ("success", "min_gain"),
        ("limits", "margin"),
        ("limits", "memory_gb"),
        ("limits", "usd_per_hour"),
    ],
)
def test_non_finite_numbers_are_refused_naming_the_key(section, key, value):
    extra = {"metric": "macro_f1"} if section == "success" else {}
    msg = bad({**BASE, section: {**extra, key: value}})
    assert msg.startswith("pilot.yaml: invalid pilot spec: ")
    assert f"{section}.{key}: must be a finite number (got {value!r})" in msg, msg


def test_non_finite_numbers_in_yaml_lists_and_nested_sections(tmp_path):
    (tmp_path / "pilot.yaml").write_text(
        "name: t\nhypothesis: h\ntask: {kind: classification, labels: [a, b]}\n"
        "data: {file: d.jsonl, split: {val: .nan}, near_dup_threshold: .NaN}\n"
        "guards: [{metric: accuracy, min: -.inf}]\n"
    )
    with pytest.raises(UsageError) as e:
        load_pilot(tmp_path)
    msg = str(e.value)
    for needle in (
        "data.split.val: must be a finite number (got nan)",
        "data.near_dup_threshold: must be a finite number (got nan)",
        "guards[0].min: must be a finite number (got -inf)",
    ):
        assert needle in msg, msg


def test_every_float_field_of_the_spec_refuses_non_finite_values():
    """Not only the fields listed above: any float field, present or added later."""
    import typing

    from pydantic import BaseModel, ValidationError

    from lorapilot import spec as spec_mod

    models = [
        m
        for m in vars(spec_mod).values()
        if isinstance(m, type)
        and issubclass(m, BaseModel)
        and m.__module__.startswith(spec_mod.__name__)
    ]
    seen = 0
    for model in models:
        for name, info in model.model_fields.items():
            ann = info.annotation
            if float not in (ann, *typing.get_args(ann)) or typing.get_origin(ann) is dict:
                continue  # a mapping's values are checked by its own validator
            seen += 1
            obj = model.model_construct()
            for value in (float("inf"), float("nan"), "inf"):
                with pytest.raises(ValidationError, match="finite number"):
                    setattr(obj, name, value)  # validate_assignment: the field's own validation
    assert seen >= 15  # the walk found the spec's float fields


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", ".inf", ".nan", "1e999", "1.0e+999"])
def test_non_finite_overrides_are_refused(tmp_path, value):
    import yaml

    (tmp_path / "pilot.yaml").write_text(yaml.safe_dump(BASE))
    with pytest.raises(
        UsageError,
        match=r"with --set train\.lr=.*: invalid pilot spec: train\.lr: must be a finite number",
    ):
        load_pilot(tmp_path, [f"train.lr={value}"])
    assert load_pilot(tmp_path, ["train.lr=1e-4"]).spec.train.lr == 1e-4  # a finite one still works


def test_compile_mode_needs_compile_on_and_its_defaults_keep_the_spec_hash(tmp_path):
    import yaml

    dumped = TrainSpec(compile="on").model_dump()
    assert "compile_mode" not in dumped and "pad_to_multiple_of" not in dumped
    (tmp_path / "pilot.yaml").write_text(yaml.safe_dump(BASE))
    with pytest.raises(UsageError, match=r"compile_mode: reduce-overhead needs compile: on"):
        load_pilot(tmp_path, ["train.compile_mode=reduce-overhead"])
    with pytest.raises(UsageError, match=r"train\.pad_to_multiple_of"):
        load_pilot(tmp_path, ["train.pad_to_multiple_of=0"])
    spec = load_pilot(tmp_path, ["train.compile=on", "train.compile_mode=reduce-overhead"]).spec
    assert spec.train.compile == "on" and spec.train.compile_mode == "reduce-overhead"
    # a bare `on` in the file is YAML 1.1's true: still the setting the user wrote
    assert "train" not in BASE
    text = (tmp_path / "pilot.yaml").read_text()
    (tmp_path / "pilot.yaml").write_text(text + "train:\n  compile: on\n")
    assert load_pilot(tmp_path).spec.train.compile == "on"


# --------------------------------------------------------------------------- the plan


def _plan(tmp_path, variants, **extra):
    import yaml

    (tmp_path / "pilot.yaml").write_text(yaml.safe_dump({**BASE, "variants": variants, **extra}))
    return tmp_path


def test_variants_load_as_pilots_with_their_name_and_diff(tmp_path):
    d = _plan(tmp_path, [{"name": "r8", "set": {"adapter.r": 8}},
                         {"name": "q4", "set": {"model.quantization.bits": 4}},
                         {"name": "both", "set": {"adapter.r": 8, "train.lr": 1e-3},
                          "why": "a smaller rank needs a larger step"}])  # fmt: skip
    base = load_pilot(d)
    assert base.variant == "base" and base.spec.variant_names() == ["base", "r8", "q4", "both"]
    r8 = load_pilot(d, variant="r8")
    assert r8.variant == "r8" and r8.spec.adapter.r == 8 and r8.diff == {"adapter.r": [16, 8]}
    assert variant_label(r8.diff) == "one_change"
    assert variant_label(load_pilot(d, variant="both").diff) == "combined"
    assert load_pilot(d, variant="base").diff == {}
    assert load_pilot(d, ["adapter.r=4"]).variant is None  # ad hoc: not in the plan
    assert load_pilot(d, ["tracking=[]"]).variant == "base"  # a mirror changes nothing
    assert base.spec.selection_metric == "macro_f1"  # the success metric by default


@pytest.mark.parametrize(
    ("variants", "needle"),
    [
        ([{"name": "x", "set": {"adapter.r": 8, "train.lr": 1e-3}}],
         "variants[0] (x): changes 2 parameter groups (learning_rate, rank)"),
        ([{"name": "x", "set": {"adapter.r": 16}}], "variants[0] (x): changes nothing"),
        ([{"name": "x", "set": {"adapter.r": -1}}],
         "variants[0] (x): invalid pilot spec: adapter.r"),
        ([{"name": "x", "set": {"eval.batch_size": 4}}], "the task, data, evaluation"),
        ([{"name": "base", "set": {"adapter.r": 8}}], "`base` is reserved"),
        ([{"name": "x", "set": {"adapter.r": 8}}, {"name": "x", "set": {"adapter.r": 4}}],
         "variants: [1].name 'x' is given twice"),
        ([{"name": "x", "set": {}}], "at least one key"),
        ([{"name": "x", "set": {"adapter.r": 8}, "seed": 1}], "variants[0].seed: unknown key"),
    ],
)  # fmt: skip
def test_bad_variants_are_refused_naming_the_entry(tmp_path, variants, needle):
    d = _plan(tmp_path, variants)
    with pytest.raises(UsageError) as e:
        load_pilot(d)
    assert needle in str(e.value) and e.value.exit_code == 2


def test_variant_flag_errors_and_selection_metric_is_checked(tmp_path):
    d = _plan(tmp_path, [{"name": "r8", "set": {"adapter.r": 8}}])
    with pytest.raises(UsageError, match=r"no such variant \(plan: base, r8\)"):
        load_pilot(d, variant="r4")
    with pytest.raises(UsageError, match="runs as written"):
        load_pilot(d, ["train.lr=1e-3"], variant="r8")
    d2 = _plan(tmp_path, [], selection={"metric": "macro_f1x"})
    with pytest.raises(UsageError, match="selection.metric.*closest: macro_f1"):
        load_pilot(d2)
    d3 = _plan(tmp_path, [], selection={"metric": "accuracy"})
    assert load_pilot(d3).spec.selection_metric == "accuracy"


def test_shared_prefix_settings_read_bare_yaml_on_and_off():
    """YAML 1.1 reads bare on/off as booleans: they mean the settings `on` and `off`."""
    for text, want in (("on", "on"), ("off", "off"), ("auto", "auto"), ('"on"', "on")):
        raw = parse_yaml(
            "name: t\nhypothesis: h\ntask: {kind: classification, labels: [a, b]}\n"
            f"data: {{file: d.jsonl}}\ntrain: {{shared_prefix: {text}}}\n"
            f"eval: {{shared_prefix: {text}}}\n",
            "pilot.yaml",
        )
        spec = spec_from_dict(raw, "pilot.yaml")
        assert spec.train.shared_prefix == spec.eval.shared_prefix == want
    assert "shared_prefix" in bad({**BASE, "train": {"shared_prefix": "sometimes"}})


def test_gguf_export_is_refused_for_images_and_without_the_extra(tmp_path, monkeypatch):
    import yaml

    from lorapilot.spec import requirements

    image = yaml.safe_load((EXAMPLES / "fashion-items" / "pilot.yaml").read_text())
    assert "export.formats: gguf is llama.cpp's format" in bad(
        {**image, "export": {"formats": ["gguf"]}}
    )
    (tmp_path / "pilot.yaml").write_text(yaml.safe_dump({**BASE, "export": {"formats": ["gguf"]}}))
    monkeypatch.setattr(requirements, "available", lambda m: m != "llama_cpp")
    with pytest.raises(
        UsageError, match=r"export.formats: the GGUF export needs llama_cpp.*make serve"
    ):
        load_pilot(tmp_path)


def test_calibrated_scoring_is_in_the_hash_and_the_default_is_not():
    plain = spec_from_dict(BASE).spec_hash()
    assert spec_from_dict({**BASE, "eval": {"label_scoring": "sum"}}).spec_hash() == plain
    assert spec_from_dict({**BASE, "eval": {"label_scoring": "calibrated"}}).spec_hash() != plain


@pytest.mark.parametrize(
    "values, needle",
    [
        ("map | list", "the one alternative written with | is a scalar or a list of it"),
        ("string | number", "the one alternative written with |"),
        ({"type": "map", "or_list": True}, "`or_list` (`<scalar> | list`) belongs to a scalar"),
    ],
)
def test_scalar_or_list_types_are_checked(values, needle):
    task = {"kind": "extraction",
            "fields": [{"name": "slots", "type": "map", "values": values}]}  # fmt: skip
    assert needle in bad({**BASE, "task": task})
