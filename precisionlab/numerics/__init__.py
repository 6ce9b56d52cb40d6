"""Exact references, double-double, distribution statistics, the one comparison module, the divergence rules (divergence.py)
and the paired statistics of two builds (paired.py: block bootstrap, McNemar, Newcombe)."""
