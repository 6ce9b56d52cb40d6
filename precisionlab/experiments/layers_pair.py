"""compare engine-layers --engine SPEC --reference SPEC: two models, module by
module, on the same tokens.

REF (--reference) and YOURS (--engine) read the same
tokens: the prompt and REF's fp32 greedy continuation, teacher-forced. Every
watched module of both runs is captured (engines/hooks.py; a llama.cpp engine
through its eval callback, its GGML names mapped to the Hugging Face ones,
engines/llamacpp.py). Per module, in REF's execution order, two views:

  two-way    YOURS fp32 vs REF fp32 (rel-L2), against what fp32 rounding costs
             there (REF fp32 vs REF fp64): where both can run fp32 this sees a
             0.5 % bug that hides inside bf16's own rounding;
  three-way  per low dtype: (2) REF low vs REF fp32, the yardstick; (3) YOURS
             low vs REF low; their ratio, and the fitted scale YOURS ~ s * REF
             low with its z (compare tensors' three-way view). An engine that
             computes only as it was opened (llama.cpp, ...) is YOURS in every
             column: is its departure within what the low dtype costs REF?

The verdict rules (ratio, scale fit, first to differ, first jump, overflow)
are numerics/divergence's; every flag names its rule and number. Modules only
one side has are listed apart, never a first divergence.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from precisionlab.catalog import formats
from precisionlab.engines.protocol import greedy
from precisionlab.engines.registry import ModelRun, resolve
from precisionlab.errors import RunError, UsageError
from precisionlab.experiments import layers as single
from precisionlab.experiments import layers_heads, layers_routing, startup
from precisionlab.numerics import compare, divergence
from precisionlab.runtime import progress


@dataclass
class PairConfig(ModelRun):
    reference: str | None = None  # REF's spec; None: what the engine's export recorded, else the embedded model
    engine: str | None = None     # YOURS' spec (--engine)
    heads: bool = False           # inside attention too: per-head outputs and probabilities (experiments/layers_heads)


@dataclass
class PairResult:
    params: dict
    rows: list[dict]
    first_divergence: str | None
    first_divergence_by_view: dict
    flags: list[dict]
    missing: dict
    model_info: dict
    reference_info: dict
    takeaways: list[str]
    timing: dict
    notes: list[str] = field(default_factory=list)
    routing: list[dict] = field(default_factory=list)  # per view and MoE layer (experiments/layers_routing)


def _module_engine(spec: str | None, role: str):
    """REF must expose its modules; YOURS may be an engine with a capture() of its own."""
    from precisionlab.engines import registry

    cls = registry.engine_class(registry.parse(spec)[0])  # before its own checks: the refusal that matters first

    if not cls.has_modules and not cls.captures_layers:
        raise UsageError(f"{role} {spec}: {cls.ENGINE or cls.__name__} exposes no intermediate tensors, so "
                         "compare engine-layers cannot compare it module by module (compare engine compares its logits)")
    if role == "--reference" and not (cls.has_modules and "fp64" in cls.compute_dtypes):
        raise UsageError(f"--reference {spec}: the reference runs in fp32 and fp64 through its modules; give an "
                         "hf:DIR or the embedded model")
    try:
        resolve(spec)
    except UsageError as e:  # the hf engine's checks speak of --model: name the option that was given
        raise UsageError(str(e).replace("--model", role, 1) if role != "--model" else str(e)) from None
    return cls


def check_specs(yours: str, reference: str | None):
    """Both specs checked before anything loads (exit 2): YOURS' class, REF's when given."""
    cls = _module_engine(yours, "--engine")
    if reference is not None:
        _module_engine(reference, "--reference")
    return cls


def run(cfg: PairConfig, advance=lambda k=1: None) -> PairResult:
    startup.check_run(cfg.steps, cfg.prompt)
    lows = startup.parse_dtypes(cfg.dtypes, formats.LOW_COMPUTE)
    yours_spec = cfg.engine
    ycls = check_specs(yours_spec, cfg.reference)
    ref_spec, ref_note = startup.default_reference(cfg.reference, [yours_spec])
    _module_engine(ref_spec, "--reference")
    startup.check_chat(ref_spec, cfg.chat, "--reference")  # REF's template makes the ids both sides read
    external = not ycls.has_modules  # captured by the engine itself, as it was opened
    device = startup.device(cfg.device)
    with _hf_named(ref_spec, external) as (run_spec, how):
        if how:
            ref_note += f"; {how}"
        return _run(cfg, lows, yours_spec, run_spec, ref_spec, ref_note, external, device, advance)


@contextmanager
def _hf_named(ref_spec: str, external: bool):
    """An engine names its modules as Hugging Face does (llama.cpp's map), the embedded model its own way:
    REF embedded is then run as its Hugging Face export, written to a temporary folder for the run (the
    same weights; RoPE and the attention scale computed by transformers, equal to fp32 rounding)."""
    from precisionlab.engines.registry import DEFAULT_SPEC, parse

    if not external or parse(ref_spec)[0] != DEFAULT_SPEC:
        yield ref_spec, ""
        return
    import tempfile

    from precisionlab.engines.exporters import hf
    from precisionlab.engines.model_folders import quiet_library

    with tempfile.TemporaryDirectory(prefix="precisionlab-ref-") as work:
        with quiet_library():
            hf.write_embedded(work)
        yield f"hf:{work}", "the embedded model run as its Hugging Face export (a temporary folder), whose module names the engine's map to"


def _run(cfg, lows, yours_spec, run_spec, ref_spec, ref_note, external, device, advance) -> PairResult:
    import torch

    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    ref, yours = startup.open_engines(
        [startup.Load(run_spec, device, cfg.steps, cfg.prompt),
         startup.Load(yours_spec, "cpu" if external else device, cfg.steps, cfg.prompt)],
        lambda shapes: _estimate(shapes, lows, external),
        f"compare engine-layers --engine {yours_spec} --reference {ref_spec} --steps {cfg.steps}")
    prompt = ref.prompt_ids(cfg.prompt, cfg.steps, cfg.chat)
    notes = [f"reference {ref_spec} ({ref_note})"]
    # a python: engine's class may have modules; the instance declares whether it captures itself instead
    external = external or not yours.has_modules
    t_load = time.perf_counter() - t0
    t1 = time.perf_counter()
    with startup.numerics(), torch.no_grad(), single.threads_for(ref.base):
        ref_tokens, _ = greedy(ref, ref.base, prompt, cfg.steps)
        ids = (prompt + ref_tokens)[:-1]
        notes.append("tokens: " + startup.token_check(ids, _encoded(yours, ref, ids, len(prompt), cfg), str(yours_spec)))
        x = torch.tensor([ids], device=device)
        ref_sites = _with_heads(ref, ref.sites(ref.base), cfg.heads)
        routers = (layers_routing.find(ref, ref.base, "REF"), layers_routing.find(yours, yours.base, "YOURS"))
        routes = ({}, {})  # REF's and YOURS' captured routers, by dtype
        progress.stage("reference layers (fp32, fp64)")
        cap32 = single.captured_run(ref, ref.base, ref_sites, x, routers[0])
        r32, order, routes[0]["fp32"] = _outputs(cap32), list(cap32.order), cap32.routes
        r64 = _outputs(single.captured_run(ref, ref.model("fp64"), ref_sites, x))
        advance()
        progress.stage("yours layers (fp32)")
        if external:  # per-head tensors only for --heads (an engine may give them anyway)
            y32 = {k: torch.from_numpy(v) for k, v in yours.capture_layers(ids).items()
                   if cfg.heads or layers_heads.kind_of(k) is None}
        else:
            y_sites = _with_heads(yours, yours.sites(yours.base), cfg.heads)
            y32 = _outputs(_routed(single.captured_run(yours, yours.base, y_sites, x, routers[1]), routes[1], "fp32"))
        advance()
        quant, rq = _quantised_reference(ref, ref_sites, x, yours_spec, notes) if external else (None, None)
        ref_low, yours_low = {}, {}
        for low in lows:
            progress.stage(f"{low} layers, both models")
            ref_low[low] = _outputs(_routed(single.captured_run(ref, single.low_copy(ref, low), ref_sites, x,
                                                                routers[0]), routes[0], low))
            yours_low[low] = y32 if external else _outputs(_routed(
                single.captured_run(yours, single.low_copy(yours, low), y_sites, x, routers[1]), routes[1], low))
            advance()
    kinds = {s.name: s.kind for s in ref_sites}
    order = _probs_first(order)
    common = [n for n in order if n in y32]
    missing = {"only_reference": [n for n in order if n not in y32],
               "only_yours": sorted(n for n in y32 if n not in r32)}
    if not common:
        raise RunError(f"no module in common between {ref_spec} and {yours_spec}: nothing compared "
                       f"({len(order)} reference modules, {len(y32)} of yours)")
    rows = [_full_row(i, name, kinds.get(name, "module"), r32, r64, y32, ref_low, yours_low, quant, rq)
            for i, name in enumerate(common)]
    t_run = time.perf_counter() - t1
    # a quantised engine: fp32's and the low dtypes' views are what quantisation costs, shown, not judged
    views = [quant.view] if quant else ["fp32", *lows]
    flags, first_by = apply_rules(rows, views, _weight_flags(rows, quant) if quant else layers_heads.flags(rows))
    head_takeaways = layers_heads.read(rows, views, ref.kv_heads(ref.base)) if cfg.heads else []
    first = min((r for r in rows if any(first_by.get(v) == r["module"] for v in views)),
                key=lambda r: r["order"], default=None)
    first_name = first["module"] if first else None
    params = {"model": yours_spec, "reference": ref_spec, "reference_from": ref_note, "engine": cfg.engine,
              "steps": cfg.steps, "prompt": cfg.prompt, "chat": cfg.chat, "dtypes": lows, "device": device, "seed": cfg.seed,
              "tokens": len(ids), "ratio_threshold": compare.RATIO_THRESHOLD, "compared": len(common),
              "quant_view": quant.view if quant else None, "quant_departs_at": None,
              "heads": cfg.heads, "routing": routers[0].info()}
    routed = _routing(routers, routes, lows)
    takeaways = (_takeaways(first_name, first_by, flags, missing, quant.view if quant else "rounding")
                 + head_takeaways + layers_routing.takeaways(
                     [r for r in routed if r["view"] != "yardstick"], lambda r: f"YOURS vs REF in {r['view']}"))
    notes += [r.note for r in routers if r.note and routers[0].names]  # said only where REF has routers
    _close_takeaways(takeaways, params, rows, quant, cfg.heads, len(common), len(order))
    return PairResult(params, rows, first_name, first_by, flags, missing, yours.info(), ref.info(),
                      takeaways, {"load_s": t_load, "run_s": t_run}, notes, routed)


def _close_takeaways(takeaways: list, params: dict, rows, quant, heads: bool, common: int, modules: int) -> None:
    """The run's last readings: per-head tensors asked for and missing, where a quantised engine first leaves
    REF (into params too), and two models that name most modules differently."""
    if heads and not any(r["kind"] in layers_heads.KINDS for r in rows):
        takeaways.append("--heads: no per-head tensor in common (YOURS gives none named <attn>.heads or "
                         "<attn>.probs; see docs/dumps-from-your-engine.md)")
    if quant:
        params["quant_departs_at"] = _quant_departure(rows, quant.view)
        takeaways.insert(0, _quant_takeaway(quant.view, params["quant_departs_at"]))
    if common * 2 < modules:
        takeaways.append(f"only {common} of REF's {modules} modules have a counterpart in YOURS: the two "
                         "name their modules differently (a different architecture or engine naming?)")


def _routed(run, into: dict, dtype: str):
    """A captured run, its routers' captures kept in into[dtype]."""
    into[dtype] = run.routes
    return run


def _routing(routers, routes, lows) -> list[dict]:
    """Per MoE layer: YOURS vs REF in fp32 and in each low dtype (view), and REF low vs REF fp32 (view
    "yardstick", with `dtype`): what rounding alone moves there. None where either side exposes no routing."""
    ref_r, yours_r = routers
    if ref_r.alg is None or yours_r.alg is None:
        return []
    (ref, yours), out = routes, []
    for view in ("fp32", *lows):
        if view in yours:
            out += layers_routing.compare(routers, ref[view], yours[view], view, ref["fp32"], yours["fp32"],
                                          {"view": view})
    for low in lows:
        out += layers_routing.compare((ref_r, ref_r), ref["fp32"], ref[low], low, ref["fp32"], ref["fp32"],
                                      {"view": "yardstick", "dtype": low})
    return out


def _with_heads(engine, sites, heads: bool):
    """The sites, and with --heads each attention's per-head pseudo-sites (engines/hooks.py), the model
    switched to an attention that returns its probabilities where it can."""
    from precisionlab.engines import hooks

    if not heads:
        return sites
    hooks.eager_attention(engine.base)
    return sites + hooks.head_sites(engine.base, sites)


def _probs_first(order: list[str]) -> list[str]:
    """An attention's probabilities before its per-head outputs (they are computed first; the hooks fire
    on the attention's return, after the output projection's)."""
    from precisionlab.engines.hooks import HEAD_SUFFIX, PROBS_SUFFIX

    out = list(order)
    for name in order:
        if name.endswith(PROBS_SUFFIX):
            heads = name[:-len(PROBS_SUFFIX)] + HEAD_SUFFIX
            if heads in out and out.index(heads) < out.index(name):
                out.remove(name)
                out.insert(out.index(heads), name)
    return out


def _head_views(row, r32, r64, y32, ref_low: dict, yours_low: dict) -> None:
    """Per head, each view as its row's (experiments/layers_heads): fp32 against REF fp64, a low dtype's YOURS
    against REF low with REF low vs REF fp32 as that head's yardstick."""
    R32 = single.as_float64(r32)
    pairs = {"fp32": (_as(y32, R32), R32, single.as_float64(r64))}
    for d in ref_low:
        pairs[d] = (_as(yours_low[d], R32), single.as_float64(ref_low[d]), R32)
    row["per_head"] = layers_heads.per_head(row["kind"], pairs, _rounding)


def _full_row(i, name, kind, r32, r64, y32, ref_low, yours_low, quant, rq) -> dict:
    """One module's row: its fp32 and low-dtype views, the quantisation view, per head (--heads)."""
    row = _row(i, name, kind, r32[name], r64[name], y32[name],
               {d: (ref_low[d][name], yours_low[d][name]) for d in ref_low})
    if quant:
        _quant_view(row, quant.view, r32[name], rq[name], y32[name])
    if kind in layers_heads.KINDS and row.get("views"):
        _head_views(row, r32[name], r64[name], y32[name], {d: ref_low[d][name] for d in ref_low},
                    {d: yours_low[d][name] for d in ref_low})
    return row


def _quant_takeaway(view: str, departs: dict | None) -> str:
    return (f"YOURS holds {view} weights: its departure from REF fp32 (and from each low dtype) is what "
            f"quantisation costs, shown, not judged; the {view} view judges YOURS against REF with its weights "
            f"quantised as the GGUF holds them."
            + (f" It leaves REF fp32 first at {departs['module']} ({departs['fp32_ratio']:.3g}x fp32's rounding: "
               f"where the first quantised matmul is), at {departs['quant_ratio']:.2g}x what {view} costs there."
               if departs else ""))


def _quant_departure(rows: list[dict], view: str) -> dict | None:
    """Where a quantised engine first leaves REF fp32 beyond the ratio line (what the quantisation costs
    starts there: the first module holding a quantised matmul), with that module's ratio in its own view."""
    for r in rows:
        v = r.get("views", {})
        if "fp32" in v and view in v and v["fp32"]["ratio"] > compare.RATIO_THRESHOLD:
            return {"module": r["module"], "fp32_ratio": v["fp32"]["ratio"], "quant_ratio": v[view]["ratio"]}
    return None


def _quantised_reference(ref, sites, x, yours_spec, notes):
    """(the plan, REF's captured outputs with its weights quantised as YOURS' GGUF holds them), or (None,
    None) for an engine whose weights are not quantised (experiments/quant_yardstick)."""
    from precisionlab.experiments import quant_yardstick

    quant = quant_yardstick.plan(yours_spec)
    if quant is None:
        return None, None
    model, kept, differ = quant_yardstick.reference_copy(ref.base, quant)
    quant.differ = differ
    notes.append(f"{quant.view} yardstick: REF fp32 with its weights quantised as {quant.path} holds them"
                 + (f"; {len(kept)} weights kept in fp32 (no quantised counterpart)" if kept else ""))
    if differ:
        notes.append(f"{len(differ)} GGUF tensors are not REF's weights quantised the same way (a change on top "
                     "of the quantisation): " + ", ".join(list(differ)[:6]) + ("..." if len(differ) > 6 else ""))
    return quant, _outputs(single.captured_run(ref, model, sites, x))


def _quant_view(row: dict, view: str, r32, rq, y32) -> None:
    """The quantisation view of one row: (2) REF quantised vs REF fp32, (3) YOURS vs REF quantised."""
    if not row.get("views"):
        return
    R32, RQ = single.as_float64(r32), single.as_float64(rq)
    Y = _as(y32, R32)
    # what the quantisation costs, and fp32's own rounding beside it (independent: in quadrature), so a module
    # before any quantised matmul (0 for the first) is judged by fp32's rounding rather than by nothing
    yard = math.hypot(compare.rel_l2(RQ, R32), row["views"]["fp32"]["yardstick"])
    err = compare.rel_l2(Y, RQ)
    s, z = divergence.scale_fit(Y, RQ, yard)
    row["views"][view] = {"error": err, "yardstick": yard, "ratio": compare.ratio(err, yard), "scale_fit": s,
                          "bias_z": z, "yours_vs_fp32": compare.rel_l2(Y, R32),
                          "overflow": list(divergence.overflow_split(RQ, Y))}


def _estimate(shapes, lows, external) -> int:
    """Both models' bytes from their shapes (runtime/memory.compare_layers_pair);
    0 where a shape cannot be read (the loader's own error follows). An
    external engine captures in its own memory: its shape is not counted."""
    from precisionlab.runtime import memory

    ref_shape, yours_shape = shapes[0], None if external else shapes[1]
    if ref_shape is None or (not external and yours_shape is None):
        return 0
    return memory.compare_layers_pair(ref_shape, yours_shape, len(lows))


def _encoded(yours, ref, ids, n_prompt: int, cfg):
    """YOURS' own token ids for the text REF's ids decode to (None: it has no tokenizer); with --chat, the
    prompt under YOURS' own chat template, then the continuation's text."""
    try:
        if cfg.chat and yours.chats:
            return yours.chat_ids(cfg.prompt) + yours.encode(ref.decode(ids[n_prompt:]), "--prompt")
        return yours.encode(ref.decode(ids), "--prompt")
    except (UsageError, NotImplementedError):
        return None


def _outputs(run) -> dict:
    return dict(run.outputs)


def _as(y, like: np.ndarray) -> np.ndarray:
    """YOURS' tensor in REF's shape: an engine's (tokens, width) for HF's (1, tokens, width); same element order."""
    a = single.as_float64(y)
    if a.shape != like.shape and a.size == like.size:
        a = a.reshape(like.shape)
    return a


def _row(i, name, kind, r32, r64, y32, lows: dict) -> dict:
    from precisionlab.engines import hooks

    R32, R64 = single.as_float64(r32), single.as_float64(r64)
    row = {"order": i, "module": name, "kind": kind, "shape": list(R32.shape), "amax_fp32": hooks.max_abs(r32)}
    Y32 = _as(y32, R32)
    if Y32.shape != R32.shape:
        row["shape_yours"] = list(Y32.shape)
        row["views"] = {}
        return row
    yard = compare.rel_l2(R32, R64)
    # the ratio's yardstick: the whole tensor's rounding, or the typical row's where a few elements carry the
    # norm and the whole tensor's is one lucky draw (compare.typical_row_rel_l2)
    rows = compare.typical_row_rel_l2(R32, R64)
    err = compare.rel_l2(Y32, R32)
    s, z = divergence.scale_fit(Y32, R32, yard)
    views = {"fp32": {"error": err, "yardstick": yard, "yardstick_rows": rows, "ratio": compare.ratio(err, max(yard, rows)),
                      "scale_fit": s, "bias_z": z, "overflow": list(divergence.overflow_split(R32, Y32))}}
    for d, (rl, yl) in lows.items():
        RL, YL = single.as_float64(rl), _as(yl, R32)
        y2, y3 = compare.rel_l2(RL, R32), compare.rel_l2(YL, RL)
        fin = compare.finite_yardstick(R32, RL, YL)
        s, z = divergence.scale_fit(YL, RL, y2)
        views[d] = {"error": y3, "yardstick": y2, "ratio": compare.three_way_ratio(y3, fin), "scale_fit": s,
                    "bias_z": z, "yours_vs_fp32": compare.rel_l2(YL, R32),
                    "overflow": list(divergence.overflow_split(RL, YL)),
                    "nonfinite_reference_low": divergence.overflow_count(R32, RL),
                    # an overflow that hides as finite rows (rsqrt(inf) = 0): YOURS' rows flat where REF's vary
                    "hidden_overflow_rows": list(divergence.constant_rows(R32, YL)),
                    "range_excess": divergence.range_excess(R32, d, "REF fp32")}
    row["views"] = views
    return row


def _rounding(view: str) -> float | None:
    """One rounding of a view's format; None for a GGUF quantisation view (no unit roundoff: blocks)."""
    from precisionlab.catalog import formats as catalog

    return divergence.rounding(view) if catalog.find(view) in catalog.FORMATS else None


def _weight_flags(rows: list[dict], quant) -> dict:
    """(module, view) -> flags: each GGUF weight that is not REF's weight quantised the same way, judged by the
    rules (its rel-L2 against what the quantisation costs REF's weight, its fitted scale), at the compared
    module that holds it. Activations cannot show a 1 % scale under a Q4 engine's own 4 % per module; the
    weight, compared exactly, can."""
    names = [r["module"] for r in rows if r.get("views")]
    out: dict = {}
    for weight, m in quant.differ.items():
        owner = max((n for n in names if weight.startswith(n + ".")), key=len, default=None)
        if owner is None or m["error"] is None:
            continue
        found = divergence.judge_tensor(m["error"], m["yardstick"], scale=(m["scale_fit"], m["bias_z"]),
                                        against=f"REF {quant.view}")
        if found:
            rule = "scale_fit" if any(f.rule == "scale_fit" for f in found) else found[0].rule
            text = (f"its weight {weight} is not REF's quantised: YOURS = {m['scale_fit']:.4f} x REF "
                    f"{quant.view}, rel-L2 {m['error']:.2g} where {quant.view} costs it {m['yardstick']:.2g}")
            out.setdefault((owner, quant.view), []).append(divergence.Flag(rule, text, m["bias_z"]))
    return out


def apply_rules(rows: list[dict], views: list[str], extra: dict | None = None) -> tuple[list[dict], dict]:
    """numerics/divergence's rules on each view's modules in execution order:
    the flags (module, view, rule, text, value) and each view's first divergence. `extra`: flags measured
    elsewhere, by (module, view), added to that module's own (a quantised engine's weights)."""
    flags, first = [], {}
    for view in views:
        seq = [(r, r["views"][view]) for r in rows if view in r.get("views", {})]
        judged, upstream = [], None
        for r, v in seq:
            against = "REF" if view == "fp32" else "REF_LOW" if _rounding(view) else f"REF {view}"
            found = divergence.judge_tensor(v["error"], v["yardstick"], ratio=v["ratio"],
                                            scale=(v["scale_fit"], v["bias_z"]), overflow=tuple(v["overflow"]),
                                            against=against, ref=against,
                                            rounding=_rounding(view))
            if "hidden_overflow_rows" in v:  # at this module, with its own or its input's range excess
                cause = v["range_excess"] or upstream
                hidden = divergence.hidden_overflow_flag(tuple(v["hidden_overflow_rows"]), view, cause, ref="REF fp32")
                found = ([hidden] if hidden else []) + found
                if v["range_excess"]:  # the latest module upstream whose values or squares leave the range
                    upstream = f"upstream at {r['module']}: {v['range_excess']}"
            found += (extra or {}).get((r["module"], view), [])
            judged.append(divergence.Judged(r["module"], v["error"], v["ratio"], found,
                                            rounding=_rounding(view)))
        div = divergence.first_divergence(judged)
        for (r, v), j in zip(seq, judged, strict=True):
            v.update(divergence.row_fields(j.flags))
            flags += [{"module": r["module"], "order": r["order"], "view": view, **f.as_dict()} for f in j.flags]
        first[view] = div.name if div else None
    return flags, first


def _takeaways(first, first_by, flags, missing, costs: str = "rounding") -> list[str]:
    out = []
    if first is None:
        out.append(f"no module of YOURS departs from REF beyond what {costs} costs there, in any view.")
    for view, m in first_by.items():
        if m:
            why = next((f for f in flags if f["view"] == view and f["module"] == m), None)
            out.append(f"{view}: first divergence at {m}" + (f" ({why['rule']}: {why['text']})" if why else ""))
    if missing["only_reference"]:
        out.append(f"{len(missing['only_reference'])} reference modules have no counterpart in YOURS (not compared): "
                   + ", ".join(missing["only_reference"][:6]) + ("..." if len(missing["only_reference"]) > 6 else ""))
    return out
