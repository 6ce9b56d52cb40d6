/*
 * precisionlab.h: the whole C API of libprecisionlab.so.
 *
 * Conventions
 *  - Every function returns an int status (PL_OK == 0) unless stated.
 *  - On failure, pl_last_error() holds a one-line message naming the function
 *    and the cause (for CUDA failures, the CUDA error string). It is
 *    thread-local and valid until the next failing call on that thread.
 *  - Pointers are host pointers unless the parameter name ends in _dev.
 *  - n is int64_t; n <= 0 and sizes whose byte count overflows are rejected.
 *  - A library built without nvcc exports the same symbols; the CUDA entry
 *    points then return PL_ERR_NO_CUDA.
 *
 * Formats are the pl_format codes below; precisionlab/formats.py mirrors them.
 */
#ifndef PRECISIONLAB_H
#define PRECISIONLAB_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PL_ABI_VERSION 5

enum pl_status {
    PL_OK = 0,
    PL_ERR_INVALID_ARGUMENT = 1, /* bad enum, n <= 0, inconsistent sizes */
    PL_ERR_NULL_POINTER = 2,
    PL_ERR_SIZE_OVERFLOW = 3,    /* n * element size does not fit in size_t */
    PL_ERR_UNSUPPORTED = 4,      /* valid arguments, combination not offered */
    PL_ERR_NO_DEVICE = 5,        /* no CUDA driver or no GPU */
    PL_ERR_NO_CUDA = 6,          /* library built without nvcc */
    PL_ERR_CUDA = 7,             /* a CUDA runtime call or kernel launch failed */
    PL_ERR_OUT_OF_MEMORY = 8,    /* host or device allocation failed */
    PL_ERR_COUNT_ = 9
};

enum pl_format {
    PL_FP64 = 0,
    PL_FP32 = 1,
    PL_FP16 = 2,
    PL_BF16 = 3,
    PL_FP8_E4M3 = 4, /* OCP e4m3fn: no infinities, overflow gives NaN */
    PL_FP8_E5M2 = 5,
    PL_TF32 = 6,     /* tensor-core input format: fp32 range, 10 stored mantissa bits */
    PL_FORMAT_COUNT_ = 7
};

/* CPU fp32 sum split into `threads` equal chunks summed by that many threads,
 * the chunk sums added in order: the bits depend on the thread count. */
int pl_sum_cpu_threads(const double* x, int64_t n, int threads, double* result);

/* ---- the catalog: every kernel variant and format, declared once ---------
 * A variant is one way the library computes an op (an algorithm, a kernel,
 * or a deliberate bug kept to show its error). Each is declared once, as a row
 * of the table beside its code in cuda/<op>.cu; pl_variant_info walks every
 * row. An op's entry points take a row's `id` as their `method` / `version`
 * argument: look it up by (op, name), never by a literal.
 * Formats: pl_format_info describes each pl_format code by its bits. */
enum pl_variant_kind { PL_KIND_ALGORITHM = 0, PL_KIND_KERNEL = 1, PL_KIND_BUG = 2 };
enum pl_device_bits { PL_ON_CPU = 1, PL_ON_CUDA = 2 };
/* How the caller arranges x before the call (the sum's reordered variants). */
enum pl_input_order { PL_ORDER_AS_GIVEN = 0, PL_ORDER_REVERSED = 1, PL_ORDER_ASCENDING_ABS = 2,
                      PL_ORDER_DESCENDING_ABS = 3 };
/* What make sass-check (scripts/sass_check.py) holds one of a variant's GPU
 * kernels to: the checks it gets and its ceiling on instructions per element
 * for the element types in `dtypes`. */
enum pl_sass_check {
    PL_SASS_SINGLE_PASS = 1, /* the row in registers: every load before the first reduction */
    PL_SASS_STREAMING = 2,   /* a hot loop over the input: its instructions per element loaded */
    PL_SASS_TWO_AN_SM = 4,   /* registers that let two 512-thread CTAs share an SM */
    PL_SASS_SHARED_LOOPS = 8 /* a tiled kernel: its innermost loop over shared memory, per element it reads */
};
typedef struct {
    const char* kernel; /* the __global__ function (its template's name, as cuobjdump shows it) */
    int32_t checks;     /* pl_sass_check bits */
    uint32_t dtypes;    /* element formats the ceiling applies to: bit (1 << pl_format) each */
    double ceiling;     /* instructions per element, at most */
} pl_sass_rule;
typedef struct {
    const char* op;          /* "sum", "softmax", "rmsnorm", "matmul", ... */
    const char* name;        /* lower_snake identifier, unique within op */
    int32_t id;              /* what the op's entry points take */
    int32_t kind;            /* pl_variant_kind */
    int32_t devices;         /* pl_device_bits */
    int32_t order;           /* pl_input_order */
    int32_t batch_invariant; /* 1: a row's bits never depend on the batch; 0: they may; -1: no batch */
    int32_t deterministic;   /* 1: the same bits on every run (stochastic: for a seed) */
    int32_t is_default;      /* 1: run when the user names none */
    const char* summary;     /* one line, for --help and info */
    uint32_t dtypes;         /* the formats it takes: bit (1 << pl_format) each (the sum: its accumulator) */
    int32_t nsass;           /* entries in sass */
    const pl_sass_rule* sass; /* its kernels' instruction ceilings (make sass-check); NULL when nsass is 0 */
} pl_variant_desc;
int pl_variant_count(int* count);
/* Row `index` (0 <= index < count), ops in name order, rows in their file's order. */
int pl_variant_info(int index, pl_variant_desc* out);

/* The arithmetic formats (pl_format codes). The block-scaled formats' element
 * and scale formats are pl_minifloat_info's (blockscale.cu). */
typedef struct {
    const char* name;
    int32_t bits;           /* bits of a value (tf32: 19) */
    int32_t precision;      /* significand bits, the implicit one included */
    int32_t emin, emax;     /* exponents of the smallest and largest normal */
    double max;             /* largest finite value */
    double min_subnormal;   /* smallest positive value */
    int32_t has_inf, has_nan;
    int32_t bytes;          /* bytes a value takes in the library's buffers */
} pl_format_desc;
int pl_format_info(int code, pl_format_desc* out);

/* ---- library ------------------------------------------------------------ */
int pl_abi_version(void);                 /* returns PL_ABI_VERSION */
const char* pl_error_string(int status);  /* static text per status; never NULL */
const char* pl_last_error(void);          /* detail of the last failure; never NULL */
const char* pl_build_info(void);          /* compiler, flags, CUDA archs; never NULL */

/* Number of usable CUDA devices. With no driver or no GPU: *count = 0 and
 * PL_ERR_NO_DEVICE (pl_last_error says which). Built without nvcc: *count = 0
 * and PL_ERR_NO_CUDA. */
int pl_cuda_device_count(int* count);

/* CUDA runtime and driver versions (1000 * major + 10 * minor); driver 0 when
 * there is none. */
int pl_cuda_versions(int* runtime, int* driver);

/* Name, SM count and memory of device `device` (name_len bytes at most,
 * NUL-terminated). */
int pl_cuda_device_info(int device, char* name, int name_len, int* sm_count,
                        int* cc_major, int* cc_minor, size_t* total_mem);

/* Device memory for callers with no framework of their own (the experiments
 * need no torch CUDA for this project's kernels). dev: a device pointer;
 * host: a host pointer. The copies are synchronous and ordered after every
 * kernel the library launched (all on the legacy default stream). Freeing
 * NULL is a no-op. */
int pl_device_alloc(size_t bytes, void** dev);
int pl_device_free(void* dev);
int pl_copy_to_device(void* dev, const void* host, size_t bytes);
int pl_copy_to_host(void* host, const void* dev, size_t bytes);

/* Round n doubles to `format` (round to nearest, ties to even), in place of y.
 * x and y may alias. */
int pl_round(const double* x, int64_t n, int format, double* y);

/* ---- accumulate: CPU reference kernels ----------------------------------
 * x: n stored values, given as doubles (each must already be representable in
 *    the storage format; the sum does not care which format that was).
 * accumulator: pl_format of the running sum; every operation is rounded once,
 *    to nearest-even (stochastically for PL_STOCHASTIC), from its exact result.
 * seed: used by PL_STOCHASTIC only.
 * result: the sum, as a double (exact: it is a value of the accumulator format).
 * stall_step, stall_value (may be NULL): for PL_SEQUENTIAL, the 0-based
 *    index of the first non-zero finite addend that left the running sum
 *    unchanged, and the sum there; -1 and NaN when that never happened or for
 *    other methods (a stochastic sum only pauses: it has no stall).
 * trace (may be NULL): n doubles, the running sum after each step
 *    (PL_SEQUENTIAL and PL_STOCHASTIC only; PL_ERR_UNSUPPORTED otherwise). */
int pl_accumulate_cpu(const double* x, int64_t n, int accumulator, int variant,
                      uint64_t seed, double* result, int64_t* stall_step,
                      double* stall_value, double* trace);

/* pl_accumulate_cpu on its exact path only (every operation through the
 * general round-to-odd rounding): the same bits, slower; kept to test the fast
 * path against. */
int pl_accumulate_cpu_exact(const double* x, int64_t n, int accumulator, int variant,
                            uint64_t seed, double* result, int64_t* stall_step,
                            double* stall_value, double* trace);

/* x sorted by increasing |x| (descending = 1: decreasing), stably, NaN last
 * in both directions, into out; work: n doubles of scratch. O(n) time and no
 * memory beyond out and work (the sorted summation orders). */
int pl_sort_by_magnitude(const double* x, int64_t n, int descending, double* out, double* work);

/* pl_sort_by_magnitude for x whose every value is a float32 value (bit for
 * bit once widened; PL_ERR_INVALID_ARGUMENT otherwise), with no work array:
 * out's 8n bytes are the scratch. */
int pl_sort_float32_by_magnitude(const double* x, int64_t n, int descending, double* out);

/* sorted: x as pl_sort_by_magnitude(descending = 0) left it; out (sorted
 * itself for in place): the order pl_sort_by_magnitude(descending = 1) gives,
 * in O(n) (the runs of equal |x| reversed as runs, NaN last). */
int pl_reverse_magnitude_order(const double* sorted, int64_t n, double* out);

/* The exact sum of x (absolute = 1: of |x|) as at most PL_EXACT_SUM_TERMS
 * doubles, written to terms (capacity >= PL_EXACT_SUM_TERMS), whose exact sum
 * is the same: a correctly rounded sum of them (math.fsum) is that of x.
 * Only zeros: no terms, or one -0.0 when every x is -0.0 (absolute = 0).
 * *special: 0 done; 1 x holds a NaN or an infinity (no terms); 2 the sum is
 * near or past the double range (no terms). n in [0, 2^40). */
#define PL_EXACT_SUM_TERMS 2176
int pl_exact_sum_terms(const double* x, int64_t n, int absolute, double* terms, int64_t capacity,
                       int64_t* nterms, int* special);

/* ---- accumulate: CUDA kernels --------------------------------------------
 * storage: format the values are held in on the device (any pl_format).
 * accumulator: PL_FP32, PL_BF16 or PL_FP64 (PL_GPU_ATOMIC: PL_FP32, PL_BF16,
 *    PL_FP64, using hardware atomicAdd of that type).
 */

/* Bytes of device workspace pl_sum_cuda_device needs for n elements. */
int pl_sum_workspace_bytes(int64_t n, int storage, int variant, size_t* bytes);

/* Asynchronous, on the legacy default stream: sums x_dev (n values of
 * `storage`) and writes the result as one double to out_dev.
 * x_dev, work_dev, out_dev are device pointers. */
int pl_sum_cuda_device(const void* x_dev, int64_t n, int storage, int accumulator,
                       int variant, void* work_dev, size_t work_bytes, double* out_dev);

/* Synchronous convenience: converts host doubles x to `storage`, uploads them
 * once, runs the sum `runs` times and writes the runs results (host). */
int pl_sum_cuda(const double* x, int64_t n, int storage, int accumulator, int variant,
                int runs, double* results);

/* ---- softmax -------------------------------------------------------------
 * x, y: rows x cols, row-major, in `dtype` (PL_FP32, PL_BF16 or PL_FP16; bf16
 * and fp16 as raw 16-bit patterns). Arithmetic is fp32 except in
 * the lowp_accum variant. lse (may be NULL): rows log-sum-exp values, each as
 * the method computes it (double on the host API, float on the device API).
 * masked: what a row of all -inf gives: PL_MASKED_NAN (the textbook formula's
 * NaN) or PL_MASKED_ZERO (zeros, log-sum-exp -inf).
 */
/* Variants: the catalog's op "softmax" (softmax.cu declares them). */
enum pl_masked_policy { PL_MASKED_NAN = 0, PL_MASKED_ZERO = 1 };

/* Threads per row of the simple GPU kernels: cols rounded up to a warp,
 * between 32 and 1024. The CPU's bug_zero_identity emulates these lanes. */
int pl_softmax_lanes(int64_t cols);

int pl_softmax_cpu(const void* x, int64_t rows, int64_t cols, int dtype, int variant, int masked, void* y,
                   double* lse);
/* Stable softmax with the sum in the order of a `lanes`-thread GPU block (1..1024). */
int pl_softmax_cpu_lanes(const void* x, int64_t rows, int64_t cols, int dtype, void* y, int lanes);
/* Threads per row the adaptive GPU kernels use: 1024 while rows < sm_count, else
 * 32, at most cols rounded up to a warp. */
int pl_adaptive_lanes(int64_t rows, int64_t cols, int sm_count);
/* The launch a GPU call of `variant` on rows x cols gets (16-byte aligned
 * pointers assumed): the variant actually run (a fallback may differ), the
 * kernel (softmax.cu's numbered versions) it launches, vectors a thread (0: not vectorised), threads a block, rows
 * a block and thread blocks a cluster. sm_count: the device's SMs. */
typedef struct {
    int32_t variant, kernel, vpt, threads, rows_per_block, cluster;
} pl_softmax_plan;
int pl_softmax_cuda_plan(int64_t rows, int64_t cols, int dtype, int variant, int sm_count, pl_softmax_plan* plan);
/* Host pointers; uploads, runs, downloads. */
int pl_softmax_cuda(const void* x, int64_t rows, int64_t cols, int dtype, int variant, int masked, void* y,
                    double* lse);
/* Device pointers; asynchronous on the legacy default stream. lse_dev may be NULL. */
int pl_softmax_cuda_device(const void* x_dev, int64_t rows, int64_t cols, int dtype, int variant, int masked,
                           void* y_dev, float* lse_dev);

/* ---- the ops engines most often get wrong in precision ---------------------
 * Host functions take host pointers, _cuda functions device pointers (launched
 * asynchronously on the legacy default stream). Storage fp32, bf16 or fp16,
 * arithmetic fp32, each result rounded once to the storage format.
 *
 * SwiGLU (swiglu.cu): y = silu(gate) * up over n values. */
int pl_swiglu_cpu(const void* gate, const void* up, int64_t n, int dtype, void* y);
int pl_swiglu_cuda(const void* gate_dev, const void* up_dev, int64_t n, int dtype, void* y_dev);
/* RoPE, rotate-half layout (rope.cu): x rows x dim (even), pos[rows] positions,
 * base (10000 in Llama 2). phase: the format of inv_freq, the angles and
 * cos/sin: PL_FP32, or PL_BF16 / PL_FP16 to show the long-position pitfall. */
int pl_rope_cpu(const void* x, int64_t rows, int64_t dim, int dtype, const int64_t* pos, float base, int phase, void* y);
int pl_rope_cuda(const void* x_dev, int64_t rows, int64_t dim, int dtype, const int64_t* pos_dev, float base, int phase,
                 void* y_dev);
/* Scaled dot-product attention (attention.cu): q bh x tq x d, k bh x tk x d,
 * v bh x tk x dv, y bh x tq x dv. Key j is visible to query i when
 * j >= kv_start[b] (NULL: 0) and, if causal, j <= i + tk - tq. A query that
 * sees no key gets zeros. The GPU version takes tk <= 8192. */
int pl_attention_cpu(const void* q, const void* k, const void* v, int64_t bh, int64_t tq, int64_t tk, int64_t d,
                     int64_t dv, int dtype, int causal, const int32_t* kv_start, float scale, void* y);
int pl_attention_cuda(const void* q_dev, const void* k_dev, const void* v_dev, int64_t bh, int64_t tq, int64_t tk,
                      int64_t d, int64_t dv, int dtype, int causal, const int32_t* kv_start_dev, float scale,
                      void* y_dev);

/* ---- RMSNorm and LayerNorm over the last dimension --------------------------
 * x, y: rows x cols; w, b: cols (may be NULL: no scale / no shift); all in
 * `dtype` (fp32, bf16, fp16). Statistics in fp32. */
/* Variants of pl_rmsnorm_cuda: the catalog's op "rmsnorm" (norms.cu). */
int pl_rmsnorm_cpu(const void* x, int64_t rows, int64_t cols, int dtype, const void* w, float eps, void* y);
int pl_layernorm_cpu(const void* x, int64_t rows, int64_t cols, int dtype, const void* w, const void* b, float eps,
                     void* y);
/* RMSNorm with the statistic summed in the order of a `lanes`-thread GPU block. */
int pl_rmsnorm_cpu_lanes(const void* x, int64_t rows, int64_t cols, int dtype, const void* w, float eps, void* y,
                         int lanes);
/* Device pointers; asynchronous on the legacy default stream. */
int pl_rmsnorm_cuda(const void* x_dev, int64_t rows, int64_t cols, int dtype, const void* w_dev, float eps,
                    void* y_dev, int variant);
int pl_layernorm_cuda(const void* x_dev, int64_t rows, int64_t cols, int dtype, const void* w_dev,
                      const void* b_dev, float eps, void* y_dev);

/* ---- matmul: C = A @ B, row-major, fp32 accumulation ------------------------ */
/* Variants of pl_matmul_cuda: the catalog's op "matmul" (matmul.cu). */
int pl_matmul_cpu(const void* a, const void* b, int64_t m, int64_t n, int64_t k, int dtype, void* c);
/* fp32 workspace the split-K versions need (0 for the others). */
int pl_matmul_workspace_bytes(int64_t m, int64_t n, int variant, int splits, size_t* bytes);
/* Device pointers; asynchronous on the legacy default stream. */
int pl_matmul_cuda(const void* a_dev, const void* b_dev, int64_t m, int64_t n, int64_t k, int dtype, int variant,
                   int splits, void* work_dev, size_t work_bytes, void* c_dev);

/* ---- matmul under an accumulator model (matmul_accumulator.cu) ---------------
 * How a matmul's dot products are carried, bit for bit as
 * precisionlab/numerics/accumulators.py's docstring defines each model:
 *   PL_ACC_EXACT          the exact sum, rounded once to fp32
 *   PL_ACC_FP32           IEEE sequential: c = fp32(c + fp32(a_k b_k))
 *   PL_ACC_FP32_PAIRWISE  adjacent pairs level by level, in fp32
 *   PL_ACC_HOPPER_FP8     a tensor core's fused dot-add (MMA-Sim's Hopper
 *                         model): groups of `group` products and c aligned
 *                         to their largest alignment exponent (`align`), cut
 *                         to `bits` bits (`rounding`), summed exactly, the sum
 *                         cut to `out_bits` significant bits (`rounding`)
 *   PL_ACC_PROMOTE        chunks of `interval` k by PL_ACC_HOPPER_FP8 from +0,
 *                         added in fp32
 * order: PL_ORDER_AS_GIVEN (k ascending) or PL_ORDER_REVERSED. bits (1..40,
 * with (group + 1) 2^(bits + 1) < 2^53), group (>= 1), rounding, align and
 * out_bits (1..24) are read by the hopper-fp8 and promote kinds only,
 * interval (>= 1) by promote only.
 * The names are the library's: pl_accumulator_kind_info and
 * pl_accumulator_rounding_info give them (the Python spellings). */
enum pl_accumulator_kind { PL_ACC_EXACT = 0, PL_ACC_FP32 = 1, PL_ACC_FP32_PAIRWISE = 2, PL_ACC_HOPPER_FP8 = 3,
                           PL_ACC_PROMOTE = 4, PL_ACC_KIND_COUNT_ = 5 };
/* trunc: toward zero (sign-magnitude); rne: nearest, ties to even; floor: toward -inf, as an arithmetic
 * (sign-filling) right shift of a two's-complement term cuts it. */
enum pl_accumulator_rounding { PL_ACC_TRUNC = 0, PL_ACC_RNE = 1, PL_ACC_FLOOR = 2, PL_ACC_ROUNDING_COUNT_ = 3 };
/* A product's alignment exponent: product, its factors' exponents summed (each at least its format's smallest
 * normal one; the hardware's); value, floor(log2 |a b|) of the exact product. */
enum pl_accumulator_align { PL_ACC_ALIGN_PRODUCT = 0, PL_ACC_ALIGN_VALUE = 1, PL_ACC_ALIGN_COUNT_ = 2 };
typedef struct {
    int32_t kind;     /* pl_accumulator_kind */
    int32_t bits;     /* bits kept of the group's largest term */
    int32_t group;    /* products fused per step */
    int32_t rounding; /* pl_accumulator_rounding of the cut */
    int64_t interval; /* promote: k per chunk */
    int32_t order;    /* pl_input_order: PL_ORDER_AS_GIVEN or PL_ORDER_REVERSED */
    int32_t align;    /* pl_accumulator_align */
    int32_t out_bits; /* significant bits of each step's result, 1..24 (Hopper FP8: 14) */
} pl_accumulator;
/* The kind's / rounding's / alignment's name (static text) in *name. */
int pl_accumulator_kind_info(int id, const char** name);
int pl_accumulator_rounding_info(int id, const char** name);
int pl_accumulator_align_info(int id, const char** name);
/* C = A @ B, row-major: a m x k, b k x n, c m x n, all fp32 arrays; every
 * value of a and b must be a value of `format` (PL_FP32, PL_TF32, PL_BF16,
 * PL_FP16, PL_FP8_E4M3, PL_FP8_E5M2; the host checks, naming the first that is
 * not). Each output is computed by the model alone: no other rounding. NaN or
 * inf inputs (outside the models' domain) give NaN under exact, hopper-fp8 and
 * promote, IEEE's result under fp32 and fp32-pairwise. */
int pl_matmul_acc_cpu(const float* a, const float* b, int64_t m, int64_t n, int64_t k, int format,
                      const pl_accumulator* acc, float* c);
/* The same outputs, bit for bit, on the GPU (variants: the catalog's op
 * "matmul_acc"). Device pointers, acc a host pointer; asynchronous on the
 * legacy default stream; the values are not checked against the format. */
int pl_matmul_acc_cuda(const float* a_dev, const float* b_dev, int64_t m, int64_t n, int64_t k, int format,
                       const pl_accumulator* acc, float* c_dev, int variant);

/* ---- FlashAttention's forward pass, one head (flash_attention.cu) ----------
 * Tiled online softmax bit for bit as precisionlab/numerics/flash_attention.py
 * defines it, at its knobs below and fp32 everywhere else (inputs, Q.K^T and
 * P.V accumulated by the fp32 model, one split). q rows x d, k keys x d,
 * v keys x dv, out rows x dv, all fp32 row-major; lse (may be NULL): rows
 * log-sum-exp values (natural log). Row i sees key j unless causal and
 * j > i + keys - rows (causal needs rows <= keys). */
typedef struct {
    int32_t block_r, block_c;  /* Br query rows a block, Bc keys a tile: 1..1024 */
    int32_t p_format;          /* P's format: PL_FP32, PL_BF16, PL_FP16, PL_FP8_E4M3, PL_FP8_E5M2 (FP8 saturating) */
    int32_t causal;            /* 0 or 1 */
    float max_offset;          /* log2 units, [0, 64]: P in (0, 2^max_offset] */
    float rescale_threshold;   /* log2 units, [0, 64]: rescale only when the max grows by more; 0 eager */
    float p_scale;             /* > 0: P multiplied before its cast, undone at the end (1: none) */
    double softmax_scale;      /* > 0; 0: 1 / sqrt(d) */
} pl_flash_config;
int pl_flash_attention_cpu(const float* q, const float* k, const float* v, int64_t rows, int64_t keys, int64_t d,
                           int64_t dv, const pl_flash_config* cfg, float* out, float* lse);
/* The dynamic shared memory a GPU block takes at these tiles (the GPU call
 * refuses more than 227 KiB). */
int pl_flash_attention_shared_bytes(int64_t d, int64_t dv, const pl_flash_config* cfg, size_t* bytes);
/* The same outputs, bit for bit, on the GPU (variants: the catalog's op
 * "flash_attention"). Device pointers (lse_dev may be NULL), cfg a host
 * pointer; asynchronous on the legacy default stream. */
int pl_flash_attention_cuda(const float* q_dev, const float* k_dev, const float* v_dev, int64_t rows, int64_t keys,
                            int64_t d, int64_t dv, const pl_flash_config* cfg, float* out_dev, float* lse_dev,
                            int variant);

/* ---- all-reduce order: CPU replay (allreduce.cu) ------------------------------
 * partials: ranks * n doubles, rank r's vector at partials[r * n]; each must be
 *    a value of `format` (NaN allowed). out: n doubles, the sums.
 * Every addition is rounded once to `format`. order ring: element i
 *    sits at position offset + i of a buffer cut into chunks of `chunk`
 *    elements, chunk c finished by rank c and begun at rank c + step (step 1 or
 *    -1; gloo's ring is -1); (offset + n - 1) / chunk must be < ranks.
 *    tree: adjacent pairs level by level (offset, chunk, step unused). */
/* order: the catalog's op "allreduce" (allreduce.cu declares ring and tree). */
int pl_allreduce_cpu(const double* partials, int ranks, int64_t n, int format, int order, int64_t offset,
                     int64_t chunk, int step, double* out);
/* ---- block-scaled formats (blockscale.cu) -----------------------------------
 * Element formats are minifloats described by bits, not bytes. Codes are
 * stored one per byte (the low `bits` bits; a packed layout is a storage
 * detail these experiments do not need); scales one byte per block.
 * OCP Microscaling (MX) v1.0: element formats e4m3, e5m2, e2m3, e3m2, e2m1
 * with one e8m0 scale (2^(code - 127), code 255 NaN) per block of 32.
 * NVFP4 (NVIDIA): e2m1 elements, one e4m3 scale per block of 16, and an fp32
 * per-tensor decode scale. Each format and rule is declared once, in
 * blockscale.cu's tables, and exported by the *_info functions below. */
enum pl_minifloat {
    PL_MF_E2M1 = 0, /* fp4: bias 1, max 6, no inf, no NaN */
    PL_MF_E2M3 = 1, /* fp6: bias 1, max 7.5, no inf, no NaN */
    PL_MF_E3M2 = 2, /* fp6: bias 3, max 28, no inf, no NaN */
    PL_MF_E4M3 = 3, /* fp8 e4m3fn: bias 7, max 448, NaN = S.1111.111, no inf */
    PL_MF_E5M2 = 4, /* fp8 e5m2: bias 15, max 57344, IEEE inf and NaN */
    PL_MF_E8M0 = 5, /* scale: unsigned, 2^(code - 127), code 255 NaN, no zero */
    PL_MINIFLOAT_COUNT_ = 6
};
struct pl_minifloat_desc {
    const char* name;
    int bits, ebits, mbits; /* total, exponent and stored mantissa bits (sign = bits - ebits - mbits) */
    int bias, emin, emax;   /* exponent bias; exponents of the smallest and largest normal */
    double max;             /* largest finite value */
    double min_subnormal;   /* smallest positive value */
    int has_inf, has_nan;
};
int pl_minifloat_info(int id, struct pl_minifloat_desc* out);

enum pl_block_format {
    PL_MXFP8_E4M3 = 0,
    PL_MXFP8_E5M2 = 1,
    PL_MXFP6_E2M3 = 2,
    PL_MXFP6_E3M2 = 3,
    PL_MXFP4 = 4,
    PL_NVFP4 = 5,
    PL_BLOCK_FORMAT_COUNT_ = 6
};
struct pl_block_format_desc {
    const char* name;
    int element;           /* pl_minifloat of the elements */
    int block;             /* the format's block size (others may be asked for) */
    int scale;             /* pl_minifloat of the block scale: PL_MF_E8M0 or PL_MF_E4M3 */
    int tensor_scale_bits; /* 32: an fp32 per-tensor scale as well (NVFP4); 0: none */
};
int pl_block_format_info(int id, struct pl_block_format_desc* out);

/* How a block's scale is chosen from its largest magnitude amax (exact
 * integer arithmetic on amax's bits; blockscale.cu's header says exactly). */
enum pl_scale_rule {
    PL_SCALE_FLOOR = 0,   /* OCP: 2^(floor(log2 amax) - emax_elem) */
    PL_SCALE_RCEIL = 1,   /* NVIDIA: the smallest 2^e with amax / 2^e <= max_elem */
    PL_SCALE_CEIL = 2,    /* 2^(ceil(log2 amax) - emax_elem) */
    PL_SCALE_EVEN = 3,    /* FLOOR of amax rounded to the element's mantissa bits */
    PL_SCALE_NEAREST = 4, /* NVFP4 only: e4m3 nearest-even of amax / 6 times the tensor scale */
    PL_SCALE_RULE_COUNT_ = 5
};
/* The rule's name (static text) in *name. */
int pl_scale_rule_info(int id, const char** name);

/* Quantize n fp32 values: codes[n] element codes, scales[ceil(n / block)]
 * scale codes. block: 1..1024; a last partial block is scaled by its own
 * elements alone (as if padded with zeros). rule: PL_SCALE_FLOOR..EVEN for
 * the MX formats, PL_SCALE_NEAREST for NVFP4. tensor_amax (NVFP4 only, else
 * ignored): the amax the per-tensor scale is computed from, >= 0 or NaN;
 * tensor_scale (NVFP4: required, host pointer; else may be NULL): the fp32
 * per-tensor decode scale written. A block holding NaN or inf gets the NaN
 * scale and zero element codes. */
int pl_blockscale_quantize_cpu(const float* x, int64_t n, int format, int block, int rule, float tensor_amax,
                               uint8_t* codes, uint8_t* scales, float* tensor_scale);
/* y[i] = element(codes[i]) * scale(block of i) (* tensor_scale for NVFP4), fp32. */
int pl_blockscale_dequantize_cpu(const uint8_t* codes, const uint8_t* scales, float tensor_scale, int64_t n,
                                 int format, int block, float* y);
/* Device pointers (tensor_scale: a host pointer); asynchronous on the legacy
 * default stream. version 1: a thread per block, 2: a warp per block. */
int pl_blockscale_quantize_cuda(const float* x_dev, int64_t n, int format, int block, int rule, float tensor_amax,
                                uint8_t* codes_dev, uint8_t* scales_dev, float* tensor_scale, int variant);
/* version 1: a thread per element. */
int pl_blockscale_dequantize_cuda(const uint8_t* codes_dev, const uint8_t* scales_dev, float tensor_scale, int64_t n,
                                  int format, int block, float* y_dev, int variant);

#ifdef __cplusplus
}
#endif
#endif /* PRECISIONLAB_H */
