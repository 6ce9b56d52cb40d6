"""The quantisation yardstick for `compare layers --engine llamacpp:FILE`
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


@dataclass
class Plan:
    path: str
    view: str                                   # the most common quantised type: "q8_0" ("bf16-weights")
    types: dict[str, object]                    # GGUF tensor name -> gguf.GGMLQuantizationType
    tensors: dict[str, object] = field(repr=False, default_factory=dict)  # GGUF name -> the reader's tensor


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
    return Plan(path, view, types, tensors)


def _roundtrip(data: np.ndarray, qtype) -> np.ndarray:
    import gguf

    if qtype.name in UNQUANTISED:
        return data
    return gguf.quants.dequantize(gguf.quants.quantize(data, qtype), qtype).reshape(data.shape)


def reference_copy(model, p: Plan) -> tuple[object, list[str], list[str]]:
    """(REF's fp32 model with every weight quantised as the GGUF holds it,
    the weights that could not be (no GGUF counterpart or no quantiser),
    the GGUF tensors that are not REF's weight quantised the same way)."""
    import gguf
    import torch

    from precisionlab.engines.exporters.gguf import gguf_name

    m = copy.deepcopy(model).float()
    kept, differ = [], []
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
            t = p.tensors[g]
            own = gguf.quants.dequantize(t.data, t.tensor_type) if t.tensor_type.name not in UNQUANTISED \
                else np.asarray(t.data, dtype=np.float32)
            if own.size != q.size or not np.array_equal(own.reshape(q.shape), q):
                differ.append(name)
    return m, kept, differ
