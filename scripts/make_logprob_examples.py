"""Write the log-prob streams docs/compare-logprobs.md and the README compare:
the embedded char-LM as a tiny RL pipeline, seeded, on the CPU.

- rollout: the model in bf16 samples 8 continuations of 64 tokens (top-p 0.9,
  temperature 1, KV cache, one token a step, as an inference engine decodes)
  after 64-character prompts from the held-out Shakespeare text. Each step's
  log-probs are fp32 log-softmax of the bf16 logits. Two files of the same
  tokens: `rollout.jsonl` holds those raw log-probs, `rollout-top-p.jsonl`
  the log-probs of the distribution sampled from, renormalised over the top-p
  support (-inf outside it), as an engine reporting processed log-probs does.
- trainer: the model in fp32 scores prompt + continuation teacher-forced in
  one forward pass: `trainer.safetensors`, (8, 64) arrays with the top 5.

    .venv/bin/python scripts/make_logprob_examples.py [OUT_DIR]   # default docs/data/logprobs
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from precisionlab.engines import charlm  # noqa: E402

SEQUENCES, PROMPT, RESPONSE, TOP_K, TOP_P, SEED = 8, 64, 64, 5, 0.9, 0


def log_softmax32(logits: torch.Tensor) -> np.ndarray:
    """fp32 log-softmax of a row of logits (bf16 ones upcast first), as an engine computes it."""
    return torch.log_softmax(logits.float(), dim=-1).numpy()


def f32(v):
    """An fp32 value for JSON: its shortest decimal that reads back as the same fp32
    (what an engine's json writer gives), -inf as strict JSON's "-inf"."""
    return "-inf" if v == -np.inf else float(str(np.float32(v)))


def top(lp: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    idx = np.argsort(-lp, kind="stable")[:k]
    return idx, lp[idx]


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "data" / "logprobs"
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    rng = np.random.default_rng(SEED)
    bf16, tok = charlm.load_default(torch.bfloat16)
    fp32, _ = charlm.load_default(torch.float32)
    text = (charlm.DEFAULT_WEIGHTS.parent / "shakespeare.txt").read_text("utf-8")
    held = text[int(len(text) * 0.95):]
    raw_recs, proc_recs = [], []
    ids_all, lp_all, top_ids_all, top_lp_all = [], [], [], []
    with torch.no_grad():
        for s in range(SEQUENCES):
            start = s * (len(held) - PROMPT) // SEQUENCES
            prompt = tok.encode(held[start:start + PROMPT])
            logits, cache = bf16(torch.tensor([prompt]))
            seq, raw, proc, raw_top, proc_top = list(prompt), [], [], [], []
            for _ in range(RESPONSE):
                lp = log_softmax32(logits[0, -1])
                order = np.argsort(-lp, kind="stable")
                p = np.exp(lp[order].astype(np.float64))
                keep = order[:int(np.searchsorted(np.cumsum(p), TOP_P)) + 1]  # the smallest set with mass >= p
                kept = np.float32(np.exp(lp[keep].astype(np.float64)).sum())
                plp = np.full_like(lp, -np.inf)
                plp[keep] = lp[keep] - np.log(kept)  # fp32, as the engine's processed log-probs
                w = np.exp(plp[keep].astype(np.float64))
                x = int(rng.choice(keep, p=w / w.sum()))
                seq.append(x)
                raw.append(f32(lp[x]))
                proc.append(f32(plp[x]))
                raw_top.append({str(int(i)): f32(v) for i, v in zip(*top(lp, TOP_K), strict=True)})
                proc_top.append({str(int(i)): f32(v) for i, v in zip(*top(plp, TOP_K), strict=True)})
                logits, cache = bf16(torch.tensor([[x]]), cache, len(seq) - 1)
            response = seq[PROMPT:]
            chars = [tok.decode([i]) for i in response]
            raw_recs.append({"token_ids": response, "tokens": chars, "logprobs": raw, "top_logprobs": raw_top})
            proc_recs.append({"token_ids": response, "tokens": chars, "logprobs": proc, "top_logprobs": proc_top})
            # the trainer: teacher-forced fp32, one pass over prompt + response
            full = log_softmax32(fp32(torch.tensor([seq]))[0][0])  # row t predicts token t+1
            rows = full[PROMPT - 1:PROMPT - 1 + RESPONSE]
            ids_all.append(response)
            lp_all.append(rows[np.arange(RESPONSE), response])
            t = [top(r, TOP_K) for r in rows]
            top_ids_all.append([i for i, _ in t])
            top_lp_all.append([v for _, v in t])
    from safetensors.numpy import save_file

    save_file({"token_ids": np.asarray(ids_all, dtype=np.int32), "logprobs": np.asarray(lp_all, dtype=np.float32),
               "top_ids": np.asarray(top_ids_all, dtype=np.int32),
               "top_logprobs": np.asarray(top_lp_all, dtype=np.float32)}, str(out / "trainer.safetensors"))

    def write(name, recs):
        with open(out / name, "w", encoding="utf-8") as f:
            for r in recs:
                f.write(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n")

    write("rollout.jsonl", raw_recs)
    write("rollout-top-p.jsonl", proc_recs)
    print(f"wrote {out}/trainer.safetensors, rollout.jsonl, rollout-top-p.jsonl", file=sys.stderr)


if __name__ == "__main__":
    main()
