"""The VS Code extension (editors/vscode): build, Node unit tests, end-to-end run, .vsix package.

VS Code itself cannot be downloaded here, so the extension host is not run. Everything
else is: the TypeScript build, the client modules' unit tests (`node --test`, VS Code API
behind `vscodeHost.ts`), and an end-to-end suite that drives the real `codectx serve` over
stdio with the extension's own launch, settings, ask and status code on a
`vscode-languageserver-protocol` connection, with a tiny random-weight model (and one whose
greedy answers loop, for the hover, question, focus and loop guard checks of answers.test.ts).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import pytest_lsp

from server.core.features.hover import PENDING_LINE
from tests.server.harness import build_server_test_model

EXTENSION = Path(__file__).resolve().parents[2] / "editors" / "vscode"
VSCODE_CAPABILITIES = Path(pytest_lsp.__file__).parent / "clients" / "visual_studio_code_v1.65.2.json"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: the VS Code extension tests need Node.js >= 18 and npm "
                    "(scripts/dev-setup.sh builds the extension with them)", pytrace=False)
    return path


def _run(args: list[str], env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Runs `args` in editors/vscode; on timeout kills its whole process group (node, the server)."""
    with subprocess.Popen(args, cwd=EXTENSION, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            stderr += f"\n[killed after {timeout} s]"
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


def _check(result: subprocess.CompletedProcess, what: str) -> None:
    assert result.returncode == 0, (
        f"{what} failed (exit {result.returncode})\n--- stdout ---\n{result.stdout[-20000:]}\n"
        f"--- stderr ---\n{result.stderr[-20000:]}")


@pytest.fixture(scope="module")
def compiled() -> Path:
    """The extension's compiled JS (`npm ci` first when node_modules is missing)."""
    npm = _tool("npm")
    _tool("node")
    if not (EXTENSION / "node_modules" / ".package-lock.json").exists():
        _check(_run([npm, "ci", "--no-audit", "--no-fund"]), "npm ci")
    _check(_run([npm, "run", "compile"]), "npm run compile")
    return EXTENSION / "out"


@pytest.fixture(scope="module")
def vscode_model(tmp_path_factory) -> Path:
    return build_server_test_model(tmp_path_factory.mktemp("vscode-model"))


def test_unit_suite(compiled):
    result = _run([_tool("node"), "--test", str(compiled / "test" / "unit")])
    _check(result, "node --test out/test/unit")
    assert "# fail 0" in result.stdout and "# pass " in result.stdout


def test_end_to_end_suite_against_the_real_server(compiled, vscode_model, looping_model):
    """out/test/e2e: server.test.js (9 tests) on the tiny model, answers.test.js (4 tests: the pending
    hover, the empty question, focus, the loop guard) on the looping one."""
    env = dict(os.environ, CODECTX_TEST_MODEL=str(vscode_model), CODECTX_TEST_PYTHON=sys.executable,
               CODECTX_TEST_CAPABILITIES=str(VSCODE_CAPABILITIES), CODECTX_TEST_LOOPING_MODEL=str(looping_model),
               CODECTX_TEST_PENDING_LINE=PENDING_LINE)
    result = _run([_tool("node"), "--test", str(compiled / "test" / "e2e")], env=env)
    _check(result, "node --test out/test/e2e")
    assert "# fail 0" in result.stdout and "# pass 14" in result.stdout, result.stdout
    assert re.search(r"^ok \d+ - issue 17 answers, through the extension client code$", result.stdout, re.M)


def test_settings_mirror_the_server_settings(compiled):
    """package.json's server settings are the server's Settings tree: same names, same defaults."""
    import dataclasses
    import json

    from server.core.settings import Settings

    def camel(name: str) -> str:
        head, *rest = name.split("_")
        return head + "".join(part.title() for part in rest)

    expected = {}
    for group in dataclasses.fields(Settings):
        defaults = getattr(Settings(), group.name)
        for field in dataclasses.fields(defaults):
            default = getattr(defaults, field.name)
            expected[f"codectx.{group.name}.{camel(field.name)}"] = list(default) if isinstance(default, tuple) else default
    properties = json.loads((EXTENSION / "package.json").read_text())["contributes"]["configuration"]["properties"]
    contributed = {key: value["default"] for key, value in properties.items()
                   if not key.startswith(("codectx.server.", "codectx.trace."))}
    assert contributed == expected


def test_the_settings_it_offers_a_restart_for_are_those_the_server_keeps():
    """The server keeps `RESTART_SECTIONS` until a restart (and says so); the extension offers the
    restart for exactly those, and for its own launch settings."""
    import re

    from server.core.host import RESTART_SECTIONS

    source = (EXTENSION / "src" / "config.ts").read_text()
    groups = re.search(r"export const RESTART_GROUPS = \[([^\]]*)\]", source).group(1)
    assert [g.strip().strip("'") for g in groups.split(",")] == ["server", *RESTART_SECTIONS]


def test_vsce_packages_a_vsix(compiled, tmp_path):
    vsix = tmp_path / "codectx.vsix"
    result = _run([_tool("npx"), "--no-install", "vsce", "package", "--allow-missing-repository", "--skip-license",
                   "--out", str(vsix)])
    _check(result, "vsce package")
    with zipfile.ZipFile(vsix) as archive:
        names = set(archive.namelist())
    assert {"extension/package.json", "extension/out/extension.js", "extension/out/askPanel.js",
            "extension/node_modules/vscode-languageclient/package.json"} <= names
    assert not any(name.startswith(("extension/src/", "extension/out/test/")) for name in names)
