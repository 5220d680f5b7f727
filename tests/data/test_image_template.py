"""data.fields.image_template: a table that names each image by an id (`images.csv` beside
`images/<uuid>.jpg`) read as paths, without rewriting the table."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from lorapilot.data.load import load_records
from lorapilot.spec import DataSpec, FieldMap, TaskSpec

PHOTOS = TaskSpec(kind="image_classification", labels=["cat", "dog"])


def test_ids_become_paths_and_a_hole_in_the_path_is_an_invalid_row(tmp_path):
    path = tmp_path / "images.csv"
    path.write_text("image,label\nab12,cat\n,dog\n7,dog\n")
    data = DataSpec(file="images.csv", fields=FieldMap(image_template="images/{image}.jpg",
                                                       id=None), on_error="skip")  # fmt: skip
    records, skipped = load_records(path, PHOTOS, data)
    assert [(r.text, r.label) for r in records] == [("images/ab12.jpg", "cat"),
                                                    ("images/7.jpg", "dog")]  # fmt: skip
    assert [s.problem for s in skipped] == [
        "every column of data.fields.image_template is empty: image"
    ]
    two = DataSpec(file="x.csv", on_error="skip",
                   fields=FieldMap(image_template="{folder}/{image}.png", id=None))  # fmt: skip
    path.write_text("image,folder,label\nab,,cat\n")
    _, skipped = load_records(path, PHOTOS, two)
    assert skipped[0].problem == "field 'folder' (data.fields.image_template) is empty"


def test_image_template_is_for_image_pilots_and_in_place_of_image():
    with pytest.raises(ValidationError, match="set image .* or image_template"):
        FieldMap(image="path", image_template="images/{id}.jpg")
    from lorapilot.spec import PilotSpec

    spec = {"name": "t", "hypothesis": "h", "model": {"base": "x"},
            "task": {"kind": "classification", "labels": ["a", "b"]},
            "data": {"file": "d.csv", "fields": {"image_template": "i/{id}.jpg"}}}  # fmt: skip
    with pytest.raises(ValidationError, match="image_template builds an image's path; a text"):
        PilotSpec.model_validate(spec)
