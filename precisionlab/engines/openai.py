"""An OpenAI-compatible completions endpoint (`--engine openai:URL[,model=NAME,
top=K,timeout=S]`), contacted only when the user names its URL: POST
URL/v1/completions with the token ids as the prompt, echo=true, logprobs=K
and max_tokens=1, so the answer carries every prompt position's top-K
log-probabilities. Only the top K are known, so the comparison gives a KLD
lower bound over those K tokens plus one tail bucket (numerics/distribution's
kl_lower_bound_top_k), labelled as a bound. Token strings are mapped to ids
through the reference's vocabulary; an echoed token that is not the id sent
is a tokenizer mismatch, named. Every request has a timeout.

A server that ignores echo (llama.cpp's llama-server, as llama-cpp-python
0.3.36 vendors it: its answer holds only the generated token's logprobs, in
the newer content[] form) or refuses it (an HTTP error naming echo;
llama-server's sources have "Only no echo is supported") is asked one
position at a time instead: the prefix ids[:i+1] as token ids, max_tokens=1, logprobs=K, cache_prompt=false (each row a fresh
prefill, whatever the order of the requests), and the first generated token's
top K are row i. Its answer's newer form (logprobs.content[0].top_logprobs, a
list of {id, token, logprob}) is read by id where the server gives one; the
legacy form (top_logprobs[0], {token: logprob}) by string. info() says which
way the rows came (prompt_logprobs).

vLLM (its GET /v1/models says owned_by "vllm", asked once) is read through its
own extensions instead: `prompt_logprobs=K` gives every prompt position's top K
(and the sent token's own log-prob) keyed by token id, in one request, so no
token string is mapped back (byte-level BPE pieces that are not whole UTF-8
characters all come back as "" in its strings); each row is checked to hold
the id sent. Its greedy tokens come as ids too (return_tokens_as_token_ids).

Greedy decoding (generates): one request, the prompt's ids, max_tokens=steps,
temperature 0, logprobs=1, and vLLM's ignore_eos (other servers ignore the
field; one that stops at an end token gives fewer steps, said as such); the
generated token strings are mapped to ids through the reference's
vocabulary, and one that is not there is named.

Its requests go through engines/http_client.py, the project's one HTTP client.
"""

from __future__ import annotations

from precisionlab.engines.external import ExternalEngine, int_opt, split_spec
from precisionlab.engines.http_client import MAX_TIMEOUT_S, Client, v1_base
from precisionlab.errors import RunError, UsageError
from precisionlab.io.inputs import logprob

KEYS = {"model": "the model name the endpoint serves", "top": "top_logprobs K (default 5)",
        "timeout": "seconds per request (default 60)",
        "lag": "0: echo's top_logprobs[j] is token j's distribution (OpenAI's rule, default); 1: token j+1's "
               "(llama-cpp-python 0.3.36's echo, one position late)"}
MAX_TOP = 1000
ECHO = "echo (one request)"
PER_POSITION = "one request per position (the server ignored or refused echo)"
VLLM = "vLLM's prompt_logprobs (one request, keyed by token id)"
_UNASKED = object()


class OpenAIEngine(ExternalEngine):
    top_k = 5           # top=K of the spec (set per instance); only these log-probabilities come back
    vocabulary = False  # it reads the reference's ids, and maps its token strings back through bind()
    generates = True    # greedy decoding through the completions API (generate)

    @classmethod
    def check(cls, arg):
        url, opts = split_spec(arg, "openai", KEYS)
        v1_base(url)
        # bounded: top=10^20 went to the server as is, and a timeout past a day overflows the socket's
        int_opt(opts, "top", 5, "openai", 1, MAX_TOP, "top_logprobs per position; vLLM's default allows 20")
        int_opt(opts, "timeout", 60, "openai", 1, MAX_TIMEOUT_S, "seconds: a day")
        if int_opt(opts, "lag", 0, "openai") > 1:
            raise UsageError("engine openai: lag is 0 or 1")

    def __init__(self, arg, device: str):
        self.check(arg)
        url, opts = split_spec(arg, "openai", KEYS)
        self.url = v1_base(url)
        self.settings = {"url": self.url + "/completions", "served_model": opts.get("model", ""),
                         "top_logprobs": int_opt(opts, "top", 5, "openai"),
                         "timeout_s": int_opt(opts, "timeout", 60, "openai"), "echo": True, "temperature": 0,
                         "prompt_as": "token ids", "lag": int_opt(opts, "lag", 0, "openai"),
                         "prompt_logprobs": ECHO}
        self.top_k = self.settings["top_logprobs"]
        self.name = f"openai:{url}"
        self.device = "cpu"
        self.max_len = 1 << 20
        self.vocab = 0
        self.strings: dict[str, int] | None = None
        self.names: list[str] = []  # id -> the reference's string, for a server that takes only text
        self.owner = _UNASKED       # /v1/models' owned_by, asked once (_is_vllm)

    @property
    def echoes_prompt(self) -> bool:
        """Its rows came from one echo of the prompt (checked against it), not one request per position."""
        return self.settings["prompt_logprobs"] in (ECHO, VLLM)

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
        self.names = [decode_one(i) for i in range(vocab)]
        for i, s in enumerate(self.names):
            self.strings.setdefault(s, i)

    def _is_vllm(self) -> bool:
        """GET /v1/models once: owned_by "vllm" (any failure there: not known to be vLLM)."""
        if self.owner is _UNASKED:
            try:
                doc = Client(self.url, self.settings["timeout_s"]).get("/models")
                data = doc.get("data") if isinstance(doc, dict) else None
                owner = data[0].get("owned_by") if isinstance(data, list) and data and isinstance(data[0], dict) \
                    else None
            except RunError:
                owner = None
            self.owner = owner if isinstance(owner, str) else None
            if self.owner == "vllm":  # said in info() only where it changes how the rows are read
                self.settings.update({"server": "vllm", "prompt_logprobs": VLLM, "lag": None})
        return self.owner == "vllm"

    def top_logprobs(self, ids: list[int]) -> list[dict[int, float]]:
        """For each position i < len(ids) - 1: {id: log Q(id | ids[:i+1])} over the top K."""
        if self._is_vllm():
            return self._vllm_rows(ids)
        if self.settings["prompt_logprobs"] == ECHO:
            try:
                doc = self._echo(ids)
                refused = _echo_ignored(doc)
            except _EchoRefused:
                refused = True
            if refused:
                self.settings["prompt_logprobs"] = PER_POSITION
                self.settings["lag"] = None  # each row is the answer to its own prefix: no echo to be late
        if self.settings["prompt_logprobs"] == PER_POSITION:
            return self._per_position(ids)
        try:
            lp = doc["choices"][0]["logprobs"]
            tokens, tops = lp["tokens"], lp["top_logprobs"]
        except (KeyError, IndexError, TypeError) as e:
            raise RunError(f"{self.name}: no usable completions answer ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''})") from None
        _check_echo_shape(self.name, tokens, tops)
        for j, (s, want) in enumerate(zip(tokens, ids, strict=False)):
            if self.strings.get(s) != want:
                raise RunError(f"{self.name}: echoed token {j} is {s!r}, not the id {want} sent: the endpoint's "
                               "tokenizer differs from the reference's")
        if len(tokens) < len(ids) or len(tops) < len(ids):
            raise RunError(f"{self.name}: echoed {len(tokens)} tokens for the {len(ids)} sent")
        out = []
        lag = self.settings["lag"]
        for j in range(1, len(ids)):
            row = tops[j - lag] or {}  # lag 1: the first position's row is null, a miss in the top-1 count
            mapped = {}
            for s, v in row.items():
                if s not in self.strings:
                    raise RunError(f"{self.name}: top_logprobs names {s!r}, not in the reference's vocabulary")
                mapped[self.strings[s]] = logprob(v, f"{self.name}: top_logprobs[{j - lag}][{s!r}]", RunError)
            out.append(mapped)
        return out

    def _echo(self, ids: list[int]) -> dict:
        """The endpoint's echo of ids. The token ids go as the prompt; a server
        whose API takes only text (llama-cpp-python's answers a list of ints
        with HTTP 500, a validation error) gets the reference's strings of those ids joined, from then on,
        said in info()'s prompt_as, and the echoed tokens are still checked
        against the ids, so a tokenization that differs is named, not averaged."""
        body = {"max_tokens": 1, "echo": True, "logprobs": self.settings["top_logprobs"], "temperature": 0}
        if self.settings["served_model"]:
            body["model"] = self.settings["served_model"]
        client = Client(self.url, self.settings["timeout_s"])
        if self.settings["prompt_as"] == "token ids":
            try:
                return client.post("/completions", {**body, "prompt": list(ids)})
            except RunError as e:
                if _refuses_echo(e):
                    raise _EchoRefused(str(e)) from None
                if ": HTTP " not in str(e) or not self.names:  # no answer at all: text would fare no better
                    raise
                self.settings["prompt_as"] = "text (the server refused token ids)"
        return client.post("/completions", {**body, "prompt": "".join(self.names[i] for i in ids)})

    def _vllm_rows(self, ids: list[int]) -> list[dict[int, float]]:
        """vLLM's prompt_logprobs: row j (j >= 1) holds {id: {logprob, ...}} for token j's position, the id
        sent among them; row j is position j-1's distribution."""
        body = {"prompt": list(ids), "max_tokens": 1, "temperature": 0, "prompt_logprobs": self.top_k}
        if self.settings["served_model"]:
            body["model"] = self.settings["served_model"]
        doc = Client(self.url, self.settings["timeout_s"]).post("/completions", body)
        try:
            rows = doc["choices"][0]["prompt_logprobs"]
            if not isinstance(rows, list) or len(rows) != len(ids):
                raise TypeError(f"{len(rows) if isinstance(rows, list) else 'no'} rows for {len(ids)} tokens")
            out = []
            for j in range(1, len(ids)):
                row = {int(k): logprob(v["logprob"], f"{self.name}: prompt_logprobs[{j}][{k}]", RunError)
                       for k, v in rows[j].items()}
                if ids[j] not in row:
                    raise RunError(f"{self.name}: prompt_logprobs[{j}] does not hold the id {ids[j]} sent: the "
                                   "server read other tokens")
                out.append(row)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            raise RunError(f"{self.name}: no usable prompt_logprobs in vLLM's answer ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''})") from None
        return out

    def generate(self, ids: list[int], steps: int) -> list[int]:
        """Up to `steps` greedy tokens after ids, from one completions request."""
        body = {"prompt": list(ids), "max_tokens": steps, "temperature": 0, "logprobs": 1, "ignore_eos": True}
        if self._is_vllm():
            body["return_tokens_as_token_ids"] = True
        if self.settings["served_model"]:
            body["model"] = self.settings["served_model"]
        timeout = min(MAX_TIMEOUT_S, self.settings["timeout_s"] * max(1, steps // 16 + 1))  # scales with steps
        try:
            doc = Client(self.url, self.settings["timeout_s"]).post("/completions", body, timeout=timeout)
        except RunError as e:
            if "HTTP 4" not in str(e) and "HTTP 500" not in str(e):
                raise
            # llama-cpp-python's own server takes a text prompt only: a prompt of token ids is refused
            raise RunError(f"{self.name}: the server refused a prompt of token ids for greedy decoding "
                           f"({str(e).splitlines()[0][:160]}); --steps 0 runs the metrics alone") from None
        try:
            lp = doc["choices"][0]["logprobs"]
            if isinstance(lp, dict) and isinstance(lp.get("content"), list):  # llama-server gives each token's id
                tokens = [f"token_id:{x['id']}" if type(x.get("id")) is int else x["token"] for x in lp["content"]]
            else:
                tokens = lp["tokens"]
        except (KeyError, IndexError, TypeError) as e:
            raise RunError(f"{self.name}: no generated tokens in the completions answer "
                           f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
        out = []
        for j, t in enumerate(tokens[:steps]):
            if isinstance(t, str) and t.startswith("token_id:") and t[9:].isdigit() and int(t[9:]) < self.vocab:
                out.append(int(t[9:]))
                continue
            if not isinstance(t, str) or t not in self.strings:
                raise RunError(f"{self.name}: generated token {j} is {t!r}, not in the reference's vocabulary")
            out.append(self.strings[t])
        return out

    def _per_position(self, ids: list[int]) -> list[dict[int, float]]:
        """Row i from its own request: the prefix ids[:i+1] as token ids, one token generated."""
        body = {"max_tokens": 1, "logprobs": self.settings["top_logprobs"], "temperature": 0,
                "cache_prompt": False}
        if self.settings["served_model"]:
            body["model"] = self.settings["served_model"]
        client = Client(self.url, self.settings["timeout_s"])
        return [self._first_top(client.post("/completions", {**body, "prompt": list(ids[:i + 1])}))
                for i in range(len(ids) - 1)]

    def _first_top(self, doc: dict) -> dict[int, float]:
        """The first generated token's top K, as {id: logprob}, from either logprobs form."""
        try:
            lp = doc["choices"][0]["logprobs"]
            if isinstance(lp, dict) and isinstance(lp.get("content"), list):
                items = [(x.get("id"), x["token"], x["logprob"]) for x in lp["content"][0]["top_logprobs"]]
            else:
                items = [(None, t, v) for t, v in (lp["top_logprobs"][0] or {}).items()]
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            raise RunError(f"{self.name}: no usable completions answer ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''})") from None
        out = {}
        for i, s, v in items:
            if isinstance(i, int) and not isinstance(i, bool):
                if not 0 <= i < self.vocab:
                    raise RunError(f"{self.name}: top_logprobs names token id {i}, outside the reference's "
                                   f"vocabulary of {self.vocab}")
                out[i] = logprob(v, f"{self.name}: top_logprobs id {i}", RunError)
            elif isinstance(s, str) and s in self.strings:
                out[self.strings[s]] = logprob(v, f"{self.name}: top_logprobs {s!r}", RunError)
            else:
                raise RunError(f"{self.name}: top_logprobs names {s!r}, not in the reference's vocabulary")
        if not out:
            raise RunError(f"{self.name}: the answer carries no top_logprobs (logprobs={self.settings['top_logprobs']} "
                           "was asked)")
        return out


def _check_echo_shape(name: str, tokens, tops) -> None:
    """An echo's tokens are strings and its top_logprobs rows objects or null (a list there was an
    internal error: unhashable, or no .items())."""
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise RunError(f"{name}: the echoed tokens are not a list of strings")
    if not isinstance(tops, list) or not all(r is None or isinstance(r, dict) for r in tops):
        raise RunError(f"{name}: top_logprobs is not a list of {{token: logprob}} objects (or null)")


def _echo_ignored(doc: dict) -> bool:
    """An answer with no echoed tokens, only the newer content[] form (the generated tokens'): echo not done."""
    try:
        lp = doc["choices"][0]["logprobs"]
    except (KeyError, IndexError, TypeError):
        return False
    return isinstance(lp, dict) and "tokens" not in lp and isinstance(lp.get("content"), list)


class _EchoRefused(RunError):
    """The server answered, refusing echo: its rows come one position at a time."""


def _refuses_echo(e: RunError) -> bool:
    """An HTTP error whose text names echo (llama-server: "Only no echo is supported")."""
    text = str(e)
    return ": HTTP " in text and "echo" in text.split(": HTTP ", 1)[1].lower()
