"""export --to gguf with real (byte-level BPE) tokenizers, export llamacpp:FILE --to hf,
and SmolLM2-135M-Instruct (make smollm2) where it is cached.

What is checked, against transformers (the reference) rather than the code under test:
llama.cpp tokenises a held-out text (one never used to build the tokenizer: digits,
double newlines, accents, CJK, tabs) to the same ids as the HF tokenizer, and the f32
GGUF's logits, from llama.cpp with an f32 KV cache, against transformers' fp32 logits
over those ids have mean KL below 1e-6 (fp32 rounding of different summation orders
moves a logit by ~1e-5 at most here, KL ~ Var/2 ~ 1e-10; a wrong q/k permutation or
pre-tokenizer is KL ~ 1 or different ids). Bands chosen before any run.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from helpers import cli

HELD_OUT = ("Held-out: The 3 quick brown foxes (1234 of them!) jumped over\n\nthe lazy dog's kennel... "
            "naïve café — 你好 \t tabs  and  double  spaces. It's 2026; we'll see 42 + 7 = 49.\n")
TRAIN = ["the quick brown fox jumps over the lazy dog", "it's a test; they'll see", "numbers 0123456789",
         "  spaces\n\nnewlines\tand tabs", "we've done what you'd do"] * 20
MAX_KL_MEAN = 1e-6
SMOL = Path(os.environ.get("PRECISIONLAB_CACHE") or Path.home() / ".cache" / "precisionlab") / "smollm2"
SMOL_GGUF = SMOL / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _tiny_bpe_folder(folder: Path, arch: str, pre: str) -> Path:
    """A random 2-layer `arch` model with a byte-level BPE trained here, its pre-tokenizer `pre`
    (a llama.cpp name of gguf_vocab.PRE_TOKENIZERS), two special tokens, BOS added by the
    post-processor for llama (as Llama-3's tokenizer does)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from precisionlab.engines.exporters import gguf_vocab

    tok = Tokenizer(models.BPE())
    trainer = trainers.BpeTrainer(vocab_size=420, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|begin|>", "<|end|>"], show_progress=False)
    doc = json.loads(tok.to_str())
    doc["pre_tokenizer"] = gguf_vocab.PRE_TOKENIZERS[pre]
    tok = Tokenizer.from_str(json.dumps(doc))
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TRAIN, trainer)
    if arch == "llama":
        tok.post_processor = processors.TemplateProcessing(single="<|begin|> $A", special_tokens=[("<|begin|>", 0)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin|>", eos_token="<|end|>")
    fast.chat_template = "{% for m in messages %}<|begin|>{{ m['content'] }}<|end|>{% endfor %}"
    common = dict(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                  rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    cfg = (transformers.LlamaConfig if arch == "llama" else transformers.Qwen3Config)(**common)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # weights large enough that a wrong q/k row order shows in the logits
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def _llama(path: str):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama.cpp's engine needs llama-cpp-python")
    from precisionlab.engines.llamacpp import _model_params, _quantised_amx_default

    # the weight buffers the llamacpp engine uses: a quantised file on an AMX CPU without the repacked
    # kernels, whose every-logit eval segfaults in llama-cpp-python 0.3.36 (engines/llamacpp.py)
    with _model_params(llama_cpp, use_extra_bufts=not _quantised_amx_default(llama_cpp, str(path))):
        return llama_cpp.Llama(str(path), n_ctx=512, logits_all=True, verbose=False, n_threads=1,
                               type_k=0, type_v=0, flash_attn=False)  # GGML_TYPE_F32 KV cache: fp32 throughout


def _kl_mean(hf_dir, llm, ids) -> float:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids])).logits[0].double()
    llm.eval(ids)
    got = torch.tensor(np.array(llm.scores[:len(ids)]), dtype=torch.float64)
    lp, lq = ref.log_softmax(-1), got.log_softmax(-1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


@pytest.mark.parametrize("arch,pre", [("qwen3", "qwen2"), ("llama", "llama-bpe"), ("llama", "smollm")])
def test_bpe_gguf_tokenises_and_computes_as_transformers(arch, pre, tmp_path):
    pytest.importorskip("gguf", reason="the GGUF export needs the gguf package")
    transformers = pytest.importorskip("transformers")
    src = _tiny_bpe_folder(tmp_path / "hf", arch, pre)
    out = tmp_path / "m.gguf"
    r = cli("export", f"hf:{src}", "--to", "gguf:f32", "--out", str(out), "--json")
    assert r.code == 0, r.err
    changes = " ".join(json.loads(r.out)["changes"])
    assert f"pre-tokenizer {pre!r}" in changes and "chat template: written" in changes
    assert "q/k rows permuted" in changes if arch == "llama" else "NEOX" in changes
    ids = transformers.AutoTokenizer.from_pretrained(src)(HELD_OUT)["input_ids"]
    llm = _llama(out)
    assert llm.tokenize(HELD_OUT.encode(), add_bos=True, special=False) == ids
    assert (ids[0] == 0) is (arch == "llama")  # BOS where the post-processor puts it, and only there
    assert llm.metadata["tokenizer.ggml.pre"] == pre and int(llm.metadata[f"{arch}.context_length"]) == 256
    assert _kl_mean(src, llm, ids) < MAX_KL_MEAN


# q8_0 (issue 39's `--to gguf:f32|q8_0` on a Qwen3 BPE folder). Band chosen before running: the weights
# are N(0, 0.2) in blocks of 32, so a block's scale is about 3 sd / 127 and each weight moves by about
# 0.7 % of its size (uniform rounding); llama.cpp also rounds the activations to Q8 blocks. Over two
# layers that moves a logit by a few hundredths, KL ~ Var/2 ~ 1e-4 to 1e-3: the band is (1e-6, 0.02),
# f32's bound below (the q8_0 weights were used) and a wrong block layout (KL ~ 1) above.
Q8_KL_BAND = (MAX_KL_MEAN, 0.02)


def test_q8_0_gguf_of_a_bpe_qwen3_folder_tokenises_and_costs_what_q8_0_costs(tmp_path):
    pytest.importorskip("gguf", reason="the GGUF export needs the gguf package")
    transformers = pytest.importorskip("transformers")
    src = _tiny_bpe_folder(tmp_path / "hf", "qwen3", "qwen2")
    out = tmp_path / "m-q8_0.gguf"
    r = cli("export", f"hf:{src}", "--to", "gguf:q8_0", "--out", str(out), "--json")
    assert r.code == 0, r.err
    assert any("Q8_0" in c for c in json.loads(r.out)["changes"])
    ids = transformers.AutoTokenizer.from_pretrained(src)(HELD_OUT)["input_ids"]
    llm = _llama(out)
    assert llm.tokenize(HELD_OUT.encode(), add_bos=True, special=False) == ids
    kl = _kl_mean(src, llm, ids)
    assert Q8_KL_BAND[0] < kl < Q8_KL_BAND[1], kl


def test_unknown_pre_tokenizer_is_refused_before_any_weight(tmp_path):
    """No weight file at all in the folder: the refusal comes from tokenizer.json alone."""
    pytest.importorskip("gguf", reason="the GGUF export needs the gguf package")
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": 300}))
    tok = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}, "added_tokens": [],
           "pre_tokenizer": {"type": "Whitespace"}}
    (d / "tokenizer.json").write_text(json.dumps(tok))
    r = cli("export", f"hf:{d}", "--to", "gguf:f32", "--out", str(tmp_path / "m.gguf"))
    assert r.code == 2 and "matches none of llama.cpp's rules" in r.err and "Traceback" not in r.err, r.err


def test_gguf_source_usage_errors(tmp_path):
    g = tmp_path / "only" / "m.gguf"
    g.parent.mkdir()
    g.write_bytes(b"GGUF")
    for args, says in ((("compare", "model", "--model", f"hf:{g.parent}", "--steps", "2"), "no config.json"),
                       (("export", f"llamacpp:{g}", "--to", "gguf:f32", "--out", str(tmp_path / "x.gguf")),
                        "exported --to hf"),
                       (("export", f"llamacpp:{tmp_path / 'none.gguf'}", "--to", "hf", "--out", str(tmp_path / "o")),
                        "give a .gguf file")):
        r = cli(*args)
        assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, (args, r.err)


needs_smol = pytest.mark.skipif(not SMOL_GGUF.is_file(), reason="SmolLM2 not cached: make smollm2")


@needs_smol
def test_smollm2_gguf_to_hf_and_back(tmp_path):
    """The Q4_1 file -> fp32 HF folder -> f32 GGUF: the same ids from llama.cpp and transformers on a
    held-out text, and the f32 GGUF computes the HF folder's logits (KL < 1e-6)."""
    pytest.importorskip("accelerate", reason="transformers' GGUF loader needs accelerate")
    transformers = pytest.importorskip("transformers")
    hf = tmp_path / "hf"
    r = cli("export", f"llamacpp:{SMOL_GGUF}", "--to", "hf", "--out", str(hf), "--json", timeout=900)
    assert r.code == 0, r.err
    assert any("'smollm' rule" in c for c in json.loads(r.out)["changes"])
    out = tmp_path / "s.gguf"
    r = cli("export", f"hf:{hf}", "--to", "gguf:f32", "--out", str(out), timeout=900)
    assert r.code == 0, r.err
    ids = transformers.AutoTokenizer.from_pretrained(hf)(HELD_OUT)["input_ids"]
    for path in (out, SMOL_GGUF):  # the export and the original file split a text the same way
        assert _llama(path).tokenize(HELD_OUT.encode(), add_bos=False, special=False) == ids, path
    assert _kl_mean(hf, _llama(out), ids) < MAX_KL_MEAN


@needs_smol
def test_onnx_of_smollm2_computes_as_transformers(tmp_path):
    """--to onnx:fp32 of SmolLM2's fp32 HF folder (make smollm2 writes it beside the GGUF): onnxruntime's
    logits over the held-out text against transformers' fp32 ones, mean KL < 1e-6 (fp32 rounding of two
    summation orders, as above)."""
    pytest.importorskip("onnxscript", reason="the ONNX export of a HF folder needs onnxscript")
    if not (SMOL / "hf" / "model.safetensors").is_file():
        pytest.skip("SmolLM2's HF folder not cached: make smollm2")
    out = tmp_path / "s.onnx"
    r = cli("export", f"hf:{SMOL / 'hf'}", "--to", "onnx:fp32", "--out", str(out), timeout=900)
    assert r.code == 0, r.err
    assert _onnx_kl_mean(SMOL / "hf", out) < MAX_KL_MEAN


def _onnx_kl_mean(src, out) -> float:
    """Mean KL between transformers' fp32 logits and onnxruntime's over the held-out text's ids (more
    tokens than the export traced: the token axis must be dynamic)."""
    ort = pytest.importorskip("onnxruntime")
    import torch
    import transformers

    ids = transformers.AutoTokenizer.from_pretrained(src)(HELD_OUT)["input_ids"]
    assert len(ids) > 8
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(
        None, {"input_ids": np.array([ids], dtype=np.int64)})[0][0]
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids])).logits[0].double()
    lp, lq = ref.log_softmax(-1), torch.tensor(got, dtype=torch.float64).log_softmax(-1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_onnx_of_a_hf_folder_computes_as_transformers(arch, tmp_path):
    """--to onnx:fp32 of a HF folder (torch's dynamo exporter), run by onnxruntime over more tokens than
    it was traced with: mean KL < 1e-6 against transformers' fp32 logits."""
    pytest.importorskip("onnxscript", reason="the ONNX export of a HF folder needs onnxscript")
    src = _tiny_bpe_folder(tmp_path / "hf", arch, "qwen2" if arch == "qwen3" else "llama-bpe")
    out = tmp_path / "m.onnx"
    r = cli("export", f"hf:{src}", "--to", "onnx:fp32", "--out", str(out), timeout=900)
    assert r.code == 0, r.err
    assert _onnx_kl_mean(src, out) < MAX_KL_MEAN
