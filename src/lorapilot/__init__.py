"""lorapilot: a LoRA / PEFT fine-tuning pilot that ends in a reproducible result and a decision."""

import logging as _logging

__version__ = "0.1.0"

# bitsandbytes, imported by peft in every verb, warns on AVX512-BF16 CPUs that it could not
# fetch an inference kernel from the Hugging Face hub. lorapilot never fetches at run time and
# keeps that kernel off (quantize.keep_one_cpu_path), so the line is noise on every command.
_logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(_logging.ERROR)
