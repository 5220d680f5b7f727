"""The serving check under calibrated label scoring: llama.cpp's own content-free scores give
the served model's offsets, and its predictions are the argmax of score + offset."""

from __future__ import annotations

import numpy as np

from lorapilot.data.rows import Record
from lorapilot.export.gguf_export import _compare
from lorapilot.spec import spec_from_dict

SPEC = {
    "name": "t",
    "hypothesis": "calibrated routing",
    "task": {"kind": "classification", "labels": ["first", "second"]},
    "data": {"file": "d.jsonl"},
    "eval": {"label_scoring": "calibrated"},
}


def test_served_predictions_use_the_served_content_free_offsets():
    spec = spec_from_dict(SPEC)
    records = [Record(f"r{i}", "x", "second", None, "d:1", "val", "second") for i in range(2)]
    cases = {
        "records": records,
        "prompt_texts": ["p0", "p1"],
        "lorapilot_predictions": {"r0": {"parsed": "second"}, "r1": {"parsed": "second"}},
        "lorapilot_metrics": {"accuracy": 1.0},
    }
    # "first" wins every plain argmax, but it is what the model says without any input
    scores = [[-1.0, -1.5], [-0.5, -1.2]]
    plain = _compare(spec, cases, {"name": "adapter", "scores": scores})
    assert plain["n_same"] == 0
    free = np.log([[0.9, 0.1], [0.9, 0.1], [0.9, 0.1]]).tolist()
    calibrated = _compare(
        spec, cases, {"name": "adapter", "scores": scores, "content_free_scores": free}
    )
    assert calibrated["n_same"] == 2 and calibrated["serving_agreement"] == 1.0
