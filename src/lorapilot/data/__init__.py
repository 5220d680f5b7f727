"""Data stage: load and validate records, clean texts, split train/val/test."""
