"""--chat: the model's chat template applied to --prompt, one user turn and
the assistant's turn opened, as transformers' apply_chat_template does it
(add_generation_prompt=True). An instruct model read its raw prompt as text
to continue (SmolLM2 loops on it); under its template it answers.

Where the template lives: a Hugging Face folder's chat_template.jinja
(transformers 5), or `chat_template` in its tokenizer_config.json or
chat_template.json (older saves); a GGUF's `tokenizer.chat_template`
metadata. The hf engine hands the turn to its tokenizer's own
apply_chat_template (the ids are transformers', by construction); a GGUF's
template is rendered by transformers' renderer with the file's BOS/EOS
strings, then tokenised by the engine's own tokenizer with special tokens
parsed and no BOS added (transformers' add_special_tokens=False: a BOS the
model wants is in its template). No torch here; transformers only where a
template is rendered.
"""

from __future__ import annotations

import json
from pathlib import Path

from precisionlab.engines.protocol import no_chat_template
from precisionlab.errors import UsageError

TEMPLATE_KEY = "tokenizer.chat_template"  # the GGUF metadata key
FOLDER_PLACES = "no chat_template.jinja, nor chat_template in tokenizer_config.json or chat_template.json"


def conversation(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def folder_has_template(arg: str | None) -> bool | None:
    """A local Hugging Face folder: whether it holds a chat template (its files
    read, no tokenizer built); None for a cached repo id (known once loaded)."""
    p = Path(arg or "")
    if not arg or not p.is_dir():
        return None
    if (p / "chat_template.jinja").is_file():
        return True
    for name in ("tokenizer_config.json", "chat_template.json"):
        try:
            doc = json.loads((p / name).read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            continue  # absent or unreadable: the tokenizer's own load says what is wrong
        if isinstance(doc, dict) and doc.get("chat_template"):
            return True
    return False


def gguf_has_template(path: str) -> bool | None:
    """A GGUF: whether its metadata holds a chat template (the header read by
    the gguf package, no tensor); None where that package cannot read it
    (llama.cpp's load says, and chat_ids refuses then)."""
    try:
        import gguf

        field = gguf.GGUFReader(path).fields.get(TEMPLATE_KEY)
    except Exception:  # a stranger's file, or no gguf package: known once llama.cpp has opened it
        return None
    return field is not None and len(field.data) > 0 and len(field.parts[field.data[0]]) > 0


def hf_ids(tok, prompt: str, name: str) -> list[int]:
    """transformers' own apply_chat_template ids for the turn (a tokenizer without a template: refused)."""
    if not getattr(tok, "chat_template", None):  # transformers' attribute, None when the folder has none
        raise no_chat_template(name, FOLDER_PLACES)
    got = tok.apply_chat_template(conversation(prompt), add_generation_prompt=True, tokenize=True, return_dict=True)
    return [int(i) for i in got["input_ids"]]


def render(template: str, prompt: str, name: str, **special: str) -> str:
    """The turn under `template`, rendered by transformers' renderer (the one
    apply_chat_template uses) with the model's special-token strings
    (bos_token, eos_token) as the template's variables."""
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError:
        raise UsageError(f"--chat with {name} renders its template with transformers' renderer: "
                         "pip install 'precisionlab[hf]'") from None
    try:
        rendered, _ = render_jinja_template(conversations=[conversation(prompt)], chat_template=template,
                                            add_generation_prompt=True, **special)
    except Exception as e:  # a template's own error (jinja's TemplateError, raise_exception()): the file's
        why = str(e).splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"--chat: {name}'s chat template does not render ({why})") from None
    return rendered[0]
