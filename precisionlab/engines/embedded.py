"""The embedded engine (`--model embedded`, the default): the shipped
character-level decoder of engines/charlm.py, its weights stored in bf16 so
an fp32 run is an exact upcast. Its KV-cache hook is each layer's
Attention.kv_store."""

from __future__ import annotations

from precisionlab.engines.protocol import Engine, KVStores
from precisionlab.errors import RunError, UsageError

# The model was trained on 128-character windows (scripts/train_model.py --ctx);
# its RoPE table reaches further, but positions it never saw would measure an
# untrained model, not a precision.
WINDOW = 128
# torch threads for --metrics: its matrices are 128 wide, so a second thread
# mostly waits; on a 2-core machine 8192 positions in fp32, bf16 and fp16 took
# 2.6 s of CPU on one thread and 6.9 s on two, for no gain in wall time.
SCORE_THREADS = 1


class EmbeddedEngine(Engine):
    window = WINDOW
    score_threads = SCORE_THREADS
    batches = True  # CharLM takes a key mask and positions
    forks = True    # its cache is a list of tensors never written in place
    stores_kv = True  # each layer's attention writes and reads its cache through kv_store

    @classmethod
    def check(cls, arg):
        if arg is not None:
            raise UsageError(f"--model embedded:{arg}: the embedded model takes no argument; give `embedded`")

    @classmethod
    def shape(cls, arg, steps, prompt):
        from precisionlab.engines import shape

        _weights()  # the estimate reads their header
        return shape.model_shape(None, steps, prompt)

    def __init__(self, arg, device: str):
        import torch

        from precisionlab.engines import charlm

        self.check(arg)
        _weights()
        self.base, self.tok = charlm.load_default(torch.float32, device)
        self.device = device
        self.name = "precisionlab char-LM (embedded, bf16 weights)"
        self.max_len = self.base.cfg.max_seq_len

    def info(self) -> dict:
        n = sum(p.numel() for p in self.base.parameters())
        return {"name": self.name, "parameters": n, "vocab": len(self.tok), "max_seq_len": self.max_len}

    def cache_info(self) -> dict:
        cfg = self.base.cfg
        return {"name": self.name, "parameters": sum(p.numel() for p in self.base.parameters()),
                "layers": len(self.base.layers), "heads": cfg.n_heads, "head_dim": cfg.head_dim}

    def encode(self, text: str, source: str = "--prompt") -> list[int]:
        missing = sorted({c for c in text if c not in self.tok.index})
        if missing:
            raise UsageError(f"{source} has characters the embedded model does not know: {''.join(missing)!r}")
        return self.tok.encode(text)

    def decode(self, ids) -> str:
        return self.tok.decode(ids)

    def prefix_ids(self, text: str, need: int, source: str) -> list[int]:
        return self.encode(text[:need], source)  # one character is one token

    def forward(self, model, ids, head_dtype: str | None = None):
        import torch

        from precisionlab.catalog import formats

        head = None if head_dtype is None else formats.get(head_dtype).torch_dtype
        with torch.no_grad():
            return model(ids, head_dtype=head)[0]

    def forward_batch(self, model, ids, attention_mask=None, position_ids=None):
        import torch

        with torch.no_grad():
            mask = None if attention_mask is None else attention_mask.bool()
            return model(ids, key_mask=mask, positions=position_ids)[0]

    def session(self, model, stores: KVStores | None = None):
        for i, layer in enumerate(model.layers):
            layer.attn.kv_store = None if stores is None else stores[i]
        return self._feed(model, {"cache": None, "pos": 0})

    def fork(self, feed):
        # The cache's tensors are never written in place (each step concatenates
        # new ones), so a copy of the list is a copy of the cache.
        return self._feed(feed.model, {"cache": list(feed.state["cache"] or []) or None, "pos": feed.state["pos"]})

    def _feed(self, model, state: dict):
        import torch

        def feed(ids: list[int]):
            with torch.no_grad():
                logits, state["cache"] = model(torch.tensor([ids], device=self.device), state["cache"], state["pos"])
            state["pos"] += len(ids)
            return logits[0]

        feed.model, feed.state = model, state
        return feed

    def close(self) -> None:
        for layer in self.base.layers:
            layer.attn.kv_store = None

    def kv_heads(self, model) -> int | None:
        return model.cfg.n_heads  # multi-head attention: a KV head per query head

    def sites(self, model) -> list:
        """CharLM's watched modules. Its RoPE tables and its tied LM head are
        computed outside any module: two pseudo-sites, `rope` (built by the
        experiment from the tables) and `lm_head` (the model's own output,
        after `norm`)."""
        from precisionlab.engines.hooks import Site

        out = [Site("rope", "rope", True), Site("embed", "embed")]
        for i, _ in enumerate(model.layers):
            p = f"layers.{i}"
            out += [Site(f"{p}.attn_norm", "norm"), Site(f"{p}.attn.q_norm", "norm"), Site(f"{p}.attn.k_norm", "norm"),
                    Site(f"{p}.attn", "attn"), Site(f"{p}.mlp_norm", "norm"), Site(f"{p}.mlp", "mlp"),
                    Site(p, "block")]
        return out + [Site("norm", "final_norm"), Site("lm_head", "lm_head", True, hook_on="")]


def _weights():
    """The shipped weights file; missing: one line, exit 1."""
    from precisionlab.engines import charlm

    if not charlm.DEFAULT_WEIGHTS.is_file():
        raise RunError(f"the embedded model's weights are missing ({charlm.DEFAULT_WEIGHTS}): "
                       "reinstall, or train them with scripts/train_model.py")
    return charlm.DEFAULT_WEIGHTS
