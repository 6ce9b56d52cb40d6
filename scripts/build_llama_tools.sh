#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` and `llama-perplexity` (and nothing else)
# from the llama.cpp that llama-cpp-python's sdist vendors, so the tests of
# `nondeterminism endpoint` and of `compare logits` on a --kl-divergence-base
# file run against the same llama.cpp sources as the llamacpp engine.
#
#   scripts/build_llama_tools.sh            (make llama-tools)
#
# Into $PRECISIONLAB_CACHE (default ~/.cache/precisionlab)/llama.cpp-VERSION/bin;
# a no-op when both binaries are there. The sdist comes through pip (the
# configured index, nothing else); the build runs in a work directory beside
# the cache and the finished bin/ is renamed into place, so an interrupted
# build never leaves a half cache that the tests would take for a built one.
# Not part of `make test`: it compiles for tens of minutes on a small machine.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# llama-cpp-python's pin in pyproject.toml (the version the llamacpp engine runs)
PIN=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' "$ROOT/pyproject.toml" | head -n 1)
VERSION=${LLAMA_CPP_PYTHON_VERSION:-$PIN}
[ -n "$VERSION" ] || { echo "llama-tools: no llama-cpp-python==VERSION pin in $ROOT/pyproject.toml" >&2; exit 1; }
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-2}
CACHE=${PRECISIONLAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/precisionlab}
DEST=$CACHE/llama.cpp-$VERSION
WORK=$CACHE/.work-llama.cpp-$VERSION

if [ -x "$DEST/bin/llama-server" ] && [ -x "$DEST/bin/llama-perplexity" ]; then
    echo "llama-tools: already built in $DEST/bin"
    exit 0
fi
command -v cmake >/dev/null || { echo "llama-tools: cmake is not installed" >&2; exit 1; }

mkdir -p "$CACHE"
# One build at a time: a second caller waits for the first, then finds it built.
exec 9>"$CACHE/.llama.cpp-$VERSION.lock"
flock 9
if [ -x "$DEST/bin/llama-server" ] && [ -x "$DEST/bin/llama-perplexity" ]; then
    echo "llama-tools: already built in $DEST/bin"
    exit 0
fi

start=$(date +%s)
mkdir -p "$WORK/dl" "$WORK/src"
SDIST=$WORK/dl/llama_cpp_python-$VERSION.tar.gz
if [ ! -f "$SDIST" ]; then
    "$PYTHON" -m pip download "llama-cpp-python==$VERSION" --no-deps \
        --no-binary :all: -d "$WORK/dl.tmp" -q
    mv "$WORK/dl.tmp/llama_cpp_python-$VERSION.tar.gz" "$SDIST"
    rm -rf "$WORK/dl.tmp"
fi
SRC=$WORK/src/llama_cpp_python-$VERSION/vendor/llama.cpp
if [ ! -f "$SRC/CMakeLists.txt" ]; then
    tar xzf "$SDIST" -C "$WORK/src" "llama_cpp_python-$VERSION/vendor/llama.cpp"
fi

# Only what the two tools need: Release, GGML_NATIVE as the wheel builds it,
# static libraries (the binaries need nothing beside them), no tests,
# examples, unified app, web UI (neither built nor fetched), TLS or curl.
CMAKE_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DGGML_NATIVE=ON
    -DBUILD_SHARED_LIBS=OFF
    -DLLAMA_BUILD_COMMON=ON
    -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_CURL=OFF
    -DGGML_CCACHE=OFF
)
cmake -S "$SRC" -B "$WORK/build" "${CMAKE_FLAGS[@]}" >"$WORK/configure.log" 2>&1 \
    || { tail -n 20 "$WORK/configure.log" >&2; exit 1; }
cmake --build "$WORK/build" --config Release -j "$JOBS" \
    --target llama-server llama-perplexity

rm -rf "$WORK/out"
mkdir -p "$WORK/out/bin"
cp "$WORK/build/bin/llama-server" "$WORK/build/bin/llama-perplexity" "$WORK/out/bin/"
elapsed=$(( $(date +%s) - start ))
{
    echo "llama-cpp-python $VERSION (vendor/llama.cpp)"
    echo "cmake ${CMAKE_FLAGS[*]}"
    echo "targets llama-server llama-perplexity, -j $JOBS"
    echo "build_s $elapsed"
    echo "host $(uname -m) $(nproc) cores"
} >"$WORK/out/BUILD_INFO"
rm -rf "$DEST"
mv "$WORK/out" "$DEST"
rm -rf "$WORK"
echo "llama-tools: built in $DEST/bin in ${elapsed}s"
