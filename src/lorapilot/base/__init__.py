"""The base and what is trained on it: resolving, fetching and loading base models offline
(`models`: text, from safetensors or a package's GGUF converted once; `image_models`), the
quantized base (`quantize`: bitsandbytes configs, the base identity an adapter is bound to,
the weight-byte arithmetic), the compute precision resolved per device and the dtype the
frozen base is held in (`precision`), the
adapter put on a base (`adapter`: PEFT LoRA, checkpointing) and the adapter manifest that
binds it to its exact base (`manifest`). Imports the spec, records (the environment a
manifest names) and the root helpers only."""
