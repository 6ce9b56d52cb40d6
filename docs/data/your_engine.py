"""Your PyTorch model behind precisionlab's Engine protocol (docs/your-engine.md).
Run: precisionlab compare contracts --model python:your_engine.py:factory"""
import torch

from precisionlab.engines.protocol import Engine


class YourModel(torch.nn.Module):  # yours instead: (batch, tokens) ids -> (batch, tokens, vocab) logits
    def __init__(self, vocab=256, width=64):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = torch.nn.Embedding(vocab, width), torch.nn.Linear(width, vocab)
        self.mix = torch.nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True)

    def forward(self, ids):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(ids.shape[1], dtype=self.head.weight.dtype)
        return self.head(self.mix(self.embed(ids), src_mask=mask, is_causal=True))


class YourEngine(Engine):
    # Declare what you implement (engines/protocol.py): batches = True with forward_batch(model, ids,
    # attention_mask, position_ids); forks = True with fork(feed); compute_dtypes: what model(dtype) takes.

    def __init__(self, device):
        self.base, self.device, self.name = YourModel().eval().to(device), device, "your-model"
        self.max_len = self.window = 512

    def info(self):  # what decides the numbers
        return {"name": self.name, "vocab": 256, "max_seq_len": self.max_len,
                "parameters": sum(p.numel() for p in self.base.parameters())}

    def encode(self, text, source="--prompt"):
        return list(text.encode("utf-8"))

    def decode(self, ids):
        return bytes(ids).decode("utf-8", "replace")

    @torch.no_grad()
    def forward(self, model, ids, head_dtype=None):  # model: self.model(dtype), a copy in that dtype
        return model(torch.as_tensor(ids, device=self.device))

    def session(self, model, stores=None):  # yours keeps a KV cache; this one re-runs what it was fed
        seen = []

        def feed(ids):
            seen.extend(int(i) for i in ids)
            return self.forward(model, [seen])[0, -len(ids):]
        return feed


def factory(device):
    return YourEngine(device)
