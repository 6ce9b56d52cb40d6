"""Write the logits files of the compare logits examples (docs/compare-model.md):
the embedded char-LM teacher-forced over 1024 held-out characters.

- ref.safetensors: the fp32 run (REF); bf16.safetensors: the bf16 run (REF_LOW,
  the yardstick); fp16.safetensors: the fp16 run (a correct "engine");
- scaled.safetensors: the fp16 run's logits times 1.01, an engine whose final
  norm or LM head is 1 % off (a planted bug);
- ref.kld: REF as llama.cpp's --kl-divergence-base file, chunks of 128.

    .venv/bin/python scripts/make_logits_examples.py [OUT_DIR]   # default docs/data/logits
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from precisionlab.experiments import logits as exp  # noqa: E402
from precisionlab.io import kld_base_file, logits_file  # noqa: E402

out = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "docs" / "data" / "logits")
out.mkdir(parents=True, exist_ok=True)
ref, low, fp16 = (str(out / n) for n in ("ref.safetensors", "bf16.safetensors", "fp16.safetensors"))
exp.run_model(exp.MetricsConfig(dtypes="bf16,fp16", tokens=1024, save_logits=[ref, f"bf16={low}", f"fp16={fp16}"]))
f = logits_file.open_file(fp16, "fp16")
logits_file.write(str(out / "scaled.safetensors"), (f.rows(0, f.positions) * 1.01).astype("float32"), f.tokens,
                  {**f.metadata, "dtype": "fp32", "note": "fp16 logits x 1.01 (planted)"})
kld_base_file.write(str(out / "ref.kld"), logits_file.open_file(ref, "REF"), 128)
