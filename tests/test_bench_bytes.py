"""The CPU bench's GB/s counts the bytes each kernel actually reads: the
library's CPU sums take float64 (8 bytes a value), numpy.sum the float32 array."""

import numpy as np
import pytest

from precisionlab import native
from precisionlab.experiments import bench


def test_cpu_gbps_counts_the_bytes_read():
    n = 4096
    rows = bench.accumulate_cpu(n, 0, lambda k=1: None)
    # what the kernels read is what native hands them: float64, however x is stored
    assert native._as_f64(np.zeros(n, dtype=np.float32)).dtype == np.float64
    for r in rows:
        per_value = 4 if r["variant"] == "numpy.sum" else 8
        assert r["bytes_read"] == per_value * n, r
        assert r["gbps"] == pytest.approx(per_value * n / r["time_s"] / 1e9, rel=1e-12), r
