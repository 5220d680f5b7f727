"""`live_tensor_peak`: the live bytes of CPU tensors inside a block, from the profiler's memory
events; with a module, one profiling window per call (bounded memory on a long generation),
and the windows together count what one window would."""

from __future__ import annotations

import pytest
import torch

from lorapilot.train.meter import live_tensor_peak

MIB = 1 << 20


class Churn(torch.nn.Module):
    """Each call frees what the call before kept and keeps a new MiB: across calls, an
    allocation in one window is freed in the next."""

    def __init__(self):
        super().__init__()
        self.kept: list[torch.Tensor] = []

    def forward(self, n: int) -> None:
        self.kept.clear()
        self.kept.extend(torch.empty(MIB, dtype=torch.uint8) for _ in range(n))


@pytest.mark.parametrize("windowed", [False, True])
def test_the_live_peak_is_exact_and_windows_lose_no_event(windowed):
    churn = Churn()
    with live_tensor_peak(churn if windowed else None) as seen:
        for n in (1, 3, 2, 2, 1):  # at most 3 MiB live at once
            churn(n)
        churn.kept.clear()
        extra = torch.empty(2 * MIB, dtype=torch.uint8)  # after the last window closed
        del extra
    assert seen["peak_bytes"] == 3 * MIB  # a free lost between windows would add up
    assert seen["windows"] == (6 if windowed else 1)  # a window per call, and the last one
    assert not churn._forward_hooks  # the window hook is gone after the block


def test_tensors_live_before_the_block_are_not_counted():
    before = torch.empty(4 * MIB, dtype=torch.uint8)
    churn = Churn()
    with live_tensor_peak(churn) as seen:
        churn(1)
    assert seen["peak_bytes"] == MIB and before.numel() == 4 * MIB
