#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine: the Python venv with the dev
# extras, the VS Code extension's Node packages, Debian's Chromium for the /monitor test, Emacs with
# eglot for the Emacs editor test and llama.cpp's llama-server for the remote-engine tests.
# Idempotent: a second run only checks. Used by README's test command and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

# --- Python -------------------------------------------------------------------------------
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install --quiet -e ".[dev]"

# --- Node (editors/vscode) ----------------------------------------------------------------
if [ -f editors/vscode/package-lock.json ]; then
  (cd editors/vscode && npm ci --no-audit --no-fund --loglevel=error && npm run --silent compile)
fi

# --- Chromium (tests/http: /monitor screenshot) -------------------------------------------
if ! command -v chromium >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

# --- Emacs + eglot (tests/editors/test_emacs_eglot.py runs docs/editors.md's Emacs setup) --
# Debian 12: emacs-nox 28 + elpa-eglot (about 15 s); Emacs 29+ has eglot built in.
if ! emacs --batch --eval "(require 'eglot)" >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends emacs-nox >/dev/null
  if ! emacs --batch --eval "(require 'eglot)" >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends elpa-eglot >/dev/null
  fi
fi

# --- llama.cpp's llama-server (tests/server/test_remote_llama.py), built once per machine; the
# benchmark's llama-quantize and llama-bench: `bash scripts/build-llama-server.sh` (bench/models.py) ---
PYTHON=.venv/bin/python bash scripts/build-llama-server.sh llama-server >/dev/null
