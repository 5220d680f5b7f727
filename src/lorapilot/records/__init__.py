"""What a run leaves behind and how it is watched: run records written atomically with their
statuses and signals (`registry`), the machine and library snapshot (`environment`), a step's
record opened with its spec, environment and tracker hook (`steprun`), the mirrors to MLflow
and TensorBoard (`tracking`), the live progress of a long phase (`progress`) and the runs
table (`runs_view`). Imports only the spec and the root helpers: every layer above may
write or read a record."""
