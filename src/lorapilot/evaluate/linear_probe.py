"""The image baseline's classifier: multinomial logistic regression on frozen features, fitted
on the training split only, so an adapter is compared with the best a frozen backbone can do
with a head, not with a random head.

Full-batch L-BFGS on standardised features with an L2 penalty: deterministic for a given
input (no minibatch order, no seed in the optimisation), and converged, not "trained for a
few epochs". Pure: arrays in, weights and predictions out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# L2 penalty on the weights (mean cross-entropy + L2 / 2 * |W|^2): features are standardised,
# so one value fits most backbones; it keeps a probe fitted on a few hundred images from
# memorising them.
L2 = 1e-3
MAX_ITER = 500


@dataclass
class LinearProbe:
    mean: np.ndarray  # (d,) feature means on the training split
    scale: np.ndarray  # (d,) feature standard deviations (1 where constant)
    weight: np.ndarray  # (classes, d)
    bias: np.ndarray  # (classes,)
    iterations: int
    train_loss: float

    def logits(self, features: np.ndarray) -> np.ndarray:
        z = (features - self.mean) / self.scale
        return z @ self.weight.T + self.bias

    def predict(self, features: np.ndarray) -> np.ndarray:
        return self.logits(features).argmax(axis=1)


def fit_linear_probe(
    features: np.ndarray, labels: np.ndarray, n_classes: int, l2: float = L2
) -> LinearProbe:
    """Fit on (n, d) float features and (n,) integer labels in [0, n_classes)."""
    import torch

    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    if x.ndim != 2 or len(x) != len(y) or len(y) == 0:
        raise ValueError("features must be (n, d) with one label per row")
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale == 0] = 1.0
    z = torch.from_numpy((x - mean) / scale)
    target = torch.from_numpy(y)
    w = torch.zeros(n_classes, x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(n_classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [w, b], lr=1.0, max_iter=MAX_ITER, tolerance_grad=1e-9, tolerance_change=1e-12,
        line_search_fn="strong_wolfe",
    )  # fmt: skip

    def objective() -> torch.Tensor:
        return torch.nn.functional.cross_entropy(z @ w.T + b, target) + l2 / 2 * (w * w).sum()

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        loss = float(objective())
    state = opt.state[w]
    return LinearProbe(
        mean=mean,
        scale=scale,
        weight=w.detach().numpy(),
        bias=b.detach().numpy(),
        iterations=int(state.get("n_iter", 0)),
        train_loss=loss,
    )
