"""Evaluation: predictions (predict), pure metrics (metrics) and pre-registered rules (guards)."""
