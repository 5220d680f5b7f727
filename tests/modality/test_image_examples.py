"""Images as a training set: a batch decoded on threads is the batch decoded in order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from image_helpers import image_pilot

from lorapilot.data.dataset import load_all
from lorapilot.modality import image_examples
from lorapilot.modality.image_examples import ImageExamples, decode_workers
from lorapilot.modality.image_transforms import resolve_pipeline
from lorapilot.spec import ImageSpec, load_pilot


@pytest.fixture
def examples(tmp_path):
    pilot = load_pilot(image_pilot(tmp_path, per_label=4))
    records, _ = load_all(pilot)
    pipe = resolve_pipeline(ImageSpec(size=16, resize="stretch", crop="none", normalize="none",
                                      augment=["hflip", "vflip"]), None)  # fmt: skip
    labels = sorted({r.label for r in records})
    return ImageExamples(pilot.dir, records, pipe, labels, 10**7, augment=True)


def _batch(ex: ImageExamples, workers: int, monkeypatch) -> torch.Tensor:
    monkeypatch.setattr(image_examples, "decode_workers", lambda: workers)
    monkeypatch.setattr(image_examples, "_POOL", None)
    torch.manual_seed(3)
    return ex.pixels(list(range(len(ex))))


def test_threads_do_not_change_the_batch_or_its_augments(examples, monkeypatch):
    one = _batch(examples, 1, monkeypatch)
    four = _batch(examples, 4, monkeypatch)
    assert torch.equal(one, four)
    # the augments were drawn: some images flipped, others not, per image
    plain = resolve_pipeline(ImageSpec(size=16, resize="stretch", crop="none",
                                       normalize="none"), None)  # fmt: skip
    from lorapilot.data.images import load_record_image

    unflipped = [plain(load_record_image(examples.pilot_dir, r, 10**7)) for r in examples.records]
    same = [np.array_equal(one[i].numpy(), unflipped[i]) for i in range(len(unflipped))]
    assert any(same) and not all(same)
    torch.manual_seed(4)
    assert not torch.equal(one, examples.pixels(list(range(len(examples)))))


def test_decode_workers_share_the_cores_between_local_ranks(monkeypatch):
    monkeypatch.setattr(image_examples.os, "sched_getaffinity", lambda _: set(range(16)))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert decode_workers() == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert decode_workers() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert decode_workers() == 1
