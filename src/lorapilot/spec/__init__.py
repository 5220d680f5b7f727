"""The pilot spec (pilot.yaml): pydantic models, defaults, JSON Schema and error formatting.

The spec is the pre-registration of the pilot: the hypothesis, the success criterion and the
guards are written before any model is trained, and every run records the spec's hash.
Everything but `name`, `hypothesis`, `task` and `data` has a default.

One module per topic: `task`, `model`, `data`, `train` (adapter and training), `evaluation`
(protocol, success, guards), `limits`, `checks` (the smoke), `plan` (variants, selection),
`pilot` (the whole spec), `load` (reading, overrides, variants, the `Pilot`), with `common`
beneath them; `requirements` (what the machine must have for a spec), `metric_names`,
`scaffold` (`init`) and `reference` (docs/spec-reference.md). The spec is
the lowest layer: it imports only `errors` and `fsutil`, and every name is re-exported here.
"""

from lorapilot.spec.checks import (
    SmokeSpec,
)
from lorapilot.spec.common import (
    _NAME_RE,
    CLEANING_RULES,
    DEFAULT_BASE,
    IMAGE_BASE,
    SPEC_FILENAME,
    AutoOnOff,
    _Strict,
)
from lorapilot.spec.data import (
    DataFiles,
    DataSpec,
    FieldMap,
    HFDataset,
    HFSplits,
    SampleSpec,
    SplitSpec,
)
from lorapilot.spec.evaluation import (
    GUARD_RULES,
    EvalNormalize,
    EvalSpec,
    GuardSpec,
    SuccessSpec,
)
from lorapilot.spec.export import (
    EXPORT_FORMATS,
    ExportSpec,
)
from lorapilot.spec.limits import (
    LimitsSpec,
)
from lorapilot.spec.load import (
    MAX_SPEC_BYTES,
    PARAM_GROUPS,
    Pilot,
    apply_overrides,
    apply_values,
    format_validation_error,
    json_schema,
    load_pilot,
    load_spec_file,
    param_group,
    parse_sets,
    parse_yaml,
    require_text,
    resolve_pilot,
    resolved_diff,
    spec_from_dict,
    variant_label,
    variant_of,
)
from lorapilot.spec.model import (
    ModelSpec,
    QuantizationSpec,
)
from lorapilot.spec.pilot import (
    PilotSpec,
)
from lorapilot.spec.plan import (
    VARIANT_SECTIONS,
    SelectionSpec,
    VariantSpec,
)
from lorapilot.spec.task import (
    IMAGE_AUGMENTS,
    IMAGE_EXTENSIONS,
    FieldSpec,
    ImageSpec,
    TaskSpec,
    ValueSpec,
    ValueType,
)
from lorapilot.spec.train import (
    AdapterSpec,
    TrainSpec,
)

__all__ = [
    "SmokeSpec",
    "SPEC_FILENAME",
    "DEFAULT_BASE",
    "IMAGE_BASE",
    "CLEANING_RULES",
    "_NAME_RE",
    "_Strict",
    "AutoOnOff",
    "ValueType",
    "ValueSpec",
    "FieldSpec",
    "IMAGE_AUGMENTS",
    "IMAGE_EXTENSIONS",
    "ImageSpec",
    "TaskSpec",
    "QuantizationSpec",
    "ModelSpec",
    "FieldMap",
    "SplitSpec",
    "DataFiles",
    "HFSplits",
    "HFDataset",
    "SampleSpec",
    "DataSpec",
    "AdapterSpec",
    "TrainSpec",
    "EvalNormalize",
    "EvalSpec",
    "EXPORT_FORMATS",
    "ExportSpec",
    "SuccessSpec",
    "GUARD_RULES",
    "GuardSpec",
    "LimitsSpec",
    "VARIANT_SECTIONS",
    "VariantSpec",
    "SelectionSpec",
    "PilotSpec",
    "format_validation_error",
    "parse_yaml",
    "spec_from_dict",
    "resolve_pilot",
    "MAX_SPEC_BYTES",
    "load_spec_file",
    "PARAM_GROUPS",
    "param_group",
    "parse_sets",
    "apply_values",
    "apply_overrides",
    "resolved_diff",
    "variant_of",
    "variant_label",
    "json_schema",
    "Pilot",
    "load_pilot",
    "require_text",
]
