"""Hostile and careless inputs, round four (issue 45): what an export may
replace, values and timing from servers, knobs passed to C, options that
change an allocation, and the smaller cases; each with the siblings of its
mechanism."""

from __future__ import annotations

import contextlib
import math
import importlib.util
import os

import pytest

from helpers import fail_if_a_model_runs, one_line


def _packages_present(monkeypatch, *names):
    """export's package checks pass for `names` (the refusals under test come after them)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: object() if n in names else real(n, *a))


def _user_folder(tmp_path, model_file="config.json"):
    d = tmp_path / "mine"
    d.mkdir()
    (d / model_file).write_text("{}")
    (d / "my_notes.txt").write_text("notes")
    (d / "README_mine.md").write_text("readme")
    return d


def _contents(d):
    return {p.name: p.read_bytes() for p in d.iterdir()}


# ---------------------------------------------------------------------------
# (1) export never empties a user's folder


@pytest.mark.parametrize("to, model_file", [("hf", "config.json"), ("ct2:float32", "model.bin")])
def test_export_refuses_a_users_model_folder_without_force(run, tmp_path, monkeypatch, to, model_file):
    """DIR held config.json (or model.bin) plus the user's notes: the export replaced it whole, exit 0."""
    _packages_present(monkeypatch, "ctranslate2")
    fail_if_a_model_runs(monkeypatch)
    d = _user_folder(tmp_path, model_file)
    before = _contents(d)
    one_line(run("export", "embedded", "--to", to, "--out", str(d)), 2, "--force", "not empty")
    assert _contents(d) == before


@pytest.mark.parametrize("to, model_file, written", [("hf", "config.json", "model.safetensors"),
                                                     ("ct2:float32", "model.bin", "precisionlab-source.json")])
def test_export_with_force_fills_the_folder_and_keeps_the_users_files(run, tmp_path, to, model_file, written):
    if to.startswith("ct2"):
        pytest.importorskip("ctranslate2")
    d = _user_folder(tmp_path, model_file)
    r = run("export", "embedded", "--to", to, "--out", str(d), "--force", "--json")
    assert r.code == 0, r.err
    assert (d / "my_notes.txt").read_text() == "notes" and (d / "README_mine.md").read_text() == "readme"
    assert (d / model_file).read_bytes() != b"{}" and (d / written).is_file()
    import json

    names = {f["name"] for f in json.loads(r.out)["rows"]}
    assert "my_notes.txt" not in names and model_file in names  # only what the run wrote is listed


def test_atomic_dir_never_deletes_a_file_it_did_not_write(tmp_path):
    from precisionlab.errors import RunError, UsageError
    from precisionlab.io import outputs

    d = _user_folder(tmp_path)
    before = _contents(d)
    with pytest.raises(UsageError):
        outputs.atomic_dir(d, lambda tmp: (open(os.path.join(tmp, "config.json"), "w").write("new")))
    assert _contents(d) == before
    (d / "sub").mkdir()
    with pytest.raises(RunError):  # a member that is the user's folder: nothing written at all
        outputs.atomic_dir(d, lambda tmp: [open(os.path.join(tmp, n), "w").write("new") for n in ("a", "sub")],
                           force=True)
    assert not (d / "a").exists() and (d / "sub").is_dir()
    assert outputs.atomic_dir(d, lambda tmp: open(os.path.join(tmp, "config.json"), "w").write("new"),
                              force=True) == ["config.json"]
    assert (d / "config.json").read_text() == "new" and (d / "my_notes.txt").read_text() == "notes"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_an_empty_folder_is_filled_without_force(tmp_path):
    from precisionlab.io import outputs

    d = tmp_path / "empty"
    d.mkdir()
    outputs.atomic_dir(d, lambda tmp: open(os.path.join(tmp, "x"), "w").write("1"))
    assert (d / "x").read_text() == "1"


# ---------------------------------------------------------------------------
# (2) side files and --out's extension; (7) a link as --out


def test_the_onnx_side_file_is_refused_if_it_exists(run, tmp_path, monkeypatch):
    _packages_present(monkeypatch, "onnx")
    fail_if_a_model_runs(monkeypatch)
    side = tmp_path / "m.onnx.precisionlab-source.json"
    side.write_text("mine")
    one_line(run("export", "embedded", "--to", "onnx:fp32", "--out", str(tmp_path / "m.onnx")), 2,
             "m.onnx.precisionlab-source.json", "--force")
    assert side.read_text() == "mine"


@pytest.mark.parametrize("to, name", [("gguf:f32", "notes.txt"), ("gguf:q8_0", "m"), ("onnx:fp32", "m.gguf")])
def test_an_out_whose_extension_is_not_the_formats_is_refused(run, tmp_path, monkeypatch, to, name):
    _packages_present(monkeypatch, "gguf", "onnx")
    fail_if_a_model_runs(monkeypatch)
    f = tmp_path / name
    f.write_text("my text")
    one_line(run("export", "embedded", "--to", to, "--out", str(f)), 2, "extension" if "." in name else "no ext")
    assert f.read_text() == "my text"


def test_the_success_line_names_the_side_file():
    from precisionlab.engines.export import ExportResult
    from precisionlab.report import export as report
    from precisionlab.report.console import stdout

    res = ExportResult("embedded", "onnx:fp32", "m.onnx", [], [{"name": "m.onnx", "bytes": 3}],
                       {"export_s": 1.0}, ["m.onnx.precisionlab-source.json"])
    with stdout.capture() as cap:
        report.table(res)
    assert "m.onnx.precisionlab-source.json" in cap.get()


@pytest.mark.parametrize("to", ["hf", "ct2:float32"])
def test_an_out_that_is_a_link_to_a_folder_is_refused_before_the_run(run, tmp_path, monkeypatch, to):
    """NotADirectoryError after the whole export had run."""
    _packages_present(monkeypatch, "ctranslate2")
    fail_if_a_model_runs(monkeypatch)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    one_line(run("export", "embedded", "--to", to, "--out", str(tmp_path / "link")), 2, "symbolic link")


# ---------------------------------------------------------------------------
# (1)'s sibling: a folder's members the user never named (compare layers --dump DIR)


@pytest.mark.parametrize("member", ["fp32.safetensors", "bf16.safetensors"])
def test_dump_refuses_a_file_of_its_own_name_without_force(run, tmp_path, monkeypatch, member):
    """DIR/<dtype>.safetensors that exists was replaced without a word: DIR is named, its members are not."""
    fail_if_a_model_runs(monkeypatch)
    d = tmp_path / "dump"
    d.mkdir()
    (d / member).write_bytes(b"my own dump")
    (d / "my_notes.txt").write_text("notes")
    before = _contents(d)
    one_line(run("compare", "layers", "--dtypes", "bf16", "--steps", "1", "--dump", str(d)), 2,
             member, "--force")
    assert _contents(d) == before


def test_dump_with_force_replaces_only_its_own_files(run, tmp_path):
    d = tmp_path / "dump"
    d.mkdir()
    (d / "bf16.safetensors").write_bytes(b"my own dump")
    (d / "my_notes.txt").write_text("notes")
    r = run("compare", "layers", "--dtypes", "bf16", "--steps", "1", "--dump", str(d), "--force", "--json")
    assert r.code in (0, 1), r.err  # 1: a module diverged, still a finished run
    assert sorted(p.name for p in d.iterdir()) == ["bf16.safetensors", "fp32.safetensors", "my_notes.txt"]
    assert (d / "my_notes.txt").read_text() == "notes"
    assert (d / "bf16.safetensors").read_bytes() != b"my own dump"


def test_force_without_dump_is_refused(run, monkeypatch):
    """A flag that does nothing is not accepted silently (as --prompt without --endpoint was not)."""
    fail_if_a_model_runs(monkeypatch)
    one_line(run("compare", "layers", "--dtypes", "bf16", "--steps", "1", "--force"), 2, "--force", "--dump")


def test_a_folder_writer_checks_every_member_for_a_file_there(tmp_path):
    """The mechanism itself (io/outputs.check_output_dir): a member that exists is refused unless force."""
    from precisionlab.errors import UsageError
    from precisionlab.io import outputs

    (tmp_path / "b.bin").write_bytes(b"x")
    with pytest.raises(UsageError, match="b.bin.*--force"):
        outputs.check_output_dir(str(tmp_path), ["a.bin", "b.bin"], "--dump")
    assert outputs.check_output_dir(str(tmp_path), ["a.bin", "b.bin"], "--dump", force=True) == tmp_path
    assert outputs.check_output_dir(str(tmp_path), ["a.bin"], "--dump") == tmp_path


# ---------------------------------------------------------------------------
# (3) values from servers are validated; (4) a deadline for the whole request


@contextlib.contextmanager
def _server(answer, dribble: str | None = None):
    """A local server on 127.0.0.1 for the length of a with block: POST answers `answer` (a str, the
    body as sent: NaN spelled as JSON cannot), or sends it one header line or one body byte a second
    (`dribble` "headers" or "body") until the client goes."""
    import http.server
    import threading
    import time

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):  # /v1/models: not served (a server without the route is fine)
            self.send_error(404)

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            data = answer.encode()
            try:
                if dribble == "headers":
                    self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                    for i in range(15):
                        self.wfile.write(f"X-Slow-{i}: 1\r\n".encode())
                        self.wfile.flush()
                        time.sleep(1)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if dribble == "body":
                    for b in data:
                        self.wfile.write(bytes([b]))
                        self.wfile.flush()
                        time.sleep(1)
                else:
                    self.wfile.write(data)
            except OSError:  # the client went away: what a deadline does
                pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _engine(url, vocab=("a", "b", "c"), opts=""):
    from precisionlab.engines.openai import PER_POSITION, OpenAIEngine

    e = OpenAIEngine(f"{url}{opts}", "cpu")
    e.bind(lambda i: vocab[i], len(vocab))
    return e, PER_POSITION


def _echo_answer(value: str) -> str:
    return ('{"choices": [{"logprobs": {"tokens": ["a", "b", "x"], "token_logprobs": [null, -1, null], '
            '"top_logprobs": [null, {"a": %s, "b": -2.0}, null]}}]}' % value)


def _content_answer(value: str, token_id: int = 1) -> str:
    return ('{"choices": [{"text": "b", "logprobs": {"content": [{"id": 1, "token": "b", "logprob": -1, '
            '"top_logprobs": [{"id": %d, "token": "b", "logprob": %s}]}]}}]}' % (token_id, value))


@pytest.mark.parametrize("value, words", [("NaN", "nan"), ("Infinity", "inf"), ("50", "above 0"),
                                          ('"-1"', "not a number"), ("true", "not a number")])
@pytest.mark.parametrize("form", ["echo", "per-position"])
def test_a_servers_log_prob_that_no_probability_has_is_a_failed_run(value, words, form):
    """"logprob": NaN gave 'KLD >= nan', +50 'KLD >= inf', exit 0."""
    from precisionlab.errors import RunError

    body = _echo_answer(value) if form == "echo" else _content_answer(value)
    with _server(body) as url:
        e, per_position = _engine(url)
        if form == "per-position":
            e.settings["prompt_logprobs"] = per_position
        with pytest.raises(RunError, match=words):
            e.top_logprobs([0, 1])


@pytest.mark.parametrize("form", ["echo", "per-position"])
def test_a_near_certain_tokens_rounding_above_0_is_taken_as_0(form):
    body = _echo_answer("1e-6") if form == "echo" else _content_answer("1e-6")
    with _server(body) as url:
        e, per_position = _engine(url)
        if form == "per-position":
            e.settings["prompt_logprobs"] = per_position
        row = e.top_logprobs([0, 1])[0]
    assert max(row.values()) == 0.0


@pytest.mark.parametrize("token_id", [-1, 3, 10 ** 20])
def test_a_token_id_outside_the_vocabulary_is_a_failed_run(token_id):
    from precisionlab.errors import RunError

    with _server(_content_answer("-0.5", token_id)) as url:
        e, per_position = _engine(url)
        e.settings["prompt_logprobs"] = per_position
        with pytest.raises(RunError, match="outside the reference's vocabulary"):
            e.top_logprobs([0, 1])


@pytest.mark.parametrize("value", ["NaN", "50"])
def test_nondeterminism_endpoints_log_probs_are_validated_too(value):
    """The sibling: nondeterminism --endpoint's answers went through float(v) as well."""
    import json

    from precisionlab.errors import RunError
    from precisionlab.experiments import endpoint

    doc = json.loads('{"choices": [{"text": "x", "logprobs": {"tokens": ["x"], "token_logprobs": [%s], '
                     '"top_logprobs": [{"x": -0.1}]}}]}' % value)
    with pytest.raises(RunError, match="log-probability"):
        endpoint.parse_completion(doc, "http://h")


@pytest.mark.parametrize("dribble", ["headers", "body"])
def test_a_server_that_dribbles_its_answer_ends_at_the_timeout(dribble):
    """--engine "openai:URL,timeout=3" against a header line or a body byte a second: never ended."""
    import time

    from precisionlab.engines.openai import Client
    from precisionlab.errors import RunError

    with _server('{"choices": []}', dribble) as url:
        t0 = time.monotonic()
        with pytest.raises(RunError, match="within 2 s"):
            Client(url + "/v1", 2).post("/completions", {"prompt": [1]})
        took = time.monotonic() - t0
    assert took < 2 + 3, took  # the deadline plus a loaded machine's slack, far from the 15 s dribble


# ---------------------------------------------------------------------------
# (5) engine knobs passed to C are bounded, the bound named


@pytest.mark.parametrize("prefix, knobs, words", [
    ("llamacpp", "threads=100000", ["threads=100000", "bound"]),
    ("llamacpp", "threads=0", ["threads must be >= 1"]),
    ("llamacpp", "ubatch=0", ["ubatch must be >= 1"]),
    ("llamacpp", "batch=0", ["batch must be >= 1"]),
    ("llamacpp", "batch=64,ubatch=128", ["ubatch=128", "n_batch"]),
    ("llamacpp", "ctx=99999999999", ["ctx=99999999999", "bound"]),
    ("llamacpp", "threads=" + "9" * 5000, ["too long"]),
    ("onnx", "threads=100000", ["threads=100000", "bound"]),
    ("onnx", "batch=10000000", ["batch=10000000", "bound"]),
])
def test_an_engine_knob_past_its_bound_is_refused_before_c_sees_it(tmp_path, monkeypatch, prefix, knobs, words):
    """llamacpp:FILE,threads=100000 ended in SIGSEGV; ubatch=0 ran and reported n_ubatch=0."""
    from precisionlab.engines import external, registry
    from precisionlab.errors import UsageError

    monkeypatch.setattr(external, "need_package", lambda *a: None)
    f = tmp_path / ("m.gguf" if prefix == "llamacpp" else "m.onnx")
    f.write_bytes(b"not opened: refused first")
    with pytest.raises(UsageError) as e:
        registry.resolve(f"{prefix}:{f},{knobs}")
    assert all(w in str(e.value) for w in words), str(e.value)


def test_a_knob_past_its_bound_is_one_line_from_the_cli(run, tmp_path, monkeypatch):
    from precisionlab.engines import external

    monkeypatch.setattr(external, "need_package", lambda *a: None)
    f = tmp_path / "m.gguf"
    f.write_bytes(b"not opened: refused first")
    one_line(run("compare", "engine", "--engine", f"llamacpp:{f},threads=100000"), 2, "threads=100000", "bound")


def test_the_thread_bound_is_named_with_where_it_comes_from():
    from precisionlab.engines import external
    from precisionlab.errors import UsageError

    bound = external.thread_bound()
    assert 64 <= bound <= 1024
    assert external.threads_opt({"threads": str(bound)}, "x") == bound
    with pytest.raises(UsageError, match=f"bound of {bound} .*per CPU"):
        external.threads_opt({"threads": str(bound + 1)}, "x")


@pytest.mark.parametrize("knob, words", [("top=100000000000000000000", "top="), ("timeout=10000000", "timeout=")])
def test_openai_top_and_timeout_are_bounded(knob, words):
    """top=10^20 was sent to the server as is."""
    from precisionlab.engines import registry
    from precisionlab.errors import UsageError

    with pytest.raises(UsageError, match=f"{words}.*bound"):
        registry.resolve(f"openai:http://127.0.0.1:9,{knob}")


# ---------------------------------------------------------------------------
# (6) every option that changes an allocation is in the estimate


def test_attention_splits_are_in_the_memory_estimate(run, monkeypatch):
    """--splits 1000000000 grew to 5.6 GB, then ended 'out of memory' (exit 1)."""
    from precisionlab.experiments import attention
    from precisionlab.numerics import flash_attention as fa

    monkeypatch.setattr(fa, "attention", lambda *a, **k: pytest.fail("ran before the memory check"))
    monkeypatch.setattr(attention.fa, "attention", fa.attention)
    one_line(run("attention", "--seq", "256", "--rows", "8", "--dim", "8", "--splits", "1000000000"), 2,
             "--splits 1000000000", "needs about")


def test_the_attention_estimate_covers_many_splits_as_measured():
    """The estimate against tracemalloc's peak of a run whose splits dominate (numpy reports to it)."""
    import tracemalloc

    import numpy as np

    from precisionlab.numerics import flash_attention as fa
    from precisionlab.runtime import memory

    rows, seq, dim, splits = 8, 64, 8, 3000
    cfg = fa.FlashConfig(block_c=16, splits=splits)
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((rows, dim)), rng.standard_normal((seq, dim)), rng.standard_normal((seq, dim))
    tracemalloc.start()
    try:
        fa.attention(q, k, v, cfg)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    est = memory.attention(rows, seq, dim, 16, fa.CHUNK_ROWS, 0, splits) - memory.COMPARE_FIXED
    assert peak <= est, (peak, est)
    assert peak > memory.attention(rows, seq, dim, 16, fa.CHUNK_ROWS, 0, 1) - memory.COMPARE_FIXED  # splits count


# ---------------------------------------------------------------------------
# (7) compare logits --plot; (9) its FAIL line's prefix


def _logits_files(tmp_path, nan: bool = False, dtype: str | None = None):
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    ref = (rng.standard_normal((64, 17)) * 2).astype(np.float32)
    yours = ref + np.float32(0.01) * rng.standard_normal(ref.shape).astype(np.float32)
    if nan:
        yours[[2, 7], 3] = np.nan
    tok = rng.integers(0, 17, 64)
    paths = []
    for name, x in (("ref", ref), ("yours", yours)):
        meta = {"window": "32", **({"dtype": dtype} if dtype else {})}
        save_file({"logits": x, "tokens": tok.astype(np.int64)}, str(tmp_path / f"{name}.safetensors"), metadata=meta)
        paths.append(str(tmp_path / f"{name}.safetensors"))
    return paths


@pytest.mark.parametrize("dtype", [None, "bf16"])
def test_compare_logits_plot_is_drawn(run, tmp_path, dtype):
    """'internal error: KeyError' from report/logits.py, declared dtype or not."""
    pytest.importorskip("matplotlib")
    ref, yours = _logits_files(tmp_path, dtype=dtype)
    r = run("compare", "logits", ref, yours, "--plot", str(tmp_path / "x.png"))
    assert r.code == 0, r.err
    assert (tmp_path / "x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_logits_nan_fail_line_has_the_prefix(run, tmp_path):
    ref, yours = _logits_files(tmp_path, nan=True)
    r = run("compare", "logits", ref, yours)
    assert r.code == 1
    fails = [line for line in r.err.splitlines() if "FAIL" in line]
    assert fails and all(line.startswith("precisionlab: FAIL") for line in fails), r.err


def test_the_references_perplexity_and_top5_shares_have_one_name():
    """ppl_fp32, fp32_top1_in_top5_pct, top1_in_fp32_top5_pct in compare metrics (and kvcache), the ref_*
    names in compare logits: docs/json.md's role name wins, in the one place the row is made."""
    import numpy as np

    from helpers import GLOSSARY_FORBIDDEN
    from precisionlab.numerics import distribution

    x = np.random.default_rng(0).standard_normal((8, 5))
    st = distribution.position_stats(x, x, np.zeros(8, dtype=np.int64))
    row = distribution.summarize(st)
    for old, new in (("ppl_fp32", "ppl_ref"), ("fp32_top1_in_top5_pct", "ref_top1_in_top5_pct"),
                     ("top1_in_fp32_top5_pct", "top1_in_ref_top5_pct")):
        assert new in row and old not in row
        assert GLOSSARY_FORBIDDEN[old] == new  # every document the glossary tests run is checked for the old name
    assert row["ref_top1_in_top5_pct"] == row["top1_in_ref_top5_pct"] == 100.0  # the same logits: every top-1


# ---------------------------------------------------------------------------
# (8) compare logprobs' std_ratio: +inf where it is, all its digits near 1


def _std_ratio_exact(d):
    """The population standard deviation of exp(d_i), to 60 digits (mpmath; each d_i a double, exact)."""
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(60):
        r = [mpmath.exp(mpmath.mpf(float(x))) for x in d]
        m = mpmath.fsum(r) / len(r)
        return mpmath.sqrt(mpmath.fsum((x - m) ** 2 for x in r) / len(r))


@pytest.mark.parametrize("d", [[1e-7, -1e-7, 3e-8, 0.0], [2e-9, -5e-10, 1e-12, 7e-9, -3e-9],
                               [0.5, -0.25, 1e-7, 3.0], [700.0, -1.0, 0.0]])
def test_std_ratio_keeps_its_digits(d):
    """r = 1 +- 1e-7 kept about 10 digits (r - mean(r)); expm1's deviations keep them."""
    import numpy as np

    from precisionlab.numerics import logprobs

    k = 700.0 if max(d) >= 700 else 0.0  # log-probs <= 0 where a ratio is huge: Delta = (d - k) - (-k) = d exactly
    a, b = np.array(d) - k, np.full(len(d), -k)
    assert (a - b).tolist() == d
    got = logprobs.token_stats(a, b)["std_ratio"]
    want = _std_ratio_exact(d)
    assert abs(got - float(want)) <= 4e-16 * float(want) * len(d), (got, want)


def test_std_ratio_past_float64_is_inf_not_nan():
    """A ratio past float64 (Delta > 709.8): std_ratio printed nan, mean_ratio and chi2 said inf."""
    import numpy as np

    from precisionlab.numerics import logprobs

    a, b = np.array([-1.0, -2.0, -3.0]), np.array([-801.0, -2.0, -2.0])  # Delta 800, 0, -1
    row = logprobs.token_stats(a, b)
    assert row["std_ratio"] == math.inf and row["mean_ratio"] == math.inf and row["chi2"] == math.inf


# ---------------------------------------------------------------------------
# (9) nondeterminism: --prompt without --endpoint; zero answers


def test_nondeterminism_prompt_without_endpoint_is_refused(run):
    """--prompt hi without --endpoint ran the sections and ignored the prompt; the prompt is now
    `nondeterminism endpoint`'s option alone, so the sections refuse it."""
    one_line(run("nondeterminism", "--prompt", "hi"), 2, "--prompt")


def test_nondeterminism_endpoint_with_zero_answers_is_a_failed_run(run):
    """Every request cut short by --time-limit: a table of 'answered 0', exit 0."""
    with _server('{"choices": []}', "headers") as url:
        r = run("nondeterminism", "endpoint", url, "--requests", "2", "--concurrency", "1", "--cache", "on",
                "--time-limit", "1")
    one_line(r, 1, "no completion answered")


# ---------------------------------------------------------------------------
# (9) a password in a URL is masked wherever it is shown or written


@pytest.mark.parametrize("url", ["http://user:hunter2@127.0.0.1:9", "ftp://user:hunter2@127.0.0.1:9",
                                 "http://hunter2@127.0.0.1:9/v1"])
def test_a_password_in_an_endpoint_url_never_reaches_stderr(run, url):
    r = run("nondeterminism", "endpoint", url, "--requests", "1", "--time-limit", "5")
    assert r.code in (1, 2) and "hunter2" not in r.err and "***@127.0.0.1" in r.err, r.err


def test_a_password_in_a_url_is_masked_in_json_and_tables():
    from precisionlab.report import console, jsondoc

    doc = jsondoc.jsonable({"engine_spec": "openai:https://me:hunter2@host:8000/v1,top=5",
                            "rows": [{"url": "http://tok3n@h/v1/completions"}], "n": 3})
    text = str(doc)
    assert "hunter2" not in text and "tok3n" not in text and "openai:https://***@host:8000/v1,top=5" in text
    assert console.safe_text("see http://a:b@h/ and https://c@d/") == "see http://***@h/ and https://***@d/"
    assert console.printable("an e-mail: me@example.com, not a URL") == "an e-mail: me@example.com, not a URL"


# ---------------------------------------------------------------------------
# (9) a KLD base file as YOURS; a comma in a spec's path


@pytest.mark.parametrize("order", ["yours", "ref_low"])
def test_a_kld_base_file_given_as_yours_says_it_is_a_reference(run, tmp_path, order):
    """It said 'token ids differ'."""
    ref, yours = _logits_files(tmp_path)
    r = run("compare", "logits", ref, "--write-kld-base", str(tmp_path / "base.kld"))
    assert r.code == 0, r.err
    base = str(tmp_path / "base.kld")
    args = [ref, base] if order == "yours" else [ref, base, yours]
    one_line(run("compare", "logits", *args), 2, "a KLD base file is a reference", "REF")


def test_a_comma_in_a_specs_path_is_named(tmp_path, monkeypatch):
    from precisionlab.engines import external, registry
    from precisionlab.errors import UsageError

    monkeypatch.setattr(external, "need_package", lambda *a: None)
    (tmp_path / "a,b.gguf").write_bytes(b"x")
    with pytest.raises(UsageError, match="a path with a comma cannot be named"):
        registry.resolve(f"llamacpp:{tmp_path}/a,b.gguf")


# ---------------------------------------------------------------------------
# (9) an engine library's own stderr lines are captured


def test_a_librarys_stderr_is_held_back_and_explains_its_error(capfd, monkeypatch):
    from precisionlab.engines.chatter import captured
    from precisionlab.errors import UsageError

    with captured("lib"):
        os.write(2, b"lib: a line nobody asked for\n")
    assert "nobody asked" not in capfd.readouterr().err
    with pytest.raises(UsageError) as e:
        with captured("lib"):
            os.write(2, b"lib: loading\nlib: error: bad magic\n")
            raise UsageError("engine x: cannot load it")
    assert str(e.value) == "engine x: cannot load it (lib said: lib: error: bad magic)"
    assert "bad magic" not in capfd.readouterr().err  # only under the error line, once
    monkeypatch.setenv("PRECISIONLAB_DEBUG", "1")
    with captured("lib"):
        os.write(2, b"lib: shown under debug\n")
    assert "lib: shown under debug" in capfd.readouterr().err


def test_llama_cpps_context_line_does_not_reach_stderr(tmp_path, capfd):
    """`llama_context: n_ctx_seq (512) > n_ctx_train (0)` reached stderr: one error became two lines."""
    pytest.importorskip("llama_cpp")
    pytest.importorskip("gguf")
    from precisionlab.engines import export
    from precisionlab.engines.llamacpp import LlamaCppEngine

    export.run("embedded", "gguf:f32", str(tmp_path / "m.gguf"))
    capfd.readouterr()
    e = LlamaCppEngine(f"{tmp_path / 'm.gguf'},ctx=512", "cpu")
    assert e.rows([1, 2, 3]).shape[0] == 3
    err = capfd.readouterr().err
    assert "n_ctx" not in err and "llama" not in err, err


def test_llama_cpp_reports_the_batch_sizes_it_used(tmp_path):
    """ubatch=0 ran and reported n_ubatch=0; what llama.cpp used instead was not said."""
    pytest.importorskip("llama_cpp")
    pytest.importorskip("gguf")
    from precisionlab.engines import export
    from precisionlab.engines.llamacpp import LlamaCppEngine

    export.run("embedded", "gguf:f32", str(tmp_path / "m.gguf"))
    s = LlamaCppEngine(f"{tmp_path / 'm.gguf'},ctx=64,batch=512,ubatch=256", "cpu").settings
    assert (s["n_batch"], s["n_ubatch"], s["n_batch_asked"], s["n_ubatch_asked"]) == (64, 64, 512, 256)


@pytest.mark.parametrize("option", ["--request-timeout", "--time-limit"])
def test_an_endpoint_timeout_past_a_day_is_refused(run, option):
    """The sibling of the whole-request deadline: 1e20 s overflowed the timer's clock, a traceback from its thread."""
    one_line(run("nondeterminism", "endpoint", "http://127.0.0.1:9", "--requests", "1", option, "1e20"), 2,
             option, "a day")


def test_a_client_timeout_past_a_day_is_a_day(capfd):
    from precisionlab.engines.openai import Client
    from precisionlab.errors import RunError

    with pytest.raises(RunError, match="connection refused"):
        Client("http://127.0.0.1:9/v1", 1e20).get("/models")
    assert "Exception in thread" not in capfd.readouterr().err


@pytest.mark.parametrize("value", ["-5", "0"])
def test_a_gguf_context_length_that_is_no_count_never_reaches_c(tmp_path, monkeypatch, value):
    """The sibling of the knobs: a value from the file on its way to n_ctx (ctx=0 takes the file's)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from precisionlab.engines.llamacpp import LlamaCppEngine
    from precisionlab.errors import UsageError

    opened = []

    class Fake:
        def __init__(self, path, vocab_only=False, **kw):
            opened.append(vocab_only)
            self.metadata = {"general.architecture": "qwen3", "qwen3.context_length": value}

    monkeypatch.setattr(llama_cpp, "Llama", Fake)
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x")
    with pytest.raises(UsageError, match="context_length"):
        LlamaCppEngine(f"{f}", "cpu")
    assert opened == [True]  # the probe only: no context was made


def test_the_quantizers_metadata_listing_does_not_reach_stderr(tmp_path):
    """export --to gguf:q4_k_m printed llama.cpp's loader listing (dozens of lines) on stderr."""
    pytest.importorskip("llama_cpp")
    pytest.importorskip("gguf")
    from helpers import cli

    r = cli("export", "embedded", "--to", "gguf:q4_k_m", "--out", str(tmp_path / "m.gguf"))
    assert r.code == 0, r.err
    assert "llama_model_loader" not in r.err and "llama_model_quantize" not in r.err, r.err[:2000]


def test_ctrl_c_inside_a_capture_still_says_interrupted(capfd):
    """The main thread's Ctrl-C line goes to fd 2: the capture gives it back first (interrupt.run_all)."""
    from precisionlab.engines.chatter import captured
    from precisionlab.runtime import interrupt

    with captured("lib"):
        interrupt.run_all()  # what cli._interrupted does, from the main thread
        os.write(2, b"precisionlab: interrupted\n")
    assert "precisionlab: interrupted" in capfd.readouterr().err


@pytest.mark.parametrize("body", [
    '{"choices": [{"logprobs": {"tokens": [["a"], "b", "x"], "top_logprobs": [null, {"a": -1}, null]}}]}',
    '{"choices": [{"logprobs": {"tokens": ["a", "b", "x"], "top_logprobs": [null, ["a"], null]}}]}',
    '{"choices": [{"logprobs": {"tokens": "abx", "top_logprobs": [null, {"a": -1}, null]}}]}',
], ids=["token-a-list", "row-a-list", "tokens-a-string"])
def test_an_echo_of_the_wrong_shape_is_a_failed_run(body):
    """The siblings of the value checks, found while writing them: TypeError / AttributeError, internal errors."""
    from precisionlab.errors import RunError

    with _server(body) as url:
        e, _ = _engine(url)
        with pytest.raises(RunError, match="echoed tokens|top_logprobs is not"):
            e.top_logprobs([0, 1])
