"""precisionlab: a command-line lab for numerical precision."""

__version__ = "0.1.0"
