"""Real dump layouts: YOURS' tensors brought to the reference's layout before
`compare tensors` matches them, and size-1 dimensions squeezed on the side
that has them.

What changes, in this order (the reference's layout is the target, so the
options act on YOURS, the last file: B of two, YOURS of three; a GLOB matches
a name after the --map renames, i.e. the reference's name):

  --unshard GLOB:DIM      tensor-parallel shards NAME.shard0, NAME.shard1, ...
                          (NAME matching GLOB) concatenated along DIM into NAME
  --map 'NAME=A+B[+...]'  NAME is the sum of YOURS' tensors A, B, ... (an
                          engine keeping the residual in two parts); each `*`
                          stands for the same text in NAME and every part
                          (`layers.*=layers.*.hidden+layers.*.residual`). The
                          sum is taken in float64, so it adds no rounding of
                          its own: it is the exact sum of the stored values
                          (up to float64's 2^-53); the row keeps the parts'
                          format for its tolerances and ulps
  --layout GLOB=PERM      axes permuted as numpy.transpose(x, PERM)
  --transpose GLOB        the last two axes swapped ([vocab, T] -> [T, vocab])
  --reshape GLOB=SHAPE    numpy.reshape (one -1 allowed), after the permutation

Per option, the first rule whose GLOB matches a name is the one applied; a
rule matching no tensor of YOURS is a usage error (a typo, else). Then, where
the files' shapes still differ and dropping their size-1 dimensions makes them
agree, those are dropped (a missing batch dimension: [1, T, D] vs [T, D]), on
whichever side has them. Every change is said per tensor (`layout` in each
row). Specs are checked before any file is opened; ranks and sizes against
the headers, before any value is read.
"""

from __future__ import annotations

import fnmatch
import itertools
import math
import re
from dataclasses import dataclass, field

import numpy as np

from precisionlab.errors import UsageError
from precisionlab.io import inputs
from precisionlab.io.tensorfiles import TensorFile

SHARD = re.compile(r"^(?P<base>.+)\.shard(?P<k>\d+)$")  # the one shard naming: NAME.shard0, NAME.shard1, ...
MAX_RANK_SEARCH = 6  # hints search permutations up to this rank (6! = 720 shapes, header arithmetic only)


@dataclass(frozen=True)
class SumRule:
    spec: str
    target: str
    parts: tuple[str, ...]

    def bind(self, name: str) -> tuple[str, list[str]] | None:
        """(target, parts) when `name` is this rule's first part, its `*`s bound."""
        groups = _wild_groups(self.parts[0], name)
        if groups is None:
            return None
        return _fill(self.target, groups), [_fill(p, groups) for p in self.parts]


@dataclass
class LayoutSpec:
    unshards: list[tuple[str, int]] = field(default_factory=list)
    sums: list[SumRule] = field(default_factory=list)
    layouts: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    transposes: list[str] = field(default_factory=list)
    reshapes: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)

    def params(self) -> dict:
        return {"unshard": [f"{g}:{d}" for g, d in self.unshards], "sums": [s.spec for s in self.sums],
                "layout": [f"{g}={','.join(map(str, p))}" for g, p in self.layouts], "transpose": list(self.transposes),
                "reshape": [f"{g}={','.join(map(str, s))}" for g, s in self.reshapes]}


# --- one parser per option ---------------------------------------------------------------


def _ints(text: str, what: str, spec: str) -> tuple[int, ...]:
    try:
        vals = tuple(inputs.integers(text, ",", what))
    except ValueError:
        raise UsageError(f"{what} {spec!r}: {text!r} is not a comma list of integers") from None
    return vals


def _glob_and(spec: str, sep: str, what: str, usage: str) -> tuple[str, str]:
    glob, found, rest = spec.rpartition(sep) if sep == ":" else spec.partition(sep)
    if not found or not glob.strip() or not rest.strip():
        raise UsageError(f"{what} needs {usage}, got {spec!r}")
    return glob.strip(), rest.strip()


def parse_layout(spec: str) -> tuple[str, tuple[int, ...]]:
    glob, text = _glob_and(spec, "=", "--layout", "'GLOB=PERM' (e.g. 'layers.*.attn=1,0,2')")
    perm = _ints(text, "--layout", spec)
    if sorted(perm) != list(range(len(perm))):
        raise UsageError(f"--layout {spec!r}: {text} is not a permutation of 0..{len(perm) - 1}")
    return glob, perm


def parse_transpose(spec: str) -> str:
    if not spec.strip() or "=" in spec:
        raise UsageError(f"--transpose needs a GLOB (the last two axes are swapped), got {spec!r}")
    return spec.strip()


def parse_reshape(spec: str) -> tuple[str, tuple[int, ...]]:
    glob, text = _glob_and(spec, "=", "--reshape", "'GLOB=SHAPE' (e.g. 'lm_head=1,-1,78')")
    shape = _ints(text, "--reshape", spec)
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise UsageError(f"--reshape {spec!r}: sizes are >= 0, with at most one -1")
    return glob, shape


def parse_unshard(spec: str) -> tuple[str, int]:
    glob, text = _glob_and(spec, ":", "--unshard", "'GLOB:DIM' (shards named NAME.shard0, NAME.shard1, ...)")
    try:
        (dim,) = inputs.integers(text, ",", "--unshard")  # one integer: a list does not unpack into one
    except ValueError:
        raise UsageError(f"--unshard {spec!r}: DIM {text!r} is not an integer") from None
    return glob, dim


def is_sum(spec: str) -> bool:
    """A --map whose replacement holds '+' is a sum 'NAME=A+B'; else a rename 'REGEX=REPLACEMENT'."""
    return "+" in spec.partition("=")[2]


def parse_sum(spec: str) -> SumRule:
    target, _, rhs = spec.partition("=")
    parts = tuple(p.strip() for p in rhs.split("+"))
    target = target.strip()
    if not target or len(parts) < 2 or not all(parts):
        raise UsageError(f"--map sum needs 'NAME=PART+PART[+...]', got {spec!r}")
    stars = target.count("*")
    if any(p.count("*") != stars for p in parts):
        raise UsageError(f"--map {spec!r}: each `*` stands for the same text in NAME and in every part, "
                         "so each needs as many")
    if len(set(parts)) < len(parts):
        raise UsageError(f"--map {spec!r}: a part is named twice; each tensor is summed once")
    return SumRule(spec, target, parts)


def parse(maps: list[str], layouts: list[str], transposes: list[str], reshapes: list[str],
          unshards: list[str]) -> tuple[LayoutSpec, list[str]]:
    """Every spec checked (before any file is opened); the --map renames returned for tensors.parse_maps."""
    spec = LayoutSpec(unshards=[parse_unshard(s) for s in unshards],
                      sums=[parse_sum(s) for s in maps if is_sum(s)],
                      layouts=[parse_layout(s) for s in layouts], transposes=[parse_transpose(s) for s in transposes],
                      reshapes=[parse_reshape(s) for s in reshapes])
    return spec, [s for s in maps if not is_sum(s)]


def _wild_groups(pattern: str, name: str) -> list[str] | None:
    """What each `*` of `pattern` (one or more characters each) stands for in
    `name`, or None when it does not match: each piece between the stars
    placed at its leftmost fit, which fits whenever any placement does, so the
    groups are the shortest-first ones a lazy regex would find; in linear
    time, where that regex ('(.+?)' per star) backtracks for ever on a glob of
    many stars."""
    first, *mid = pattern.split("*")
    if not mid:
        return [] if name == pattern else None
    *mid, last = mid
    end = len(name) - len(last)  # where the last star's text must stop
    if not name.startswith(first) or not name.endswith(last) or end < len(first):
        return None
    groups, pos = [], len(first)
    for piece in mid:
        at = name.find(piece, pos + 1, end - 1)  # a character at least for this star and for the next
        if at < 0:
            return None
        groups.append(name[pos:at])
        pos = at + len(piece)
    if end - pos < 1:
        return None
    return groups + [name[pos:end]]


def _fill(pattern: str, groups) -> str:
    pieces = pattern.split("*")
    return pieces[0] + "".join(g + p for g, p in zip(groups, pieces[1:], strict=True))


def _first(globs: list[str], name: str) -> int | None:
    """The index of the first GLOB matching `name`: per option, that rule applies."""
    return next((i for i, g in enumerate(globs) if fnmatch.fnmatchcase(name, g)), None)


def dims(shape) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


# --- the arrangement ---------------------------------------------------------------------


@dataclass
class _Entry:
    """One tensor of a file as it will be compared: where its values come from and what is done to them."""
    shape: tuple
    dtype: str
    read: object                      # () -> np.ndarray
    nbytes: int
    notes: list[str] = field(default_factory=list)


def arrange(files: list[TensorFile], maps: list[dict[str, str]], spec: LayoutSpec,
            labels: list[str]) -> tuple[list[TensorFile], list[dict[str, str]], dict[str, list[str]]]:
    """The files as they will be compared: YOURS (the last) unsharded, summed,
    permuted, transposed and reshaped by `spec`, then size-1 dimensions squeezed
    where that makes a tensor's shapes agree. Returns (files, name maps: new
    name -> the file's key, per-tensor notes); a key is the stored name, or
    for a composite what it is made of ('A + B', 'X.shard0, X.shard1')."""
    entries = [{new: _plain(f, stored) for new, stored in m.items()} for f, m in zip(files, maps, strict=True)]
    keys = [dict(m) for m in maps]
    ours = len(files) - 1
    _unshard(entries[ours], keys[ours], spec, files[ours].path)
    _sum(entries[ours], keys[ours], spec, files[ours].path)
    _reshape_all(entries[ours], spec)
    notes: dict[str, list[str]] = {}
    for name, e in entries[ours].items():
        if e.notes:
            notes[name] = [f"{labels[ours]}: {n}" for n in e.notes]
    for name in entries[0]:
        if all(name in es for es in entries):
            said = _squeeze([es[name] for es in entries], labels)
            if said:
                notes.setdefault(name, []).append(said)
    views = []
    for f, es, ks in zip(files, entries, keys, strict=True):
        order = {stored: i for i, stored in enumerate(f.names)}
        ks_sorted = sorted(es, key=lambda n: order.get(ks[n].split(" + ")[0].split(", ")[0], len(order)))
        views.append(_view(f, {ks[n]: es[n] for n in ks_sorted}))
    return views, keys, notes


def _plain(f: TensorFile, stored: str) -> _Entry:
    return _Entry(tuple(f.shapes[stored]), f.dtypes[stored], lambda: f.get(stored), f.nbytes(stored))


def _view(f: TensorFile, by_key: dict[str, _Entry]) -> TensorFile:
    view = TensorFile(f.path, list(by_key), {k: e.shape for k, e in by_key.items()},
                      {k: e.dtype for k, e in by_key.items()}, f.order_recorded, f.metadata,
                      lambda k: by_key[k].read(), f.skipped)
    view.nbytes = lambda k: by_key[k].nbytes  # what is read: every shard or part, in its stored dtype
    return view


def _unshard(es: dict[str, _Entry], keys: dict[str, str], spec: LayoutSpec, path: str) -> None:
    for glob, dim in spec.unshards:
        groups: dict[str, dict[int, str]] = {}
        for name in es:
            m = SHARD.match(name)
            if m and fnmatch.fnmatchcase(m["base"], glob):
                groups.setdefault(m["base"], {})[int(m["k"])] = name
        if not groups:
            raise UsageError(f"--unshard {glob}:{dim}: no tensor of {path} is named like {glob}.shard0")
        for base, by_k in groups.items():
            if base in es:
                raise UsageError(f"--unshard {glob}:{dim}: {path} holds both {base!r} and its shards")
            if sorted(by_k) != list(range(len(by_k))):
                raise UsageError(f"--unshard: {base!r} has shards {sorted(by_k)}; they must be numbered 0..k-1")
            parts = [es.pop(by_k[k]) for k in range(len(by_k))]
            names = [by_k[k] for k in range(len(by_k))]
            for k in range(len(by_k)):
                keys.pop(by_k[k])
            es[base] = _concat(base, names, parts, dim)
            keys[base] = ", ".join(keys.get(n, n) for n in names)


def _concat(base: str, names: list[str], parts: list[_Entry], dim: int) -> _Entry:
    rank = len(parts[0].shape)
    if not -rank <= dim < rank:
        raise UsageError(f"--unshard {base}: DIM {dim} is out of range for shards of shape {dims(parts[0].shape)}")
    d = dim % rank
    for n, p in zip(names, parts, strict=True):
        if len(p.shape) != rank or p.shape[:d] + p.shape[d + 1:] != parts[0].shape[:d] + parts[0].shape[d + 1:]:
            raise UsageError(f"--unshard {base}: shard {n!r} is {dims(p.shape)}, shard {names[0]!r} "
                             f"{dims(parts[0].shape)}: they may differ along dim {dim} only")
        if p.dtype != parts[0].dtype:
            raise UsageError(f"--unshard {base}: shard {n!r} is {p.dtype}, shard {names[0]!r} {parts[0].dtype}")
    shape = parts[0].shape[:d] + (sum(p.shape[d] for p in parts),) + parts[0].shape[d + 1:]
    return _Entry(shape, parts[0].dtype, lambda: np.concatenate([p.read() for p in parts], axis=d),
                  sum(p.nbytes for p in parts),
                  [f"{len(parts)} shards {', '.join(names)} concatenated along dim {dim} -> {dims(shape)}"])


def _sum(es: dict[str, _Entry], keys: dict[str, str], spec: LayoutSpec, path: str) -> None:
    for rule in spec.sums:
        bound = [b for b in (rule.bind(n) for n in list(es)) if b is not None]
        if not bound:
            raise UsageError(f"--map {rule.spec!r}: no tensor of {path} is named like {rule.parts[0]!r}")
        for target, parts in bound:
            if len(set(parts)) < len(parts):
                raise UsageError(f"--map {rule.spec!r}: the parts of {target!r} name one tensor twice: "
                                 + ", ".join(parts))
            missing = [p for p in parts if p not in es]
            if missing:
                raise UsageError(f"--map {rule.spec!r}: {path} has {parts[0]!r} but not {missing[0]!r}")
            if target in es and target not in parts:
                raise UsageError(f"--map {rule.spec!r}: {path} already holds a tensor named {target!r}")
            shapes = {es[p].shape for p in parts}
            if len(shapes) > 1:
                raise UsageError(f"--map {rule.spec!r}: the parts of {target!r} differ in shape: "
                                 + ", ".join(f"{p} {dims(es[p].shape)}" for p in parts))
            entries = [es.pop(p) for p in parts]
            key = " + ".join(keys.pop(p) for p in parts)
            es[target] = _Entry(entries[0].shape, max((e.dtype for e in entries), key=lambda d: np.dtype(
                _itemsize_dtype(d)).itemsize), lambda es_=entries: _float64_sum(es_), sum(e.nbytes for e in entries),
                [f"sum of {' + '.join(parts)} (in float64)"])
            keys[target] = key


def _itemsize_dtype(name: str):
    from precisionlab.io.tensorfiles import _np_dtype

    return _np_dtype(name)


def _float64_sum(entries: list[_Entry]) -> np.ndarray:
    """In float64, the parts one at a time: exact for two bf16/fp16/fp32 parts of like magnitude."""
    acc = np.asarray(entries[0].read()).astype(np.float64)
    for e in entries[1:]:
        acc += np.asarray(e.read()).astype(np.float64)
    return acc


def _reshape_all(es: dict[str, _Entry], spec: LayoutSpec) -> None:
    unused = {("--layout", i) for i in range(len(spec.layouts))} | \
        {("--transpose", i) for i in range(len(spec.transposes))} | {("--reshape", i) for i in range(len(spec.reshapes))}
    for name, e in es.items():
        i = _first([g for g, _ in spec.layouts], name)
        if i is not None:
            unused.discard(("--layout", i))
            glob, perm = spec.layouts[i]
            _permute(name, e, perm, f"--layout {glob}={','.join(map(str, perm))}")
        i = _first(spec.transposes, name)
        if i is not None:
            unused.discard(("--transpose", i))
            if len(e.shape) < 2:
                raise UsageError(f"--transpose {spec.transposes[i]}: {name!r} is {dims(e.shape)}, "
                                 "with fewer than two axes")
            _permute(name, e, tuple(range(len(e.shape) - 2)) + (len(e.shape) - 1, len(e.shape) - 2), None)
        i = _first([g for g, _ in spec.reshapes], name)
        if i is not None:
            unused.discard(("--reshape", i))
            glob, shape = spec.reshapes[i]
            _reshape(name, e, shape, f"--reshape {glob}={','.join(map(str, shape))}")
    for opt, i in sorted(unused):
        glob = (spec.layouts[i][0] if opt == "--layout" else spec.transposes[i] if opt == "--transpose"
                else spec.reshapes[i][0])
        raise UsageError(f"{opt} {glob}: matches no tensor of YOURS")


def _chain(e: _Entry, op) -> None:
    read = e.read
    e.read = lambda: op(read())


def _permute(name: str, e: _Entry, perm: tuple[int, ...], what: str | None) -> None:
    if len(perm) != len(e.shape):
        raise UsageError(f"{what}: {name!r} is {dims(e.shape)} ({len(e.shape)} axes), the permutation has "
                         f"{len(perm)} ({dims(tuple(perm))})")
    new = tuple(e.shape[i] for i in perm)
    e.notes.append(("transposed" if what is None else f"permuted {','.join(map(str, perm))}:")
                   + f" {dims(e.shape)} -> {dims(new)}")
    e.shape = new
    _chain(e, lambda a: np.transpose(a, perm))


def _reshape(name: str, e: _Entry, shape: tuple[int, ...], what: str) -> None:
    n = math.prod(e.shape)
    known = math.prod(d for d in shape if d != -1)
    if -1 in shape:
        if known == 0 or n % known:
            raise UsageError(f"{what}: {name!r} is {dims(e.shape)} ({n} elements), which {dims(shape)} cannot hold")
        shape = tuple(n // known if d == -1 else d for d in shape)
    if math.prod(shape) != n:
        raise UsageError(f"{what}: {name!r} is {dims(e.shape)} ({n} elements), {dims(shape)} holds "
                         f"{math.prod(shape)}")
    e.notes.append(f"reshaped {dims(e.shape)} -> {dims(shape)}")
    e.shape = shape
    _chain(e, lambda a: np.reshape(a, shape))


def _squeeze(entries: list[_Entry], labels: list[str]) -> str | None:
    """Size-1 dimensions dropped where the shapes differ only by them; what was done, or None."""
    shapes = [e.shape for e in entries]
    if len(set(shapes)) == 1:
        return None
    bare = {tuple(d for d in s if d != 1) for s in shapes}
    if len(bare) > 1:
        return None
    target = bare.pop()
    said = {}
    for lab, e in zip(labels, entries, strict=True):
        if e.shape != target:
            said.setdefault((e.shape, target), []).append(lab)
            e.shape = target
            _chain(e, lambda a, t=target: np.reshape(a, t))
    return "; ".join(f"{', '.join(labs)}: squeezed {dims(s)} -> {dims(t)}" for (s, t), labs in said.items())


# --- hints for what is left unmatched ----------------------------------------------------


def hint_shapes(name: str, ref: tuple, yours: tuple) -> str | None:
    """The option that would bring YOURS' shape to the reference's, from the
    shapes alone: a permutation (--transpose, --layout), one followed by a
    reshape that only merges or splits neighbouring axes, or None."""
    if math.prod(ref) != math.prod(yours):
        return None
    bare_ref = tuple(d for d in ref if d != 1)
    rank = len(yours)
    if rank > MAX_RANK_SEARCH:
        return None
    for perm in itertools.permutations(range(rank)):
        moved = tuple(yours[i] for i in perm)
        bare = tuple(d for d in moved if d != 1)
        opts = []
        if perm != tuple(range(rank)):
            last_two = perm == tuple(range(rank - 2)) + (rank - 1, rank - 2)
            opts.append(f"--transpose '{name}'" if last_two else f"--layout '{name}={','.join(map(str, perm))}'")
        if bare == bare_ref:
            return " ".join(opts) if opts else None
        if _merges(bare, bare_ref):
            return " ".join(opts + [f"--reshape '{name}={','.join(map(str, ref))}'"])
    return None


def _merges(shape: tuple, target: tuple) -> bool:
    """Whether a reshape from `shape` to `target` only merges runs of neighbouring axes, or only splits them."""
    return _coarser(shape, target) or _coarser(target, shape)


def _coarser(shape: tuple, target: tuple) -> bool:
    """Each axis of `target` the product of a run of neighbouring axes of `shape` (no size-0 or size-1 axes)."""
    if 0 in shape or 0 in target:
        return False
    i = 0
    for t in target:
        p = 1
        while p < t and i < len(shape):
            p *= shape[i]
            i += 1
        if p != t:
            return False
    return i == len(shape)


def hint_shards(name: str, present: dict[str, tuple], ref_shapes: dict[str, tuple]) -> str | None:
    """For a tensor of YOURS named NAME.shardK whose NAME is the reference's:
    --unshard NAME:DIM, DIM the shards' axis whose concatenation gives the
    reference's shape (size-1 axes aside), with --transpose where it holds
    the last two axes swapped."""
    m = SHARD.match(name)
    if not m or m["base"] not in ref_shapes:
        return None
    base = m["base"]
    bare = lambda s: tuple(d for d in s if d != 1)  # noqa: E731
    ref = bare(ref_shapes[base])
    shards = [s for n, s in present.items() if (mm := SHARD.match(n)) and mm["base"] == base]
    first = shards[0]
    for d in range(len(first)):
        if not all(len(s) == len(first) and s[:d] + s[d + 1:] == first[:d] + first[d + 1:] for s in shards):
            continue
        whole = first[:d] + (sum(s[d] for s in shards),) + first[d + 1:]
        if bare(whole) == ref:
            return f"--unshard '{base}:{d}'"
        if len(whole) >= 2 and bare(whole[:-2] + (whole[-1], whole[-2])) == ref:
            return f"--unshard '{base}:{d}' --transpose '{base}'"
    return f"--unshard '{base}:DIM'"


def _bare(shape) -> tuple:
    return tuple(d for d in shape if d != 1)


_DIGITS = re.compile(r"\d+")


def _map_rule(yours: str, ref: str) -> str:
    """A --map rule renaming `yours` to `ref`: where both names hold the same
    numbers in the same order (layer indices), each becomes a (\\d+) group so
    one rule covers every layer; else the whole name, anchored."""
    ny, nr = _DIGITS.findall(yours), _DIGITS.findall(ref)
    if ny and ny == nr:
        ys, rs = _DIGITS.split(yours), _DIGITS.split(ref)
        pat = r"(\d+)".join(re.escape(p) for p in ys)
        rep = "".join(p + (f"\\{i + 1}" if i < len(nr) else "") for i, p in enumerate(rs))
        return f"^{pat}$={rep}"
    return f"^{re.escape(yours)}$={ref}"


# How far back a pairing may reach for a reference tensor it skipped: two
# neighbours computed in the other order.
SWAP_WINDOW = 2


def suggest_maps(ref: list[tuple[str, tuple]], yours: list[tuple[str, tuple]],
                 limit: int = 8) -> tuple[list[str], list[str]]:
    """--map rules (and --transpose globs) for two dumps with no name in
    common, from execution order and shapes alone: walking both in order,
    each tensor of YOURS is paired with the reference's next tensor of the
    same shape (size-1 axes aside) or, failing that, of its shape with the
    last two axes swapped (an engine's [vocab, T] logits for [T, vocab]); each
    pair becomes a rule (_map_rule), a swapped one also a --transpose glob on
    the reference's name (its numbers as '*', as --transpose matches the
    renamed tensor). Rules the pairs repeat (every layer's) are given once, in
    the order first met; at most `limit` rules.

    Two neighbours computed in the other order (an engine that builds its
    RoPE phases before the embedding lookup) are a local swap: a reference
    tensor skipped over by the last pairing, up to SWAP_WINDOW back, is tried
    before the ones ahead, so the swap pairs both and shifts nothing after."""
    out: list[str] = []
    swaps: list[str] = []
    j = 0
    used: set[int] = set()

    def find(want):
        back = [i for i in range(max(0, j - SWAP_WINDOW), j) if i not in used]
        return next((i for i in (*back, *range(j, len(ref))) if _bare(ref[i][1]) == want), None)

    for name, shape in yours:
        bare = _bare(shape)
        k = find(bare)
        swapped = False
        if k is None and len(bare) >= 2 and bare[-1] != bare[-2]:
            k = find(bare[:-2] + (bare[-1], bare[-2]))
            swapped = k is not None
        if k is None:
            continue
        rule = _map_rule(name, ref[k][0])
        if rule not in out:
            out.append(rule)
        if swapped:
            glob = _DIGITS.sub("*", ref[k][0])  # --transpose matches the renamed tensor, every layer's
            if glob not in swaps:
                swaps.append(glob)
        used.add(k)
        j = max(j, k + 1)
        if len(out) >= limit:
            break
    return out, swaps
