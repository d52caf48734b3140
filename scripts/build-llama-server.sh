#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (the remote-engine tests' and bench/remote.py's peer),
# `llama-quantize` and `llama-bench` (bench/models.py: the default model in each GGUF quantisation,
# timed on llama.cpp beside codectx) from the llama.cpp tree that the llama-cpp-python sdist on PyPI
# vendors, once per machine: the binaries and their libraries go to $CODECTX_DEV_CACHE (default
# ~/.cache/codectx-dev), outside the clone, so a second run (or a second clone) only checks, and a
# run after an older version of this script builds only the tools that are missing. On 2 cores
# (cmake and a C++ compiler) about 7 minutes for llama-server, 15 for the other two.
# Arguments: the tools to have (default: all three); the test setup (dev-setup.sh) asks only for
# llama-server, so CI does not build what only the benchmark uses. `--where` prints the folder and
# builds nothing (the one place that names it: tests/server/remote_servers.py and bench/models.py ask).
# Prints the folder that holds the tools (run them with LD_LIBRARY_PATH set to that folder).
set -euo pipefail
VERSION=0.3.36
CACHE="${CODECTX_DEV_CACHE:-$HOME/.cache/codectx-dev}"
# On x86-64 the build targets a fixed instruction set (x86-64-v3: AVX2, FMA, F16C), not the build
# machine's (-march=native): a VM can list AMX in /proc/cpuinfo and still fault on its first tile
# instruction (SIGILL in ggml's AMX matmul on 2026-12-05), and a cached build may run on another machine.
# The folder names that choice, so a build of the older native flags is never reused.
ISA_FLAGS=()
FLAVOUR=""
if [ "$(uname -m)" = "x86_64" ]; then
  ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
             -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
  FLAVOUR="-x86-64-v3"
fi
TARGET="$CACHE/llama-server-$VERSION$FLAVOUR"
if [ "${1:-}" = "--where" ]; then
  echo "$TARGET"
  exit 0
fi
PYTHON="${PYTHON:-python3}"
TOOLS=("$@")
[ "${#TOOLS[@]}" -gt 0 ] || TOOLS=(llama-server llama-quantize llama-bench)
for tool in "${TOOLS[@]}"; do
  case "$tool" in llama-server|llama-quantize|llama-bench) ;; *) echo "unknown tool: $tool" >&2; exit 2 ;; esac
done

works() {
  # llama-server and llama-bench answer --version; llama-quantize only prints its usage (exit 1).
  local out
  case "$1" in
    llama-quantize)
      out="$(LD_LIBRARY_PATH="$TARGET" "$TARGET/$1" --help 2>&1 || true)"
      [[ "$out" == *"--allow-requantize"* ]] ;;
    *) LD_LIBRARY_PATH="$TARGET" "$TARGET/$1" --version >/dev/null 2>&1 ;;
  esac
}

MISSING=()
for tool in "${TOOLS[@]}"; do
  if [ ! -x "$TARGET/$tool" ] || ! works "$tool"; then
    MISSING+=("$tool")
  fi
done
if [ "${#MISSING[@]}" -eq 0 ]; then
  echo "$TARGET"
  exit 0
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK" >&2
tar -xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
GENERATOR=()
command -v ninja >/dev/null 2>&1 && GENERATOR=(-G Ninja)
cmake -S "$SRC" -B "$WORK/build" "${GENERATOR[@]}" ${ISA_FLAGS[@]+"${ISA_FLAGS[@]}"} -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF \
  -DCMAKE_BUILD_TYPE=Release >&2
cmake --build "$WORK/build" --target "${MISSING[@]}" -j"$(nproc)" >&2
# Each file lands by rename, so a llama-server already running from $TARGET keeps its old inodes.
mkdir -p "$TARGET"
for file in "${MISSING[@]/#/$WORK/build/bin/}" "$WORK"/build/bin/*.so*; do
  name="$(basename "$file")"
  cp -a "$file" "$TARGET/.$name.tmp"
  mv -f "$TARGET/.$name.tmp" "$TARGET/$name"
done
echo "$TARGET"
