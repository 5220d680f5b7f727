"""The image baseline's linear probe: converged, deterministic, fitted on train only."""

from __future__ import annotations

import numpy as np

from lorapilot.evaluate.linear_probe import fit_linear_probe


def _blobs(n: int, seed: int, spread: float = 1.0):
    rng = np.random.default_rng(seed)
    centres = np.array([[4.0, 0, 0], [0, 4.0, 0], [0, 0, 4.0]])
    y = rng.integers(0, 3, n)
    return centres[y] + spread * rng.standard_normal((n, 3)) + 100.0, y  # offset: standardised


def test_separable_classes_are_learnt_and_held_out_ones_predicted():
    x, y = _blobs(300, 0)
    probe = fit_linear_probe(x, y, 3)
    xv, yv = _blobs(200, 1)
    assert (probe.predict(xv) == yv).mean() > 0.97
    assert probe.iterations > 0 and probe.train_loss < 0.2


def test_it_is_deterministic_and_the_penalty_keeps_weights_finite():
    x, y = _blobs(60, 2, spread=0.01)  # separable: without L2 the weights would diverge
    a, b = fit_linear_probe(x, y, 3), fit_linear_probe(x, y, 3)
    assert np.array_equal(a.weight, b.weight) and np.array_equal(a.bias, b.bias)
    assert np.isfinite(a.weight).all() and np.abs(a.weight).max() < 1e3


def test_a_constant_feature_and_an_unseen_class_do_not_break_it():
    x, y = _blobs(90, 3)
    x = np.hstack([x, np.ones((90, 1))])
    probe = fit_linear_probe(x, y, 4)  # class 3 never seen: it is never predicted
    assert probe.weight.shape == (4, 4) and 3 not in set(probe.predict(x))
