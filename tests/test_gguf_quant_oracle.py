"""The GGUF exporter's Q8_0 / Q4_0 bytes against llama.cpp's own C quantizer
(issue 41, bullet 2).

engines/exporters/gguf.py quantizes every 2-D tensor with gguf-py's
`gguf.quants.quantize` (numpy; its comment claims "bit-exact same results as
the reference implementation in ggml-quants.c"). The file is read by
llama.cpp, so the oracle is llama.cpp's C: ggml_quantize_chunk and
dequantize_row_q8_0 / dequantize_row_q4_0 from the libggml-base that
llama-cpp-python ships, called through ctypes. Checked:
- 10^5 random blocks of 32 (block magnitudes log-uniform over 2^-30 .. 2^20,
  so fp16 block scales go subnormal and overflow to inf), with edge blocks
  (all zero, one non-zero, the largest magnitude negative, exact .5 ties of
  x / d): gguf-py's bytes equal the C quantizer's, byte for byte, and the
  dequantized values are equal (gguf-py's dequantize against the C one).
- an exported model: every 2-D tensor's bytes in the Q8_0 / Q4_0 file equal
  the C quantizer run on the model's fp32 weights, and the file holds them
  under the shapes llama.cpp expects.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from helpers import save_char_qwen

gguf = pytest.importorskip("gguf", reason="the GGUF exporter needs the gguf package")
llama_cpp = pytest.importorskip("llama_cpp", reason="llama.cpp's C quantizer comes with llama-cpp-python")

QK = 32
N_BLOCKS = 100_000
# ggml.h's enum ggml_type; gguf-py's GGMLQuantizationType mirrors it
GGML_TYPE = {"q8_0": 8, "q4_0": 2}
BLOCK_BYTES = {"q8_0": 2 + QK, "q4_0": 2 + QK // 2}


@pytest.fixture(scope="module")
def ggml():
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    found = sorted(lib_dir.glob("libggml-base.so*")) + sorted(lib_dir.glob("libggml-base.dylib"))
    if not found:
        pytest.skip(f"no libggml-base in {lib_dir}")
    lib = ctypes.CDLL(str(found[0]))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    for name in ("dequantize_row_q8_0", "dequantize_row_q4_0"):
        getattr(lib, name).restype = None
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


def c_quantize(lib, x: np.ndarray, kind: str) -> np.ndarray:
    """llama.cpp's quantizer on rows of x (float32, rows x n with n % 32 == 0): the raw bytes, rows x bytes."""
    x = np.ascontiguousarray(x, np.float32)
    rows, n = x.shape
    out = np.zeros((rows, n // QK * BLOCK_BYTES[kind]), np.uint8)
    size = lib.ggml_quantize_chunk(GGML_TYPE[kind], x.ctypes.data, out.ctypes.data, 0, rows, n, None)
    assert size == out.nbytes
    return out


def c_dequantize(lib, q: np.ndarray, kind: str) -> np.ndarray:
    q = np.ascontiguousarray(q, np.uint8)
    k = q.size // BLOCK_BYTES[kind] * QK
    y = np.empty(k, np.float32)
    getattr(lib, f"dequantize_row_{kind}")(q.ctypes.data, y.ctypes.data, k)
    return y


def random_blocks(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scale = np.exp2(rng.uniform(-30, 20, (N_BLOCKS, 1)))
    x = (rng.standard_normal((N_BLOCKS, QK)) * scale).astype(np.float32)
    x[0] = 0.0                                  # all zero: d = 0, id = 0
    x[1] = 0.0
    x[1, 7] = -3.0                              # one non-zero, negative
    x[2] = np.linspace(-1, 0.5, QK)             # the largest magnitude is negative (Q4_0's signed max)
    x[3] = np.arange(QK) - 15.5                 # Q8_0 ties: with amax 127, d = 1 and every x / d is k + 0.5
    x[3, 0] = 127.0
    x[4] = np.arange(QK) % 16 - 7.5             # Q4_0: max -8 gives d = 1, and x + 8.5 lands on integers
    x[4, 0] = -8.0
    x[5] = 7e6                                  # amax / 127 overflows fp16: d is inf
    x[6] = 2.0 ** -24                           # d deep in fp16's subnormals, rounds to 0
    return x


@pytest.mark.parametrize("kind", list(GGML_TYPE))
def test_gguf_py_quantizer_is_llama_cpp_byte_for_byte(ggml, kind):
    qtype = getattr(gguf.GGMLQuantizationType, kind.upper())
    assert int(qtype) == GGML_TYPE[kind]
    x = random_blocks(seed=GGML_TYPE[kind])
    with np.errstate(over="ignore", invalid="ignore"):  # the inf-scale block
        ours = np.asarray(gguf.quants.quantize(x, qtype))
        y_ours = np.asarray(gguf.quants.dequantize(ours, qtype), np.float32).ravel()
    theirs = c_quantize(ggml, x, kind)
    assert ours.shape == theirs.shape == (N_BLOCKS, BLOCK_BYTES[kind])
    bad = np.flatnonzero((ours != theirs).any(axis=1))
    assert bad.size == 0, f"{bad.size} of {N_BLOCKS} blocks differ, first {bad[:5].tolist()}: {x[bad[0]]!r}"
    y_theirs = c_dequantize(ggml, theirs, kind)
    both_nan = np.isnan(y_ours) & np.isnan(y_theirs)  # the inf-scale block: 0 * inf
    assert np.array_equal(y_ours[~both_nan], y_theirs[~both_nan])
    assert np.array_equal(np.isnan(y_ours), np.isnan(y_theirs))
    # the tie rows are what their comments say (the comparison above would pass if both were wrong alike)
    if kind == "q8_0":
        assert y_theirs[3 * QK:4 * QK].tolist() == [127.0] + [float(np.copysign(np.floor(abs(v) + 0.5), v))
                                                          for v in x[3, 1:]]
    else:
        assert np.array_equal(y_theirs[4 * QK:5 * QK], np.minimum(np.trunc(x[4] + 8.5), 15) - 8)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A random Qwen3 128 wide (2 layers, MLP 256) with the embedded model's character tokenizer, exported
    as F32, Q8_0 and Q4_0 by the exporter."""
    pytest.importorskip("transformers")
    from precisionlab.engines.exporters import gguf as exporter

    d = tmp_path_factory.mktemp("gguf-oracle")
    save_char_qwen(d / "src", hidden=128, positions=64, seed=1)
    paths = {}
    for v in ("f32", *GGML_TYPE):
        paths[v] = d / f"m-{v}.gguf"
        exporter.write(str(d / "src"), str(paths[v]), v)
    return paths


@pytest.mark.parametrize("kind", list(GGML_TYPE))
def test_exported_bytes_are_llama_cpp_quantizer_bytes(ggml, exported, kind):
    weights = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(exported["f32"]).tensors}
    qtype = getattr(gguf.GGMLQuantizationType, kind.upper())
    blocks, checked = 0, set()
    for t in gguf.GGUFReader(exported[kind]).tensors:
        w = weights[t.name]
        if w.ndim == 1:  # the norm gains stay F32
            assert t.tensor_type == gguf.GGMLQuantizationType.F32
            continue
        assert t.tensor_type == qtype, t.name
        # llama.cpp's shape order: ne[0] is the row length
        assert [int(n) for n in t.shape] == [w.shape[1], w.shape[0]], t.name
        want = c_quantize(ggml, w.astype(np.float32), kind)
        got = np.asarray(t.data).reshape(want.shape)
        assert np.array_equal(got, want), t.name
        blocks += w.size // QK
        checked.add(t.name)
    assert checked == {n for n, w in weights.items() if w.ndim == 2}  # every matrix, the head's too
    assert blocks > 9_000  # this model: 9,528 blocks of 32
