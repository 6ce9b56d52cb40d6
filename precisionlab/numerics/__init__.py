"""Exact references, double-double, distribution statistics and the one comparison module."""
