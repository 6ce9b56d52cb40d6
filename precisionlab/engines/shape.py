"""A model's sizes, read from the checkpoint's headers and config.json before
anything is loaded, for the memory estimates of runtime/memory.py (the
estimate by model name the tests use is tests/model_estimates.py)."""

from __future__ import annotations

from typing import NamedTuple


# Bytes per element of the dtypes safetensors headers name (get_dtype()'s spelling).
_DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
                "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1}


# The catalog's names of the dtypes a model's weights may be held in.
_CATALOG = {"F64": "fp64", "F32": "fp32", "BF16": "bf16", "F16": "fp16"}


def safetensors_sizes(paths) -> tuple[int, int, str]:
    """(parameters, bytes, the dtype most of them are in: a catalog name, ""
    for another) declared in safetensors headers, without reading the
    tensors: the weights as stored, which is how the Hugging Face engine
    holds them (its compute copies are counted apart)."""
    import math
    from collections import Counter

    from safetensors import safe_open

    count = size = 0
    by_dtype: Counter = Counter()
    for path in paths:
        with safe_open(str(path), framework="pt") as f:
            for k in f.keys():
                s = f.get_slice(k)
                n = math.prod(s.get_shape())
                count += n
                size += n * _DTYPE_BYTES.get(s.get_dtype(), 4)
                by_dtype[s.get_dtype()] += n
    most = by_dtype.most_common(1)[0][0] if by_dtype else ""
    return count, size, _CATALOG.get(most, "")


def safetensors_parameters(paths) -> int:
    """Parameters declared in safetensors headers, without reading the tensors."""
    return safetensors_sizes(paths)[0]


class ModelShape(NamedTuple):
    params: int
    seq: int        # prompt + steps positions
    vocab: int
    hidden: int
    layers: int
    heads: int
    kind: str       # "hf" | "embedded"
    positions: int  # the model's longest sequence (0: not declared)
    stored: int = 0  # bytes of the weights as the engine holds them between runs (0: 4 per parameter)
    dtype: str = "fp32"  # the dtype they are held in (a catalog name; "": another): a copy in it is shared
    experts: int = 0  # routed experts a MoE layer, as the config declares them (0: none declared)

    @property
    def weight_bytes(self) -> int:
        return self.stored or 4 * self.params


def model_shape(model: str | None, steps: int, prompt: str) -> ModelShape | None:
    """The sizes of the embedded model or a Hugging Face folder, read from
    the checkpoint's headers and config.json before anything is loaded. A
    repo id resolves to its local snapshot; where none is found, None (the
    loader's own error follows)."""
    import json
    from pathlib import Path

    seq = len(prompt.encode()) + steps  # a token is at least one byte of the prompt
    if model is None:
        from safetensors import safe_open

        from precisionlab.engines import charlm

        with safe_open(str(charlm.DEFAULT_WEIGHTS), framework="pt") as f:
            cfg = json.loads(f.metadata()["config"])
        # stored in bf16, held in fp32 (the engine's base): 4 per parameter
        return ModelShape(safetensors_parameters([charlm.DEFAULT_WEIGHTS]), seq, cfg["vocab_size"], cfg["d_model"],
                          cfg["n_layers"], cfg["n_heads"], "embedded", int(cfg.get("max_seq_len", 1024)))
    folder = Path(model)
    if not folder.is_dir():
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(model, local_files_only=True))
        except Exception:  # not in the cache, or no huggingface_hub: the loader says so
            return None
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        cfg = {}
    cfg = cfg if isinstance(cfg, dict) else {}
    cfg = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg  # multimodal configs nest it
    try:
        params, stored, dtype = safetensors_sizes(sorted(folder.glob("*.safetensors")))
    except Exception:  # a header safetensors cannot read: the loader will refuse the folder
        params = stored = 0
    if params == 0:  # pickled checkpoints (.bin): their bytes, as if 2 per parameter
        stored = sum(p.stat().st_size for p in folder.glob("*.bin"))
        params, dtype = stored // 2, ""

    def num(key: str) -> int:
        v = cfg.get(key)
        return int(v) if isinstance(v, (int, float)) and v > 0 else 0

    # Qwen-MoE's, DeepSeek-V3's and Mixtral's names for the routed experts (router's estimate)
    experts = num("num_experts") or num("n_routed_experts") or num("num_local_experts")
    return ModelShape(params, seq, num("vocab_size"), num("hidden_size"), num("num_hidden_layers"),
                      num("num_attention_heads"), "hf", num("max_position_embeddings"), stored, dtype, experts)

