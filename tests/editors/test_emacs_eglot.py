"""docs/editors.md's Emacs configuration, run as written: `emacs --batch` loads the elisp block
of the "Emacs (eglot)" section, opens a Python file (eglot-ensure starts `codectx serve` from
PATH) and checks hover and a streamed `codectx-ask` against the real server with a tiny model.

Emacs and eglot come from Debian (`emacs-nox`, `elpa-eglot`; scripts/dev-setup.sh installs them).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server.harness import build_server_test_model, write_sample_workspace

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS = REPO_ROOT / "docs" / "editors.md"
TIMEOUT_S = 300

TEST_SCRIPT = r""";; -*- lexical-binding: t -*-
(defun codectx-test-fail (format-string &rest args)
  (princ (concat "FAIL: " (apply #'format format-string args) "\n") #'external-debugging-output)
  (kill-emacs 1))

(defun codectx-test-wait (what predicate)
  "Process events until PREDICATE holds; fail after two minutes."
  (let ((deadline (+ (float-time) 120)))
    (while (not (funcall predicate))
      (when (> (float-time) deadline)
        (codectx-test-fail "timed out waiting for %s" what))
      (accept-process-output nil 0.05))))

(defun codectx-test-command (server command &optional argument)
  (jsonrpc-request server :workspace/executeCommand
                   (if argument (list :command command :arguments (vector argument)) (list :command command))
                   :timeout 120))

(condition-case err
    (progn
      (load (getenv "CODECTX_TEST_SNIPPET") nil t)
      ;; The test's settings replace the snippet's (a tiny model instead of the default one).
      (setq-default eglot-workspace-configuration
                    `(:codectx (:model (:name ,(getenv "CODECTX_TEST_MODEL") :kvBits 16 :prefillChunk 16)
                                :ask (:maxTokens 12) :hover (:maxTokens 8 :latencyBudgetMs 60000)
                                :warmup (:enabled :json-false) :memory (:archiveEnabled :json-false))))
      (find-file (expand-file-name "main.py" (getenv "CODECTX_TEST_WORKSPACE")))
      (unless (eq major-mode 'python-mode) (codectx-test-fail "main.py is in %s" major-mode))
      (run-hooks 'post-command-hook)    ; eglot-ensure connects after the next command
      (codectx-test-wait "eglot to connect" (lambda () (and (eglot-current-server) eglot--managed-mode)))
      (let ((server (eglot-current-server)))
        (princ (format "connected: %s\n" (jsonrpc-name server)))
        (codectx-test-command server "codectx.showContext") ; waits for the model load
        ;; Hover on the `add' of `print(greet("café"), add(1, 2))'.
        (goto-char (point-min))
        (forward-line 4)
        (search-forward "add(")
        (backward-char 3)
        (let* ((hover (jsonrpc-request server :textDocument/hover (eglot--TextDocumentPositionParams)
                                       :timeout 120))
               (value (plist-get (plist-get hover :contents) :value))
               (region (eglot--range-region (plist-get hover :range))))
          (princ (format "hover: %s\n" value))
          (unless (string-prefix-p "**add** (function, `util.py:4`)" value)
            (codectx-test-fail "hover: %S" value))
          (unless (equal (buffer-substring-no-properties (car region) (cdr region)) "add")
            (codectx-test-fail "hover range covers %S" (buffer-substring-no-properties (car region) (cdr region)))))
        ;; M-x codectx-ask from the snippet: the answer streams into *codectx*.
        (codectx-ask "What does add do?")
        (codectx-test-wait "the streamed answer" (lambda () codectx-finish-reason))
        (let ((streamed (with-current-buffer "*codectx*" (buffer-string)))
              (again (plist-get (codectx-test-command server "codectx.ask" '(:question "What does add do?")) :text)))
          (princ (format "streamed (%s): %S\n" codectx-finish-reason streamed))
          (unless (and (> (length streamed) 0) (equal streamed again))
            (codectx-test-fail "streamed %S, asked again %S" streamed again)))
        (let ((counters (plist-get (codectx-test-command server "codectx.status") :counters)))
          (unless (equal (plist-get counters :asks) 2)
            (codectx-test-fail "status counters %S" counters)))
        (princ "ok emacs_eglot\n")
        (eglot-shutdown server))
      (kill-emacs 0))
  (error (codectx-test-fail "%S" err)))
"""


def emacs_snippet() -> str:
    """The first elisp block of docs/editors.md's "Emacs (eglot)" section."""
    section = DOCS.read_text(encoding="utf-8").split("## Emacs (eglot)", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```elisp\n(.*?)```", section, re.S)
    assert match, "docs/editors.md has no elisp block in its Emacs section"
    return match.group(1)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_server_test_model(tmp_path_factory.mktemp("model"))


def test_docs_eglot_configuration_hovers_and_streams(tiny_model, tmp_path):
    emacs = shutil.which("emacs")
    assert emacs, "emacs is missing: scripts/dev-setup.sh installs emacs-nox and elpa-eglot"
    workspace = tmp_path / "repo"
    workspace.mkdir()
    write_sample_workspace(workspace)
    snippet, script = tmp_path / "codectx-eglot.el", tmp_path / "test.el"
    snippet.write_text(emacs_snippet(), encoding="utf-8")
    script.write_text(TEST_SCRIPT, encoding="utf-8")
    # `codectx` on PATH is this checkout's, through a wrapper in this test's Python.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "codectx").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m server.cli "$@"\n', encoding="utf-8")
    (bin_dir / "codectx").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONPATH=str(REPO_ROOT),
               CODECTX_HOME=str(tmp_path / "home"), HOME=str(tmp_path), CODECTX_TEST_SNIPPET=str(snippet),
               CODECTX_TEST_MODEL=str(tiny_model), CODECTX_TEST_WORKSPACE=str(workspace))
    run = subprocess.run([emacs, "--batch", "-l", str(script)], cwd=workspace, env=env,
                         capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    output = f"--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}"
    assert run.returncode == 0, output
    assert "ok emacs_eglot" in run.stdout, output
