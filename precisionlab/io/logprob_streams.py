"""Per-token log-probability streams from any engine, read as they come: one
record per sequence, the token ids (or token strings) and the log-probability
of each chosen token, optionally the top-k alternatives at each position.

Formats, by extension:
- `.jsonl`: one JSON object per line (blank lines skipped), either
  `{"token_ids": [int...], "logprobs": [float...], "tokens": [str...],
  "top_logprobs": [{KEY: float, ...} | null, ...]}` (`token_ids` or `tokens`,
  or both; `tokens` and `top_logprobs` optional; KEY a token id written as a
  decimal string when the record has `token_ids`, else a token string; a value
  may also be `{"logprob": float, ...}`, as vLLM's Logprob objects dump), or
  an OpenAI-style response (below), one per line.
- `.json`: one OpenAI-style response, or a list of them: `/v1/completions`
  (`choices[i].logprobs.tokens`, `.token_logprobs`, `.top_logprobs`) or
  `/v1/chat/completions` (`choices[i].logprobs.content[j].token`, `.logprob`,
  `.top_logprobs[k].{token, logprob}`). Each choice is one sequence, in the
  order of its `index`. Token ids come from `choices[i].token_ids` where the
  server sends them, or from tokens written `token_id:N` (vLLM's
  return_tokens_as_token_ids); otherwise the token strings are compared.
- `.safetensors`, `.npz` (allow_pickle=False: a pickled member is refused):
  `token_ids` (integer) and `logprobs` (F64, F32, F16 or BF16), either
  - 2-D, (sequences, T): row s holds sequence s; with `lengths` (integer,
    (sequences,)) row s has lengths[s] tokens and the rest is padding, ignored
    whatever it holds; without `lengths` every position is a token; or
  - 1-D, (tokens,): the sequences concatenated, split by `offsets` (integer,
    (sequences + 1,): 0, ..., tokens, non-decreasing) or `lengths` (summing to
    tokens); with neither, one sequence;
  and optionally `top_ids` (integer) and `top_logprobs` (float), the shape of
  `token_ids` plus a last axis of k: the alternatives listed at each token, a
  negative id an empty slot. Other tensors are ignored.

JSON numbers may also be the strings "nan", "inf", "-inf" (strict JSON, as
this tool writes them) or NaN / Infinity / -Infinity (Python's json). A null
log-prob at a sequence's first token (an echo's first prompt token, which has no
context to be predicted from: vLLM's and OpenAI's echo write null there) is not
a value: it is marked `unscored`, and compare logprobs leaves that position out
of both streams (see drop_unscored), so the sequence keeps its per-sequence
statistics. A null anywhere else is read as NaN and counted.

Nothing is read before its size is checked against memory: a JSON file by its
size, an array file by the shapes and dtypes in its header.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from precisionlab.catalog import formats
from precisionlab.errors import UsageError
from precisionlab.io import inputs

EXTENSIONS = (".jsonl", ".json", ".safetensors", ".npz")
# Bytes of memory per byte of JSON text, at most: a parsed number is a 24-28
# byte Python object behind an 8-byte pointer (2.5-6x its text), a top-k entry
# a dict (~10x); the arrays kept are smaller than the text they came from.
JSON_MEMORY_FACTOR = 16
# Bytes per value once read from an array file: the stored value and its float64 / int64 copy.
ARRAY_COPY_BYTES = 8
_TOKEN_ID = re.compile(r"token_id:([0-9]+)\Z")
MAX_ID = 2**63 - 1  # ids are held as int64
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "+inf": math.inf}


@dataclass
class Stream:
    """One stream, flat over its tokens: sequence s is [offsets[s], offsets[s+1])."""

    name: str
    kind: str                               # jsonl, openai, safetensors, npz, arrays
    logprobs: np.ndarray                    # float64 (tokens,)
    offsets: np.ndarray                     # int64 (sequences + 1,)
    token_ids: np.ndarray | None = None     # int64 (tokens,)
    tokens: list[str] | None = None         # the token strings, where the file has them
    top_logprobs: np.ndarray | None = None  # float64 (tokens, k), NaN in an empty slot
    top_ids: np.ndarray | None = None       # int64 (tokens, k), -1 in an empty slot
    top_tokens: list[list[str]] | None = None  # string keys of the top lists, where they have no ids
    dtype: str = "float64"                  # what the log-probs were stored in
    unscored: np.ndarray | None = None      # bool (tokens,): a sequence's first token whose log-prob was null

    @property
    def sequences(self) -> int:
        return self.offsets.size - 1

    @property
    def n(self) -> int:
        return int(self.offsets[-1])

    @property
    def top_k(self) -> int:
        return 0 if self.top_logprobs is None else int(self.top_logprobs.shape[1])


def from_arrays(token_ids, logprobs, offsets=None, top_ids=None, top_logprobs=None, name: str = "stream",
                tokens: list[str] | None = None) -> Stream:
    """A stream from arrays in memory (an engine's output): flat token_ids and
    logprobs (tokens,), offsets (sequences + 1,) or None for one sequence,
    top_ids / top_logprobs (tokens, k) optional."""
    lp = np.asarray(logprobs, dtype=np.float64).ravel()
    ids = None if token_ids is None else np.asarray(token_ids, dtype=np.int64).ravel()
    off = np.array([0, lp.size], dtype=np.int64) if offsets is None else np.asarray(offsets, dtype=np.int64)
    st = Stream(name, "arrays", lp, off, ids, tokens)
    if top_ids is not None:
        st.top_ids = np.asarray(top_ids, dtype=np.int64).reshape(lp.size, -1)
        st.top_logprobs = np.where(st.top_ids >= 0, np.asarray(top_logprobs, dtype=np.float64)
                                   .reshape(lp.size, -1), np.nan)
        st.top_ids = np.where(st.top_ids >= 0, st.top_ids, -1)
    _check_stream(st, name)
    return st


def _check_stream(st: Stream, where: str) -> None:
    off = st.offsets
    if off.ndim != 1 or off.size < 2 or off[0] != 0 or np.any(np.diff(off) < 0) or off[-1] != st.logprobs.size:
        raise UsageError(f"{where}: offsets must run from 0 to the {st.logprobs.size} tokens, never decreasing")
    if st.token_ids is not None:
        if st.token_ids.size != st.logprobs.size:
            raise UsageError(f"{where}: {st.token_ids.size} token ids but {st.logprobs.size} log-probs")
        neg = np.flatnonzero(st.token_ids < 0)
        if neg.size:
            raise UsageError(f"{where}: negative token id {int(st.token_ids[neg[0]])} at token {int(neg[0])}")
    if st.n == 0:
        raise UsageError(f"{where}: holds no tokens")


def read(path: str, what: str) -> Stream:
    """The stream in `path`; `what` names it in messages (A, B). A bad file is a usage error naming it."""
    p = inputs.check_regular_file(path, what)
    ext = p.suffix.lower()
    if ext not in EXTENSIONS:
        raise UsageError(f"{what} {path}: unsupported extension {ext!r} (use {', '.join(EXTENSIONS)})")
    where = f"{what} {path}"
    if ext in (".jsonl", ".json"):
        inputs.check_memory(JSON_MEMORY_FACTOR * p.stat().st_size, where)
        records = _jsonl_records(p, where) if ext == ".jsonl" else _json_records(p, where)
        st = _from_records(records, str(p), "jsonl" if ext == ".jsonl" else "openai", where)
    else:
        st = _read_arrays(p, ext, where)
    _check_stream(st, where)
    return st


# ---------------------------------------------------------------------------
# JSON: records of one sequence each


def _parse_constant(name: str) -> float:  # NaN, Infinity, -Infinity: Python's json writes them
    return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[name]


def _parse_int(digits: str) -> int | float:
    """A JSON integer: an int while it could be a token id or a plain number;
    a longer one (past 10^40) as the float its digits round to (inf past the
    range, as a float literal past it is), so that neither Python's limit on
    int conversion nor float(int) raises on a hostile file."""
    return int(digits) if len(digits.lstrip("-")) <= 40 else float(digits)


def _jsonl_records(p: Path, where: str):
    """(where, sequence dict) for each sequence of each line."""
    try:
        fh = open(p, "rb")
    except OSError as e:
        raise UsageError(f"{where}: cannot read ({e.strerror})") from None
    with fh:
        for lineno, raw in enumerate(fh, 1):
            at = f"{where}: line {lineno}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UsageError(f"{at}: not UTF-8 (byte {e.start})") from None
            if not text.strip():
                continue
            yield from _sequences(_parse_json(text, at, "a record"), at)


def _parse_json(text: str, at: str, what: str, lines: bool = False):
    """One JSON document, strict about NaN literals; a bad one is one line
    naming where (the line of a JSONL file, or line and column of a file)."""
    try:
        return json.loads(text, parse_constant=_parse_constant, parse_int=_parse_int)
    except json.JSONDecodeError as e:
        where = f"line {e.lineno}, column {e.colno}" if lines else f"column {e.colno}"
        raise UsageError(f"{at}: not JSON ({e.msg}, {where})") from None
    except RecursionError:
        raise UsageError(f"{at}: nested too deeply to be {what}") from None


def _json_records(p: Path, where: str):
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{where}: not UTF-8 (byte {e.start})") from None
    except OSError as e:
        raise UsageError(f"{where}: cannot read ({e.strerror})") from None
    doc = _parse_json(text, where, "a response", lines=True)
    docs = doc if isinstance(doc, list) else [doc]
    for i, d in enumerate(docs):
        at = f"{where}: response {i}" if isinstance(doc, list) else where
        if not (isinstance(d, dict) and "choices" in d):
            raise UsageError(f"{at}: not an OpenAI-style response (no 'choices'); one record per sequence "
                             "belongs in a .jsonl file")
        yield from _sequences(d, at)


def _sequences(doc, at: str):
    if not isinstance(doc, dict):
        raise UsageError(f"{at}: a record is a JSON object, got {type(doc).__name__}")
    if "choices" in doc:
        yield from _openai(doc, at)
        return
    if "logprobs" not in doc or not ("token_ids" in doc or "tokens" in doc):
        raise UsageError(f"{at}: a record needs 'logprobs' and 'token_ids' (or 'tokens'), or is an OpenAI-style "
                         "response with 'choices'")
    lps = _floats(doc["logprobs"], f"{at}: logprobs")
    ids = None if doc.get("token_ids") is None else _ints(doc["token_ids"], f"{at}: token_ids")
    toks = None if doc.get("tokens") is None else _strings(doc["tokens"], f"{at}: tokens")
    if ids is None and toks is None:
        raise UsageError(f"{at}: 'token_ids' and 'tokens' are both null")
    for name, v in (("token_ids", ids), ("tokens", toks)):
        if v is not None and len(v) != lps.size:
            raise UsageError(f"{at}: {len(v)} {name} but {lps.size} logprobs")
    tops = None
    if doc.get("top_logprobs") is not None:
        raw = doc["top_logprobs"]
        if not isinstance(raw, list) or len(raw) != lps.size:
            raise UsageError(f"{at}: top_logprobs must be a list of {lps.size} entries (one per token)")
        tops = [_top_entry(e, f"{at}: top_logprobs[{j}]", ids is not None) for j, e in enumerate(raw)]
    yield at, ids, toks, lps, tops, _first_null(doc["logprobs"])


def _openai(doc: dict, at: str):
    choices = doc["choices"]
    if not isinstance(choices, list) or not choices:
        raise UsageError(f"{at}: 'choices' must be a non-empty list")
    if all(isinstance(c, dict) and type(c.get("index")) is int for c in choices):
        choices = sorted(choices, key=lambda c: c["index"])
    for i, c in enumerate(choices):
        here = f"{at}: choices[{i}]"
        lp = c.get("logprobs") if isinstance(c, dict) else None
        if not isinstance(lp, dict):
            raise UsageError(f"{here} has no logprobs (ask the server for them: logprobs=true / logprobs=k)")
        if "content" in lp:  # chat completions
            content = lp["content"]
            if not isinstance(content, list):
                raise UsageError(f"{here}.logprobs.content must be a list")
            toks, vals, tops = [], [], []
            for j, e in enumerate(content):
                if not isinstance(e, dict) or "token" not in e or "logprob" not in e:
                    raise UsageError(f"{here}.logprobs.content[{j}]: needs 'token' and 'logprob'")
                toks.append(e["token"])
                vals.append(e["logprob"])
                alts = e.get("top_logprobs")
                if alts is None:
                    tops.append(None)
                    continue
                if not isinstance(alts, list) or not all(isinstance(t, dict) and "token" in t and "logprob" in t
                                                         for t in alts):
                    raise UsageError(f"{here}.logprobs.content[{j}].top_logprobs: a list of {{token, logprob}}")
                entry: dict = {}
                for t in alts:  # two ids may decode to one string: the first (most likely) is kept
                    entry.setdefault(_string(t["token"], f"{here}.logprobs.content[{j}].top_logprobs"),
                                     t["logprob"])
                tops.append(entry)
            base = f"{here}.logprobs.content"
        elif "token_logprobs" in lp and "tokens" in lp:  # completions
            toks, vals = lp["tokens"], lp["token_logprobs"]
            tops = lp.get("top_logprobs")
            base = f"{here}.logprobs"
        else:
            raise UsageError(f"{here}.logprobs: neither 'content' (chat) nor 'tokens' + 'token_logprobs' (completions)")
        toks = _strings(toks, f"{base} tokens")
        lps = _floats(vals, f"{base} logprobs")
        if len(toks) != lps.size:
            raise UsageError(f"{base}: {len(toks)} tokens but {lps.size} logprobs")
        if tops is not None:
            if not isinstance(tops, list) or len(tops) != lps.size:
                raise UsageError(f"{base}: top_logprobs must be a list of {lps.size} entries (one per token)")
            tops = [_top_entry(e, f"{base} top_logprobs[{j}]", False) for j, e in enumerate(tops)]
        ids = None
        sent = c.get("token_ids")
        if isinstance(sent, list) and len(sent) == lps.size:
            ids = _ints(sent, f"{here}.token_ids")
        elif toks and all(_TOKEN_ID.match(t) for t in toks):
            ids = np.array([_id(_TOKEN_ID.match(t).group(1), f"{here}.tokens") for t in toks], dtype=np.int64)
        if ids is not None and tops is not None and all(e is None or all(_TOKEN_ID.match(k) for k in e) for e in tops):
            tops = [None if e is None else {_id(_TOKEN_ID.match(k).group(1), f"{here}.top_logprobs"): v
                                            for k, v in e.items()} for e in tops]
        yield here, ids, toks, lps, tops, _first_null(vals)


def _first_null(vals) -> bool:
    """The record's first log-prob is JSON null (an echo's unconditioned first token), not a number."""
    return isinstance(vals, list) and bool(vals) and vals[0] is None


def _top_entry(e, at: str, keyed_by_id: bool):
    """One position's alternatives: {key: logprob}, keys ints (ids) or strings."""
    if e is None:
        return None
    if not isinstance(e, dict):
        raise UsageError(f"{at}: an object mapping each listed token to its log-prob")
    out = {}
    for k, v in e.items():
        if isinstance(v, dict):
            if "logprob" not in v:
                raise UsageError(f"{at}[{k!r}]: an object without 'logprob'")
            v = v["logprob"]
        if keyed_by_id:
            if not re.fullmatch(r"[0-9]+", k):
                raise UsageError(f"{at}: key {k!r} is not a token id (the record has token_ids)")
            k = _id(k, at)
        out[k] = _float(v, f"{at}[{k!r}]")
    return out


def _float(v, at: str) -> float:
    if type(v) is float or type(v) is int:
        return float(v)
    if v is None:
        return math.nan
    if isinstance(v, str) and v.strip().lower() in _NONFINITE:
        return _NONFINITE[v.strip().lower()]
    raise UsageError(f"{at}: not a number ({_show(v)})")


def _floats(v, at: str) -> np.ndarray:
    if not isinstance(v, list):
        raise UsageError(f"{at}: a list of numbers, got {type(v).__name__}")
    if all(type(x) is float or type(x) is int for x in v):  # the common case, at numpy's speed
        return np.array(v, dtype=np.float64)
    return np.array([_float(x, f"{at}[{j}]") for j, x in enumerate(v)], dtype=np.float64)


def _id(digits: str, at: str) -> int:
    """A token id spelled in decimal digits, within int64."""
    digits = digits.lstrip("0") or "0"  # 19 digits hold any int64; int() on a long string is slow, or refused
    if len(digits) > 19 or int(digits) > MAX_ID:
        raise UsageError(f"{at}: token id {_show(digits)} is past the largest id held here (2^63 - 1)")
    return int(digits)


def _ints(v, at: str) -> np.ndarray:
    if not isinstance(v, list):
        raise UsageError(f"{at}: a list of token ids, got {type(v).__name__}")
    for j, x in enumerate(v):
        if type(x) is not int or not 0 <= x <= MAX_ID:
            raise UsageError(f"{at}[{j}]: not a token id (a non-negative integer): {_show(x)}")
    return np.array(v, dtype=np.int64)


def _string(v, at: str) -> str:
    if not isinstance(v, str):
        raise UsageError(f"{at}: a token string, got {_show(v)}")
    return v


def _strings(v, at: str) -> list[str]:
    if not isinstance(v, list):
        raise UsageError(f"{at}: a list of token strings, got {type(v).__name__}")
    return [_string(x, f"{at}[{j}]") for j, x in enumerate(v)]


def _show(v) -> str:
    s = json.dumps(v) if not isinstance(v, float) else repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _from_records(records, name: str, kind: str, where: str) -> Stream:
    ids, toks, lps, tops, lengths, nulls = [], [], [], [], [], []
    first_at = None
    for at, i, t, lp, top, null in records:
        first_at = first_at or at
        if lengths and (i is None) != (ids[0] is None):
            raise UsageError(f"{at}: has {'no ' if i is None else ''}token ids where the first record "
                             f"{'has' if i is None else 'has none'}; a stream has ids throughout or not at all")
        ids.append(i)
        toks.append(t)
        lps.append(lp)
        tops.append(top)
        nulls.append(null)
        lengths.append(lp.size)
    if not lengths:
        raise UsageError(f"{where}: holds no records")
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    st = Stream(name, kind, np.concatenate(lps), offsets)
    if any(nulls):
        st.unscored = np.zeros(st.n, dtype=bool)
        st.unscored[offsets[:-1][np.asarray(nulls, dtype=bool)]] = True
    if ids[0] is not None:
        st.token_ids = np.concatenate(ids)
    if all(t is not None for t in toks):
        st.tokens = [s for t in toks for s in t]
    if any(t is not None for t in tops):
        _dense_tops(st, [e for t, n in zip(tops, lengths, strict=True) for e in (t if t is not None else [None] * n)], where)
    return st


def _dense_tops(st: Stream, entries: list, where: str) -> None:
    """Per-token {key: logprob} lists as dense (tokens, k) arrays, keys ids or strings."""
    k = max((len(e) for e in entries if e), default=0)
    if k == 0:
        return
    inputs.check_memory(len(entries) * k * 24, f"{where}: top_logprobs")
    lps = np.full((len(entries), k), np.nan)
    by_id = all(isinstance(key, int) for e in entries if e for key in e)
    keys = np.full((len(entries), k), -1, dtype=np.int64) if by_id else None
    strs: list[list[str]] = []
    for i, e in enumerate(entries):
        items = list(e.items()) if e else []
        lps[i, :len(items)] = [v for _, v in items]
        if by_id:
            keys[i, :len(items)] = [key for key, _ in items]
        else:
            strs.append([str(key) for key, _ in items])
    st.top_logprobs = lps
    if by_id:
        st.top_ids = keys
    else:
        st.top_tokens = strs


# ---------------------------------------------------------------------------
# arrays: .safetensors and .npz, headers first

_FLOATS = tuple(formats.TWINS[n][0].name for n in ("fp64", *formats.COMPUTE))


def _read_arrays(p: Path, ext: str, where: str) -> Stream:
    from precisionlab.io import tensorfiles

    tf = tensorfiles.open_tensor_file(str(p))  # headers only; .npz members with allow_pickle=False
    names = set(tf.names)
    missing = [k for k in ("token_ids", "logprobs") if k not in names]
    if missing:
        raise UsageError(f"{where}: no {' or '.join(repr(m) for m in missing)} array (the layout: 'token_ids' and "
                         "'logprobs', (sequences, T) or flat, with 'lengths' or 'offsets'; see docs/compare-logprobs.md)")
    shape = tf.shapes["logprobs"]
    _want(tf, "logprobs", _FLOATS, where)
    _want(tf, "token_ids", None, where)
    if tf.shapes["token_ids"] != shape or len(shape) not in (1, 2):
        raise UsageError(f"{where}: 'token_ids' {list(tf.shapes['token_ids'])} and 'logprobs' {list(shape)} must "
                         "have one shape, (sequences, T) or (tokens,)")
    used = ["token_ids", "logprobs"]
    for k in ("lengths", "offsets"):
        if k in names:
            _want(tf, k, None, where)
            used.append(k)
    if "lengths" in names and "offsets" in names:
        raise UsageError(f"{where}: give 'lengths' or 'offsets', not both")
    if "offsets" in names and len(shape) == 2:
        raise UsageError(f"{where}: 'offsets' splits flat (tokens,) arrays; rows of (sequences, T) take 'lengths'")
    top = [k for k in ("top_ids", "top_logprobs") if k in names]
    if len(top) == 1:
        raise UsageError(f"{where}: {top[0]!r} without {({'top_ids', 'top_logprobs'} - set(top)).pop()!r}")
    if top:
        _want(tf, "top_ids", None, where)
        _want(tf, "top_logprobs", _FLOATS, where)
        ts = tf.shapes["top_ids"]
        if tf.shapes["top_logprobs"] != ts or ts[:-1] != shape or len(ts) != len(shape) + 1:
            raise UsageError(f"{where}: 'top_ids' and 'top_logprobs' must both be {list(shape)} + [k], got "
                             f"{list(ts)} and {list(tf.shapes['top_logprobs'])}")
        used += top
    need = sum(tf.nbytes(k) + ARRAY_COPY_BYTES * int(np.prod(tf.shapes[k], dtype=np.int64)) for k in used)
    inputs.check_memory(need, where)
    get = {k: tf.get(k) for k in used}
    lp = np.asarray(get["logprobs"], dtype=np.float64)
    ids = np.asarray(get["token_ids"]).astype(np.int64)
    tids = np.asarray(get["top_ids"]).astype(np.int64) if top else None
    tlp = np.asarray(get["top_logprobs"], dtype=np.float64) if top else None
    if len(shape) == 2:
        s, t = shape
        lengths = np.full(s, t, dtype=np.int64)
        if "lengths" in get:
            lengths = _index_array(get["lengths"], (s,), "lengths", where)
            bad = np.flatnonzero((lengths < 0) | (lengths > t))
            if bad.size:
                raise UsageError(f"{where}: lengths[{int(bad[0])}] = {int(lengths[bad[0]])} is outside 0..{t} "
                                 "(the row's width)")
        keep = np.arange(t)[None, :] < lengths[:, None]
        lp, ids = lp[keep], ids[keep]
        if top:
            tids, tlp = tids[keep], tlp[keep]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    else:
        n = shape[0]
        if "offsets" in get:
            offsets = _index_array(get["offsets"], None, "offsets", where)
            if offsets.size < 2 or offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) < 0):
                raise UsageError(f"{where}: 'offsets' must run from 0 to {n} (the tokens), never decreasing")
        elif "lengths" in get:
            lengths = _index_array(get["lengths"], None, "lengths", where)
            if np.any(lengths < 0) or int(lengths.sum()) != n:
                raise UsageError(f"{where}: 'lengths' must be >= 0 and sum to {n} (the tokens), "
                                 f"got a sum of {int(lengths.sum())}")
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        else:
            offsets = np.array([0, n], dtype=np.int64)
    st = Stream(str(p), ext.lstrip("."), lp, offsets, ids, dtype=tf.dtypes["logprobs"])
    if top:
        empty = tids < 0
        st.top_ids = np.where(empty, -1, tids)
        st.top_logprobs = np.where(empty, np.nan, tlp)
    return st


def _want(tf, name: str, floats, where: str) -> None:
    dt = tf.dtypes[name]
    if floats is None and not dt.startswith(("int", "uint")):
        raise UsageError(f"{where}: {name!r} must hold integers, got {dt}")
    if floats is not None and dt not in floats:
        raise UsageError(f"{where}: {name!r} must hold floats ({', '.join(floats)}), got {dt}")


def _index_array(a, shape, name: str, where: str) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 1 or (shape is not None and a.shape != shape):
        raise UsageError(f"{where}: {name!r} must be 1-D" + (f" of {shape[0]} entries" if shape else "")
                         + f", got shape {list(a.shape)}")
    return a.astype(np.int64)


# ---------------------------------------------------------------------------
# a pair


def check_pair(a: Stream, b: Stream) -> str:
    """The two streams must hold the same tokens, sequence by sequence: by id
    where both have ids, else by token string. Returns "ids" or "tokens"; the
    first disagreement is a usage error naming its sequence and position."""
    if a.token_ids is not None and b.token_ids is not None:
        by, ka, kb = "ids", a.token_ids, b.token_ids
    elif a.tokens is not None and b.tokens is not None:
        by, ka, kb = "tokens", np.asarray(a.tokens, dtype=object), np.asarray(b.tokens, dtype=object)
    else:
        raise UsageError("A and B share no way to compare their tokens: "
                         f"A has {_keys(a)}, B has {_keys(b)}")
    for s in range(min(a.sequences, b.sequences)):
        xa = ka[a.offsets[s]:a.offsets[s + 1]]
        xb = kb[b.offsets[s]:b.offsets[s + 1]]
        m = min(xa.size, xb.size)
        diff = np.flatnonzero(xa[:m] != xb[:m])
        if diff.size:
            t = int(diff[0])
            what = "token ids" if by == "ids" else "tokens"
            raise UsageError(f"{what} differ first at sequence {s}, position {t}: A {_token(xa[t])}, B {_token(xb[t])}")
        if xa.size != xb.size:
            raise UsageError(f"sequence {s} has {xa.size} tokens in A, {xb.size} in B: they differ first at "
                             f"position {m}")
    if a.sequences != b.sequences:
        raise UsageError(f"A has {a.sequences} sequences, B {b.sequences}: they differ first at sequence "
                         f"{min(a.sequences, b.sequences)}")
    return by


def drop_unscored(a: Stream, b: Stream) -> tuple[Stream, Stream, np.ndarray]:
    """Two streams that check_pair accepted (the same sequences and lengths),
    less every position either marks unscored (a null first log-prob): (a, b,
    per sequence 1 where its first position was left out, else 0: what to add
    to a position to name it as the file counts). The rest of each sequence stays in, so a stream of
    echoes keeps its per-sequence statistics instead of losing every sequence
    to a NaN at position 0."""
    drop = np.zeros(a.n, dtype=bool)
    for st in (a, b):
        if st.unscored is not None:
            drop |= st.unscored
    first = drop[a.offsets[:-1][np.diff(a.offsets) > 0]] if a.n else drop[:0]
    shift = np.zeros(a.sequences, dtype=np.int64)
    shift[np.diff(a.offsets) > 0] = first
    if not drop.any():
        return a, b, shift
    keep = ~drop
    return _subset(a, keep), _subset(b, keep), shift


def _subset(st: Stream, keep: np.ndarray) -> Stream:
    """st's positions where keep is True, its sequences' bounds moved to match."""
    kept = np.concatenate([[0], np.cumsum(keep)]).astype(np.int64)
    sub = Stream(st.name, st.kind, st.logprobs[keep], kept[st.offsets], dtype=st.dtype)
    if st.token_ids is not None:
        sub.token_ids = st.token_ids[keep]
    if st.tokens is not None:
        sub.tokens = [t for t, k in zip(st.tokens, keep, strict=True) if k]
    if st.top_logprobs is not None:
        sub.top_logprobs = st.top_logprobs[keep]
    if st.top_ids is not None:
        sub.top_ids = st.top_ids[keep]
    if st.top_tokens is not None:
        sub.top_tokens = [t for t, k in zip(st.top_tokens, keep, strict=True) if k]
    return sub


def _keys(st: Stream) -> str:
    return "token ids" if st.token_ids is not None else "token strings only"


def _token(x) -> str:
    return str(int(x)) if isinstance(x, (int, np.integer)) else repr(x)


def top_keys(a: Stream, b: Stream) -> tuple[np.ndarray, np.ndarray] | None:
    """Both streams' top-list keys as integers that compare across them: the
    ids where both are keyed by id, else codes for the token strings (one
    table for both). None where a side lists no alternatives, or the two are
    keyed differently."""
    if a.top_logprobs is None or b.top_logprobs is None:
        return None
    if a.top_ids is not None and b.top_ids is not None:
        return a.top_ids, b.top_ids
    if a.top_tokens is None or b.top_tokens is None:
        return None
    table: dict[str, int] = {}

    def codes(st: Stream) -> np.ndarray:
        out = np.full(st.top_logprobs.shape, -1, dtype=np.int64)
        for i, row in enumerate(st.top_tokens):
            out[i, :len(row)] = [table.setdefault(t, len(table)) for t in row]
        return out

    return codes(a), codes(b)
