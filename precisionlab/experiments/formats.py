"""formats: the block-scaled formats (MXFP8, MXFP6, MXFP4, NVFP4) under each
scale rule and block size, on normal, heavy-tailed (Student-t) and
outlier-injected data (one element per block scaled 10x, 30x, 100x), beside
bf16 and per-tensor-scaled fp8.

For each configuration and distribution (fp32 inputs, float64 references):
  rel_l2        numerics.compare.rel_l2(y, x): ||y - x|| / ||x|| exactly (the relative RMSE), y the
                dequantized values;
  clip_share    the share of blocks whose largest element clips: its scaled
                magnitude exceeds the element format's max, so it comes back
                as +-max * scale, smaller than it went in;
  flush_share   the share of non-zero elements that come back as zero;
  matmul_rel_l2 relative Frobenius error of C = A @ B, both operands
                block-scaled along K (A's rows, B's columns), dequantized and
                multiplied with fp32 accumulation (the library's CPU matmul),
                against float64 A @ B of the unquantized fp32 operands;
                with --accumulator MODEL[,MODEL...] the product is each
                numerics.accumulators model's instead (exact, fp32,
                fp32-pairwise, hopper-fp8, promote:N: the dequantized values
                are fp32 values, their products exact), one row per model,
                carrying `accumulator` (None: the library's fp32 matmul);
  accumulation_rel_l2  (with --accumulator) the model's C against float64
                A_hat @ B_hat of the same dequantized operands: the
                accumulator's own error, apart from the quantization's.
The quantization runs in the library (cuda/blockscale.cu) on the chosen
device; with --device all the GPU's bits must equal the host reference's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from precisionlab import native
from precisionlab.runtime import devices
from precisionlab.catalog import formats
from precisionlab.io import inputs
from precisionlab.numerics import accumulators, compare as comparison
from precisionlab.errors import RunError, UsageError

DISTRIBUTIONS = ("normal", "student_t", "outlier_10x", "outlier_30x", "outlier_100x")
STUDENT_DF = 3  # heavy tails with a finite variance
BASELINES = ("bf16", *formats.FP8)  # fp8 with one per-tensor scale, amax / max
MAX_BLOCK = 1024  # the library's limit


@dataclass
class FormatsConfig:
    formats: str | None = None  # block formats, comma list; None: all
    rules: str | None = None    # scale rules; None: every rule a format takes
    blocks: str | None = None   # block sizes; None: 16,32
    dists: str | None = None
    n: int = 65536              # elements per distribution for the element statistics
    shape: str = "64x1024x64"   # the matmul, MxKxN
    baselines: bool = True
    device: str = "auto"
    seed: int = 0
    accumulators: str | None = None  # MODEL[,MODEL...] for the matmul (numerics.accumulators); None: fp32 BLAS-like
    acc_bits: int | None = None      # --acc-bits, --acc-rounding: accumulators.parse_option
    acc_rounding: str | None = None


@dataclass
class FormatsResult:
    params: dict
    devices: dict
    rows: list[dict]
    takeaways: list[str]


def _parse_blocks(text: str | None) -> list[int]:
    if text is None:  # left out; "" is an empty list, refused below like --formats ""
        return [16, 32]
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            (b,) = inputs.integers(part, ",", "--blocks")
        except ValueError:
            raise UsageError(f"--blocks takes integers, comma-separated (got {part!r})") from None
        if not 1 <= b <= MAX_BLOCK:
            raise UsageError(f"block sizes must be in [1, {MAX_BLOCK}] (got {b})")
        if b not in out:
            out.append(b)
    if not out:
        raise UsageError("empty --blocks")
    return out


def _parse_shape(text: str) -> tuple[int, int, int]:
    try:
        dims = tuple(inputs.integers(text.lower().replace(",", "x"), "x", "--shape"))
    except ValueError:
        raise UsageError(f"--shape must look like 64x1024x64 (MxKxN), got {text!r}") from None
    if len(dims) != 3 or any(d <= 0 for d in dims):
        raise UsageError(f"--shape needs three positive sizes MxKxN, got {text!r}")
    return dims


def _data(dist: str, rows: int, cols: int, block: int, rng: np.random.Generator) -> np.ndarray:
    """rows x cols fp32 values; blocks run along a row. Outliers: one random
    element of every block (a partial last block included) scaled k times."""
    if dist == "student_t":
        return rng.standard_t(STUDENT_DF, (rows, cols)).astype(np.float32)
    x = rng.standard_normal((rows, cols))
    if dist.startswith("outlier_"):
        k = float(dist.removeprefix("outlier_").removesuffix("x"))
        starts = np.arange(0, cols, block)
        lens = np.minimum(block, cols - starts)
        for r in range(rows):
            x[r, starts + rng.integers(0, lens)] *= k
    return x.astype(np.float32)


class _Quantizer:
    """Block-scaled round trips on the chosen devices; with two devices the
    GPU's bits are checked against the host reference's."""

    def __init__(self, device_names: list[str]):
        self.devices = device_names

    def roundtrip(self, x: np.ndarray, fmt: str, rule: str, block: int) -> tuple[np.ndarray, np.ndarray]:
        """x: rows x cols fp32, blocks along each row. (dequantized fp32, codes)."""
        rows, cols = x.shape
        results = [self._one(x, fmt, rule, block, d) for d in self.devices]
        y, codes = results[0]
        for (y2, c2), d in zip(results[1:], self.devices[1:], strict=True):
            if not (np.array_equal(c2, codes) and np.array_equal(y2.view(np.uint32), y.view(np.uint32))):
                raise RunError(f"{fmt}/{rule}/block {block}: the {d} kernels disagree with the host reference")
        return y.reshape(rows, cols), codes.reshape(rows, cols)

    @staticmethod
    def _one(x, fmt, rule, block, device):
        rows, cols = x.shape
        # Blocks must not straddle rows: whole rows at once when they are a
        # whole number of blocks, row by row otherwise. NVFP4's per-tensor
        # scale is the whole operand's either way.
        amax = float(np.max(np.abs(x)))
        pieces = [x.ravel()] if cols % block == 0 else list(x)
        ys, cs = [], []
        for p in pieces:
            if device == "cpu":
                q = native.blockscale_quantize_cpu(p, fmt, rule, block, tensor_amax=amax)
                ys.append(native.blockscale_dequantize_cpu(q))
                cs.append(q.codes)
            else:
                n = p.size
                dx = native.DeviceArray.from_numpy(np.ascontiguousarray(p))
                dc, ds = native.DeviceArray((n,), np.uint8), native.DeviceArray((-(-n // block),), np.uint8)
                dy = native.DeviceArray((n,), np.float32)
                ts = native.blockscale_quantize_cuda(dx.ptr, n, fmt, rule, dc.ptr, ds.ptr, block=block,
                                                     tensor_amax=amax)
                native.blockscale_dequantize_cuda(dc.ptr, ds.ptr, ts, n, fmt, dy.ptr, block=block)
                ys.append(dy.numpy())
                cs.append(dc.numpy())
        return np.concatenate(ys), np.concatenate(cs)


def _flush_share(y: np.ndarray, x: np.ndarray) -> float:
    nz = x != 0
    return float(np.count_nonzero((y == 0) & nz)) / max(int(np.count_nonzero(nz)), 1)


def _clip_share(y: np.ndarray, x: np.ndarray, codes: np.ndarray, block: int, elem: native.Minifloat) -> float:
    """Blocks (along rows, the last of a row possibly partial) whose largest
    element came back at the element format's largest code, smaller than it went
    in. For MX that is exactly |x| / X > max_elem."""
    rows, cols = x.shape
    nb = -(-cols // block)
    pad = nb * block - cols
    ax = np.pad(np.abs(x.astype(np.float64)), ((0, 0), (0, pad))).reshape(rows * nb, block)
    ay = np.pad(np.abs(y.astype(np.float64)), ((0, 0), (0, pad))).reshape(rows * nb, block)
    ac = np.pad(codes, ((0, 0), (0, pad))).reshape(rows * nb, block) & np.uint8((1 << (elem.bits - 1)) - 1)
    i = np.argmax(ax, axis=1)
    top = np.arange(rows * nb)
    max_code = int(np.array([elem.max], np.float32).astype(formats.get(elem.name).dtype).view(np.uint8)[0])
    clipped = (ac[top, i] == max_code) & (ay[top, i] < ax[top, i])
    return float(np.count_nonzero(clipped)) / (rows * nb)


def _matmul_error(a_hat: np.ndarray, b_hat: np.ndarray, ref: np.ndarray) -> float:
    c = native.matmul_cpu(np.ascontiguousarray(a_hat, np.float32), np.ascontiguousarray(b_hat, np.float32),
                         formats.get("fp32").code)
    return comparison.rel_l2(c, ref)


NO_MODEL = dict.fromkeys(accumulators.Accumulator("fp32").fields())  # the library's matmul: every field null


def _matmul_fields(a_hat: np.ndarray, b_hat: np.ndarray, ref: np.ndarray, model, backend: str) -> dict:
    """The row's matmul fields: the library's fp32 matmul (model None), or the
    accumulator model's (the dequantized values are fp32 values: dtype fp32),
    with its error against the float64 product of the same dequantized
    operands too: what the accumulator alone costs."""
    if model is None:
        return {**NO_MODEL, "matmul_rel_l2": _matmul_error(a_hat, b_hat, ref), "accumulation_rel_l2": None}
    c = model.matmul(a_hat, b_hat, backend=backend, dtype="fp32")
    own = np.asarray(a_hat, np.float64) @ np.asarray(b_hat, np.float64)
    return {**model.fields(), "matmul_rel_l2": comparison.rel_l2(c, ref),
            "accumulation_rel_l2": comparison.rel_l2(c, own)}


def parse_accumulators(text: str | None, bits: int | None = None,
                       rounding: str | None = None) -> list[accumulators.Accumulator | None]:
    """--accumulator's models (every command's parser), or [None]: the library's fp32 matmul."""
    if text is None:
        if bits is not None or rounding is not None:
            raise UsageError("--acc-bits and --acc-rounding go with --accumulator")
        return [None]
    return list(accumulators.parse_option(text, bits, rounding))


def _per_tensor(x: np.ndarray, name: str) -> np.ndarray:
    """bf16: a plain rounding. fp8: one scale for the tensor, amax / max, in
    float64; x / s rounded to fp8 (never past max), times s."""
    f = formats.get(name)
    x64 = x.astype(np.float64)
    if name == "bf16":
        return f.round(x64).astype(np.float32)
    amax = float(np.max(np.abs(x64)))
    s = amax / f.max if amax > 0 else 1.0
    return (f.round(x64 / s) * s).astype(np.float32)


def run(cfg: FormatsConfig, advance=lambda k=1: None) -> FormatsResult:
    catalog = native.block_formats()
    fmts = inputs.parse_choices(cfg.formats, tuple(catalog), "block format")
    all_rules = tuple(native.scale_rules())
    rules = inputs.parse_choices(cfg.rules, all_rules, "scale rule")
    blocks = _parse_blocks(cfg.blocks)
    dists = inputs.parse_choices(cfg.dists, DISTRIBUTIONS, "distribution")
    inputs.check_n(cfg.n, 1, "--n")
    if cfg.seed < 0:
        raise UsageError(f"--seed must be >= 0 (got {cfg.seed})")
    m, k, n = _parse_shape(cfg.shape)
    models = parse_accumulators(cfg.accumulators, cfg.acc_bits, cfg.acc_rounding)
    backend = accumulators.default_backend() if models != [None] else "numpy"
    model_peak = max((a.peak_bytes(m, n, k) for a in models if a is not None and backend == "numpy"), default=0)
    # the largest live set: one distribution's vector and matmul operands, float64 copies, dequantized values,
    # and an accumulator model's arrays
    inputs.check_memory((cfg.n + m * k + k * n) * 8 * 6 + m * n * 8 * 3 + model_peak, "formats")
    plan = devices.resolve(cfg.device)
    q = _Quantizer(plan.names)

    def takes(fmt: str, rule: str) -> bool:  # NVFP4's scale is e4m3, rounded to nearest; MX's e8m0, by a rule
        return (rule == "nearest") == (catalog[fmt].scale.name != "e8m0")

    combos = [(f, r) for f in fmts for r in rules if takes(f, r)]
    if not combos:
        raise UsageError("no format takes the scale rules asked for (nvfp4 takes nearest; MX formats floor, rceil, "
                         "ceil, even)")
    rows: list[dict] = []
    for di, dist in enumerate(dists):
        for block in blocks:
            rng = np.random.default_rng([cfg.seed, di, block])
            vec = _data(dist, 1, cfg.n, block, rng)
            a = _data(dist, m, k, block, rng)
            bt = _data(dist, n, k, block, rng)  # B's columns, blocks along K
            ref = a.astype(np.float64) @ bt.astype(np.float64).T
            for fmt, rule in combos:
                f = catalog[fmt]
                y, codes = q.roundtrip(vec, fmt, rule, block)
                a_hat, _ = q.roundtrip(a, fmt, rule, block)
                bt_hat, _ = q.roundtrip(bt, fmt, rule, block)
                stats = {
                    "format": fmt, "element": f.element.name, "scale": f.scale.name, "rule": rule, "block": block,
                    "dist": dist, "bits_per_element": f.element.bits + f.scale.bits / block,
                    "rel_l2": comparison.rel_l2(y, vec), "clip_share": _clip_share(y, vec, codes, block, f.element),
                    "flush_share": _flush_share(y, vec),
                }
                for model in models:
                    rows.append(stats | _matmul_fields(a_hat, bt_hat.T, ref, model, backend))
                advance()
            if cfg.baselines and block == blocks[0]:  # no blocks: once per distribution
                for name in BASELINES:
                    y = _per_tensor(vec, name)
                    stats = {
                        "format": name if name == "bf16" else f"{name} per-tensor", "element": name,
                        "scale": None if name == "bf16" else "fp64 per-tensor", "rule": None, "block": None,
                        "dist": dist, "bits_per_element": float(formats.get(name).bits),
                        "rel_l2": comparison.rel_l2(y, vec), "clip_share": None, "flush_share": _flush_share(y, vec),
                    }
                    a_t, bt_t = _per_tensor(a, name), _per_tensor(bt, name)
                    for model in models:
                        rows.append(stats | _matmul_fields(a_t, bt_t.T, ref, model, backend))
                    advance()
    return FormatsResult(
        params={"formats": fmts, "rules": rules, "blocks": blocks, "dists": dists, "n": cfg.n,
                "shape": [m, k, n], "student_df": STUDENT_DF, "device": cfg.device, "seed": cfg.seed,
                "accumulators": [a.name for a in models if a is not None] or None},
        devices=plan.describe(), rows=rows, takeaways=takeaways(rows))


def _find(rows, **want) -> dict | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in want.items())), None)


def takeaways(rows: list[dict]) -> list[str]:
    out = []
    for fmt in ("mxfp4", "mxfp8_e4m3"):
        fl, rc = _find(rows, format=fmt, rule="floor", block=32, dist="normal"), \
            _find(rows, format=fmt, rule="rceil", block=32, dist="normal")
        if fl and rc:
            out.append(f"{fmt}, Gaussian blocks of 32: FLOOR clips the largest element in {fl['clip_share']:.1%} of "
                       f"blocks, RCEIL in {rc['clip_share']:.1%} (matmul error {fl['matmul_rel_l2']:.3g} vs "
                       f"{rc['matmul_rel_l2']:.3g}).")
    for fmt in ("mxfp4", "nvfp4"):
        o = [r for r in rows if r["format"] == fmt and r["dist"] == "outlier_100x" and r["rule"] in ("rceil", "nearest")]
        g = [r for r in rows if r["format"] == fmt and r["dist"] == "normal" and r["rule"] in ("rceil", "nearest")]
        if o and g:
            o0 = max(o, key=lambda r: r["block"])
            g0 = _find(g, block=o0["block"]) or g[0]
            out.append(f"{fmt}, one 100x outlier per block of {o0['block']}: {o0['flush_share']:.1%} of elements flush "
                       f"to zero (Gaussian: {g0['flush_share']:.1%}); relative RMSE {o0['rel_l2']:.3g} "
                       f"(Gaussian {g0['rel_l2']:.3g}).")
    bf = _find(rows, format="bf16", dist="normal")
    fp8 = _find(rows, format="fp8_e4m3 per-tensor", dist="normal")
    mx8 = _find(rows, format="mxfp8_e4m3", rule="rceil", block=32, dist="normal")
    if bf and fp8 and mx8:
        out.append(f"Gaussian matmul error: bf16 {bf['matmul_rel_l2']:.3g}, fp8 e4m3 per-tensor "
                   f"{fp8['matmul_rel_l2']:.3g}, MXFP8 e4m3 (RCEIL, 32) {mx8['matmul_rel_l2']:.3g}.")
    return out
