"""compare logprobs: two per-token log-probability streams of the same tokens
(A = trainer, B = rollout, or any two engines), the importance ratios they
imply and what made them disagree.

`run` reads two files (precisionlab.io.logprob_streams); `compare_streams`
(experiments/logprob_compare.py, shared with compare rollout) takes two
streams already in memory (logprob_streams.from_arrays), so an
engine that scores tokens itself feeds the same statistics
(precisionlab.numerics.logprobs) without writing a file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from precisionlab.errors import UsageError
from precisionlab.experiments.logprob_compare import (DIAGNOSES, STAT_BYTES_PER_TOKEN, STAT_BYTES_PER_TOP,  # noqa: F401
                                                      LogprobsResult, compare_streams, gate_failures, parse_fail_on,
                                                      takeaways)
from precisionlab.io import inputs, logprob_streams
from precisionlab.numerics import logprobs as lpstats

__all__ = ["STAT_BYTES_PER_TOKEN", "STAT_BYTES_PER_TOP", "LogprobsConfig", "LogprobsResult", "compare_streams",
           "takeaways", "run"]


@dataclass
class LogprobsConfig:
    a: str
    b: str
    clip: str | None = None
    cap: float = lpstats.DEFAULT_CAP
    tokenizer: str | None = None
    worst: int = 10
    fail_on: str | None = None  # --fail-on: the diagnoses that exit 1


def parse_clips(text: str | None) -> tuple[float, ...]:
    """--clip: a comma list of c > 1 (the band [1/c, c])."""
    if text is None:
        return lpstats.DEFAULT_CLIPS
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise UsageError(f"--clip {text!r}: a comma list of numbers > 1, e.g. 1.1,1.25,2")
    out = []
    for p in parts:
        try:
            c = float(p)
        except ValueError:
            raise UsageError(f"--clip: {p!r} is not a number") from None
        if not (math.isfinite(c) and c > 1):
            raise UsageError(f"--clip: each c must be a finite number > 1 (the band [1/c, c]), got {p}")
        out.append(c)
    return tuple(dict.fromkeys(out))


def check_cap(cap: float) -> float:
    if not (math.isfinite(cap) and cap > 1):
        raise UsageError(f"--cap must be a finite number > 1 (a truncated-IS cap on the sequence ratio), got {cap}")
    return cap


def load_decoder(folder: str) -> Callable[[int], str]:
    """--tokenizer DIR: a Hugging Face tokenizer folder, read offline and with
    trust_remote_code=False (a folder that maps to custom code is refused)."""
    import os

    from precisionlab.engines.model_folders import quiet_library, refuse_foreign_code

    p = Path(folder)
    if not p.is_dir():
        raise UsageError(f"--tokenizer {folder!r}: " + ("not a directory" if p.exists() else "no such directory"))
    refuse_foreign_code(p)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import transformers
    except ImportError:
        raise UsageError("--tokenizer needs transformers: pip install 'precisionlab[hf]'") from None
    try:
        with quiet_library():
            tok = transformers.AutoTokenizer.from_pretrained(str(p), trust_remote_code=False, local_files_only=True)
    except Exception as e:  # OSError, ValueError... from a folder without a usable tokenizer
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"--tokenizer {folder!r}: not a loadable tokenizer ({msg})") from None

    def decode(i: int) -> str:
        try:
            return tok.decode([int(i)])
        except Exception:  # an id beyond the tokenizer's vocabulary
            return "?"

    return decode


def run(cfg: LogprobsConfig, advance=lambda k=1: None) -> LogprobsResult:
    clips = parse_clips(cfg.clip)
    fail_on = parse_fail_on(cfg.fail_on)
    check_cap(cfg.cap)
    if cfg.worst < 0:
        raise UsageError(f"--worst must be >= 0, got {cfg.worst}")
    inputs.check_given(cfg.tokenizer, "--tokenizer")
    decode = load_decoder(cfg.tokenizer) if cfg.tokenizer is not None else None
    a = logprob_streams.read(cfg.a, "A")
    advance()
    b = logprob_streams.read(cfg.b, "B")
    advance()
    params = {"a": cfg.a, "b": cfg.b, "tokenizer": cfg.tokenizer, "fail_on": list(fail_on)}
    return compare_streams(a, b, clips, cfg.cap, cfg.worst, decode, params, fail_on)
