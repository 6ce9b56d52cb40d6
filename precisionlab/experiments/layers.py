"""compare model --layers: where in the model a low-precision run leaves fp32,
module by module, and whether a module adds more than rounding.

Every dtype reads the same tokens (the prompt and fp32's greedy continuation,
teacher-forced). For each watched module (models/hooks.py), in execution order:

  accumulated  the low run's output vs the fp32 run's output: what a dump
               comparison sees, every upstream error included;
  local        the module as the low run has it ("yours", --inject applied),
               fed the fp32 run's input rounded to the low dtype, vs the fp32
               output: what the module itself adds;
  (2)          yardstick: the same module, clean ("trusted"), in the same
               dtype on the same input, vs the fp32 output: what rounding
               alone costs there. For the RoPE phases the trusted low value
               is fp32's phases rounded once (how HF and engines build them);
  (3)          yours vs trusted, both low, same input.

numerics.divergence's rules decide: (3) above RATIO_THRESHOLD x (2), a scale
fit yours = s x clean far from 1 for rounding (z), the first module to differ
after bit-identical ones, the first 10x jump in (3), and the low run turning
non-finite where fp32 is finite (an overflow) are flagged, each naming its rule
and number; the first flagged module in execution order is the first
divergence. The classic pitfalls are named by module beside it: RoPE phases not built in fp32, a final
norm + LM head in the low dtype costing most of the logit error, fp16 values
past 65504.

Where the model has routers (an MoE model), each run's routing of the same
tokens is compared too, MoE layer by MoE layer (experiments/layers_routing).
"""

from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from precisionlab.catalog import formats
from precisionlab.engines import inject as inject_mod
from precisionlab.engines.protocol import greedy
from precisionlab.engines.registry import DEFAULT_SPEC, ModelRun, spec_path
from precisionlab.experiments import layers_routing, startup
from precisionlab.io import outputs, urls
from precisionlab.runtime import progress
from precisionlab.numerics import divergence
from precisionlab.numerics.compare import RATIO_THRESHOLD, judge, rel_l2
from precisionlab.io.tensorfiles import ORDER_KEY, TOKENS_KEY

FP16_MAX = 65504.0
INJECT_KEYS = {"scale", "eps", "rope"}
# A final norm + LM head in the low dtype is called out when running them in
# fp32 (on the low run's own input) would cut the logits' rel-L2 by this much.
HEAD_SHARE = 2.0
SMALL_MODEL = 20_000_000  # parameters; see threads_for


@dataclass
class LayersConfig(ModelRun):
    inject: list[str] = field(default_factory=list)
    dump: str | None = None
    force: bool = False  # --force: --dump may replace DIR/<dtype>.safetensors files that exist


@dataclass
class LayersResult:
    params: dict
    rows: list[dict]
    first_divergence: str | None
    first_divergence_by_dtype: dict
    pitfalls: list[dict]
    model_info: dict
    takeaways: list[str]
    timing: dict
    dumped: list[str]
    divergence_by_dtype: dict = field(default_factory=dict)  # dtype -> the first divergence's name, rule, text
    routing: list[dict] = field(default_factory=list)  # per dtype and MoE layer (experiments/layers_routing)


def check_dump_dir(path: str, labels: list[str], model: str | None, force: bool = False) -> Path:
    """--dump DIR, checked before the run: writable, not the model's folder,
    and every file it will hold (DIR/<dtype>.safetensors) writable as a file
    and, unless --force, not there yet (the user named DIR, not those files)."""
    return outputs.check_output_dir(path, [f"{d}.safetensors" for d in labels], "--dump", [("--model", spec_path(model))],
                                    force)


def _check_targets_before_load(model: str | None, injections) -> None:
    """--inject's module names against the model's module tree from its config
    (an HF model on the meta device: no weight read), so a typo is refused
    before the weights load. Engines with no cheap tree (the embedded model,
    whose load is itself cheap) are checked right after the load, before the
    forward passes (hooks.resolve in run())."""
    if not injections:
        return
    from precisionlab.engines import hooks, registry

    cls, arg = registry.resolve(model)
    tree = cls.module_tree(arg)
    if tree is None:
        return
    pseudo = [s.name for s in hooks.sites(tree) if s.pseudo]
    for inj in injections:
        hooks.resolve(tree, inj.target, pseudo)


def _sites_with_targets(engine, injections):
    """(the watched sites, each injection's resolved target, sites by name): an
    injected module that is not watched becomes a site of its own."""
    from precisionlab.engines import hooks

    site_list = engine.sites(engine.base)
    pseudo = [s.name for s in site_list if s.pseudo]
    targets = [hooks.resolve(engine.base, inj.target, pseudo) for inj in injections]
    by_name = {s.name: s for s in site_list}
    for t in targets:
        if t not in by_name:
            by_name[t] = hooks.Site(t, "module")
            site_list.append(by_name[t])
    return site_list, targets, by_name


def run(cfg: LayersConfig, advance=lambda k=1: None) -> LayersResult:
    startup.check_run(cfg.steps, cfg.prompt)
    startup.check_chat(cfg.model, cfg.chat)
    lows = startup.parse_dtypes(cfg.dtypes, formats.LOW_COMPUTE)  # no repeated rows
    injections = inject_mod.parse_all(cfg.inject, INJECT_KEYS)
    dump_dir = check_dump_dir(cfg.dump, ["fp32", *lows], cfg.model, cfg.force) if cfg.dump is not None else None
    device = startup.device(cfg.device)
    import torch

    from precisionlab.engines import hooks

    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    from precisionlab.runtime import memory

    estimate = lambda s: memory.compare_layers(s, lows, dump=dump_dir is not None)  # noqa: E731
    _check_targets_before_load(cfg.model, injections)
    engine = startup.open_engine(cfg.model, device, cfg.steps, cfg.prompt, estimate,
                                 f"compare layers --model {cfg.model or DEFAULT_SPEC} --steps {cfg.steps}")
    prompt = engine.prompt_ids(cfg.prompt, cfg.steps, cfg.chat)
    site_list, targets, by_name = _sites_with_targets(engine, injections)
    t_load = time.perf_counter() - t0
    routers = layers_routing.find(engine, engine.base)

    t1 = time.perf_counter()
    rows, pitfalls, dumped, first_by, div_by, routed = [], [], [], {}, {}, []
    with startup.numerics(), torch.no_grad(), threads_for(engine.base):  # fp32 means IEEE fp32 here
        ref = engine.base
        ref_tokens, _ = greedy(engine, ref, prompt, cfg.steps)
        ids = (prompt + ref_tokens)[:-1]
        x = torch.tensor([ids], device=device)
        progress.stage("fp32 layers")
        ref_cap = captured_run(engine, ref, site_list, x, routers)
        order = ref_cap.order
        if dump_dir is not None:
            dumped.append(_dump(dump_dir, "fp32", ref_cap, order, ids, engine, []))
        advance()
        for low in lows:
            progress.stage(f"{low} layers")
            tdt = formats.get(low).torch_dtype
            trusted = low_copy(engine, low)
            yours = low_copy(engine, low)
            for inj, target in zip(injections, targets, strict=True):
                hooks.apply(yours, inj, target, by_name)
            cap = captured_run(engine, yours, site_list, x, routers)
            routed += layers_routing.compare((routers,) * 2, ref_cap.routes, cap.routes, low, *[ref_cap.routes] * 2, {"dtype": low})
            if dump_dir is not None:
                dumped.append(_dump(dump_dir, low, cap, order, ids, engine, injections))
            touched = _touched(targets, order)
            dtype_rows = [_site_row(engine, by_name[name], i, low, tdt, ref_cap, cap, trusted, yours, name in touched)
                          for i, name in enumerate(order)]
            div = judge_rows(dtype_rows)
            rows += dtype_rows
            first_by[low] = None if div is None else div.name
            div_by[low] = None if div is None else div.as_dict()
            pitfalls += _pitfalls(low, dtype_rows, engine, ref_cap, cap, ref)
            del trusted, yours, cap
            advance()
    t_run = time.perf_counter() - t1
    first = None
    flagged = [r for r in rows if r["flagged"]]
    if flagged:
        first = min(flagged, key=lambda r: r["order"])["module"]
    info = engine.info()
    return LayersResult(
        params={"model": cfg.model or DEFAULT_SPEC, "steps": cfg.steps, "prompt": cfg.prompt, "chat": cfg.chat, "dtypes": lows,
                "device": device, "seed": cfg.seed, "tokens": len(ids), "inject": [str(i) for i in injections],
                "inject_targets": targets, "ratio_threshold": RATIO_THRESHOLD, "dump": cfg.dump,
                "routing": routers.info()},
        rows=rows, first_divergence=first, first_divergence_by_dtype=first_by, pitfalls=pitfalls,
        model_info=info, takeaways=_takeaways(first, div_by, pitfalls, injections, targets, routed, routers.note),
        timing={"load_s": t_load, "run_s": t_run}, dumped=dumped, divergence_by_dtype=div_by, routing=routed)


def judge_rows(rows: list[dict]):
    """numerics.divergence over one dtype's rows (every module was compared),
    in execution order: the order rules added to each row's flags, its
    flagged/rule/reason/flags/status set; returns the first divergence."""
    judged = [r.pop("_judged") for r in rows]
    first = divergence.first_divergence(judged)
    for r, j in zip(rows, judged, strict=True):
        r.update(divergence.row_fields(j.flags))
        r["status"] = "flagged" if r["flagged"] else "ok"
    return first


@contextmanager
def threads_for(model):
    """One intra-op thread for a small model: its ops touch a few thousand
    elements, and thread hand-offs cost more than they save (measured on the
    embedded model, 2 busy cores: 1.3 s with one thread, 14 s with two)."""
    import torch

    before = torch.get_num_threads()
    if sum(p.numel() for p in model.parameters()) < SMALL_MODEL:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def low_copy(engine, low: str):
    """The engine's copy in `low`, its RoPE inverse frequencies kept in fp32
    as transformers' own loader keeps them (a model without such buffers, the
    embedded one, is unchanged)."""
    from precisionlab.engines import hooks

    m = engine.model(low)
    hooks.keep_rope_fp32(m, engine.base)
    return m


class _Run:
    def __init__(self, order, outputs, records, t, routes=None):
        self.order, self.outputs, self.records, self.t = order, outputs, records, t
        self.routes = routes or {}  # router name -> layers_routing.Captured


def captured_run(engine, model, site_list, x, routers=None) -> _Run:
    """One forward of x with every site captured (and, given `routers`, every router's input and logits)."""
    from precisionlab.engines import hooks

    cap = hooks.Capture(model, site_list)
    routes: dict = {}
    try:
        with layers_routing.watch(engine, model, routers or layers_routing.Routers([], None), routes):
            engine.forward(model, x)  # no KV cache: a module re-run for its local error must not append to one
    finally:
        cap.close()
    outputs = {n: rec[2] for n, rec in cap.records.items()}
    order = list(cap.order)
    if any(s.pseudo and s.kind == "rope" for s in site_list):  # tables sliced before the embedding runs
        outputs["rope"] = hooks.charlm_rope(model, x.shape[1], model.dtype)
        order.insert(0, "rope")
    return _Run(order, outputs, cap.records, x.shape[1], routes)


def _touched(targets, order) -> set:
    """Sites whose module is an injected one or holds one: there yours and trusted differ."""
    out = set()
    for name in order:
        for t in targets:
            if t == name or t.startswith(name + "."):
                out.add(name)
    return out


def as_float64(t):
    """A captured tensor's values as float64 numpy (for the statistics)."""
    return t.detach().double().cpu().numpy()


def _local(engine, site, model, ref_cap, low_cap, tdt):
    """The site's module in `model` (low dtype) on the fp32 run's input rounded
    to the low dtype; the other arguments (masks, RoPE phases) as the low run had them."""
    import torch

    from precisionlab.engines import hooks

    if site.name == "rope" and site.pseudo:
        return hooks.charlm_rope(model, ref_cap.t, tdt)
    if site.name == "lm_head" and site.pseudo:  # tied head on the final norm's fp32 output
        return ref_cap.outputs["norm"].to(tdt) @ model.embed.weight.T
    args32, kwargs32, _ = ref_cap.records[site.name]
    args_l, kwargs_l, _ = low_cap.records[site.name]
    args, kwargs = list(args_l), dict(kwargs_l)
    if args32 and isinstance(args32[0], torch.Tensor):
        if args32[0].is_floating_point():
            args[0] = args32[0].to(tdt)
    elif "hidden_states" in kwargs32:
        kwargs["hidden_states"] = kwargs32["hidden_states"].to(tdt)
    out = model.get_submodule(site.name)(*args, **kwargs)
    return hooks.output_tensor(out, site.kind)


def _site_row(engine, site, i, low, tdt, ref_cap, cap, trusted, yours, touched) -> dict:
    from precisionlab.engines import hooks

    out32, out_low = ref_cap.outputs[site.name], cap.outputs[site.name]
    y_local = _local(engine, site, yours, ref_cap, cap, tdt)
    if site.kind == "rope":
        t_local = out32.to(tdt)  # phases built in fp32, rounded once
    else:
        t_local = _local(engine, site, trusted, ref_cap, cap, tdt) if touched else y_local
    r32, rl, ry, rt = as_float64(out32), as_float64(out_low), as_float64(y_local), as_float64(t_local)
    yard, diff = rel_l2(rt, r32), rel_l2(ry, rt)
    ratio, _ = judge(diff, yard)
    scale, bias_z = divergence.scale_fit(ry, rt, yard)
    over = divergence.overflow_split(r32, rl)  # the low run non-finite where fp32 is finite
    flags = divergence.judge_tensor(diff, yard, ratio=ratio, scale=(scale, bias_z), overflow=over, against="clean",
                                    ref="fp32", rounding=divergence.rounding(low))
    flagged = bool(flags)
    return {"dtype": low, "order": i, "module": site.name, "kind": site.kind, "shape": list(out32.shape),
            "accumulated": rel_l2(rl, r32), "local": rel_l2(ry, r32), "yardstick": yard, "yours_vs_trusted": diff,
            "ratio": ratio, "scale_fit": scale, "bias_z": bias_z, "flagged": flagged, "injected": touched,
            "amax_fp32": hooks.max_abs(out32), "nonfinite_low": int((~np.isfinite(rl)).sum()),
            "overflow": over[0] + over[1], "worst_position": _worst_position(ry, rt) if flagged else None,
            "_judged": divergence.Judged(site.name, diff, ratio, flags, rounding=divergence.rounding(low))}


def _worst_position(a, b):
    """The token position (second-to-last axis) of the largest |a - b|."""
    with np.errstate(invalid="ignore"):  # inf - inf where both overflowed: NaN, counted as the worst below
        d = np.abs(a - b)
    d[~np.isfinite(d)] = np.inf
    idx = np.unravel_index(int(np.argmax(d)), d.shape)
    return int(idx[-2]) if len(idx) >= 2 else int(idx[0])


def _pitfalls(low, rows, engine, ref_cap, cap, ref) -> list[dict]:
    import torch

    out = []
    for r in rows:
        if r["kind"] == "rope" and r["flagged"]:
            out.append({"dtype": low, "module": r["module"], "pitfall": "rope_phases_low_precision",
                        "detail": f"RoPE phases not built in fp32: {r['ratio']:.3g}x the rounding of fp32's phases, "
                                  f"worst at position {r['worst_position']}"})
    if low == "fp16":
        for r in rows:
            if r["nonfinite_low"] or (math.isfinite(r["amax_fp32"]) and r["amax_fp32"] > FP16_MAX):
                out.append({"dtype": low, "module": r["module"], "pitfall": "fp16_overflow",
                            "detail": f"fp32 reaches |x| = {r['amax_fp32']:.6g} here (fp16 max {FP16_MAX:g}); "
                                      f"{r['nonfinite_low']} non-finite values in the fp16 run"})
                break
    # Final norm + LM head in fp32 on the low run's own input: what keeping them in fp32 would leave.
    norm_name = next((r["module"] for r in rows if r["kind"] == "final_norm"), None)
    head = next((r for r in rows if r["kind"] == "lm_head"), None)
    if norm_name and head and norm_name in cap.records:
        x_low = _first_input(cap.records[norm_name])
        if x_low is not None:
            with torch.no_grad():
                h = ref.get_submodule(norm_name)(x_low.float())
                tied = any(s.pseudo and s.name == head["module"] for s in engine.sites(ref))  # a pseudo-site
                logits = h @ ref.embed.weight.T if tied else ref.get_submodule(head["module"])(h)
            kept = rel_l2(as_float64(logits), as_float64(ref_cap.outputs[head["module"]]))
            head["logits_rel_l2_head_in_fp32"] = kept
            if head["accumulated"] > HEAD_SHARE * kept:
                out.append({"dtype": low, "module": f"{norm_name} + {head['module']}", "pitfall": "head_low_precision",
                            "detail": f"the final norm and LM head in {low} leave logits at rel-L2 "
                                      f"{head['accumulated']:.3g}; in fp32 on the same input {kept:.3g}"})
    return out


def _first_input(rec):
    import torch

    args, kwargs, _ = rec
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    return kwargs.get("hidden_states")


def _dump(dir_: Path, label: str, cap: _Run, order, ids, engine, injections) -> str:
    """DIR/<dtype>.safetensors: each module's output in its run's dtype, the
    execution order and the token ids in the metadata (the model's name as a URL's secrets masked: io.urls);
    written atomically."""
    from safetensors.torch import save_file

    dir_.mkdir(exist_ok=True)
    tensors = {n: cap.outputs[n].detach().contiguous().clone().cpu() for n in order}
    meta = urls.recorded({ORDER_KEY: json.dumps(order), TOKENS_KEY: json.dumps(ids), "precisionlab.model": engine.name,
                          "precisionlab.dtype": label, "precisionlab.inject": json.dumps([str(i) for i in injections])})
    return str(outputs.atomic_write(dir_ / f"{label}.safetensors", lambda tmp: save_file(tensors, tmp, metadata=meta)))


def _takeaways(first, div_by, pitfalls, injections, targets, routed, routing_note) -> list[str]:
    out = []
    if first is None:
        out.append("no module is flagged by any rule (overflow, beyond "
                   f"{RATIO_THRESHOLD:g}x what rounding alone costs there, scale fit, first to differ, first jump): "
                   "the differences from fp32 are the precision's.")
    else:
        for d, div in div_by.items():
            if div:
                out.append(f"{d}: first divergence at {div['name']}: {div['text']} (rule {div['rule']}).")
    for p in pitfalls:
        out.append(f"{p['dtype']} pitfall at {p['module']}: {p['detail']}.")
    if injections:
        out.append("injected: " + "; ".join(f"{i} (as {t})" for i, t in zip(injections, targets, strict=True)))
    return out + layers_routing.takeaways(routed, lambda r: f"{r['dtype']} vs fp32") + ([routing_note] * bool(routing_note))
