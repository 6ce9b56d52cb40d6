"""The catalog: every format (with its named subsets and its numpy/ml_dtypes/torch twins), declared once from the library's table."""
