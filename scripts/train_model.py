"""Train the shipped character-level model (precisionlab/models/charlm.py).

CPU only and deterministic for a given --seed and thread count: the weights
are initialised and the batches drawn from seeded generators. The last 5% of
the text is held out for validation. Takes ~16 minutes on 2 otherwise idle cores at the
default settings; the saved file holds the weights rounded to bf16.

    python scripts/train_model.py --steps 2200 --seed 0 \
        --out precisionlab/engines/data/charlm.safetensors
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from precisionlab.engines.charlm import CharLM, CharLMConfig, CharTokenizer, save  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "precisionlab/engines/data/shakespeare.txt"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2200)
    p.add_argument("--out", type=Path, default=DATA.with_name("charlm.safetensors"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--ctx", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args()


def lr_at(step: int, args) -> float:
    # Linear warmup, then cosine decay to 10% of peak: a small model at a high
    # peak rate needs the tail at low LR to settle into a good minimum.
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def batch(data: torch.Tensor, n: int, ctx: int, gen: torch.Generator):
    starts = torch.randint(0, len(data) - ctx - 1, (n,), generator=gen)
    rows = torch.stack([data[s : s + ctx + 1] for s in starts.tolist()])
    return rows[:, :-1], rows[:, 1:]


def loss_on(model, x, y):
    logits, _ = model(x)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def estimate(model, data, args, n_batches=16) -> float:
    # A fixed generator so every estimate scores the same windows and the
    # printed curve moves only because the model does.
    gen = torch.Generator().manual_seed(1234)
    model.eval()
    losses = [loss_on(model, *batch(data, args.batch, args.ctx, gen)).item() for _ in range(n_batches)]
    model.train()
    return sum(losses) / len(losses)


@torch.no_grad()
def full_loss(model, data, ctx) -> float:
    """Mean nats/char over all of data, in non-overlapping ctx windows."""
    model.eval()
    n = (len(data) - 1) // ctx
    x = data[: n * ctx].view(n, ctx)
    y = data[1 : n * ctx + 1].view(n, ctx)
    total = sum(loss_on(model, x[i : i + 64], y[i : i + 64]).item() * len(x[i : i + 64]) for i in range(0, n, 64))
    return total / n


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    text = DATA.read_text("utf-8")
    tok = CharTokenizer.from_text(text)
    data = torch.tensor(tok.encode(text), dtype=torch.long)
    split = int(len(data) * 0.95)
    train, val = data[:split], data[split:]
    print(f"text {len(text):,} chars, vocab {len(tok)}, train {len(train):,}, val {len(val):,}")

    model = CharLM(CharLMConfig(vocab_size=len(tok)))
    print(f"params {sum(p.numel() for p in model.parameters()):,}")

    # Decay matrices only; decaying norm gains pulls them toward 0, not 1.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95),
    )

    t0 = time.time()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        loss = loss_on(model, *batch(train, args.batch, args.ctx, gen))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.eval_every == 0 or step == args.steps - 1:
            print(
                f"step {step:5d}  loss {loss.item():.3f}  train {estimate(model, train, args):.3f}  "
                f"val {estimate(model, val, args):.3f}  lr {lr_at(step, args):.2e}  {time.time() - t0:6.0f}s",
                flush=True,
            )

    print(f"trained {args.steps} steps in {time.time() - t0:.0f}s")
    print(f"final val loss (fp32 weights): {full_loss(model, val, args.ctx):.4f} nats/char")
    # What ships is the bf16-rounded weights, so report the loss of those too.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16))
    print(f"final val loss (bf16-rounded weights, fp32 math): {full_loss(model, val, args.ctx):.4f} nats/char")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save(model, tok, args.out)
    print(f"saved {args.out} ({args.out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
