"""Dump the output of every module of any torch model to a .safetensors file
that `precisionlab compare tensors` reads: one tensor per module, named by the
module's own name (`model.layers.3.mlp`), in its run's dtype, and the
execution order in the file's metadata, so rows come in the order the model
ran them and the first divergence is the first in that order.

Only torch and safetensors are needed: copy this file into your engine's test
harness.

    from dump_hooks import DumpHooks
    with DumpHooks(model, include=["model.layers.*", "lm_head"]) as dump:
        model(input_ids)                       # one forward pass
    dump.save("yours.safetensors")

What is recorded, per module (the first call in the pass; later calls, as
in generation, are ignored): its output when that is a tensor; else the
`.logits` of a model output; else the first tensor of a tuple, except a
rotary embedding's (cos, sin), stacked as `compare model --dump` does. The
model itself (the name "") is recorded as `root_name` when it is included.

heads=True adds, for each included attention module (one with a `head_dim`
and an output projection `o_proj`, `wo` or `out_proj`), the per-head tensors
of docs/dumps-from-your-engine.md: `<attn>.heads`, the projection's input as
(batch, tokens, heads, head_dim), and `<attn>.probs`, the softmax
probabilities, where the module returns them (transformers' eager attention:
model.set_attn_implementation("eager") first).

    python scripts/dump_hooks.py --demo OUT_DIR   # the files of docs/dumps-from-your-engine.md
"""

from __future__ import annotations

import fnmatch
import json
import sys
from pathlib import Path

import torch

ORDER_KEY = "precisionlab.order"  # what compare tensors reads the order from (precisionlab.io.tensorfiles.ORDER_KEY)


def module_output(out, rotary: bool = False) -> torch.Tensor | None:
    """The tensor a module produced (see the module's docstring), or None."""
    if isinstance(out, torch.Tensor):
        return out
    if rotary and isinstance(out, (tuple, list)) and len(out) == 2:
        return torch.stack([out[0], out[1]])
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, (tuple, list)):
        return next((o for o in out if isinstance(o, torch.Tensor)), None)
    return None


class DumpHooks:
    """Forward hooks on every module whose name matches one of `include`
    (fnmatch globs; all by default); `save` writes what one pass recorded."""

    def __init__(self, model: torch.nn.Module, include=("*",), root_name: str = "lm_head", heads: bool = False):
        self.tensors: dict[str, torch.Tensor] = {}
        self.order: list[str] = []
        self._handles = []
        for name, mod in model.named_modules():
            shown = name or root_name
            if any(fnmatch.fnmatchcase(shown, g) for g in include):
                rotary = type(mod).__name__.endswith("RotaryEmbedding")
                if heads:
                    self._heads(shown, mod)
                self._handles.append(mod.register_forward_hook(self._hook(shown, rotary)))

    def _keep(self, name: str, t) -> None:
        if isinstance(t, torch.Tensor) and name not in self.tensors:
            self.tensors[name] = t.detach().to("cpu", copy=True).contiguous()
            self.order.append(name)

    def _hook(self, name: str, rotary: bool):
        return lambda _mod, _args, out: self._keep(name, module_output(out, rotary))

    def _heads(self, name: str, mod) -> None:
        """An attention module's <name>.heads (its output projection's input, split into heads) and
        <name>.probs (the second thing it returns, where that is a tensor)."""
        proj = next((getattr(mod, p) for p in ("o_proj", "wo", "out_proj") if hasattr(mod, p)), None)
        d = getattr(mod, "head_dim", None)
        if proj is None or not isinstance(d, int):
            return

        def split(_m, args):
            x = args[0]
            self._keep(f"{name}.heads", x.reshape(*x.shape[:-1], x.shape[-1] // d, d))

        def probs(_m, _args, out):
            if isinstance(out, (tuple, list)) and len(out) > 1:
                self._keep(f"{name}.probs", out[1])
        self._handles += [proj.register_forward_pre_hook(split), mod.register_forward_hook(probs)]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []

    def save(self, path, metadata: dict | None = None) -> None:
        from safetensors.torch import save_file

        meta = {ORDER_KEY: json.dumps(self.order), **(metadata or {})}
        save_file(self.tensors, str(path), metadata=meta)


# --- the demo: a reference dump, and an engine's in the engine's own layout -------------------

DEMO_PROMPT = "ROMEO:\nWhat light"
DEMO_MODULES = ["embed", "layers.0.attn", "layers.0", "layers.1.mlp", "layers.1", "lm_head"]


def _demo(out: Path) -> None:
    """fp32.safetensors and bf16.safetensors: precisionlab's embedded char-LM,
    the modules DEMO_MODULES, in the reference layout ([1, T, ...]). engine.safetensors:
    the same model in bf16 with a 10 % scale planted in layers.1.mlp, stored as an
    engine stores it: no batch dimension, attention heads first, each block's output
    in two parts (the residual after attention, and the MLP's output), the LM head
    vocab-parallel in two shards, each [vocab/2, T]."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from precisionlab.engines import charlm

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        model, tok = charlm.load_default(dtype)
        ids = torch.tensor([tok.encode(DEMO_PROMPT)])
        with torch.no_grad(), DumpHooks(model, DEMO_MODULES) as dump:
            model(ids)
        dump.save(out / f"{name}.safetensors")
    model, _ = charlm.load_default(torch.bfloat16)
    model.layers[1].mlp.register_forward_hook(lambda _m, _a, y: y * 1.1)  # the engine's bug
    residual = {}  # each block's residual stream after attention: its MLP norm's input
    for i in (0, 1):
        model.layers[i].mlp_norm.register_forward_pre_hook(lambda _m, a, i=i: residual.setdefault(i, a[0]))
    with torch.no_grad(), DumpHooks(model, ["embed", "layers.0.attn", "layers.*.mlp", "lm_head"]) as d:
        model(ids)
    t = d.tensors
    heads = model.cfg.n_heads
    logits_t = t["lm_head"][0].T  # [vocab, T]
    half = logits_t.shape[0] // 2
    engine = {"engine.embed": t["embed"][0],
              "engine.layers.0.attn": t["layers.0.attn"][0].reshape(ids.shape[1], heads, -1).permute(1, 0, 2),
              "engine.layers.0.residual": residual[0][0], "engine.layers.0.hidden": t["layers.0.mlp"][0],
              "engine.layers.1.mlp": t["layers.1.mlp"][0],
              "engine.layers.1.residual": residual[1][0], "engine.layers.1.hidden": t["layers.1.mlp"][0],
              "engine.lm_head.shard0": logits_t[:half], "engine.lm_head.shard1": logits_t[half:]}
    from safetensors.torch import save_file

    save_file({k: v.contiguous().clone() for k, v in engine.items()}, str(out / "engine.safetensors"))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--demo":
        sys.exit("usage: python scripts/dump_hooks.py --demo OUT_DIR")
    _demo(Path(sys.argv[2]))
