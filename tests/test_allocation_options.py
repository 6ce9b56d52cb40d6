"""Issue 45's class "every option that changes an allocation is in the
estimate", swept over every command: each numeric option that sizes an
allocation, given a huge value (10^9, or the largest the option accepts where
a bound refuses 10^9 first), is refused before anything large is allocated:
exit 2, one line on stderr naming the memory it needs or the option's bound,
in a few seconds, in a child whose address space is capped (as
tests/test_memory.py's _run_limited does), so an option the estimate missed
ends in MemoryError or the cap, not in a pass.

Options whose size allocates nothing of its own (a tile or block length, a
stride, a count of listed rows) run to the end under the same cap instead."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import ROOT, TINY_WORDS, _save_word_model, loaded_timeout, save_tiny_qwen3_moe

CAP = 4_000_000_000  # bytes of address space: the child's memory_limit() is what is left of it
B = str(10**9)
QWEN, MOE = "{qwen}", "{moe}"  # the models the fixtures save, put into argv by _argv


def _run_capped(args: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """The CLI in a child capped at CAP bytes of address space: (the result, its seconds)."""
    env = {k: v for k, v in os.environ.items() if k != "PRECISIONLAB_DEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    code = "import sys\nfrom precisionlab.cli import main\nsys.argv = ['precisionlab', *sys.argv[1:]]\nmain()"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=loaded_timeout(120),
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP)))
    return r, time.monotonic() - t0


# (argv, what the one stderr line says: "memory" for an estimate's refusal, else the bound's words)
REFUSED = {
    "accumulate --n": (["accumulate", "--n", B], "memory"),
    "softmax --rows": (["softmax", "--rows", B, "--cols", "8"], "memory"),
    "softmax --cols": (["softmax", "--rows", "8", "--cols", B], "memory"),
    "tf32 --m": (["tf32", "--m", "65536", "--no-sweep", "--device", "cpu"], "memory"),
    "tf32 --n": (["tf32", "--n", "65536", "--no-sweep", "--device", "cpu"], "memory"),
    "tf32 --k": (["tf32", "--k", "65536", "--no-sweep", "--device", "cpu"], "memory"),
    "tf32 --m past its bound": (["tf32", "--m", B], "at most 65536"),
    "tf32 --sweep-mn": (["tf32", "--m", "8", "--n", "8", "--k", "8", "--sweep-mn", "65536", "--device", "cpu"],
                        "memory"),
    "tf32 --accumulator --k": (["tf32", "--accumulator", "fp32", "--k", B], "between 1 and 131072"),
    "nondeterminism --n": (["nondeterminism", "--n", B, "--device", "cpu"], "memory"),
    # split-K keeps every run's 128 x 128 result: 18 GiB at the largest --runs
    "nondeterminism --runs": (["nondeterminism", "--runs", "100000", "--sections", "splitk", "--device", "cpu"],
                              "memory"),
    "nondeterminism --runs past its bound": (["nondeterminism", "--runs", B], "at most 100000"),
    "bench --cpu-n": (["bench", "accumulate", "--cpu-n", B, "--device", "cpu"], "memory"),
    "bench --gpu-n": (["bench", "accumulate", "--gpu-n", B, "--device", "cpu"], "memory"),
    "formats --n": (["formats", "--n", B], "memory"),
    "formats --shape": (["formats", "--shape", f"8x{B}x8"], "memory"),
    "formats --blocks": (["formats", "--blocks", B], "[1, 1024]"),
    "attention --seq": (["attention", "--seq", B], "between 1 and 131072"),
    "attention --rows": (["attention", "--rows", B], "between 1 and 131072"),
    "attention --dim": (["attention", "--dim", B], "between 1 and 1024"),
    "attention at the largest sizes": (["attention", "--seq", "131072", "--rows", "131072", "--dim", "1024"],
                                       "memory"),
    "attention --splits": (["attention", "--seq", "256", "--rows", "8", "--dim", "8", "--splits", B], "memory"),
    "attention-cases --max-keys": (["attention-cases", "--max-keys", B], "between 4096 and 16777216"),
    "router --tokens": (["router", "--tokens", B], "memory"),
    "router --experts": (["router", "--experts", B], "memory"),
    "router --hidden": (["router", "--hidden", B], "memory"),
    "router --layers": (["router", "--layers", B], "memory"),
    "router --top-k": (["router", "--top-k", B], "--top-k must be in 1 ... 127"),
    "router --groups": (["router", "--groups", f"{B}:1"], "--groups N:M"),
    "router --impl --experts": (["router", "--impl", "tests.impls.router_kernels:correct", "--experts", B],
                                "memory"),
    "router --impl --threshold": (["router", "--impl", "tests.impls.router_kernels:correct", "--threshold",
                                   str(1 << 20), "--experts", "4096"], "memory"),
    "router --impl --threshold past its bound": (["router", "--impl", "tests.impls.router_kernels:correct",
                                                  "--threshold", B], "--threshold must be in 2 ... 1048576"),
    # 100,000 tokens of a 1,024-expert model: the estimate reads the experts from the config
    "router --inputs MODEL --tokens": (["router", "--inputs", f"hf:{MOE}", "--tokens", "100000", "--gate-dtypes",
                                        "fp32", "--logit-dtypes", "fp32"], "memory"),
    "compare op softmax --shape": (["compare", "op", "softmax", "--shape", f"{B}x8", "--device", "cpu"], "memory"),
    "compare op logsumexp --shape": (["compare", "op", "logsumexp", "--shape", f"8x{B}", "--device", "cpu"],
                                     "memory"),
    "compare op rmsnorm --shape": (["compare", "op", "rmsnorm", "--shape", f"{B}x8", "--device", "cpu"], "memory"),
    "compare op layernorm --shape": (["compare", "op", "layernorm", "--shape", f"8x{B}", "--device", "cpu"],
                                     "memory"),
    "compare op swiglu --shape": (["compare", "op", "swiglu", "--shape", f"{B}x8", "--device", "cpu"], "memory"),
    "compare op rope --shape": (["compare", "op", "rope", "--shape", f"{B}x8", "--device", "cpu"], "memory"),
    "compare op matmul --shape": (["compare", "op", "matmul", "--shape", f"8x{B}x8", "--device", "cpu"], "memory"),
    "compare op attention --shape": (["compare", "op", "attention", "--shape", f"8x{B}x8", "--device", "cpu"],
                                     "memory"),
    "compare model --steps": (["compare", "model", "--steps", B], "memory"),
    "compare layers --steps": (["compare", "layers", "--steps", B], "memory"),
    "compare engine-layers --steps": (["compare", "engine-layers", "--engine", "embedded", "--reference", "embedded",
                                       "--steps", B], "memory"),
    "compare contracts --steps": (["compare", "contracts", "--steps", B], "memory"),
    "compare contracts --draft-widths": (["compare", "contracts", "--steps", "4", "--draft-widths", B],
                                         "verify window"),
    "kvcache --steps": (["kvcache", "--steps", B], "memory"),
    "compare metrics --tokens": (["compare", "metrics", "--tokens", B], "memory"),
    "compare rollout --samples": (["compare", "rollout", "--trainer", "embedded", "--rollout", "embedded",
                                   "--samples", B, "--tokens", "4"], "memory"),
    "compare rollout --tokens": (["compare", "rollout", "--trainer", "embedded", "--rollout", "embedded",
                                  "--samples", "1", "--tokens", B], "memory"),
    "compare engine --tokens": (["compare", "engine", "--engine", "embedded", "--tokens", B, "--steps", "2"],
                                "memory"),
    # the greedy path's float64 rows: 100,000 steps of a 151,936-token vocabulary (the embedded model's
    # 1,024 positions refuse such --steps first)
    "compare engine --steps": (["compare", "engine", "--engine", f"hf:{QWEN}", "--reference", f"hf:{QWEN}",
                                "--steps", "100000", "--tokens", "8", "--prompt", "the cat"], "memory"),
    "compare model --threads": (["compare", "model", "--steps", "4", "--threads", B], "--threads must be at most"),
    "nondeterminism endpoint --requests": (["nondeterminism", "endpoint", "http://127.0.0.1:9", "--requests", B],
                                           "--requests must be in 1 ... 100000"),
    "nondeterminism endpoint --concurrency": (["nondeterminism", "endpoint", "http://127.0.0.1:9", "--concurrency",
                                               B], "--concurrency must be in 1 ... 64"),
    "nondeterminism endpoint --max-tokens": (["nondeterminism", "endpoint", "http://127.0.0.1:9", "--max-tokens", B],
                                             "--max-tokens must be in 1 ... 4096"),
    "compare builds --resamples": (["compare", "builds", "docs/data/builds/ref.safetensors",
                                    "docs/data/builds/f16.safetensors", "docs/data/builds/q8_0.safetensors",
                                    "--resamples", B], "--resamples must be in 100 ... 1000000"),
    "compare logits --kld-ctx": (["compare", "logits", "docs/data/logits/ref.safetensors", "--write-kld-base",
                                  "{tmp}/ref.kld", "--kld-ctx", B], "no chunk of n_ctx"),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The two Hugging Face models the cases name, saved once, only where a case needs them."""
    return {}


def _model(models, tmp_path_factory, key: str) -> str:
    if key not in models:
        pytest.importorskip("transformers")
        folder = tmp_path_factory.mktemp(key.strip("{}"))
        if key == QWEN:  # a real vocabulary and a million positions at a tiny width: 2.4 M parameters
            from transformers import Qwen3Config, Qwen3ForCausalLM

            cfg = Qwen3Config(vocab_size=151936, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=2,
                              max_position_embeddings=1_000_000)
            _save_word_model(folder, Qwen3ForCausalLM, cfg, TINY_WORDS, None)
        else:
            save_tiny_qwen3_moe(folder, layers=2, experts=1024)
        models[key] = str(folder)
    return models[key]


def _argv(argv: list[str], models, tmp_path_factory, tmp_path) -> list[str]:
    out = []
    for a in argv:
        for key in (QWEN, MOE):
            if key in a:
                a = a.replace(key, _model(models, tmp_path_factory, key))
        out.append(a.replace("{tmp}", str(tmp_path)))
    return out


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_huge_allocating_option_is_refused_in_one_line(case, models, tmp_path_factory, tmp_path):
    argv, says = REFUSED[case]
    r, seconds = _run_capped(_argv(argv, models, tmp_path_factory, tmp_path))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr[-800:])
    assert len(lines) == 1 and says in lines[0], r.stderr[-800:]
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr
    assert seconds < loaded_timeout(15), f"{case}: refused after {seconds:.1f} s"


# Options whose size is a length within what is already allocated (a tile, a block, a stride, rows
# listed from a table), a count of model-free checks, or a batch the contract leaves out by itself
# (named with its need in the report): 10^9 runs to the end under the cap.
RUN = {
    "attention --block-r": (["attention", "--seq", "256", "--rows", "8", "--dim", "8", "--block-r", B], None),
    "attention --block-c": (["attention", "--seq", "256", "--rows", "8", "--dim", "8", "--block-c", B], None),
    "attention --promote-tiles": (["attention", "--seq", "256", "--rows", "8", "--dim", "8", "--promote-tiles", B],
                                  None),
    "compare contracts --chunks": (["compare", "contracts", "--steps", "4", "--chunks", B, "--dtypes", "fp32"], None),
    "compare contracts --batches": (["compare", "contracts", "--steps", "4", "--batches", B, "--dtypes", "fp32"],
                                    f"batch of {B} not run: with the model it needs about"),
    "compare pair --chunk": (["compare", "pair", "docs/data/pairs/chunkbug-whole-fp32.safetensors",
                              "docs/data/pairs/chunkbug-chunked-fp32.safetensors", "--chunk", B], None),
    "compare logprobs --worst": (["compare", "logprobs", "docs/data/logprobs/trainer.safetensors",
                                  "docs/data/logprobs/rollout.jsonl", "--worst", B], None),
    "compare routing --experts": (["compare", "routing", "docs/data/routing/trainer.npz",
                                   "docs/data/routing/rollout.npz", "--a-experts",
                                   "docs/data/routing/trainer-experts.npy", "--b-experts",
                                   "docs/data/routing/rollout-experts.npy", "--experts", B], None),
}


@pytest.mark.parametrize("case", list(RUN))
def test_a_huge_option_that_allocates_nothing_runs_under_the_cap(case):
    argv, says = RUN[case]
    r, seconds = _run_capped(argv)
    assert r.returncode in (0, 1), (r.returncode, r.stderr[-800:])  # 1: the pair's or the streams' own verdict
    assert "memory" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-800:]
    if says is not None:
        assert says in " ".join(r.stdout.split()), r.stdout[-800:]


def test_rollouts_top_k_keeps_no_vocabulary_sized_buffer():
    """compare rollout keeps every token's top-k ids: a slice of the argsort kept
    the whole vocabulary's int64 order alive (--samples 300 of a 151,936-token
    vocabulary grew 1.6 GiB against 0.25 GiB estimated)."""
    from precisionlab.experiments import rollout

    rng = np.random.default_rng(0)
    for lp in (rng.standard_normal(1000), rng.standard_normal((3, 1000))):
        idx, v = rollout._top(lp, rollout.TOP_K)
        assert idx.shape[-1] == rollout.TOP_K and idx.base is None
        assert np.array_equal(v, np.take_along_axis(lp, idx, axis=-1))
