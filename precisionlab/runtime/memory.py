"""Each command's peak memory, estimated before anything large is allocated.

Every estimate is the bytes the run adds at its peak, past the interpreter,
numpy, the library and torch already loaded: the arrays alive at the worst
moment, counted per element from the code that allocates them, plus a fixed
term for work whose size does not follow the options. tests/test_memory.py
measures the real peak (resident set growth) at three sizes per command and
holds each estimate within 1.5x of it; change the allocations, change the
estimate.

The commands call inputs.check_memory with these numbers, which refuses
(exit 2) when the estimate exceeds what the process may still allocate.
accumulate keeps its own estimate (experiments/accumulate.py).
"""

from __future__ import annotations

import math

from precisionlab.catalog import formats

MiB = 1 << 20

# metrics.error_report at its peak, per compared element: float64 diff, the
# masks (finite, both, outside), |reference|, the compared subset, and inside
# the ulp computation its |x|, frexp's mantissa and exponent, the spacing and
# the ulps, then median's partition copy: about seven float64 arrays.
ERROR_REPORT = 56

# BLAS work buffers and the like, allocated on first use.
BLAS_FIXED = 16 * MiB


def exact_sum(n: int) -> int:
    """math.fsum fed 2^20 Python floats at a time (metrics.exact_sum): 24-byte
    float objects and 8-byte list slots."""
    return min(n, 1 << 20) * 40


# metrics.error_report against a double-double reference (reference_lo), per
# compared element: the reference's low half, the three finite masks, the
# ulps (for their median) and median's partition copy of them; the rest is
# done a chunk of EXACT_CHUNK elements at a time.
ERROR_REPORT_DD = 8 + 3 + 8 + 8

# One evaluation at a time (experiments/softmax.evaluate): the case's float64
# logits (8) held for the run, the stored copy (8), the kernel's input (4 at
# most) and output (4), the output as float64 (8), the reference's high half
# (8; the double-double reference is made a few rows at a time), then
# error_report against it.
SOFTMAX_PER_ELEMENT = 8 + 8 + 4 + 4 + 8 + 8 + ERROR_REPORT_DD


# The double-double reference (experiments/softmax.reference_dd) runs
# SOFTMAX_DD_CHUNK elements at a time, but never less than one whole row: a
# row longer than the chunk holds its temporaries (measured: 28 float64 an
# element, ddexp.softmax_dd's two-sum and two-product halves) for the whole
# row. Without this term a 1 x 4M softmax peaked at 4.1x its estimate.
SOFTMAX_DD_CHUNK = 1 << 12
SOFTMAX_DD_PER_ELEMENT = 28 * 8


def softmax(rows: int, cols: int) -> int:
    dd = SOFTMAX_DD_PER_ELEMENT * min(rows * cols, max(cols, SOFTMAX_DD_CHUNK))
    return SOFTMAX_PER_ELEMENT * rows * cols + dd + 16 * MiB


# nondeterminism's sections of fixed size (experiments/nondeterminism.py),
# measured: batch holds a 1024 x 4096 fp32 matrix, every batch's outputs
# (1462 rows) and torch's 1024 x 1024 matmuls; torch_ops 2^20-element index
# adds and a 16 x 65536 mm, run after run; split-K a 128 x 8192 x 128 matmul
# in slices. The first torch section also starts torch's thread pools.
# tp: the ranks are processes of their own, each checked by tp itself
# (tp.RANK_BYTES); the parent holds their results and the replays.
NONDET_SECTION_FIXED = {"atomics": 0, "threads": 0, "splitk": 40 * MiB, "batch": 110 * MiB,
                        "torch_ops": 130 * MiB, "tp": 40 * MiB}


NONDET_FIXED = 24 * MiB  # measured: torch's and the library's first-use state (thread pools, the kernels' grid)

# What each of --runs keeps until its section's statistics are done (the fixed terms above were
# measured at --runs 2): split-K both orders' 128 x 128 fp32 results (64 KiB and a header each) and,
# while they are compared, one order's bytes (_bits): 3 x 64 KiB, measured 186 KiB a run at --runs
# 5000 (--runs 100000 ran out of memory unestimated); torch_ops the largest op's 16 x 16 result and
# its bytes, measured 2.4 KiB a run; atomics two fp32 sums a run as Python floats and array slots.
NONDET_PER_RUN = {"atomics": 80, "threads": 0, "splitk": 3 * (4 * 128 * 128 + 112), "batch": 0,
                  "torch_ops": 2560, "tp": 0}


def nondeterminism(n: int, sections, runs: int = 2) -> int:
    """x in float64 (8 n) for the whole run; drawing it briefly holds the
    float32 copy too (4 n), whose freed pages fsum's chunk then reuses (so the
    chunk adds what exceeds them); or the largest section with its runs'
    results (NONDET_PER_RUN); plus the first-use state."""
    chunk = exact_sum(n) - min(4 * n, exact_sum(n) // 2)
    per_section = [NONDET_SECTION_FIXED[s] + runs * NONDET_PER_RUN[s] for s in sections]
    return 8 * n + max([4 * n, chunk] + per_section) + NONDET_FIXED


def _matmul_modes(m: int, n: int, k: int) -> int:
    """tf32's CPU emulation of one m x k @ k x n matmul in every mode, with a
    (4 mk) and b (4 kn) in fp32 held throughout:
      the float64 reference: a, b in float64 and the product (8 each);
      rounding an input to bf16/fp16 (formats.round: float64 copy, float32
      round-to-odd, its float64 back, masks, the result; about 33 bytes each)
      beside the other input's rounded copy;
      the output: fp32 product (4), float64 copy (8) and error_report against
      the float64 reference (8 mn) held."""
    a, b, c = m * k, k * n, m * n
    held = 4 * a + 4 * b
    return held + max(8 * a + 8 * b + 8 * c,
                      8 * c + 4 * max(a, b) + 33 * max(a, b),
                      8 * c + 4 * c + 8 * c + ERROR_REPORT * c)


K_SWEEP_MAX = 16384  # experiments/tf32.K_SWEEP's largest K


def tf32(m: int, n: int, k: int, sweep_mn: int | None) -> int:
    """The modes at m x k x n, then (sweep_mn given) the K sweep at
    sweep_mn x K x sweep_mn up to its largest K, with the first A and B still
    held, plus the four modes' results of one K (4 bytes each)."""
    modes = _matmul_modes(m, n, k)
    if sweep_mn is None:
        return modes + BLAS_FIXED
    sweep = 4 * m * k + 4 * k * n + _matmul_modes(sweep_mn, sweep_mn, K_SWEEP_MAX) + 16 * sweep_mn * sweep_mn
    return max(modes, sweep) + BLAS_FIXED


def accumulator_models(m: int, n: int, k: int, model_peaks: list[int]) -> int:
    """tf32 --accumulator: A and B in float64 and the float64 reference, the
    error report on m x n, then the largest model's own peak
    (numerics.accumulators.Accumulator.peak_bytes, passed in: runtime does not
    import numerics)."""
    return 8 * (m * k + k * n + m * n) + ERROR_REPORT * m * n + max(model_peaks, default=0) + BLAS_FIXED


def bench_cpu(n: int) -> int:
    """The CPU accumulate bench: n values in float32 (4) and float64 (8); then
    the orders section, which holds float64 values (8), their reversed or
    |x|-sorted copy (8) and the radix sort's work (8), with the float32 draw
    (4) while it is converted; plus the kernels' and numpy's small fixed state."""
    return 28 * n + 12 * MiB


COMPARE_FIXED = 16 * MiB


def compare_op(op: str, shape: tuple, case_shapes: tuple = (), contract_shape: tuple | None = None) -> int:
    """The peak over the stages a run goes through one at a time: the cases
    (--shape, and the harness's fixed-size ones such as the vocabulary rows or
    the long K: op_harness.shapes_used), each the three comparisons below, and
    the batch-invariance contract on its batch, which holds the fp32 batch,
    its low-precision copy, one output and the bit patterns compared (4 + 4 +
    4 + 4 bytes per element, plus matmul's or attention's other operands)."""
    peak = max(_compare_op_one(op, s) for s in (shape, *case_shapes))
    if contract_shape is not None:
        n = math.prod(contract_shape[:2]) if op != "attention" else math.prod(contract_shape)
        if op == "matmul":
            m, k, nn = contract_shape
            n = 16 * (m * k) + 16 * (m * nn) + 8 * k * nn
        elif op == "attention":
            n = 16 * 3 * n + 8 * contract_shape[0] * contract_shape[1] ** 2
        else:
            n = 16 * n * (2 if op in ("swiglu", "layernorm") else 1)
        peak = max(peak, n + COMPARE_FIXED)
    return peak


def _compare_op_one(op: str, shape: tuple) -> int:
    """compare op on the CPU, for this project's kernels (an --impl's own
    allocations are its business): per output element the fp32 input (4), the
    trusted fp32, float64 and this project's outputs (4 + 8 + 4) and their
    float64 copies for the comparison (8 + 8), error_report, and the
    low-precision inputs, outputs and copies of one dtype (2 + 2 + 2 + 8 + 8);
    matmul's inputs take their fp32, float64 and low copies (20 per element);
    logsumexp compares one value a row, its inputs cost 28 per element (fp32,
    the scaled draw, float64 and exp's temporary)."""
    if op == "matmul":
        m, k, n = shape
        # inputs: fp32, float64, low, and the float64 copies and |A|, |B| the advisor's bound takes (40)
        return (4 + 8 + 4 + 8 + 8 + 2 + 2 + 8 + 8 + ERROR_REPORT) * m * n + 40 * (m * k + k * n) + COMPARE_FIXED
    if op == "attention":  # q, k, v and the output as a row op each, and fp64 scores bh x t x t (SDPA's reference)
        bh, t, d = shape
        per = (4 + 4 + 8 + 4 + 8 + 8 + 2 + 2 + 2 + 8 + 8 + ERROR_REPORT)
        return 4 * per * bh * t * d + 3 * 8 * bh * t * t + COMPARE_FIXED
    rows, cols = shape
    if op == "logsumexp":
        return 28 * rows * cols + COMPARE_FIXED
    # + 36: the harness's non-finite split (six masks, the finite values of both sides: 6 + 16) and the
    # case builder's input copy with its float64 cast (4 + 8), measured at 256-1024 x 4096; + 48:
    # numerics/compare's exact rel-L2 (the float64 difference and the error-free parts of its squares,
    # six float64 an element), measured peaks 197-254 bytes an element at 256-1024 x 4096 bf16
    return (4 + 4 + 8 + 4 + 8 + 8 + 2 + 2 + 2 + 8 + 8 + ERROR_REPORT + 36 + 48) * rows * cols + COMPARE_FIXED


# compare model: the code imported on first use, measured: transformers itself
# (about 28 MiB), its model classes and tokenizer; or the embedded model's.
MODEL_FIXED = {"hf": 160 * MiB, "embedded": 64 * MiB}

# Bytes per parameter of a compute copy in each dtype engine.model() makes.
COPY_BYTES = {"fp64": 8, "fp32": 4, "bf16": 2, "fp16": 2}


def copy_bytes(shape, dtype: str) -> int:
    """What engine.model(dtype) adds beside the weights the engine holds
    (shape.weight_bytes: the Hugging Face engine's as stored, the embedded
    one's in fp32): a copy cast tensor by tensor (protocol.cast_copy), none
    where the copy shares the held weights (their own dtype)."""
    return 0 if dtype == shape.dtype else COPY_BYTES[dtype] * shape.params


def weights(shape, *together) -> int:
    """The held weights plus the compute copies alive together (dtype names;
    a list among them: the largest of its copies, made one after another);
    at least twice the held weights, the load's own peak (the checkpoint's
    pages mapped beside the tensors read out of them, measured: a model
    stored in fp32 whose runs make no fp32 copy peaks there)."""
    total = shape.weight_bytes
    for d in together:
        total += max((copy_bytes(shape, x) for x in d), default=0) if isinstance(d, (list, tuple)) \
            else copy_bytes(shape, d)
    return max(total, 2 * shape.weight_bytes)


def compare_model(shape, lows=formats.LOW_COMPUTE) -> int:
    """experiments/model.py. Weights: the held ones and one compute copy at a
    time (fp32's, then each low dtype's, each dropped when its run ends).
    Activations over seq positions: the logits of every step and of the
    teacher-forced pass in float64 and their originals (about 6 float64
    arrays of seq x vocab), the attention scores of one layer (seq^2 per
    head, fp32) and the hidden states and KV cache of every layer (about 4
    fp32 arrays of seq x hidden each)."""
    seq, vocab = shape.seq, shape.vocab
    return (weights(shape, ["fp32", *lows]) + 48 * seq * vocab + 4 * seq * seq * shape.heads
            + 16 * seq * shape.hidden * shape.layers + MODEL_PER_RUN + MODEL_FIXED[shape.kind])


# What each compare model run allocates beyond the terms above and does not scale with the model
# (transformers' generate() state, the report's tables): the second of three tiny Qwen3 runs in one child
# grew 28.6-29.4 MiB against 18.4 estimated without it (tests/test_memory.py, alone and beside a
# second worker, 2026-12-05).
MODEL_PER_RUN = 8 * MiB


# What one sequence's forward pass holds per position besides its logits, at
# most: a dozen hidden-state sized tensors (the residual, the norm, q, k, v,
# the attention output) and the MLP's (about 3 x hidden each for gate, up and
# their product), in the widest dtype a contract runs (fp64): no_grad keeps no
# layer's activations past the next.
CONTRACT_HIDDEN = 8 * 24


def contract_batch(shape, batch: int, exact: str = "fp64") -> int:
    """The batch contract's own memory for a batch of `batch` sequences of
    shape.seq positions: its logits in the widest dtype it runs (the exact
    re-run's), every position and row, the hidden states of one layer
    (CONTRACT_HIDDEN) and one layer's attention scores (8 per head and pair of
    positions)."""
    seq = shape.seq
    return batch * seq * (COPY_BYTES[exact] * shape.vocab + CONTRACT_HIDDEN * shape.hidden + 8 * shape.heads * seq)


def compare_contracts(shape, batch: int, dtypes, exact: str = "fp64") -> int:
    """experiments/contracts.py, for its largest batch. Weights: the held ones
    and one copy at a time (each dtype's for its contracts, then the exact
    dtype's for the re-runs of those that broke). Activations: the batch's
    (contract_batch), and the rows compared (the sequence alone and the rows
    under test, their float64 log-softmax, the difference and its mask:
    about 8 float64 arrays of seq x vocab)."""
    return (weights(shape, ["fp32", *dtypes, exact]) + contract_batch(shape, batch, exact)
            + 64 * shape.seq * shape.vocab + MODEL_FIXED[shape.kind])


def contracts_draft(shape, *, weights: bool, fixed: bool) -> int:
    """compare contracts --draft (experiments/spec_draft.py): the draft model's
    held weights and the fp32 copy it proposes with (the copy alone where it
    is the target's own engine, `weights` False), and one greedy session at a
    time over at most seq positions: the prefill's fp32 logits with a float64
    row (about 12 bytes a logit) and the KV cache and hidden states of every
    layer (4 fp32 arrays of seq x hidden). Its first-use state (`fixed`) where
    its kind is not the target's."""
    held = (shape.weight_bytes if weights else 0) + copy_bytes(shape, "fp32")
    return (held + 12 * shape.seq * shape.vocab + 16 * shape.seq * shape.hidden * max(1, shape.layers)
            + (MODEL_FIXED[shape.kind] if fixed else 0))


# compare metrics' and compare engine's first-use state, measured with the embedded model: less than
# compare model's (no generate(), no low-precision decoding kernels); transformers' as compare model's.
METRICS_FIXED = {"hf": MODEL_FIXED["hf"], "embedded": 24 * MiB}
ENGINE_FIXED = {"hf": MODEL_FIXED["hf"], "embedded": 32 * MiB}

# compare metrics: the logits of one batch of windows held per logit (fp32's kept as the reference,
# one other dtype's output and its numpy copy: 4 + 4 + 4 at most, the fp32 side compared too), and
# per logit of a chunk of positions scored together: both rows in float64 (16), the noise and
# distribution.position_stats' temporaries (log-softmaxes, probabilities, their products, the sort
# for the top-5 sets): measured 270 bytes a logit in all on the embedded model (one chunk of 8192
# positions, fp32 and bf16: tests/test_memory.py).
METRICS_BATCH_PER_LOGIT = 12
METRICS_CHUNK_PER_LOGIT = 256
# The batch of windows is sized as it was when every dtype's float64 windows were held (80 bytes a
# logit): a window's logits can depend on how many windows share its forward pass, so the recorded
# numbers stay those of the same batches.
METRICS_BATCH_SIZING = 80


def metrics_chunk(vocab: int, working_bytes: int) -> int:
    """Positions scored together (statistics in float64) so that their
    working set stays within working_bytes: at least one."""
    return max(1, working_bytes // (METRICS_CHUNK_PER_LOGIT * max(vocab, 1)))


def metrics_per_batch(tokens: int, window: int, vocab: int, working_bytes: int) -> int:
    """Windows run through the model together: as many as fit working_bytes
    (at least one, at most those --tokens fills)."""
    return max(1, min(tokens // window or 1, working_bytes // (METRICS_BATCH_SIZING * window * max(vocab, 1))))


def compare_metrics(shape, tokens: int, lows: list, window: int, working_bytes: int, save_bytes: int) -> int:
    """compare metrics (experiments/logits.run_model). Weights: the held ones
    and the copies of fp32 and every low dtype together (each window is
    scored in every dtype while its fp32 logits are held; a copy in the
    weights' own dtype shares them). Per batch of windows (metrics_per_batch)
    its logits (METRICS_BATCH_PER_LOGIT a logit); per chunk of positions
    (metrics_chunk) their float64 statistics' working set; per position scored
    and low dtype, the statistics kept and concatenated (nine float64, twice:
    144 bytes); --save-logits' arrays (`save_bytes`, given: the dtypes saved)."""
    vocab = max(shape.vocab, 1)
    rows = metrics_per_batch(tokens, window, vocab, working_bytes) * min(tokens, window)  # one batch's positions
    batch = rows * vocab * METRICS_BATCH_PER_LOGIT
    chunk = min(metrics_chunk(vocab, working_bytes), rows) * vocab * METRICS_CHUNK_PER_LOGIT
    return (weights(shape, *dict.fromkeys(("fp32", *lows))) + batch + chunk + 144 * tokens * max(len(lows), 1) + save_bytes
            + METRICS_FIXED[shape.kind])


def compare_engine(reference, engines: list, tokens: int) -> int:
    """compare engine (experiments/engines.py), from the reference's shape and
    each engine's (None: an engine that holds its weights in memory of its
    own, a llama.cpp mapping or a server, not counted). The reference's held
    weights and its fp32 copy, and the largest engine's likewise (they are
    opened one at a time). Per logit of the positions scored: the reference's
    float64 windows, kept for every engine (8); for the engine being compared
    both sides' float64 windows and their concatenation (32) and
    position_stats' temporaries (about ten float64: 80). Per logit of the
    greedy path (--steps: the reference's seq, prompt + steps positions): its
    float64 rows and their stack, or the stack and the reference's sort of it
    (16; measured 16.7 with the step's own logits: 18), with the decoding's KV
    cache and hidden states as compare model counts them. Without this term
    --steps 100000 on a 151,936-token vocabulary ran out of memory under an
    estimate of a few hundred MiB."""
    largest = max((weights(s, "fp32") for s in engines if s is not None), default=0)
    vocab = max(reference.vocab, 1)
    greedy = 18 * reference.seq * vocab + 16 * reference.seq * reference.hidden * reference.layers
    return (weights(reference, "fp32") + largest + 120 * tokens * vocab + greedy
            + ENGINE_FIXED[reference.kind])


# compare model --trainer/--rollout: bytes kept per sampled token, for each of
# the up to six streams (chosen and TOP_K listed log-probs and ids, float64 and
# int64: 16 per value), and compare logprobs' statistics of one pair at a time
# (experiments/logprobs.py: about twenty float64 a token, eight per listed pair).
ROLLOUT_STREAMS = 6
ROLLOUT_STATS_PER_TOKEN = 20 * 8


# compare rollout's first-use state beyond compare model's: the first teacher-forced pass's torch state
# (the low dtype's kernels, the float64 log-softmax and top-k buffers). Measured on the embedded model
# (tests/test_memory.py, first run of a child, --samples 4 --tokens 64): 101.6-104.8 MiB of growth
# against 73.2 MiB estimated with MODEL_FIXED alone, on 2026-12-05.
ROLLOUT_FIRST_USE = 32 * MiB
# What each run allocates beyond the terms below and does not scale with the model (the streams' Python
# records, the report's tables): later runs in one child grew 11.2-15.4 MiB against 9.6-10.2 estimated
# without it (the embedded model, --samples 8 and 16, alone and beside a second pytest worker).
ROLLOUT_PER_RUN = 3 * MiB


def rollout(shape, lows: list, samples: int, tokens: int, top_k: int, fixed: bool = True) -> int:
    """compare model --trainer/--rollout (experiments/rollout.py), one engine's
    share. Weights: the held ones, its fp32 base and each low dtype's copy,
    all kept for the run. One teacher-forced pass over seq positions at a
    time: its logits in the model's dtype, scaled by 1/T, the fp32
    log-softmax and its float64 copy, the top-k sort's index array (4 + 4 +
    4 + 8 + 8 = 28 per logit), every layer's hidden states (16 per position
    and hidden unit) and one layer's attention scores with eager attention's
    copies (16 per head and pair of positions). The per-sample cost: what the
    streams hold per token (samples x tokens of them). `fixed`: the first use
    of this kind of engine (its imports) is counted here."""
    seq, per_token = shape.seq, ROLLOUT_STREAMS * (1 + top_k) * 16 + ROLLOUT_STATS_PER_TOKEN + 2 * top_k * 64
    return (weights(shape, "fp32", *lows) + 28 * seq * shape.vocab + 16 * seq * shape.hidden * shape.layers
            + 16 * shape.heads * seq * seq + per_token * samples * tokens + ROLLOUT_PER_RUN
            + (MODEL_FIXED[shape.kind] + ROLLOUT_FIRST_USE if fixed else 0))


# compare model --layers' first-use state, measured: transformers as compare
# model's; for the embedded model less (no generate(), no kernels for fp16 decoding).
LAYERS_FIXED = {"hf": MODEL_FIXED["hf"], "embedded": 40 * MiB}


def compare_layers(shape, lows=formats.LOW_COMPUTE, dump: bool = False) -> int:
    """compare model --layers (experiments/layers.py). Weights: the held ones,
    the fp32 base (the reference, kept) and, for the low dtype being
    compared, its two copies (trusted and yours). Activations over seq
    positions: every watched site's input and output (hooks.sites: seven a
    layer, each about seq x hidden) captured in fp32 for the reference and in
    the low dtype for the low run, 2 x 7 x (4 + 2) = 84 per layer, position
    and hidden unit; the LM head's output in both (4 + 2 per logit), its four
    float64 copies while its row is computed (32) and the fp32 head rerun of
    the pitfall check (4): 42 per logit; one layer's attention scores with
    eager attention's copies (16 per head and pair of positions). --dump
    writes the captures: one more of each."""
    seq, vocab = shape.seq, shape.vocab
    caps = 84 * seq * shape.hidden * shape.layers + 6 * seq * vocab
    copies = max((2 * copy_bytes(shape, d) for d in lows), default=0)
    return (weights(shape, "fp32") + copies + caps + 36 * seq * vocab + 16 * shape.heads * seq * seq
            + (caps if dump else 0) + LAYERS_FIXED[shape.kind])


def _pair_weights(ref, yours) -> int:
    """Both models' weights as the pair run holds them: each held as stored with
    its fp32 base, and one more copy at a time across the two (REF's fp64, then
    each low dtype's of REF and of YOURS, each dropped when its run ends); at
    least each load's peak (weights(): twice what is being loaded, beside what
    is already held). Not weights() per model: their floors and copies are
    not alive together (measured: 1.6x high on a tiny Qwen3 pair)."""
    sides = [ref] if yours is None else [ref, yours]
    based = sum(s.weight_bytes + copy_bytes(s, "fp32") for s in sides)
    one_copy = max([copy_bytes(ref, "fp64"), *(copy_bytes(s, d) for s in sides for d in formats.LOW_COMPUTE)])
    loads = [2 * ref.weight_bytes] + ([] if yours is None else
                                      [ref.weight_bytes + copy_bytes(ref, "fp32") + 2 * yours.weight_bytes])
    return max(based + one_copy, *loads)


def compare_layers_pair(ref, yours, lows: int) -> int:
    """compare engine-layers (experiments/layers_pair.py),
    from REF's and YOURS' shapes; yours None for an engine that captures in
    its own process memory (llama.cpp: not counted here). Weights: both held
    with their fp32 bases and one more copy at a time (_pair_weights). The module outputs of every run are kept until the rows are
    computed: per watched element (hooks.sites, seven a layer, each seq x
    hidden, and the logits, seq x vocab) REF fp32 and fp64 and YOURS fp32 (4
    + 8 + 4) and, per low dtype, REF's and YOURS' (2 + 2); the run being
    captured also holds its inputs (at most 8 an element, fp64's), and eager
    attention's scores (16 per head and pair of positions). A row's
    comparison makes float64 copies of one module on each side (3 + 2 per
    low dtype, 8 bytes each): the logits at most."""
    seq = ref.seq
    elements = seq * (7 * ref.hidden * ref.layers + ref.vocab)
    held = _pair_weights(ref, yours)
    kept = (16 + 4 * lows) * elements
    in_flight = 8 * elements + 16 * ref.heads * seq * seq
    rows = 8 * (3 + 2 * lows) * seq * max(ref.hidden, ref.vocab)
    return held + kept + in_flight + rows + LAYERS_FIXED[ref.kind]


# kvcache's first-use state, measured: transformers as compare model's; for the
# embedded model less than compare model's (no bf16/fp16 copies, no kernels for them).
KVCACHE_FIXED = {"hf": MODEL_FIXED["hf"], "embedded": 32 * MiB}


def kvcache(shape, calibration: int) -> int:
    """kvcache (experiments/kvcache.py): the held weights and the fp32 base
    (no other copies: a cache changes what attention reads, not the
    weights). Over the seq positions of the teacher-forced pass, for the cache
    being measured: its fp32 logits and their float64 copy (4 + 8), the fp32
    and bf16 caches' float64 logits kept throughout (8 + 8) and
    distribution.position_stats' working arrays (about ten float64 per logit):
    112 per logit. The longest single pass, the calibration text's (at most
    `calibration` tokens: a token is at least one character; at most the
    model's positions) or the teacher-forced one: every layer's K and V in
    fp32 (8 per position and hidden unit, an upper bound under GQA) and one
    layer's attention scores with the copies eager attention makes of them
    (scaled, masked, softmaxed: 16 bytes per head and pair of positions)."""
    calib = min(calibration, shape.positions) if shape.positions else calibration
    longest = max(calib, shape.seq)
    # no load-peak floor (weights()): measured, kvcache's runs after the load stay near the held
    # weights and the fp32 copy (tests/test_memory.py, kvcache --model: 1.8x high with the floor)
    held = shape.weight_bytes + copy_bytes(shape, "fp32")
    return (held + 112 * shape.seq * shape.vocab + 16 * shape.heads * longest * longest
            + 8 * longest * shape.hidden * shape.layers + KVCACHE_FIXED[shape.kind])


# router --impl (experiments/router_cases.py), per logit of its largest case (tokens x --experts):
# the case's float64 logits and their fp32 rounding's temporaries, your kernel's fp32 (and on a
# difference fp64) input, the fp64 reference's scores and choices, both sides' dense weights and
# their difference and mask. Measured 51-55 bytes at 8-34 M logits (--threshold 16384-65536,
# --experts 256-1024), 70 at 1 M with the first-use state; your kernel's own allocations are its
# own. Without it --experts 10^9 or --threshold 2^20 ended 'out of memory' (exit 1).
ROUTER_CASE_PER_LOGIT = 64
ROUTER_CASES_FIXED = 32 * MiB


def router_cases(tokens: int, experts: int) -> int:
    return ROUTER_CASE_PER_LOGIT * tokens * experts + ROUTER_CASES_FIXED


def attention(rows: int, seq: int, dim: int, block_c: int, chunk_rows: int, model_peak: int,
              splits: int = 1) -> int:
    """attention (experiments/attention.py, numerics/flash_attention.py): q
    (rows x d) and k, v (seq x d) in float64 with their stored copies (16 per
    element) and, while one is stored, its x / descale and fp32 round trip
    (measured: about 22 per element in all); the outputs of the run, the bf16 path and the float64 reference
    (24 per row element); per chunk of rows: about twenty float64 arrays of
    chunk x block_c (the scores, P, masks, the reference's tile) and ten of
    chunk x d, plus the largest accumulator model's own peak (passed in:
    runtime does not import numerics). Each split (--splits, empty ones
    included: 10^9 of them grew to 5.6 GB unestimated) holds its range's
    Python tuple and, per chunk, its output and lse arrays until the combine
    stacks them: measured about 1.2 kB a split at 8 rows x d 8 (array
    headers dominate), estimated 1 kB plus twice chunk x (d + 2) float64."""
    chunk = min(rows, chunk_rows)
    block_c = min(block_c, seq)  # a tile holds at most the sequence's keys
    return (22 * (rows * dim + 2 * seq * dim) + 24 * rows * dim + 8 * chunk * (20 * block_c + 10 * dim)
            + splits * (1024 + 16 * chunk * (dim + 2)) + model_peak + COMPARE_FIXED)
