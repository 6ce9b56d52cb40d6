"""--chat (issue 39): --prompt under the model's chat template, the ids
transformers' own apply_chat_template gives, on a tiny model built here with
a template and on SmolLM2 (its HF folder and its Q4_1 GGUF, where cached); a
model without a template refused in one line, exit 2, before any weight."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import TINY_WORDS, cli, one_line, save_tiny_qwen

from precisionlab.engines import chat

TEMPLATE = ("{% for m in messages %}<|user|> {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
SMOL = Path.home() / ".cache/precisionlab/smollm2"
PROMPT = "the cat sat"


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory):
    pytest.importorskip("transformers")
    folder = save_tiny_qwen(tmp_path_factory.mktemp("tiny-chat"), words=[*TINY_WORDS, "<|user|>", "<|assistant|>"])
    (folder / "chat_template.jinja").write_text(TEMPLATE, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def tiny_plain(tmp_path_factory):
    pytest.importorskip("transformers")
    return save_tiny_qwen(tmp_path_factory.mktemp("tiny-plain"))


def _transformers_ids(folder, prompt: str) -> list[int]:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    got = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    return list(got["input_ids"] if hasattr(got, "keys") else got)


def test_tiny_template_ids_are_transformers_own(tiny_chat):
    from precisionlab.engines.hf import HFEngine

    eng = HFEngine(str(tiny_chat), "cpu")
    want = _transformers_ids(tiny_chat, PROMPT)
    words = [*TINY_WORDS, "<|user|>", "<|assistant|>"]
    # written out from the template by hand: the user marker, the prompt's words, the assistant's marker
    assert want == [words.index(w) for w in ("<|user|>", "the", "cat", "sat", "<|assistant|>")]
    assert eng.chat_ids(PROMPT) == want
    assert eng.prompt_ids(PROMPT, 3, chat=True) == want
    assert eng.prompt_ids(PROMPT, 3) == eng.encode(PROMPT) != want  # without --chat: the text as given


def test_folder_template_read_before_loading(tiny_chat, tiny_plain, tmp_path):
    assert chat.folder_has_template(str(tiny_chat)) is True
    assert chat.folder_has_template(str(tiny_plain)) is False
    assert chat.folder_has_template("org/not-local") is None  # a cached repo id: known once loaded
    old = tmp_path / "old"
    old.mkdir()
    (old / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}', encoding="utf-8")
    assert chat.folder_has_template(str(old)) is True


def test_compare_model_chat_runs_on_the_templated_ids(tiny_chat):
    r = cli("compare", "model", "--model", f"hf:{tiny_chat}", "--chat", "--prompt", PROMPT, "--steps", "3",
            "--dtypes", "bf16", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["params"]["chat"] is True and doc["params"]["prompt"] == PROMPT
    assert doc["params"]["prompt_tokens"] == len(_transformers_ids(tiny_chat, PROMPT)) == 5


@pytest.mark.parametrize("argv", [
    ("compare", "layers", "--steps", "2"),
    ("compare", "contracts", "--steps", "2", "--dtypes", "fp32", "--batches", "2"),
    ("kvcache", "--steps", "2", "--dtypes", "fp8_e4m3", "--scales", "unit"),
])
def test_every_model_command_records_chat(tiny_chat, argv):
    r = cli(*argv, "--model", f"hf:{tiny_chat}", "--chat", "--prompt", PROMPT, "--json")
    assert r.code in (0, 1), r.err  # compare layers exits 1 where a module diverges: the run itself is what counts
    params = r.json()["params"]
    assert params["chat"] is True and params["prompt"] == PROMPT
    if "prompt_tokens" in params:
        assert params["prompt_tokens"] == 5  # <|user|> the cat sat <|assistant|>


def test_compare_engine_feeds_the_references_templated_ids(tiny_chat, tmp_path):
    spec = f"hf:{tiny_chat}"
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on a mat and the dog ran to it " * 3, encoding="utf-8")
    r = cli("compare", "engine", "--engine", spec, "--reference", spec, "--chat", "--prompt", PROMPT, "--tokens", "8",
            "--steps", "2", "--text", str(text), "--no-ref-cache", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["params"]["chat"] is True
    assert doc["rows"][0]["prompt_tokens"] == "identical"  # the engine's own template gave the reference's ids


@pytest.mark.parametrize("argv", [
    ("compare", "model", "--chat"),  # the embedded model: a character LM, no template
    ("compare", "contracts", "--chat"),
    ("kvcache", "--chat"),
    ("compare", "layers", "--chat"),
    ("compare", "engine", "--engine", "embedded", "--chat"),  # the reference (embedded) makes the ids
])
def test_embedded_model_has_no_template(argv):
    one_line(cli(*argv), 2, "--chat", "no chat template")


def test_folder_without_template_refused_before_loading(tiny_plain, monkeypatch):
    from helpers import fail_if_a_model_runs

    from precisionlab.errors import UsageError
    from precisionlab.experiments import model as exp

    fail_if_a_model_runs(monkeypatch)
    with pytest.raises(UsageError, match="no chat template"):
        exp.run(exp.ModelConfig(model=f"hf:{tiny_plain}", steps=2, chat=True))
    r = cli("compare", "model", "--model", f"hf:{tiny_plain}", "--chat", "--steps", "2")
    one_line(r, 2, "--chat", "no chat template", str(tiny_plain))


def test_chat_with_token_ids_is_a_usage_error(tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text("1 2 3")
    one_line(cli("compare", "contracts", "--chat", "--token-ids", str(ids)), 2, "--chat", "--token-ids")


@pytest.mark.skipif(not (SMOL / "hf" / "chat_template.jinja").is_file(), reason="SmolLM2 not cached (make smollm2)")
def test_smollm2_hf_and_gguf_template_ids_equal_transformers():
    import transformers

    from precisionlab.engines.hf import HFEngine

    prompts = ["What is 2+2?", "Write a haiku about\n\nthe sea.", "Ünïcödé and <b>tags</b>"]
    tok = transformers.AutoTokenizer.from_pretrained(str(SMOL / "hf"), local_files_only=True)
    want = [_transformers_ids(SMOL / "hf", p) for p in prompts]
    assert all(w[:3] == [1, 9690, 198] for w in want)  # <|im_start|>system\n: the template's own system turn
    for p, w in zip(prompts, want, strict=True):
        assert chat.hf_ids(tok, p, "smollm2") == w  # what HFEngine.chat_ids hands back
    assert HFEngine.chats and HFEngine.has_chat_template(str(SMOL / "hf")) is True
    gguf = SMOL / "SmolLM2-135M-Instruct.Q4_1.gguf"
    pytest.importorskip("llama_cpp")
    from precisionlab.engines.llamacpp import LlamaCppEngine

    assert LlamaCppEngine.has_chat_template(str(gguf)) is True
    eng = LlamaCppEngine(str(gguf), "cpu")
    try:
        assert [eng.chat_ids(p) for p in prompts] == want  # the GGUF's template, llama.cpp's tokenizer
    finally:
        eng.close()
