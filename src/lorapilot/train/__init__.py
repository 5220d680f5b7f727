"""Training engines: `loop` (the loop, one screen), `step` (the one train_step, optimizer and
schedule), `loss` (the plain and the shared-prefix loss), `compiled` (`train.compile: on`),
`batches`, `examples` (the TrainingSet the loop trains on), `audit` (the update audit),
`checkpoint`, `meter` (peak memory of a phase or a run, shared with the probe),
`distributed` and `fsdp`. Imports the base, data, records and the spec."""
