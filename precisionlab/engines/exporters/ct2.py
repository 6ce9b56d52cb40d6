"""A Hugging Face folder as a CTranslate2 model, through ctranslate2's own
TransformersConverter (it knows Qwen3 and Llama); `quantization` is the
weight type it stores (float32, int8, bfloat16, int8_float32)."""

from __future__ import annotations

VARIANTS = ("float32", "int8", "bfloat16", "int8_float32")


def write(src: str, out: str, variant: str) -> list[str]:
    import json
    from pathlib import Path

    from ctranslate2.converters import TransformersConverter

    TransformersConverter(src, low_cpu_mem_usage=False, trust_remote_code=False).convert(
        out, quantization=variant, force=True)
    changes = []
    # ctranslate2 cannot load a model without BOS/EOS token strings (a model
    # trained without them, as the embedded one): name the first token, which
    # only generation's stopping rule reads, never forward_batch's logits.
    cfg_path = Path(out) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    first = json.loads((Path(out) / "vocabulary.json").read_text())[0]
    for key in ("bos_token", "eos_token"):
        if cfg.get(key) is None:
            cfg[key] = first
            changes.append(f"{key}: none in the model; set to token 0 ({first!r}) because ctranslate2 requires one "
                           "(generation's stop rule only, not the logits)")
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    import shutil

    for name in ("tokenizer.json", "tokenizer_config.json"):  # for the ct2 engine's encode()
        if (Path(src) / name).is_file():
            shutil.copy2(Path(src) / name, Path(out) / name)
    return changes + [f"weights: stored as {variant} by ctranslate2's converter (it computes in the type asked for at "
            "load time: compute_type)",
            "vocabulary: the tokenizer's tokens, in id order (vocabulary.json)"]
