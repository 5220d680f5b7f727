"""Exports for serving: the folder writer every export uses, the GGUF files for llama.cpp and
Ollama (`gguf_files`, pure array and metadata work with the `gguf` package), the Modelfile and
README texts (`ollama`), the fresh llama.cpp process of the serving check (`serving`, which
imports no torch) and the GGUF export that ties them to a pilot (`gguf_export`, which may
import data, evaluate and base beneath it, never a step)."""
