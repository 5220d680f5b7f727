"""Sizing a run before and while paying for it: the analytic memory model (`memory`, pure),
what the probe measures and the model's figure beside each measurement (`probe_plan`, pure),
one training-step configuration timed on this machine (`measure`, through the training
loop's own `train_step`), the time and cost arithmetic with 3/7/30-day rental plans
(`budget`, pure), and the figures `budget` gathers from the run records (`estimate`, the one
module here that several steps share, so it sits a layer above the others and may reach
the modality seam). The peak-memory meter is `train.meter`: the loop and the probe share it."""
