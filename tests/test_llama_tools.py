"""llama.cpp's own C++ tools, built by `make llama-tools` from the llama.cpp
that llama-cpp-python's sdist vendors (scripts/build_llama_tools.sh), against
the embedded model exported as GGUF at test time:

- `llama-server` (continuous batching, --parallel 4 slots), started by this
  test on 127.0.0.1 (a free port, by pid, ready when GET /health says so,
  stopped by the test): `nondeterminism --endpoint` sequential, concurrent and
  mixed with other prompts, cache_prompt on and off, and the openai adapter,
  which llama-server answers without echo (one request per position);
- `llama-perplexity`: its --kl-divergence-base file, written by itself from the
  f32 GGUF, then its --kl-divergence report of a quantised GGUF against it,
  parsed, beside `compare logits` on the same base file with YOURS computed by
  the llamacpp engine on the same windows (llama-perplexity's rule: each chunk
  of n_ctx tokens a fresh context from position 0, BOS in place of its first
  token where the model adds one, rows n_ctx/2 .. n_ctx - 2).

The binaries are looked for in $PRECISIONLAB_LLAMA_TOOLS, else the cache the
build writes; without them every test here skips, saying to run make
llama-tools (it compiles for tens of minutes, so it is not part of make test).
"""

import importlib.util
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT, cli, loaded_timeout, local_server, strict_json


def _version() -> str:
    """llama-cpp-python's pin in pyproject.toml: the one the build script reads."""
    m = re.search(r'"llama-cpp-python==([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    return m.group(1)


def tools_dir() -> Path:
    if os.environ.get("PRECISIONLAB_LLAMA_TOOLS"):
        return Path(os.environ["PRECISIONLAB_LLAMA_TOOLS"])
    cache = os.environ.get("PRECISIONLAB_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "precisionlab")
    return Path(cache) / f"llama.cpp-{_version()}" / "bin"


def _why_not() -> str | None:
    d = tools_dir()
    missing = [b for b in ("llama-server", "llama-perplexity") if not os.access(d / b, os.X_OK)]
    if missing:
        return (f"{' and '.join(missing)} not built in {d}: run `make llama-tools` (compiles llama.cpp, tens of "
                "minutes) or set PRECISIONLAB_LLAMA_TOOLS to a folder holding them")
    if importlib.util.find_spec("gguf") is None:
        return "the GGUF export needs the gguf package (precisionlab[llamacpp])"
    return None


WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")

N_CTX, N_CHUNKS = 128, 8


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama_tools")
    out = {}
    for variant in ("f32", "q8_0", "q4_0"):
        out[variant] = d / f"m-{variant}.gguf"
        r = cli("export", "embedded", "--to", f"gguf:{variant}", "--out", str(out[variant]),
                timeout=loaded_timeout(300))
        assert r.code == 0, r.err
    return d, out


@pytest.fixture(scope="module")
def server(ggufs):
    """llama-server on the f32 GGUF, 4 slots of continuous batching, its own
    defaults otherwise (f16 KV cache, flash attention auto), one thread."""
    d, models = ggufs
    log_path = d / "llama-server.log"
    argv = lambda port: [str(tools_dir() / "llama-server"), "-m", str(models["f32"]), "--host", "127.0.0.1",  # noqa: E731
                         "--port", str(port), "--parallel", "4", "-c", "1024", "-t", "1", "-tb", "1"]
    # /health: 503 while the model loads, 200 {"status": "ok"} once it serves
    with local_server(argv, log_path, "/health", lambda d: d.get("status") == "ok", what="llama-server", cwd=d) as url:
        yield url, log_path


def test_k_of_n_from_llama_server(server):
    """What must hold whatever the server does: every request answered, k of
    N a valid count, the parting position where the token lists first differ
    (none when they are all one), the spread measured over the common prefix
    only; and llama-server is recognised as honouring cache_prompt. What it
    does (k, parting, spread) is printed for docs/nondeterminism.md."""
    from precisionlab.engines.registry import DEFAULT_PROMPT
    from precisionlab.experiments import endpoint as ep

    n = 16
    res = ep.run(ep.EndpointConfig(url=server[0], prompt=DEFAULT_PROMPT, requests=n, concurrency=4, mix=True,
                                   cache="on,off", max_tokens=16, time_limit=loaded_timeout(240),
                                   request_timeout=loaded_timeout(60)))
    assert res.params["cache_switch"] == "llama.cpp's cache_prompt (llama-server)"
    assert [(r["stream"], r["cache"]) for r in res.rows] == [
        (s, c) for s in ("sequential", "concurrent", "mixed") for c in ("on", "off")]
    for r in res.rows:
        assert r["complete"] and r["answered"] == n, r
        assert 1 <= r["unique"] <= r["distinct_token_lists"] <= n and sum(c["count"] for c in r["counts"]) == n
        part = r["first_parting_token"]
        assert (part is None) == (r["distinct_token_lists"] == 1)
        if part is not None:  # the lists agree on part tokens, then differ (or one ends there)
            assert 0 <= part <= 16 and len(r["logprob_spread"]) == part
        assert len(r["logprob_spread"]) <= 16
        assert r["max_logprob_spread"] is None or r["max_logprob_spread"] >= 0
        print(f"llama-server {r['stream']} C={r['concurrency']} cache {r['cache']}: {r['unique']} of {n}, "
              f"parting {part}, {r['distinct_logprobs']} log-prob vectors, max spread {r['max_logprob_spread']}")


def test_the_openai_adapter_reads_llama_server_without_echo(server):
    """llama-server ignores echo (it answers the generated token only): the
    adapter asks one prefix a request and reads the top 5 by token id. The f32
    GGUF (with llama-server's default f16 KV cache) against the fp32 reference:
    the top-1 agrees almost everywhere and the KLD bound is small; bands chosen
    before the run (>= 90 %, < 1e-3 nats), a one-position shift would give
    chance agreement (the llama-cpp-python server test shows ~ 30 %)."""
    from precisionlab.engines.openai import PER_POSITION
    from precisionlab.experiments import engines

    res = engines.run(engines.EnginesConfig(engines=[f"openai:{server[0]},timeout=60"], tokens=32, steps=2))
    row = res.rows[0]
    assert row["engine"]["prompt_logprobs"] == PER_POSITION and row["engine"]["prompt_as"] == "token ids"
    assert row["positions"] == 32 and row["top1_agree_pct"] >= 90.0, row
    assert row["kld_lower_bound_mean"] < 1e-3, row
    print(f"openai adapter on llama-server: top-1 {row['top1_agree_pct']} %, KLD bound mean "
          f"{row['kld_lower_bound_mean']:.3g}, max {row['kld_lower_bound_max']:.3g}")


# ---------------------------------------------------------------------------
# llama-perplexity --kl-divergence-base / --kl-divergence

# llama-perplexity's closing report: its label -> compare logits' key (report of numerics/llamacpp_stats)
REPORT = {"Mean PPL(Q)": "ppl_q", "Mean PPL(base)": "ppl_base", "Mean ln(PPL(Q)/PPL(base))": "mean_ln_ppl_ratio",
          "Mean    KLD": "mean_kld", "Maximum KLD": "max_kld", "99.9%   KLD": "kld_p99_9",
          "99.0%   KLD": "kld_p99", "95.0%   KLD": "kld_p95", "90.0%   KLD": "kld_p90", "Median  KLD": "median_kld",
          "10.0%   KLD": "kld_p10", " 5.0%   KLD": "kld_p5", " 1.0%   KLD": "kld_p1", " 0.1%   KLD": "kld_p0_1",
          "Minimum KLD": "min_kld", "Mean    Δp": "mean_dp_pct", "RMS Δp": "rms_dp_pct",
          "Same top p": "same_top_p_pct"}


def parse_report(text: str) -> dict[str, tuple[float, int]]:
    """{key: (value, decimals printed)} from llama-perplexity's log."""
    out = {}
    for line in text.splitlines():
        label, sep, rest = line.partition(":")
        key = REPORT.get(label.rstrip())
        if not sep or key is None:
            continue
        m = re.match(r"\s*(-?\d+\.(\d+))", rest)
        if m:
            out[key] = (float(m.group(1)), len(m.group(2)))
    return out


def _perplexity(args: list[str], cwd: Path, until: str | None = None) -> str:
    """One llama-perplexity run (exit 0), its stdout and stderr. until: a line
    its report ends with; llama.cpp logs from a worker thread, and on this
    loaded machine one run in a few exited 0 with the report's last lines
    never written, so a run without it is repeated (at most twice more; the
    computation is deterministic, only the printing is lost)."""
    for _ in range(3):
        p = subprocess.run([str(tools_dir() / "llama-perplexity"), *args, "-c", str(N_CTX), "-b", str(N_CTX),
                            "-t", "1", "-tb", "1", "-fa", "off", "--no-repack"],
                           capture_output=True, text=True, timeout=loaded_timeout(300), cwd=cwd)
        assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
        if until is None or until in p.stdout + p.stderr:
            break
    return p.stdout + p.stderr


@pytest.fixture(scope="module")
def base_file(ggufs):
    """llama-perplexity's own base file, from the f32 GGUF on the held-out text."""
    from precisionlab.experiments import logits as lexp

    d, models = ggufs
    text = d / "text.txt"
    text.write_text(lexp.default_text()[:3 * N_CTX * N_CHUNKS], "utf-8")  # one character is about one token
    base = d / "base.kld"
    _perplexity(["-m", str(models["f32"]), "-f", str(text), "--chunks", str(N_CHUNKS),
                 "--kl-divergence-base", str(base)], d)
    return base


@pytest.fixture(scope="module", params=["q8_0", "q4_0"])
def kld_run(request, ggufs, base_file):
    """A quantised GGUF's --kl-divergence report against the base file, by
    llama-perplexity; the same windows' logits by the llamacpp engine with the
    same settings (f16 KV cache, no flash attention, one thread, no repacked
    kernels, one batch a chunk), as a logits file of the rows the base file
    scores. q4_0 as well as q8_0: q8_0's KLDs are printed with two or three
    significant digits only (%10.6f of ~1e-4), q4_0's with four."""
    from precisionlab.engines.llamacpp import LlamaCppEngine
    from precisionlab.io import kld_base_file, logits_file

    pytest.importorskip("llama_cpp", reason="YOURS' logits come from the llamacpp engine (precisionlab[llamacpp])")
    variant, (d, models), base = request.param, ggufs, base_file
    log = _perplexity(["-m", str(models[variant]), "--kl-divergence-base", str(base), "--kl-divergence"], d,
                      until="Same top p:")
    (d / f"kld-{variant}.log").write_text(log)
    bf = kld_base_file.open_file(str(base), "base")
    assert (bf.n_ctx, bf.n_chunk) == (N_CTX, N_CHUNKS)
    eng = LlamaCppEngine(f"{models[variant]},ctx={N_CTX},batch={N_CTX},ubatch={N_CTX},threads=1,flash=0,extra=0,"
                         f"kv=f16", "cpu")
    meta = eng.llm.metadata  # llama-perplexity: BOS in place of each chunk's first token where the vocab adds one
    bos = int(meta["tokenizer.ggml.bos_token_id"]) if meta.get("tokenizer.ggml.add_bos_token") == "true" else None
    text_ids = np.fromfile(str(base), dtype="<i4", count=N_CTX * N_CHUNKS, offset=kld_base_file.HEADER.size)
    first = N_CTX // 2
    rows = []
    for c in range(N_CHUNKS):
        ids = [int(t) for t in text_ids[c * N_CTX:(c + 1) * N_CTX]]
        if bos is not None:
            ids[0] = bos
        rows.append(eng.rows(ids)[first:N_CTX - 1])
    yours = d / f"yours-{variant}.safetensors"
    logits_file.write(str(yours), np.concatenate(rows).astype(np.float32), bf.tokens,
                      {"model": str(models[variant]), "window": str(N_CTX)})
    return variant, base, yours, log


def llama_kld_float32(base: Path, yours: Path) -> dict[str, float]:
    """llama-perplexity's KLD figures the way it computes them, in float32
    (written here from tools/perplexity/perplexity.cpp's log_softmax and
    percentile): per position, max and log-sum-exp in float, each term
    expf(ln p) * ((ln p - logit) + max + lse) in float, summed in double and
    stored as float; percentiles at float p = fraction (n - 1), interpolated in
    float; the median the float mean of the middle two."""
    from precisionlab.io import kld_base_file, logits_file

    f = np.float32
    bf = kld_base_file.open_file(str(base), "base")
    q = np.fromfile(str(base), dtype="<u2", offset=bf.data_offset).reshape(bf.positions, -1)
    head = np.ascontiguousarray(q[:, :4]).view("<f4")
    scale, low = head[:, :1], head[:, 1:2]
    x = logits_file.open_file(str(yours), "yours").rows(0, bf.positions).astype(f)
    top = x.max(axis=1, keepdims=True)
    lse = np.log(np.exp((x - top).astype(f)).astype(np.float64).sum(axis=1, keepdims=True)).astype(f)
    shift = (top + lse).astype(f)
    lp = (scale * q[:, 4:4 + bf.vocab].astype(f) + low).astype(f)
    term = (np.exp(lp).astype(f) * (((lp - x).astype(f) + shift).astype(f))).astype(f)
    kl = np.where(lp > f(-16), term, f(0)).astype(np.float64).sum(axis=1).astype(f)
    s = np.sort(kl)
    n = s.size

    def pct(fraction):
        p = f(f(fraction) * f(n - 1))
        i = int(p)
        p = f(p - f(i))
        return float(f((f(1) - p) * s[i] + p * s[min(i + 1, n - 1)]))

    mid = s[n // 2] if n % 2 else f(f(0.5) * (s[n // 2] + s[n // 2 - 1]))
    return {"mean_kld": float(np.sum(kl.astype(np.float64)) / n), "max_kld": float(s[-1]), "min_kld": float(s[0]),
            "median_kld": float(mid), **{k: pct(v) for k, v in (
                ("kld_p99_9", 0.999), ("kld_p99", 0.99), ("kld_p95", 0.95), ("kld_p90", 0.9), ("kld_p10", 0.1),
                ("kld_p5", 0.05), ("kld_p1", 0.01), ("kld_p0_1", 0.001))}}


def test_compare_logits_agrees_with_llama_perplexitys_report(kld_run):
    """Every figure of the closing report against compare logits' float64
    one: to 4 significant digits or, where the report prints fewer (its
    %10.6f of a KLD near 1e-4 has 3), to half a unit of its last printed
    digit. Where llama.cpp's own float32 arithmetic moves a figure further
    (a KL is a difference of two ~1-nat sums: ~1e-7 absolute at a position),
    the allowance grows by exactly that: the distance between the float64
    figure and a float32 restatement of llama.cpp's computation, which must
    itself reproduce every printed KLD figure to its last digit (so YOURS'
    logits are the ones llama-perplexity computed, bit for bit or nearly)."""
    variant, base, yours, log = kld_run
    theirs = parse_report(log)
    assert {"mean_kld", "max_kld", "kld_p99", "kld_p90", "median_kld", "rms_dp_pct", "same_top_p_pct",
            "ppl_q", "ppl_base"} <= theirs.keys(), log[-3000:]
    r = cli("compare", "logits", str(base), str(yours), "--json")
    assert r.code == 0, r.err
    ours = strict_json(r.out)["llamacpp"]["YOURS"]
    assert ours["positions"] == N_CHUNKS * (N_CTX - 1 - N_CTX // 2)
    f32 = llama_kld_float32(base, yours)
    lines = []
    for key, (value, decimals) in theirs.items():
        half = 0.5 * 10.0 ** -decimals * (1 + 1e-9)
        if key in f32:
            assert abs(f32[key] - value) <= half + 1e-12, (key, f32[key], value)
        f32_error = abs(f32[key] - ours[key]) if key in f32 else 0.0
        allowed = max(5e-4 * abs(value), half) + f32_error
        assert abs(ours[key] - value) <= allowed, (key, ours[key], value, allowed)
        lines.append(f"{variant} {key}: llama-perplexity {value:.{decimals}f}, compare logits {ours[key]:.6g}"
                     + (f", float32 restatement {f32[key]:.6g}" if key in f32 else ""))
    print("\n".join(lines))
