"""A step's run record: registry.open_run with the spec, the environment and the trackers
filled in. Used by every computing step (and by the evaluation session they share)."""

from __future__ import annotations

from typing import Any

from lorapilot.records import environment, registry, tracking
from lorapilot.spec import Pilot, require_text


def snapshot(pilot: Pilot) -> dict:
    """The environment of a step of this pilot, after its `train.threads` is applied."""
    environment.apply_threads(pilot.spec.train.threads)
    return environment.snapshot()


def record_kwargs(pilot: Pilot, env: dict | None = None) -> dict[str, Any]:
    """The spec hash, the resolved spec, the environment snapshot (`env` when the step took
    it already), and the close hook that mirrors the closed record to the spec's trackers."""
    return {
        "spec_hash": pilot.spec.spec_hash(),
        "config": pilot.spec.model_dump(mode="json"),
        "environment": env if env is not None else snapshot(pilot),
        "on_close": tracking.mirror_on_close,
    }


# run kinds built for images
IMAGE_READY = ("data", "baseline", "smoke", "probe", "eval", "verify", "predict")


def open_run(pilot: Pilot, kind: str, *, env: dict | None = None, **kwargs: Any):
    """registry.open_run for a step of this pilot (see record_kwargs)."""
    if kind not in IMAGE_READY:
        require_text(pilot, f"`{kind}`")
    return registry.open_run(pilot.dir, kind, **record_kwargs(pilot, env), **kwargs)
