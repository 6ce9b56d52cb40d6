"""scripts/sass_check.py's reading of SASS, on small made-up listings, so the
static check itself can fail (make sass-check runs it on the real library)."""

import importlib.util
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location("sass_check", Path(__file__).parent.parent / "scripts" / "sass_check.py")
sc = importlib.util.module_from_spec(spec)
sys.modules["sass_check"] = sc  # dataclasses look their module up
spec.loader.exec_module(sc)


def kernel(lines, name="void (anonymous namespace)::softmax_single_pass<float, 1>(float const*)"):
    k = sc.Kernel("m", name=name)
    text = "\n".join(f"        /*{16 * i:04x}*/                   {ln} ;" for i, ln in enumerate(lines))
    sc.parse_sass("\t\tFunction : m\n" + text, {"m": k})
    return k


LOADS_FIRST = ["LDG.E.128 R4, desc[UR4][R2.64]", "LDG.E.128 R8, desc[UR4][R6.64]", "FMNMX.NAN R0, R4, R5, !PT",
               "SHFL.BFLY PT, R1, R0, 0x10, 0x1f", "STG.E.128 desc[UR4][R2.64], R4"]


def test_loads_issued_first_pass():
    k = kernel(LOADS_FIRST)
    sc.check_single_pass(k)
    assert k.problems == [] and k.elems == 8 and k.body == 5


def test_a_use_between_loads_is_flagged():
    k = kernel(["LDG.E.128 R4, desc[UR4][R2.64]", "FMNMX.NAN R0, R4, R5, !PT", "LDG.E.128 R8, desc[UR4][R6.64]",
                "SHFL.BFLY PT, R1, R0, 0x10, 0x1f", "STG.E.128 desc[UR4][R2.64], R4"])
    sc.check_single_pass(k)
    assert any("reads loaded R4" in p for p in k.problems)


def test_a_load_after_the_first_shuffle_is_flagged():
    k = kernel(["LDG.E.128 R4, desc[UR4][R2.64]", "SHFL.BFLY PT, R1, R0, 0x10, 0x1f",
                "LDG.E.128 R8, desc[UR4][R6.64]", "STG.E.128 desc[UR4][R2.64], R4"])
    sc.check_single_pass(k)
    assert any("after the first shuffle" in p for p in k.problems)


def test_marginal_instructions_per_element_cancel_the_fixed_cost():
    a = kernel(LOADS_FIRST)  # 8 elements, body 5
    b = kernel(LOADS_FIRST[:2] + ["LDG.E.128 R12, desc[UR4][R6.64]"] + LOADS_FIRST[2:4] + ["FADD R1, R1, R2"] * 7
               + LOADS_FIRST[4:],
               name="void (anonymous namespace)::softmax_single_pass<float, 2>(float const*)")
    for k in (a, b):
        sc.check_single_pass(k)
    sc.single_pass_marginals([a, b])
    assert b.ipe == (13 - 5) / (12 - 8) and a.ipe is None


def test_streaming_loop_counts_the_trip():
    k = kernel(["MOV R0, RZ", "LDG.E.128 R4, desc[UR4][R2.64]", "FADD R0, R0, R4", "FADD R0, R0, R5",
                "FADD R0, R0, R6", "FADD R0, R0, R7", "BRA 0x10", "EXIT"],
               name="void (anonymous namespace)::sum_blocks_kernel<float, 1, false, 0>(float const*)")
    sc.check_streaming(k)
    assert k.ipe == 6 / 4


def test_spills_fail():
    k = sc.parse_resources("Function m:\nREG:64 STACK:16 SHARED:0 LOCAL:8 SAMPLERS:0")["m"]
    assert (k.stack, k.local) == (16, 8)


def test_an_allowed_stack_frame_needs_its_reason_and_no_local_memory():
    assert "rope_v1" in sc.STACK_ALLOWED and sc.STACK_ALLOWED["rope_v1"][1]
    k = sc.Kernel("m", name="void (anonymous namespace)::rope_v1<float>(float const*)", stack=32)
    assert k.family == "rope_v1"


def test_two_ctas_an_sm_need_at_most_64_registers():
    # 65536 registers an SM, 256 a warp at a time: 64 a thread leave room for
    # two 512-thread CTAs, 65 (allocated as 72) for one
    assert [sc.ctas_per_sm(r) for r in (32, 63, 64, 65, 72)] == [4, 2, 2, 1, 1]
    k = sc.Kernel("m", name="void (anonymous namespace)::softmax_cluster<float, 8>(float const*)", regs=65)
    sc.check_residency(k)
    assert k.ctas_per_sm == 1 and any("not two" in p for p in k.problems)
    k = sc.Kernel("m", name="void (anonymous namespace)::softmax_single_pass<float, 8>(float const*)", regs=64)
    sc.check_residency(k)
    assert k.ctas_per_sm == 2 and k.problems == []


def test_the_rules_come_from_the_librarys_variant_rows():
    from precisionlab import native

    rules = sc.rules_from(native.catalog())
    assert set(rules) == {c.kernel for v in native.catalog() for c in v.sass_ceiling}
    # what each family gets, as the kernels' comments in softmax.cu and sum_cuda.cu say
    assert rules["softmax_single_pass"].checks == {"single_pass", "two_an_sm"}
    assert rules["softmax_warp_rows"].checks == {"single_pass"}
    assert rules["sum_blocks_kernel"].checks == {"streaming"}
    assert set(rules["sum_blocks_kernel"].ceilings) == {"fp64", "fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"}
    k = sc.Kernel("m", name="void (anonymous namespace)::softmax_single_pass<__nv_bfloat16, 2>(__nv_bfloat16 const*)")
    assert sc.ceiling(k, rules) == rules["softmax_single_pass"].ceilings["bf16"]
    assert sc.ceiling(sc.Kernel("m", name="void (anonymous namespace)::rope_v1<float>(float const*)"), rules) is None


def test_two_variants_that_disagree_on_a_kernel_are_an_error():
    from precisionlab.native import SassCeiling, Variant

    def row(name, ceiling):
        return Variant("sum", name, 0, "kernel", ("cuda",), "as_given", None, True, False, "",
                       ("fp32",), (SassCeiling("k", ("streaming",), ("fp32",), ceiling),))
    assert sc.rules_from([row("a", 18.0), row("b", 18.0)])["k"].ceilings == {"fp32": 18.0}
    import pytest

    with pytest.raises(ValueError, match="ceiling"):
        sc.rules_from([row("a", 18.0), row("b", 19.0)])


def test_shared_loops_take_the_innermost_loop_reading_the_most_shared_memory():
    # an outer loop (0x00-0x60) around an inner one (0x10-0x40) that reads two
    # fp32 values a trip: 4 instructions / 2 elements; the outer one, reading more, is not counted
    k = kernel(["MOV R0, RZ", "LDS R4, [R2]", "LDS R5, [R3]", "FFMA R0, R4, R5, R0", "BRA 0x10", "LDS R6, [R9]",
                "BRA 0x0", "EXIT"], name="void (anonymous namespace)::flash_tiled<float>(float const*)")
    sc.check_shared_loops(k)
    assert k.ipe == 4 / 2 and not k.problems


def test_shared_loops_without_one_is_a_problem():
    k = kernel(["MOV R0, RZ", "BRA 0x0", "EXIT"], name="void (anonymous namespace)::flash_tiled<float>(float const*)")
    sc.check_shared_loops(k)
    assert k.problems
