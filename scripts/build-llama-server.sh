#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (the remote-engine tests' and bench/remote.py's peer) from the
# llama.cpp tree that the llama-cpp-python sdist on PyPI vendors, once per machine: the binary and
# its libraries go to $CODECTX_DEV_CACHE (default ~/.cache/codectx-dev), outside the clone, so a
# second run (or a second clone) only checks. About 7 minutes on 2 cores (cmake and a C++ compiler).
# Prints the folder that holds `llama-server` (run it with LD_LIBRARY_PATH set to that folder).
set -euo pipefail
VERSION=0.3.36
CACHE="${CODECTX_DEV_CACHE:-$HOME/.cache/codectx-dev}"
TARGET="$CACHE/llama-server-$VERSION"
PYTHON="${PYTHON:-python3}"

if [ -x "$TARGET/llama-server" ] && LD_LIBRARY_PATH="$TARGET" "$TARGET/llama-server" --version >/dev/null 2>&1; then
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
cmake -S "$SRC" -B "$WORK/build" "${GENERATOR[@]}" -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF \
  -DCMAKE_BUILD_TYPE=Release >&2
cmake --build "$WORK/build" --target llama-server -j"$(nproc)" >&2
mkdir -p "$TARGET.tmp"
cp -a "$WORK/build/bin/llama-server" "$WORK"/build/bin/*.so* "$TARGET.tmp/"
rm -rf "$TARGET"
mv "$TARGET.tmp" "$TARGET"
echo "$TARGET"
