"""The quantisation yardstick for `compare engine-layers --engine llamacpp:FILE`
where FILE's weights are quantised (issue 40, 5).

Judged by fp32's rounding, a q8_0 engine departs at every module by 1e5x:
q8_0 doing what it should. The yardstick here is what the quantisation costs
REF: REF run in fp32 with each weight quantised as the GGUF holds it (its type
read from the GGUF through the gguf package, the values REF's own, quantised
and dequantised by gguf's reference quantiser: for an honest export, exactly
the GGUF's own tensors, which is checked tensor by tensor). Per module:

  (2) REF quantised vs REF fp32     what the quantisation costs there;
  (3) YOURS vs REF quantised        what the engine adds on top (its own
                                    activation quantisation, its kernels, a bug).

A bug planted on top of the quantised weights then departs from (2) at its
module, and shows in the tensor check as a GGUF tensor that is not REF's
weight quantised. The fp32 and low-dtype views of such an engine are what
quantisation costs, shown and never judged.

llama.cpp also rounds each quantised matmul's input: to its weights' "vec
dot" type, 8-bit blocks (Q8_0 or Q8_1 of 32 values with a half-precision
scale, Q8_K of 256 with a float one). REF quantised does the same (a pre-hook
on each such Linear), so the yardstick holds where the weights cost nothing:
a reference folder made from the GGUF itself (`export llamacpp:FILE --to hf`
holds its dequantised values, which quantise back exactly) still measures
the activations' rounding, which is what the engine's departure is.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from precisionlab.catalog import formats

UNQUANTISED = ("F32", "F64")  # GGUF types that hold REF's fp32 values as they are
# Plain float types are no quantisation this yardstick models: llama.cpp then
# converts the activations to the weights' type too, which REF with rounded
# weights does not (the embedded model's bf16-exact weights in a BF16 GGUF
# would have a yardstick of 0 and every module "inf x"). Only block types
# (Q8_0, Q4_1, ...) get the view, whose activations llama.cpp quantises to
# Q8 blocks at about the weights' own cost.
FLOAT_TYPES = ("F32", "F64", "F16", "BF16")
# The weights' type -> the 8-bit blocks llama.cpp's CPU matmul rounds the activations to (ggml-cpu's
# type traits' vec_dot_type): (block length, the scale's dtype). Q8_0 and Q8_1 hold the same values.
Q8_32, Q8_K = (32, "float16"), (256, "float32")
ACTIVATIONS = {"Q4_0": Q8_32, "Q4_1": Q8_32, "Q5_0": Q8_32, "Q5_1": Q8_32, "Q8_0": Q8_32, "Q8_1": Q8_32,
               "Q2_K": Q8_K, "Q3_K": Q8_K, "Q4_K": Q8_K, "Q5_K": Q8_K, "Q6_K": Q8_K}


@dataclass
class Plan:
    path: str
    view: str                                   # the most common quantised type: "q8_0" ("bf16-weights")
    types: dict[str, object]                    # GGUF tensor name -> gguf.GGMLQuantizationType
    tensors: dict[str, object] = field(repr=False, default_factory=dict)  # GGUF name -> the reader's tensor
    permuted: dict[str, int] = field(default_factory=dict)  # q_proj/k_proj -> heads: llama's rows permuted
    differ: dict[str, dict] = field(default_factory=dict)  # REF weight -> weight_check: the GGUF's is not it quantised


def gguf_path(spec: str | None) -> str | None:
    """The GGUF file of a llamacpp:FILE[,options] spec, else None."""
    from precisionlab.engines import registry

    kind, arg = registry.parse(spec)
    return arg.split(",")[0] if kind == "llamacpp" and arg else None


def plan(spec: str | None) -> Plan | None:
    """The yardstick's plan for an engine spec: None unless it is a GGUF with
    at least one quantised tensor."""
    path = gguf_path(spec)
    if path is None:
        return None
    import gguf

    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    types = {n: t.tensor_type for n, t in tensors.items()}
    quantised = Counter(t.name for n, t in types.items() if t.name not in FLOAT_TYPES and len(tensors[n].shape) > 1)
    if not quantised:
        return None
    view = quantised.most_common(1)[0][0].lower()
    if formats.find(view) is not None:  # never the same key as a --dtypes view
        view += "-weights"
    return Plan(path, view, types, tensors, _permuted(reader))


def _field(reader, key: str):
    f = reader.fields.get(key)
    return None if f is None else f.parts[f.data[0]]


def _permuted(reader) -> dict[str, int]:
    """A llama GGUF holds q/k rows in interleaved-pair order (its converters permute transformers' rows;
    transformers' loader undoes it): the head counts that permutation used, for the tensor check."""
    arch = _field(reader, "general.architecture")
    if arch is None or bytes(arch).decode() != "llama":
        return {}
    q, kv = _field(reader, "llama.attention.head_count"), _field(reader, "llama.attention.head_count_kv")
    if q is None:
        return {}
    return {"q_proj": int(q[0]), "k_proj": int(kv[0] if kv is not None else q[0])}


def _roundtrip(data: np.ndarray, qtype) -> np.ndarray:
    import gguf

    if qtype.name in UNQUANTISED:
        return data
    return gguf.quants.dequantize(gguf.quants.quantize(data, qtype), qtype).reshape(data.shape)


def reference_copy(model, p: Plan) -> tuple[object, list[str], dict[str, dict]]:
    """(REF's fp32 model with every weight quantised as the GGUF holds it,
    the weights that could not be (no GGUF counterpart or no quantiser),
    the GGUF tensors that are not REF's weight quantised the same way: name ->
    weight_check's measures)."""
    import gguf
    import torch

    from precisionlab.engines.exporters.gguf import gguf_name

    m = copy.deepcopy(model).float()
    kept, differ = [], {}
    with torch.no_grad():
        for name, param in m.named_parameters():
            g = gguf_name(name)
            if g not in p.types and name == "lm_head.weight":
                g = "token_embd.weight"  # a tied head: llama.cpp reuses the embedding
            if g not in p.types:
                kept.append(name)
                continue
            data = param.detach().numpy().astype(np.float32)
            try:
                q = _roundtrip(data, p.types[g])
            except (NotImplementedError, gguf.quants.QuantError, ValueError):
                kept.append(name)
                continue
            param.copy_(torch.from_numpy(np.ascontiguousarray(q, dtype=np.float32)))
            own = _own(p, name, g, q.shape)
            if own is None or not np.array_equal(own, q):
                differ[name] = weight_check(own, q, data)
    _round_activations(m, p)
    return m, kept, differ


def _own(p: Plan, name: str, g: str, shape) -> np.ndarray | None:
    """The GGUF's tensor dequantised, in REF's row order (a llama GGUF's q/k rows un-permuted); None where
    its size is not REF's."""
    import gguf

    t = p.tensors[g]
    own = gguf.quants.dequantize(t.data, t.tensor_type) if t.tensor_type.name not in UNQUANTISED \
        else np.asarray(t.data, dtype=np.float32)
    if own.size != int(np.prod(shape)):
        return None
    own = own.reshape(shape)
    proj = name.split(".")[-2]
    if proj in p.permuted and name.endswith(".weight"):
        # the inverse of exporters/gguf._permute: interleaved pairs back to rotate-half halves, per head
        rows, heads = shape[0], p.permuted[proj]
        own = own.reshape(heads, rows // heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
    return own


def weight_check(own: np.ndarray | None, q: np.ndarray, ref: np.ndarray) -> dict:
    """A GGUF weight that is not REF's quantised: its rel-L2 from REF's quantised weight (`error`), what the
    quantisation costs REF's weight (`yardstick`: REF quantised vs REF), and the fit own = s x REF quantised
    with its z over the weight's elements (spread: the larger of the two rel-L2s, so a weight that quantises
    back exactly still has one)."""
    from precisionlab.numerics import compare, divergence

    if own is None:
        return {"error": None, "yardstick": None, "scale_fit": None, "bias_z": None}
    err, cost = compare.rel_l2(own, q), compare.rel_l2(q, ref)
    s, z = divergence.scale_fit(own.reshape(-1), q.reshape(-1), max(err, cost))
    return {"error": err, "yardstick": cost, "scale_fit": s, "bias_z": z}


def _round_activations(model, p: Plan) -> None:
    """Each Linear whose GGUF weight is block-quantised gets its input rounded as llama.cpp rounds it."""
    from torch import nn

    from precisionlab.engines.exporters.gguf import gguf_name

    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear):
            continue
        g = gguf_name(f"{name}.weight")
        if g not in p.types and name == "lm_head":
            g = "token_embd.weight"
        act = ACTIVATIONS.get(p.types[g].name) if g in p.types else None
        if act is not None:
            mod.register_forward_pre_hook(lambda _m, args, act=act: (q8_blocks(args[0], *act), *args[1:]))


def q8_blocks(x, block: int, scale_dtype: str):
    """x rounded to llama.cpp's 8-bit activation blocks along its last axis: d = max|x| / 127 per block,
    q = round(x / d), x' = q * d with d stored in `scale_dtype` (ggml's quantize_row_q8_0/q8_1/q8_K)."""
    import torch

    shape = x.shape
    if shape[-1] % block:
        return x
    b = x.float().reshape(*shape[:-1], shape[-1] // block, block)
    d = b.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    q = torch.round(b * inv)
    return (q * d.to(getattr(torch, scale_dtype)).float()).reshape(shape).to(x.dtype)
