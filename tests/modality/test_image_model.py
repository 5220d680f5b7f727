"""The image classifier wrapper: norm statistics frozen in training, the head found by name,
LoRA targets for `all-linear`."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from lorapilot.errors import UsageError
from lorapilot.modality.image_model import ImageClassifier, find_head, lora_targets


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)
        self.proj, self.classifier = nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x):
        return self.classifier(self.proj(self.bn(self.conv(x)).mean(dim=(2, 3))))


def test_train_mode_keeps_batchnorm_statistics_frozen():
    model = ImageClassifier(_Net(), "classifier", "transformers").train()
    assert model.training and model.net.proj.training and not model.net.bn.training
    before = model.net.bn.running_mean.clone(), model.net.bn.num_batches_tracked.clone()
    model(torch.randn(4, 3, 5, 5) * 10 + 3)
    assert torch.equal(model.net.bn.running_mean, before[0])
    assert torch.equal(model.net.bn.num_batches_tracked, before[1])


def test_the_head_is_found_by_name_and_excluded_from_all_linear():
    net = _Net()
    assert find_head(net, 3) == "classifier"
    with pytest.raises(UsageError, match="no classification head"):
        find_head(net, 7)
    model = ImageClassifier(net, "classifier", "transformers")
    assert lora_targets(model, "all-linear") == ["proj"]
    assert lora_targets(model, ["conv"]) == ["conv"]
