/*
 * catalog.cu: what the library implements, exported once.
 *  - pl_variant_count / pl_variant_info walk the kernel variants, which each
 *    cuda/<op>.cu declares beside its code (PL_DECLARE_VARIANTS, common.cuh)
 *    and registers when the library loads;
 *  - pl_fmt describes the arithmetic formats of PL_FORMATS.
 * Python builds its records from these (precisionlab/native.py), so the CLI's
 * choices, --help, bench, info and the tests iterate one table.
 */
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common.cuh"

namespace {

struct op_table {
    const char* op;
    const pl_variant_row* rows;
    int count;
};

// Filled by static initialisers while the library loads (one thread), read
// afterwards; kept sorted by op name, and an op's lists (the sum declares one
// in accumulate.cu, one in sum_cuda.cu) by their first id, so the order does
// not depend on link order.
constexpr int kMaxOps = 32;
op_table g_ops[kMaxOps];
int g_op_count = 0;

}  // namespace

int pl_catalog_register(const char* op, const pl_variant_row* rows, int count) {
    if (g_op_count == kMaxOps) std::abort();  // a build-time limit: raise kMaxOps
    int i = g_op_count++;
    const auto after = [&](const op_table& t) {
        const int c = std::strcmp(t.op, op);
        return c > 0 || (c == 0 && count > 0 && t.count > 0 && t.rows[0].id > rows[0].id);
    };
    while (i > 0 && after(g_ops[i - 1])) {
        g_ops[i] = g_ops[i - 1];
        --i;
    }
    g_ops[i] = {op, rows, count};
    return 0;
}

const pl_variant_row* pl_catalog_find(const char* op, int id) {
    for (int t = 0; t < g_op_count; ++t) {
        if (std::strcmp(g_ops[t].op, op) != 0) continue;
        for (int r = 0; r < g_ops[t].count; ++r)
            if (g_ops[t].rows[r].id == id && g_ops[t].rows[r].order == PL_ORDER_AS_GIVEN) return &g_ops[t].rows[r];
    }
    return nullptr;
}

int pl_check_variant(const char* op, int id, int device, const char* func) {
    const pl_variant_row* v = pl_catalog_find(op, id);
    if (!v) return pl_fail(PL_ERR_INVALID_ARGUMENT, func, "unknown %s variant %d", op, id);
    if (!(v->devices & device))
        return pl_fail(PL_ERR_UNSUPPORTED, func, "%s variant %s does not run on the %s", op, v->name,
                       device == PL_ON_CPU ? "CPU" : "GPU");
    return PL_OK;
}

extern "C" int pl_variant_count(int* count) {
    PL_REQUIRE_PTR(count);
    int c = 0;
    for (int t = 0; t < g_op_count; ++t) c += g_ops[t].count;
    *count = c;
    return PL_OK;
}

extern "C" int pl_variant_info(int index, pl_variant_desc* out) {
    PL_REQUIRE_PTR(out);
    int k = index;
    for (int t = 0; k >= 0 && t < g_op_count; ++t) {
        if (k < g_ops[t].count) {
            const pl_variant_row& r = g_ops[t].rows[k];
            *out = {g_ops[t].op, r.name, r.id, r.kind, r.devices, r.order, r.batch_invariant, r.deterministic,
                    r.is_default, r.summary, r.dtypes, r.nsass, r.nsass ? r.sass : nullptr};
            return PL_OK;
        }
        k -= g_ops[t].count;
    }
    return pl_fail(PL_ERR_INVALID_ARGUMENT, __func__, "no variant %d", index);
}

extern "C" int pl_format_info(int code, pl_format_desc* out) {
    PL_REQUIRE_PTR(out);
    PL_REQUIRE(pl_valid_format(code), PL_ERR_INVALID_ARGUMENT, "unknown format %d", code);
    const pl_fmt& f = PL_FORMATS[code];
    // emax from max: max = (2 - 2^(1-p)) 2^emax
    const int emax = std::ilogb(f.max);
    *out = {f.name, f.bits, f.precision, f.emin, emax, f.max, std::ldexp(1.0, f.emin - (f.precision - 1)),
            f.has_inf, 1, (int32_t)f.bytes};
    return PL_OK;
}
