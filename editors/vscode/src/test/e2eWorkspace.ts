/** What the end-to-end suites share: the repository's root, a per-test time limit, the sample workspace's files. */
import * as path from 'node:path';

/** The repository's root (from out/test/). */
export const REPO = path.resolve(__dirname, '..', '..', '..', '..');
/** A hang fails the test instead of the whole run. */
export const LIMIT = { timeout: 120_000 };
export const UTIL = '"""Helpers."""\n\n\ndef add(a, b):\n    """Returns a + b."""\n    return a + b\n\n\n'
  + 'def greet(name: str) -> str:\n    return "Grüße, " + name + " 🙂"\n';
export const MAIN = 'from util import add, greet\n\n\ndef main():\n    print(greet("café"), add(1, 2))\n';

/** The environment variable `name`, which tests/editors/test_vscode_client.py sets. */
export function required(name: string): string {
  const value = process.env[name];
  if (!value) {
    throw new Error(`${name} is not set: run this suite through tests/editors/test_vscode_client.py`);
  }
  return value;
}
