"""Decoding and transforming a training batch of images, on one thread and on the threads
`ImageExamples.pixels` uses (`decode_workers()`: the cores, at most 8):

    .venv/bin/python bench/image_decode.py [--pilot PILOT] [--batches 20] [--json]

The batches are the pilot's training images in order, `train.micro_batch` at a time, with
the spec's transforms and augments (torch seeded the same for both runs). Per thread count:
the median wall time of a batch and images/s; and whether the two runs gave the same tensors
(they must: each image's augments come from its own generator). On a GPU the model's step
takes milliseconds, so a batch decoded on one thread sets the pace.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pilot", type=Path, default=HERE.parent / "examples" / "clothing-photos")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from lorapilot.modality import image_examples, modality_of
    from lorapilot.modality.image_examples import ImageExamples
    from lorapilot.spec import load_pilot

    pilot = load_pilot(args.pilot)
    modality = modality_of(pilot)
    records = modality.prepare().splits["train"]
    spec = pilot.spec
    assert spec.task.image is not None
    ex = ImageExamples(pilot.dir, records, modality.pipeline, spec.task.labels or [],
                       spec.task.image.max_pixels, augment=True)  # fmt: skip
    mb = spec.train.micro_batch
    batches = [list(range(i, min(i + mb, len(ex)))) for i in range(0, len(ex), mb)]
    batches = batches[: args.batches]
    n_images = sum(len(b) for b in batches)
    out: dict = {"pilot": str(args.pilot), "micro_batch": mb, "images": n_images, "runs": {}}
    tensors = {}
    for workers in sorted({1, image_examples.decode_workers()}):
        image_examples.decode_workers = lambda w=workers: w  # type: ignore[assignment]
        image_examples._POOL = None
        torch.manual_seed(0)
        times, got = [], []
        for b in batches:
            t = time.perf_counter()
            got.append(ex.pixels(b))
            times.append(time.perf_counter() - t)
        tensors[workers] = got
        med = statistics.median(times)
        out["runs"][workers] = {
            "batch_ms_median": round(med * 1000, 1),
            "images_per_s": round(n_images / sum(times), 1),
        }
    first, *rest = tensors.values()
    out["same_tensors"] = all(
        all(torch.equal(a, b) for a, b in zip(first, other, strict=True)) for other in rest
    )
    if args.json:
        print(json.dumps(out))
    else:
        for w, r in out["runs"].items():
            print(f"{w} thread(s): {r['batch_ms_median']} ms a batch of {mb}, "
                  f"{r['images_per_s']} images/s")  # fmt: skip
        print(f"same tensors: {out['same_tensors']}")


if __name__ == "__main__":
    main()
