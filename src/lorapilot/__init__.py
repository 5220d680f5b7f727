"""lorapilot: a LoRA / PEFT fine-tuning pilot that ends in a reproducible result and a decision."""

__version__ = "0.1.0"
