"""Training engines: `loop` (the loop, one screen), `step` (the loss and the one train_step),
`batches`, `audit` (the update audit), `checkpoint`, `distributed` and `fsdp`."""
