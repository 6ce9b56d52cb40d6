"""numerics/distribution.position_stats works a block of rows at a time
(issue 39: compare engine's statistics at a real vocabulary cost 2.6x the
engine's own work, waiting on memory over whole-matrix temporaries): the
blocks must give the same bits as one pass over the whole matrix, the
non-finite rows and entries included."""

from __future__ import annotations

import numpy as np
import pytest

from precisionlab.numerics import distribution


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_blocks_give_the_whole_matrix_bits(monkeypatch, workers):
    rng = np.random.default_rng(5)
    n, vocab = 37, 1000
    ref = rng.standard_normal((n, vocab)) * 4
    low = ref + rng.standard_normal((n, vocab)) * 1e-3
    ref[3, :10] = low[3, :10] = -np.inf   # masked entries on both sides
    low[5, 7] = np.nan                    # an invalid row
    low[8, 2] = -np.inf                   # mass in P, none in Q
    low[11] = ref[11]                     # an equal row: KL exactly 0
    targets = rng.integers(0, vocab, n)
    whole = distribution._block_stats(ref, low, targets)
    monkeypatch.setattr(distribution, "BLOCK_ENTRIES", 3 * vocab)  # blocks of 3 rows, the last one short
    blocked = distribution.position_stats(ref, low, targets, workers)  # blocks on threads: the same bits
    for name in distribution.PositionStats.__dataclass_fields__:
        a, b = getattr(whole, name), getattr(blocked, name)
        assert a.shape == b.shape == (n,), name
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), name  # the same bits, NaN payloads too
    assert blocked.kl[11] == 0.0 and np.isnan(blocked.kl[5]) and blocked.kl[8] == np.inf
