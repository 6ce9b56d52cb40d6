"""Per-module capture for `compare model --layers`: which modules are watched,
forward hooks that record each one's inputs and output, and the `--inject`
perturbations applied to a model copy.

Watched ("sites"), in the model's own names: the embeddings, the RoPE phases,
each block's norms (q/k norms included), attention and MLP, the residual
stream after each block, the final norm and the LM head. Each engine owns its
sites (Engine.sites): sites() here finds a Hugging Face-style decoder's, and
an engine whose model computes something outside any module declares a
pseudo-site for it (the embedded model's RoPE tables and tied LM head, in
engines/embedded.py). Execution order is the order in which the hooks fire
(a module's hook fires when it returns).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from precisionlab.catalog import formats
from precisionlab.errors import UsageError

KINDS = ("embed", "rope", "norm", "attn", "mlp", "block", "final_norm", "lm_head", "module", "heads", "probs")
# Inside attention (compare layers --heads), two pseudo-sites per attention module, named after it:
#   <attn>.heads  the output projection's input split into query heads: (batch, tokens, heads, head_dim),
#                 head h = query head h in the model's own order;
#   <attn>.probs  the softmax probabilities: (batch, heads, query, key), where the attention returns them
#                 (transformers' eager attention; the reference is switched to it for --heads).
HEAD_SUFFIX, PROBS_SUFFIX = ".heads", ".probs"
OUT_PROJ = ("o_proj", "wo", "out_proj", "dense")  # the output projection's name in the attention modules we know


@dataclass(frozen=True)
class Site:
    name: str
    kind: str
    pseudo: bool = False   # no module of its own (the embedded model's rope tables and tied head)
    hook_on: str | None = None  # a pseudo-site read from another module's output ("": the whole
    #                             model's first output); None: not hooked (the experiment computes it)


def is_norm(module) -> bool:
    return hasattr(module, "variance_epsilon") or hasattr(module, "eps") and "norm" in type(module).__name__.lower()


def eps_attr(module) -> str | None:
    for attr in ("variance_epsilon", "eps"):
        if hasattr(module, attr) and is_norm(module):
            return attr
    return None


def sites(model) -> list[Site]:
    """A Hugging Face-style decoder's watched modules, in definition order
    (execution order is recorded at run time): Engine.sites' default."""
    names = {id(m): n for n, m in model.named_modules()}
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    base = getattr(model, "base_model", model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise UsageError(f"--layers: {type(model).__name__} has no .layers list of decoder blocks to watch")
    block_names = {names[id(b)] for b in layers}
    final_norm = getattr(base, "norm", None)
    out = []
    for n, m in model.named_modules():
        if m is emb:
            out.append(Site(n, "embed"))
        elif type(m).__name__.endswith("RotaryEmbedding"):
            out.append(Site(n, "rope"))
        elif n in block_names:
            out.append(Site(n, "block"))
        elif final_norm is not None and m is final_norm:
            out.append(Site(n, "final_norm"))
        elif head is not None and m is head:
            out.append(Site(n, "lm_head"))
        else:
            parent = n.rsplit(".", 1)[0] if "." in n else ""
            grand = parent.rsplit(".", 1)[0] if "." in parent else ""
            leaf = n.rsplit(".", 1)[-1].lower()
            if parent in block_names:
                if is_norm(m):
                    out.append(Site(n, "norm"))
                elif "attn" in leaf or "attention" in leaf:
                    out.append(Site(n, "attn"))
                elif "mlp" in leaf or "feed_forward" in leaf or leaf == "ffn":
                    out.append(Site(n, "mlp"))
            elif grand in block_names and is_norm(m):
                out.append(Site(n, "norm"))  # q_norm / k_norm inside attention
    return out


# Where an MoE model's routers live (Qwen3-MoE / Qwen2-MoE / DeepSeek-V3: .mlp.gate; Mixtral:
# .block_sparse_moe.gate); router --inputs hf:DIR and compare layers' routing both find them here.
ROUTER_SUFFIXES = (".mlp.gate", ".block_sparse_moe.gate")


def routers(model) -> list[tuple[str, nn.Module]]:
    """An MoE model's router modules (name, module), in definition order: a
    module under ROUTER_SUFFIXES with a 2-D weight (experts x hidden), in a
    model whose config routes each token to num_experts_per_tok experts. A
    dense model has none, even one whose SwiGLU projection is called
    `mlp.gate` (the embedded model's: no config of experts)."""
    if not getattr(getattr(model, "config", None), "num_experts_per_tok", None):
        return []
    return [(n, m) for n, m in model.named_modules() if n.endswith(ROUTER_SUFFIXES)
            and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2]


def router_bias(module) -> torch.Tensor | None:
    """A router's correction bias (DeepSeek-V3's e_score_correction_bias: it steers the choice), or None."""
    return getattr(module, "e_score_correction_bias", None)


def head_sites(model, site_list: list[Site]) -> list[Site]:
    """The per-head pseudo-sites of every attention site that has a known output projection and a head_dim."""
    out = []
    for s in site_list:
        if s.kind != "attn":
            continue
        attn = model.get_submodule(s.name)
        proj = next((n for n in OUT_PROJ if isinstance(getattr(attn, n, None), nn.Module)), None)
        if proj is None or not _head_dim(attn):
            continue
        out += [Site(s.name + HEAD_SUFFIX, "heads", True, hook_on=f"{s.name}.{proj}"),
                Site(s.name + PROBS_SUFFIX, "probs", True, hook_on=s.name)]
    return out


def _head_dim(attn) -> int | None:
    d = getattr(attn, "head_dim", None)
    return int(d) if isinstance(d, int) and d > 0 else None


def eager_attention(model) -> bool:
    """transformers' eager attention, the one that returns its probabilities (--heads); False where the
    model cannot switch (its attention never returns them: no .probs rows)."""
    if hasattr(model, "set_attn_implementation"):
        try:
            model.set_attn_implementation("eager")
            return True
        except (ValueError, ImportError):
            return False
    return False


def _head_tensor(site: Site, args, out, head_dim: int | None):
    """A per-head site's tensor, or None where the module gave none (probabilities from sdpa)."""
    if site.kind == "heads":
        x = args[0]
        return x.reshape(*x.shape[:-1], x.shape[-1] // head_dim, head_dim)
    probs = out[1] if isinstance(out, (tuple, list)) and len(out) > 1 else None
    return probs if isinstance(probs, torch.Tensor) else None


def module_names(model) -> list[str]:
    return [n for n, _ in model.named_modules() if n]


def resolve(model, target: str, extra: list[str]) -> str:
    """A user's module name -> the model's: exact, else the one name ending in '.' + target."""
    names = module_names(model) + extra
    if target in names:
        return target
    hits = [n for n in names if n.endswith("." + target)]
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        raise UsageError(f"--inject: {target!r} matches {len(hits)} modules ({', '.join(hits[:4])}...); give the full name")
    listed = [n for n, m in model.named_modules() if n and not isinstance(m, nn.ModuleList)]
    sample = ", ".join((extra + listed)[:6])
    raise UsageError(f"--inject: no module {target!r} in this model (names look like: {sample}, ...)")


def output_tensor(out, kind: str) -> torch.Tensor:
    """The tensor a module produced: RoPE's (cos, sin) stacked; otherwise the first tensor."""
    if isinstance(out, torch.Tensor):
        return out
    if kind == "rope" and isinstance(out, (tuple, list)):
        return torch.stack([out[0], out[1]])
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, (tuple, list)):
        for o in out:
            if isinstance(o, torch.Tensor):
                return o
    raise TypeError(f"no tensor in a module output of type {type(out).__name__}")


class Capture:
    """Forward hooks on the sites of one model: each site's first call in a
    forward pass records (args, kwargs, output) and its place in the order."""

    def __init__(self, model, site_list: list[Site]):
        self.model = model
        self.records: dict[str, tuple] = {}
        self.order: list[str] = []
        self.enabled = True
        self._handles = []
        for s in site_list:
            target = s.hook_on if s.pseudo else s.name
            if target is None:
                continue
            mod = model.get_submodule(target)
            self._handles.append(mod.register_forward_hook(self._hook(s), with_kwargs=True))

    def _hook(self, site: Site):
        head_dim = _head_dim(self.model.get_submodule(site.name[:-len(HEAD_SUFFIX)])) if site.kind == "heads" \
            else None

        def hook(_mod, args, kwargs, out):
            if self.enabled and site.name not in self.records:
                if site.kind in ("heads", "probs"):
                    t = _head_tensor(site, args, out, head_dim)
                    if t is None:
                        return
                else:
                    t = output_tensor(out[0] if site.pseudo else out, site.kind)
                self.records[site.name] = (args, kwargs, t)
                self.order.append(site.name)
        return hook

    def close(self):
        for h in self._handles:
            h.remove()


def charlm_rope(model, t: int, dtype) -> torch.Tensor:
    """The embedded model's RoPE pseudo-site: the (cos, sin) it uses for positions 0..t-1."""
    return torch.stack([model.rope_cos[:t], model.rope_sin[:t]]).to(dtype)


# --- --inject --------------------------------------------------------------------------


def _low(name: str):
    """--inject rope=DTYPE's torch dtype (inject.parse took the name and made it canonical)."""
    return formats.get(name).torch_dtype


def apply(model, inj, target: str, site_by_name: dict) -> None:
    """One --inject spec on this model copy (the low-precision run's)."""
    p = inj.params
    site = site_by_name.get(target)
    if site is not None and site.pseudo and set(p) - {"rope"}:
        raise UsageError(f"--inject {inj}: {target!r} is computed outside any module here; "
                         f"{'use rope=bf16' if site.kind == 'rope' else 'perturb the final norm or a block instead'}")
    if "rope" in p:
        low = _low(p["rope"])
        site = site_by_name.get(target)
        if site is None or site.kind != "rope":
            rope = [s.name for s in site_by_name.values() if s.kind == "rope"]
            raise UsageError(f"--inject rope: {target!r} does not compute RoPE phases; "
                             f"the rope module here is {', '.join(rope) or 'absent'}")
        if site.pseudo:
            _charlm_rope_in(model, low)
        else:
            _hf_rope_in(model.get_submodule(target), low)
    if "eps" in p:
        mod = model.get_submodule(target)
        attr = eps_attr(mod)
        if attr is None:
            raise UsageError(f"--inject eps: {target!r} is a {type(mod).__name__}, not an RMSNorm/LayerNorm")
        setattr(mod, attr, p["eps"])
    if "scale" in p:
        s = p["scale"]
        model.get_submodule(target).register_forward_hook(lambda _m, _a, out: _scaled(out, s))


def _scaled(out, s: float):
    if isinstance(out, torch.Tensor):
        return out * s
    if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
        return (out[0] * s, *out[1:])
    raise UsageError(f"--inject scale: the module returns a {type(out).__name__}, not a tensor")


def _charlm_rope_in(model, low) -> None:
    """The pitfall: positions, inverse frequencies and angles all in the low
    dtype. bf16 holds integers exactly only up to 256, and an angle of a few
    hundred radians carries an absolute error of about a radian."""
    cfg = model.cfg
    inv = torch.tensor(cfg.rope_theta, dtype=low) ** (-torch.arange(0, cfg.head_dim, 2, dtype=low) / cfg.head_dim)
    angles = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float32).to(low), inv)
    angles = torch.cat([angles, angles], dim=-1)
    model.rope_cos, model.rope_sin = angles.cos().float(), angles.sin().float()


def _hf_rope_in(rot: nn.Module, low) -> None:
    rot.inv_freq = rot.inv_freq.to(low)
    scaling = getattr(rot, "attention_scaling", 1.0)

    def forward(x, position_ids):
        freqs = position_ids[..., None].to(low) * rot.inv_freq.to(device=x.device, dtype=low)[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)

    rot.forward = forward


def keep_rope_fp32(low_model, fp32_model) -> None:
    """Hugging Face loads a model in bf16 with its RoPE inverse frequencies kept
    in fp32; model.to(bf16) would round them too (the pitfall --inject rope
    demonstrates). The low-precision copies here follow transformers' own loader."""
    ref = dict(fp32_model.named_buffers())
    for name, _buf in low_model.named_buffers():
        if ("inv_freq" in name.rsplit(".", 1)[-1]) and name in ref:
            owner = low_model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else low_model
            setattr(owner, name.rsplit(".", 1)[-1], ref[name].clone())


def max_abs(t: torch.Tensor) -> float:
    finite = t[torch.isfinite(t)]
    return float(finite.abs().max()) if finite.numel() else math.nan
