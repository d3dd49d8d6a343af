"""PREDICT: reactive vs. predictive post-training for coding agents, end to end."""

__version__ = "0.1.0"
