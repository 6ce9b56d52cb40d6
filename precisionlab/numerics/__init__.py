"""Exact references, double-double, distribution statistics, the one comparison module and the divergence rules (divergence.py)."""
