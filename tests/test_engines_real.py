"""The real engines on the embedded model exported: precisionlab export's
Hugging Face checkpoint against the embedded model, and llama.cpp, CTranslate2
and onnxruntime against the embedded fp32 run, with the expected orderings.

Bands, chosen from the arithmetic, not from a run: every fp32 path computes
the same 5-layer, 128-wide model in IEEE fp32 with its own summation order,
so a logit (|x| <= ~15, one ulp ~1e-6) may move by some hundred ulps: at most
1e-4 after removing the row's constant shift. KL over such a perturbation is
about Var(Δ)/2 <= 5e-9, so "fp32-equal" is max KLD < 1e-8 at every position.
A 16-bit weight (half: 11 significant bits) moves a logit by ~1e-3 and a
Q8_0 weight (8 bits and a per-32 scale) by ~1e-1: the KLDs are ordered
F16 < Q8_0 < Q4_0, int8 > bfloat16 (on a CPU without fast bf16 CTranslate2
computes a bfloat16 model in float32; the shipped weights are bf16-exact,
so it is fp32-equal there).
"""

import math

import numpy as np
import pytest

from helpers import cli, json_glossary_problems, save_char_qwen, strict_json

FP32_MAX_KLD = 1e-8
FP32_MAX_SHIFTED = 1e-4
TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    pytest.importorskip("transformers", reason="the hf export needs transformers (precisionlab[hf])")
    from precisionlab.engines.exporters import hf

    d = tmp_path_factory.mktemp("hf")
    hf.write_embedded(str(d))
    return d


@pytest.fixture(scope="module")
def reference():
    import torch

    from precisionlab.engines import charlm

    model, tok = charlm.load_default(torch.float32)
    ids = tok.encode(TEXT)
    with torch.no_grad():
        fp32 = model(torch.tensor([ids]))[0][0].double().numpy()
        fp64 = model.double()(torch.tensor([ids]))[0][0].numpy()
    return ids, fp32, fp64


@pytest.fixture(scope="module")
def hf_fp32(hf_dir, reference):
    """The Hugging Face fp32 run of the `--to hf` export: compare model --engine's
    other reference (--reference hf:DIR)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=False).eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([reference[0]])).logits[0].double().numpy()


def _stats(ref, low, ids):
    from precisionlab.experiments.engines import shifted_max_abs
    from precisionlab.numerics import distribution

    s = distribution.position_stats(ref, low, np.asarray(ids[1:] + [ids[0]]))
    return distribution.summarize(s), shifted_max_abs(ref, low)


def test_hf_export_is_the_embedded_model(hf_dir, reference):
    import torch
    import transformers

    ids, fp32, fp64 = reference
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=False)
    assert tok(TEXT, add_special_tokens=False)["input_ids"] == ids
    assert tok.decode(ids) == TEXT
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=False).eval()
    assert type(model).__name__ == "Qwen3ForCausalLM"
    with torch.no_grad():
        got = model(input_ids=torch.tensor([ids])).logits[0].double().numpy()
    # Against the float64 run of charlm: both fp32 paths are within fp32 rounding of it.
    assert np.max(np.abs(got - fp64)) < FP32_MAX_SHIFTED
    assert np.max(np.abs(fp32 - fp64)) < FP32_MAX_SHIFTED
    # tokenizers raises a bare Exception; its message says which error it is
    with pytest.raises(Exception, match="Missing .*UNK.* token"):
        tok("é")  # no <unk>: an unknown character is an error, never a silent token


def test_gguf_orderings(hf_dir, reference, hf_fp32, tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama.cpp's engine needs llama-cpp-python")
    pytest.importorskip("gguf", reason="the GGUF export needs the gguf package")
    from precisionlab.engines.exporters import gguf
    from precisionlab.engines.llamacpp import LlamaCppEngine

    ids, fp32, _ = reference
    kld = {}
    for v in ("f32", "f16", "q8_0", "q4_0"):
        path = tmp_path / f"m-{v}.gguf"
        gguf.write(str(hf_dir), str(path), v)
        eng = LlamaCppEngine(f"{path},kv=f32", "cpu")
        assert eng.encode(TEXT) == ids  # the same tokens, no BOS
        got = eng.logits(ids).astype(np.float64)
        row, shifted = _stats(fp32, got, ids)
        kld[v] = row["kld_mean"]
        if v == "f32":  # F32 GGUF with an f32 cache: fp32-equal to the embedded and to the HF fp32 run
            assert row["kld_max"] < FP32_MAX_KLD and shifted < FP32_MAX_SHIFTED, (row["kld_max"], shifted)
            hf_row, hf_shifted = _stats(hf_fp32, got, ids)
            assert hf_row["kld_max"] < FP32_MAX_KLD and hf_shifted < FP32_MAX_SHIFTED, (hf_row["kld_max"], hf_shifted)
            assert eng.info()["kv_cache_type"] == "f32" and eng.info()["flash_attn"] is False
        # llama.cpp's AMX kernels segfaulted on this model's q8_0/q4_0 matmuls:
        # off by default for quantised files on an AMX CPU, and said in info()
        amx = b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info()
        assert eng.info()["extra_bufts"] is (v in ("f32", "f16") or not amx), (v, amx)
    assert kld["f32"] < kld["f16"] < kld["q8_0"] < kld["q4_0"], kld
    del llama_cpp


@pytest.fixture(scope="module")
def wide_hf(tmp_path_factory):
    """A random Qwen3 256 wide (2 layers, MLP 512) with the embedded model's character tokenizer: rows
    of 256 take K-quants (the embedded model's 128-wide rows get llama.cpp's fallback types instead)."""
    pytest.importorskip("transformers")
    return save_char_qwen(tmp_path_factory.mktemp("wide"), hidden=256, positions=256, seed=0)


def test_q4_k_m_export_and_the_ordering_f16_q8_0_q4_k(wide_hf, tmp_path):
    """--to gguf:q4_k_m through llama.cpp's own quantizer; KLD against the HF fp32 run: F16 < Q8_0 < Q4_K."""
    pytest.importorskip("llama_cpp", reason="--to gguf:q4_k_m needs llama-cpp-python's quantizer")
    pytest.importorskip("gguf", reason="the GGUF export needs the gguf package")
    import torch
    import transformers

    from precisionlab.engines.exporters import gguf as gexp
    from precisionlab.engines.llamacpp import LlamaCppEngine

    model = transformers.AutoModelForCausalLM.from_pretrained(wide_hf, trust_remote_code=False).eval()
    tok = transformers.AutoTokenizer.from_pretrained(wide_hf, trust_remote_code=False)
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids])).logits[0].double().numpy()
    kld = {}
    for v in ("f16", "q8_0", "q4_k_m"):
        out = tmp_path / f"w-{v}.gguf"
        r = cli("export", f"hf:{wide_hf}", "--to", f"gguf:{v}", "--out", str(out), "--json")
        assert r.code == 0, r.err
        if v == "q4_k_m":
            changes = " ".join(strict_json(r.out)["changes"])
            types = gexp.tensor_types(str(out))
            assert "llama.cpp's own quantizer" in changes and "Q4_K" in types and types in changes, (types, changes)
            assert gexp.read_source(str(out)) == f"hf:{wide_hf.resolve()}"  # the quantizer kept the metadata
        eng = LlamaCppEngine(f"{out},kv=f32", "cpu")
        assert eng.encode(TEXT) == ids
        kld[v] = _stats(ref, eng.logits(ids).astype(np.float64), ids)[0]["kld_mean"]
    assert kld["f16"] < kld["q8_0"] < kld["q4_k_m"], kld


def test_q4_k_m_of_128_wide_rows_says_no_tensor_took_q4_k(hf_dir, tmp_path):
    pytest.importorskip("llama_cpp", reason="--to gguf:q4_k_m needs llama-cpp-python's quantizer")
    pytest.importorskip("gguf", reason="the GGUF export needs the gguf package")
    r = cli("export", f"hf:{hf_dir}", "--to", "gguf:q4_k_m", "--out", str(tmp_path / "m.gguf"), "--json")
    assert r.code == 0, r.err
    assert any("none took Q4_K" in c for c in strict_json(r.out)["changes"])


def test_ct2_orderings(hf_dir, reference, hf_fp32, tmp_path):
    pytest.importorskip("ctranslate2", reason="CTranslate2's engine needs the ctranslate2 package")
    from precisionlab.engines.ct2 import CT2Engine
    from precisionlab.engines.exporters import ct2

    ids, fp32, _ = reference
    kld = {}
    for v in ("float32", "bfloat16", "int8"):
        d = tmp_path / f"ct2-{v}"
        ct2.write(str(hf_dir), str(d), v)
        eng = CT2Engine(str(d), "cpu")
        assert eng.encode(TEXT) == ids
        got = eng.logits(ids).astype(np.float64)
        row, shifted = _stats(fp32, got, ids)
        kld[v] = row["kld_mean"]
        if v == "float32":  # fp32-equal to the embedded and to the HF fp32 run
            assert row["kld_max"] < FP32_MAX_KLD and shifted < FP32_MAX_SHIFTED, (row["kld_max"], shifted)
            hf_row, hf_shifted = _stats(hf_fp32, got, ids)
            assert hf_row["kld_max"] < FP32_MAX_KLD and hf_shifted < FP32_MAX_SHIFTED, (hf_row["kld_max"], hf_shifted)
            # in a batch of 4 prompts the compared one is still row 0, within fp32 rounding of a batch of 1
            four = CT2Engine(f"{d},batch=4", "cpu")
            assert four.info()["batch_size"] == 4
            assert np.max(np.abs(four.logits(ids).astype(np.float64) - got)) < FP32_MAX_SHIFTED
    assert kld["int8"] > kld["bfloat16"], kld


def test_onnx_fp32_is_fp32_equal(reference, tmp_path):
    pytest.importorskip("onnxruntime", reason="the ONNX engine needs onnxruntime")
    pytest.importorskip("onnx", reason="the ONNX export needs the onnx package")
    from precisionlab.engines.exporters import onnx
    from precisionlab.engines.onnx import OnnxEngine

    ids, fp32, _ = reference
    path = tmp_path / "m.onnx"
    onnx.write_embedded(str(path), "fp32")
    eng = OnnxEngine(str(path), "cpu")
    assert eng.encode(TEXT) == ids
    row, shifted = _stats(fp32, eng.logits(ids).astype(np.float64), ids)
    assert row["kld_max"] < FP32_MAX_KLD and shifted < FP32_MAX_SHIFTED
    assert eng.info()["provider"] == "CPUExecutionProvider"
    four = OnnxEngine(f"{path},batch=4", "cpu")  # the compared prompt is row 0 of a batch of 4
    assert four.info()["batch_size"] == 4
    assert np.max(np.abs(four.logits(ids).astype(np.float64) - eng.logits(ids))) < FP32_MAX_SHIFTED


def test_token_checks_name_a_mismatch_and_a_bos_shift():
    from precisionlab.errors import RunError
    from precisionlab.experiments.engines import token_check

    assert token_check([5, 6, 7], [5, 6, 7], "e") == "identical"
    assert token_check([5, 6, 7], [5, 6, 7, 8], "e") == "identical"  # a longer prefix was tokenised
    assert token_check([5, 6, 7], [1, 5, 6, 7], "e").startswith("bos shift (the engine prepends id 1")
    with pytest.raises(RunError, match="at token 0"):
        token_check([5, 6, 7], [1, 5, 6], "e")  # a BOS and a shorter text is not a shift
    with pytest.raises(RunError, match="differs from the reference's at token 1"):
        token_check([5, 6, 7], [5, 9, 7], "e")


def test_shift_removed_and_padding_trimmed():
    from precisionlab.engines.external import ExternalEngine
    from precisionlab.experiments.engines import shifted_max_abs

    ref = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    assert shifted_max_abs(ref, ref + 7.25) == 0.0  # a row's constant shift is no error
    assert shifted_max_abs(ref, ref + np.array([[0.0, 0.5, 0.0], [0, 0, 0]])) == 0.25

    class Padded(ExternalEngine):
        name, vocab = "padded", 3

        def info(self):
            return self.trim_note()

        def encode(self, text, source="--prompt"):
            return []

        def decode(self, ids):
            return ""

        def rows(self, ids):
            return np.arange(len(ids) * 8, dtype=np.float32).reshape(len(ids), 8)

    e = Padded()
    assert e.logits([1, 2]).shape == (2, 3)
    assert e.info()["vocab_padded_from"] == 8


def test_export_and_compare_cli(tmp_path):
    pytest.importorskip("llama_cpp", reason="llama.cpp's engine needs llama-cpp-python")
    pytest.importorskip("gguf", reason="the GGUF export needs the gguf package")
    out = tmp_path / "m.gguf"
    r = cli("export", "embedded", "--to", "gguf:f32", "--out", str(out), "--json")
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    assert json_glossary_problems(doc) == []
    assert any("tied" in c for c in doc["changes"]) and out.is_file()
    assert doc["rows"] == [{"name": "m.gguf", "bytes": out.stat().st_size}]
    r = cli("compare", "engine", "--engine", f"llamacpp:{out},kv=f32", "--tokens", "128", "--steps", "8", "--json")
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    assert json_glossary_problems(doc) == [] and doc["command"] == "compare engine"
    row = doc["rows"][0]
    assert row["tokens"] == "identical" and row["greedy_diverged_at"] is None
    assert row["kld_max"] < FP32_MAX_KLD and row["engine"]["kv_cache_type"] == "f32"


@pytest.mark.parametrize("args", [
    ("export", "embedded", "--to", "tflite", "--out", "x"),
    ("export", "embedded", "--to", "ct2:int4", "--out", "x"),
    ("compare", "engine", "--reference", "embedded"),
    ("compare", "engine", "--engine", "llamacpp:/no/such.gguf"),
    ("compare", "engine", "--engine", "ct2:/tmp,bogus=1"),
])
def test_usage_errors_exit_2(args):
    r = cli(*args)
    assert r.code == 2, (r.code, r.err)
    assert r.err.count("\n") == 1 and "Traceback" not in r.err


def _fake_endpoint(noise: float, form: str = "openai"):
    """A local /v1/completions that answers from the embedded model in fp32,
    its logits plus seeded Gaussian noise, top 5 per position: the true KL of
    what it serves is known, so the bound can be checked against it.
    form "llama-server": as llama.cpp's llama-server answers (measured on the
    one `make llama-tools` builds): echo ignored, the next token's top K only,
    in logprobs.content[0].top_logprobs, a list of {id, token, bytes,
    logprob}; "refuses-echo": the same, but echo refused with HTTP 500 (what
    its sources' "Only no echo is supported" would answer)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import torch

    from precisionlab.engines import charlm
    from precisionlab.numerics import distribution

    model, tok = charlm.load_default(torch.float32)
    served = {}

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            ids = body["prompt"]
            served.setdefault("bodies", []).append(body)
            if form == "refuses-echo" and body.get("echo"):
                return self._send(500, {"error": {"code": 500, "message": "Only no echo is supported",
                                                  "type": "server_error"}})
            with torch.no_grad():
                x = model(torch.tensor([ids]))[0][0].double().numpy()
            x = x + noise * np.random.default_rng(len(ids)).standard_normal(x.shape)
            served[len(ids)] = x
            lq = distribution.log_softmax(x)
            k = body["logprobs"]
            tops = [None] + [{tok.vocab[j]: float(lq[i - 1, j]) for j in np.argsort(-lq[i - 1])[:k]}
                             for i in range(1, len(ids) + 1)]
            doc = {"choices": [{"logprobs": {"tokens": [tok.vocab[i] for i in ids] + ["x"],
                                             "top_logprobs": tops, "token_logprobs": [None] * (len(ids) + 1)}}]}
            if form in ("llama-server", "refuses-echo"):
                last = lq[len(ids) - 1]
                top = [{"id": int(j), "token": tok.vocab[j], "bytes": list(tok.vocab[j].encode()),
                        "logprob": float(last[j])} for j in np.argsort(-last)[:k]]
                doc = {"choices": [{"text": top[0]["token"], "index": 0, "finish_reason": "length",
                                    "logprobs": {"content": [{**top[0], "top_logprobs": top}]}}]}
            self._send(200, doc)

        def _send(self, status, doc):
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, served


def _against_fake_endpoint(tokens: int, steps: int, *fake):
    """compare model --engine openai: against _fake_endpoint(*fake): its row and what it served."""
    from precisionlab.experiments import engines

    srv, served = _fake_endpoint(*fake)
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        res = engines.run(engines.EnginesConfig(engines=[f"openai:{url},timeout=30"], tokens=tokens, steps=steps))
    finally:
        srv.shutdown()
    return res.rows[0], served


@pytest.mark.parametrize("noise", [0.0, 0.3])
def test_openai_top_k_gives_a_labelled_lower_bound(noise):
    from precisionlab.experiments import engines
    from precisionlab.numerics import distribution

    row, served = _against_fake_endpoint(64, 4, noise)
    assert "lower bound" in row["kld_note"] and "kld_mean" not in row
    # the true KL of what was served, over the same 64 positions, from the full rows
    import torch

    from precisionlab.engines import charlm

    model, _ = charlm.load_default(torch.float32)
    x = served[65]
    ids = engines.lexp.token_ids(engines.open_engine(None, "cpu"), engines.lexp.default_text(), 65, "t")
    with torch.no_grad():
        ref = model(torch.tensor([ids[:64]]))[0][0].double().numpy()
    true = distribution.kl_rows(distribution.log_softmax(ref), distribution.log_softmax(x[:64]))
    bound_mean = row["kld_lower_bound_mean"]
    assert bound_mean <= math.fsum(true.tolist()) / true.size * (1 + 1e-9) + 1e-15
    if noise == 0.0:
        assert row["kld_lower_bound_max"] < FP32_MAX_KLD and row["top1_agree_pct"] == 100.0
    else:
        assert bound_mean > 1e-3  # sigma 0.3 on the logits: KL ~ sigma^2/2 (1 - sum p^2), of order 1e-2


@pytest.mark.parametrize("form", ["llama-server", "refuses-echo"])
def test_openai_adapter_reads_a_server_without_echo_one_position_at_a_time(form):
    """llama-server's form: echo ignored or refused, so each of the 32 rows is its own
    request (the prefix as token ids, one token, cache_prompt off), read by id.
    Served without noise, the rows are the fp32 model's: top-1 everywhere and
    a bound at fp32 rounding; the rows are the right positions' (a shift by one
    would agree by chance only, as the lag test of the real server shows)."""
    from precisionlab.engines.openai import PER_POSITION

    row, served = _against_fake_endpoint(32, 2, 0.0, form)
    assert row["engine"]["prompt_logprobs"] == PER_POSITION and row["engine"]["prompt_as"] == "token ids"
    assert row["positions"] == 32 and row["top1_agree_pct"] == 100.0
    assert row["kld_lower_bound_max"] < FP32_MAX_KLD
    greedy = [b for b in served["bodies"] if b.get("ignore_eos")]  # --steps 2: one greedy request (issue 41)
    assert len(greedy) == 1 and greedy[0]["max_tokens"] == 2 and greedy[0]["temperature"] == 0
    per = [b for b in served["bodies"] if not b.get("echo") and not b.get("ignore_eos")]
    assert all(b["max_tokens"] == 1 and b["cache_prompt"] is False and b["logprobs"] == 5 for b in per)
    assert sorted(len(b["prompt"]) for b in per) == list(range(1, 33))  # one request per prefix
    assert row["tokens"].startswith("the reference's ids, sent as token ids")


def test_export_never_replaces_a_folder_that_holds_no_model(tmp_path):
    keep = tmp_path / "notes"
    keep.mkdir()
    (keep / "todo.txt").write_text("mine")
    r = cli("export", "embedded", "--to", "hf", "--out", str(keep))
    assert r.code == 2 and "not empty" in r.err and (keep / "todo.txt").read_text() == "mine"


def test_export_refuses_foreign_code(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", "auto_map": {"AutoModel": "x.Y"}}))
    r = cli("export", f"hf:{tmp_path}", "--to", "hf", "--out", str(tmp_path / "out"))
    assert r.code == 2 and "custom code" in r.err and not (tmp_path / "out").exists()


def test_a_hugging_face_folder_through_ct2_against_its_hf_run(tmp_path):
    pytest.importorskip("ctranslate2", reason="CTranslate2's engine needs the ctranslate2 package")
    from helpers import save_tiny_qwen

    src = save_tiny_qwen(tmp_path / "tiny")
    out = tmp_path / "tiny-ct2"
    r = cli("export", f"hf:{src}", "--to", "ct2:float32", "--out", str(out))
    assert r.code == 0, r.err
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on a mat and the dog ran to it " * 6)
    r = cli("compare", "engine", "--engine", f"ct2:{out}", "--reference", f"hf:{src}", "--text", str(text),
            "--tokens", "48", "--steps", "5", "--prompt", "the cat", "--json")
    assert r.code == 0, r.err
    row = strict_json(r.out)["rows"][0]
    assert row["tokens"] == "identical" and row["engine"]["compute_type"] == "float32"
    assert row["kld_max"] < FP32_MAX_KLD and row["max_abs_diff_shifted"] < FP32_MAX_SHIFTED


def test_llamacpp_capture_maps_ggml_names_to_hf_modules(hf_dir, reference, tmp_path):
    pytest.importorskip("llama_cpp", reason="llama.cpp's engine needs llama-cpp-python")
    pytest.importorskip("gguf", reason="the GGUF export needs the gguf package")
    import torch
    import transformers

    from precisionlab.engines import llamacpp
    from precisionlab.engines.exporters import gguf

    assert llamacpp.hf_site("l_out-3") == "model.layers.3" and llamacpp.hf_site("result_norm") == "model.norm"
    assert llamacpp.hf_site("kq-0") is None and llamacpp.hf_site("l_out") is None
    ids = reference[0][:40]
    path = tmp_path / "m.gguf"
    gguf.write(str(hf_dir), str(path), "f32")
    got = llamacpp.capture(llamacpp.LlamaCppEngine(f"{path},kv=f32", "cpu"), ids)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=False).eval()
    seen = {}
    mods = dict(model.named_modules())
    for name in (n for n in got if n in mods):  # <attn>.heads (kqv_out) is no module: --heads hooks o_proj
        mods[name].register_forward_hook(
            lambda m, i, o, name=name: seen.__setitem__(name, (o[0] if isinstance(o, tuple) else o)[0].numpy()))
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]))
    for layer in range(5):  # every block's output, norms and MLP are captured
        for site in ("", ".input_layernorm", ".post_attention_layernorm", ".mlp"):
            assert f"model.layers.{layer}{site}" in got, (layer, site, sorted(got))
    for name, x in got.items():
        if name in seen:  # fp32 against fp32: within the logits' band
            assert np.max(np.abs(x - seen[name].reshape(x.shape))) < FP32_MAX_SHIFTED, name


def test_engine_reference_defaults_to_the_exports_source(tmp_path):
    pytest.importorskip("ctranslate2", reason="CTranslate2's engine needs the ctranslate2 package")
    from helpers import save_tiny_qwen

    src = save_tiny_qwen(tmp_path / "tiny")
    out = tmp_path / "tiny-ct2"
    assert cli("export", f"hf:{src}", "--to", "ct2:float32", "--out", str(out)).code == 0
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on a mat and the dog ran to it " * 6)
    r = cli("compare", "engine", "--engine", f"ct2:{out}", "--text", str(text), "--tokens", "48", "--steps", "5",
            "--prompt", "the cat", "--json")
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    assert doc["params"]["reference"] == f"hf:{src.resolve()}"
    assert doc["params"]["reference_from"] == "recorded in the export"
    assert doc["rows"][0]["kld_max"] < FP32_MAX_KLD  # the tiny model itself, not the embedded one


@pytest.mark.parametrize("record", ["hf:/no/such/dir\x1b[31m", "embedded\u202e", 3])
def test_a_recorded_source_that_is_no_model_is_refused_escaped(tmp_path, record):
    import json

    from precisionlab.engines.export import SOURCE_FILE

    d = tmp_path / "ct2"
    d.mkdir()
    (d / SOURCE_FILE).write_text(json.dumps({"source": record}))
    r = cli("compare", "engine", "--engine", f"ct2:{d}", "--tokens", "8", "--steps", "1")
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert "give --reference" in r.err and "\x1b" not in r.err and "\u202e" not in r.err


def test_onnx_export_records_its_source_beside_the_file(tmp_path):
    pytest.importorskip("onnx", reason="the ONNX export needs the onnx package")
    import json

    from precisionlab.engines.export import SOURCE_SUFFIX, recorded_source

    out = tmp_path / "m.onnx"
    r = cli("export", "embedded", "--to", "onnx:fp32", "--out", str(out))
    assert r.code == 0, r.err
    assert json.loads((tmp_path / ("m.onnx" + SOURCE_SUFFIX)).read_text()) == {"source": "embedded"}
    assert recorded_source(f"onnx:{out}") == "embedded"


def test_bit_identical_and_the_raw_difference():
    from precisionlab.experiments.engines import bit_identical

    a = np.array([[1.0, -0.0, 3.0]])
    assert bit_identical(a, a.copy())
    assert not bit_identical(a, np.array([[1.0, 0.0, 3.0]]))  # -0 and +0: equal values, other bits
    assert not bit_identical(a, np.nextafter(a, 10))
    n = np.array([[np.nan, 1.0]])
    assert not bit_identical(n, n.copy())  # two NaNs never agree
    assert not bit_identical(a, a[:, :2])


def test_batch_of_keeps_the_compared_sequence_first():
    from precisionlab.engines.external import batch_of

    ids = list(range(8))
    assert batch_of(ids, 1) == [ids]
    b = batch_of(ids, 4)
    assert b[0] == ids and len(b) == 4 and all(sorted(r) == ids and len(r) == 8 for r in b)
    assert b[1] == [2, 3, 4, 5, 6, 7, 0, 1] and len({tuple(r) for r in b}) == 4  # other prompts, one length


def test_extra_buffers_on_a_quantised_file_on_an_amx_cpu_are_refused(tmp_path):
    """llama.cpp's AMX-repacked kernels segfault in an every-logit eval of a quantised GGUF: extra=1 there is
    a one-line usage error, never a crash (runs only on a CPU with AMX)."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama.cpp's engine needs llama-cpp-python")
    pytest.importorskip("gguf", reason="the GGUF export needs the gguf package")
    if b"AMX_INT8 = 1" not in llama_cpp.llama_print_system_info():
        pytest.skip("this CPU has no AMX")
    q8 = tmp_path / "m-q8_0.gguf"
    assert cli("export", "embedded", "--to", "gguf:q8_0", "--out", str(q8)).code == 0
    r = cli("compare", "engine", "--engine", f"llamacpp:{q8},extra=1", "--tokens", "64", "--steps", "2")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "extra=0" in r.err, r.err
