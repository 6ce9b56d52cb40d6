"""A Hugging Face tokenizer (tokenizer.json) as llama.cpp's GGUF vocabulary,
read and checked before any weight is loaded.

Two kinds are translated. A byte-level BPE (Llama-3, Qwen2/3, SmolLM, GPT-2
style): its tokens in id order, its merges, the token types (special added
tokens CONTROL, other added tokens USER_DEFINED, rows past the tokenizer's
last id UNUSED padding), BOS/EOS and the chat template through the gguf
package's SpecialVocab, and the name of the pre-tokenizer llama.cpp must run
(tokenizer.ggml.pre). llama.cpp does not read the pre-tokenizer's regex from
the file: it picks a built-in rule by that name, so the name is found here by
matching tokenizer.json's pre_tokenizer against the rules PRE_TOKENIZERS
knows, and a pre-tokenizer that matches none is refused (a wrong name
tokenises silently differently). A character vocabulary (the embedded model:
a WordLevel model whose tokens are single bytes) is written as byte-level
tokens with no merges, one byte one token.

PRE_TOKENIZERS is one table, read both ways: export --to gguf maps a
tokenizer.json to a llama.cpp name, export llamacpp:FILE --to hf gives the
rebuilt tokenizer the pre-tokenizer the file's name stands for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from precisionlab.errors import UsageError

# Llama-3's split (contractions, letters with one leading non-letter, digits in threes, ...)
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2/Qwen3's: Llama-3's with every digit alone
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _split(regex: str) -> dict:
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}


_BYTELEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
# llama.cpp's pre-tokenizer name -> the tokenizer.json pre_tokenizer that tokenises the same way
PRE_TOKENIZERS = {
    "llama-bpe": _split(LLAMA3_SPLIT),
    "qwen2": _split(QWEN2_SPLIT),
    "smollm": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, _BYTELEVEL]},
    "gpt-2": _BYTELEVEL,
}


def _signature(pre: dict | None) -> tuple:
    """What decides the split: the steps' kinds and rules, not offsets or spelling."""
    if not isinstance(pre, dict):
        return ()
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    sig = []
    for s in steps or []:
        kind = s.get("type")
        if kind == "Split":
            pat = s.get("pattern") or {}
            sig.append((kind, pat.get("Regex", pat.get("String")), s.get("behavior"), bool(s.get("invert"))))
        elif kind == "Digits":
            sig.append((kind, bool(s.get("individual_digits"))))
        elif kind == "ByteLevel":
            sig.append((kind, bool(s.get("use_regex", True)), bool(s.get("add_prefix_space"))))
        else:
            sig.append((kind,))
    return tuple(sig)


def pre_name(pre: dict | None) -> str | None:
    """llama.cpp's name for a tokenizer.json pre_tokenizer, None where none of PRE_TOKENIZERS matches."""
    sig = _signature(pre)
    return next((name for name, p in PRE_TOKENIZERS.items() if _signature(p) == sig), None)


@dataclass
class Vocab:
    model: str  # "bpe" or "chars"
    tokens: list[str]
    types: list[int]
    pre: str
    merges: int = 0
    notes: list[str] = field(default_factory=list)


def read(src: str, n_vocab: int) -> Vocab:
    """The folder's tokenizer as a GGUF vocabulary of n_vocab rows, or a UsageError saying why not."""
    import gguf

    path = Path(src) / "tokenizer.json"
    if not path.is_file():
        raise UsageError(f"--to gguf: {src} has no tokenizer.json (a fast tokenizer is what is translated)")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        model = doc["model"]
        vocab = model["vocab"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"--to gguf: {path} is not a tokenizer.json this writer reads ({type(e).__name__})") from None
    added = {int(a["id"]): a for a in doc.get("added_tokens") or []}
    by_id = {int(i): t for t, i in vocab.items()} if isinstance(vocab, dict) else {}
    for i, a in added.items():
        by_id[i] = a["content"]
    size = max(by_id) + 1 if by_id else 0
    if sorted(by_id) != list(range(size)):
        raise UsageError(f"--to gguf: the tokenizer's ids are not 0..{size - 1} without gaps")
    if size > n_vocab:
        raise UsageError(f"--to gguf: the tokenizer has {size} tokens, the model only {n_vocab} rows")
    kind = model.get("type")
    if kind == "WordLevel" and all(len(by_id[i].encode()) == 1 for i in range(size)) and not added:
        return _chars(by_id, size, n_vocab)
    if kind != "BPE":
        raise UsageError(f"--to gguf: a {kind!r} tokenizer is not translated (byte-level BPE and character "
                         "vocabularies are)")
    pre = pre_name(doc.get("pre_tokenizer"))
    if pre is None:
        raise UsageError("--to gguf: the tokenizer's pre-tokenizer "
                         f"{json.dumps(doc.get('pre_tokenizer'), ensure_ascii=True)[:200]} matches none of "
                         f"llama.cpp's rules this writer knows ({', '.join(PRE_TOKENIZERS)})")
    normal, control, user = gguf.TokenType.NORMAL, gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED
    tokens = [by_id[i] for i in range(size)]
    types = [int(control if added[i].get("special") else user) if i in added else int(normal) for i in range(size)]
    pad = n_vocab - size
    tokens += [f"[PAD{i}]" for i in range(size, n_vocab)]
    types += [int(gguf.TokenType.UNUSED)] * pad
    notes = [f"tokenizer: byte-level BPE, {size} tokens ({len(added)} added, "
             f"{sum(1 for a in added.values() if a.get('special'))} of them special), "
             f"{len(model.get('merges') or [])} merges, llama.cpp pre-tokenizer {pre!r} (matched from "
             "tokenizer.json's pre_tokenizer)"]
    if pad:
        notes.append(f"vocabulary: {pad} rows past the tokenizer's last id written as unused [PADn] tokens")
    return Vocab("bpe", tokens, types, pre, len(model.get("merges") or []), notes)


def _chars(by_id: dict, size: int, n_vocab: int) -> Vocab:
    import gguf

    if size != n_vocab:
        raise UsageError(f"--to gguf: the tokenizer has {size} tokens, the model {n_vocab} rows")
    bu = byte_unicode()
    tokens = [bu[by_id[i].encode()[0]] for i in range(size)]
    return Vocab("chars", tokens, [int(gguf.TokenType.NORMAL)] * size, "default", 0,
                 [f"tokenizer: {size} characters as byte-level BPE tokens with no merges "
                  "(one byte, one token), no BOS/EOS added"])


def byte_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what byte-level BPE vocabularies are written in)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def write(w, src: str, vocab: Vocab) -> list[str]:
    """The vocabulary into the GGUF writer w; what it says about it."""
    import gguf

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.types)
    if vocab.model == "chars":
        w.add_token_merges(["\u0100 \u0100"])  # never applies: a merge llama.cpp requires the list to exist
        w.add_add_bos_token(False)
        w.add_add_eos_token(False)
        return list(vocab.notes)
    special = gguf.SpecialVocab(src, load_merges=True, n_vocab=len(vocab.tokens))
    for key, added in _added_specials(src, special.special_token_ids).items():
        special.add_special_token.setdefault(key, added)  # said by the post-processor, not by a flag
    special.add_to_gguf(w, quiet=True)
    ids = {k: v for k, v in special.special_token_ids.items()}
    named = ", ".join(f"{k} {vocab.tokens[v]!r} ({v})" for k, v in sorted(ids.items())) or "none"
    adds = ", ".join(f"add_{k} {v}" for k, v in sorted(special.add_special_token.items())) or "no add_bos/eos flags"
    return [*vocab.notes, f"special tokens: {named}; {adds}",
            "chat template: written (tokenizer.chat_template)" if special.chat_template else "chat template: none"]


def _added_specials(src: str, ids: dict) -> dict[str, bool]:
    """Whether the tokenizer's own post-processor puts BOS/EOS around a text (what transformers' encode
    does), so llama.cpp is told explicitly rather than left to its per-model default."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(src) / "tokenizer.json"))
    plain = tok.encode("a", add_special_tokens=False).ids
    full = tok.encode("a", add_special_tokens=True).ids
    start = full.index(plain[0]) if plain and plain[0] in full else 0
    got = {}
    if "bos" in ids:
        got["bos"] = start > 0 and full[start - 1] == ids["bos"]
    if "eos" in ids:
        got["eos"] = len(full) > start + len(plain) and full[start + len(plain)] == ids["eos"]
    return got
