"""An OpenAI-compatible completions endpoint (`--engine openai:URL[,model=NAME,
top=K,timeout=S]`), contacted only when the user names its URL: POST
URL/v1/completions with the token ids as the prompt, echo=true, logprobs=K
and max_tokens=1, so the answer carries every prompt position's top-K
log-probabilities. Only the top K are known, so the comparison gives a KLD
lower bound over those K tokens plus one tail bucket (numerics/distribution's
kl_lower_bound_top_k), labelled as a bound. Token strings are mapped to ids
through the reference's vocabulary; an echoed token that is not the id sent
is a tokenizer mismatch, named. Every request has a timeout.
"""

from __future__ import annotations

import json

from precisionlab.engines.external import ExternalEngine, int_opt, split_spec
from precisionlab.errors import RunError, UsageError

KEYS = {"model": "the model name the endpoint serves", "top": "top_logprobs K (default 5)",
        "timeout": "seconds per request (default 60)"}


class OpenAIEngine(ExternalEngine):
    top_k_only = True

    @classmethod
    def check(cls, arg):
        url, opts = split_spec(arg, "openai", KEYS)
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"engine openai:{url}: give the endpoint's http:// or https:// URL")
        if int_opt(opts, "top", 5, "openai") < 1 or int_opt(opts, "timeout", 60, "openai") < 1:
            raise UsageError("engine openai: top and timeout must be >= 1")

    def __init__(self, arg, device: str):
        self.check(arg)
        url, opts = split_spec(arg, "openai", KEYS)
        self.url = url.rstrip("/")
        if not self.url.endswith("/v1"):
            self.url += "/v1"
        self.settings = {"url": self.url + "/completions", "served_model": opts.get("model", ""),
                         "top_logprobs": int_opt(opts, "top", 5, "openai"),
                         "timeout_s": int_opt(opts, "timeout", 60, "openai"), "echo": True, "temperature": 0}
        self.name = f"openai:{url}"
        self.device = "cpu"
        self.max_len = 1 << 20
        self.vocab = 0
        self.strings: dict[str, int] | None = None

    def info(self) -> dict:
        return {"name": self.name, "engine": "openai-completions", "vocab": None, "max_seq_len": None,
                "parameters": None, **self.settings}

    def encode(self, text, source="--prompt"):
        raise UsageError(f"{self.name}: reads the reference's token ids (no tokenizer here)")

    def decode(self, ids) -> str:
        return ""

    def bind(self, decode_one, vocab: int) -> None:
        """The reference's vocabulary: each id's string, for mapping the endpoint's token strings back."""
        self.vocab = vocab
        self.strings = {}
        for i in range(vocab):
            self.strings.setdefault(decode_one(i), i)

    def top_logprobs(self, ids: list[int]) -> list[dict[int, float]]:
        """For each position i < len(ids) - 1: {id: log Q(id | ids[:i+1])} over the top K."""
        import urllib.error
        import urllib.request

        body = {"prompt": list(ids), "max_tokens": 1, "echo": True, "logprobs": self.settings["top_logprobs"],
                "temperature": 0}
        if self.settings["served_model"]:
            body["model"] = self.settings["served_model"]
        req = urllib.request.Request(self.settings["url"], data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.settings["timeout_s"]) as r:
                doc = json.loads(r.read().decode("utf-8"))
            lp = doc["choices"][0]["logprobs"]
            tokens, tops = lp["tokens"], lp["top_logprobs"]
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as e:
            raise RunError(f"{self.name}: no usable completions answer ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''})") from None
        for j, (s, want) in enumerate(zip(tokens, ids)):
            if self.strings.get(s) != want:
                raise RunError(f"{self.name}: echoed token {j} is {s!r}, not the id {want} sent: the endpoint's "
                               "tokenizer differs from the reference's")
        out = []
        for j in range(1, len(ids)):
            row = tops[j] or {}
            mapped = {}
            for s, v in row.items():
                if s not in self.strings:
                    raise RunError(f"{self.name}: top_logprobs names {s!r}, not in the reference's vocabulary")
                mapped[self.strings[s]] = float(v)
            out.append(mapped)
        return out
