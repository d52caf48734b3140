/**
 * Settings: what the server is told and how it is started.
 *
 * package.json's `contributes.configuration` is the one list of settings. Keys under
 * `codectx.server.*` and `codectx.trace.*` belong to the client; every other key is a
 * server setting with the server's own camelCase name (docs/protocol.md, *Settings*),
 * sent nested as `initializationOptions` and as the answer to `workspace/configuration`.
 */
import * as fs from 'fs';
import * as path from 'path';

/** Reads one setting below `codectx` by its dotted key ("model.name"); undefined when unknown. */
export type SettingsReader = (key: string) => unknown;

/** The extension manifest (package.json), reduced to what this module reads. */
export interface Manifest {
  contributes: { configuration: { properties: Record<string, { default?: unknown }> } };
}

export const SECTION = 'codectx';
const CLIENT_PREFIXES = ['server.', 'trace.'];

/** How to start the server: an executable, its arguments and extra environment. */
export interface ServerLaunch {
  command: string;
  args: string[];
  env: Record<string, string>;
}

/** Reads the extension's package.json (next to `out/`). */
export function loadManifest(root: string = path.join(__dirname, '..')): Manifest {
  return JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8')) as Manifest;
}

/** The server's setting keys ("model.name", ...) in manifest order. */
export function serverSettingKeys(manifest: Manifest): string[] {
  return Object.keys(manifest.contributes.configuration.properties)
    .filter((name) => name.startsWith(`${SECTION}.`))
    .map((name) => name.slice(SECTION.length + 1))
    .filter((key) => !CLIENT_PREFIXES.some((prefix) => key.startsWith(prefix)));
}

/** A reader over the manifest's defaults with some keys replaced (tests, fallbacks). */
export function manifestDefaults(manifest: Manifest, overrides: Record<string, unknown> = {}): SettingsReader {
  const properties = manifest.contributes.configuration.properties;
  return (key) => (key in overrides ? overrides[key] : properties[`${SECTION}.${key}`]?.default);
}

/**
 * The server's settings tree: `{ model: { name, kvBits, ... }, ... }`.
 *
 * Values are passed as they are; the server validates them and names the invalid ones.
 */
export function serverSettings(manifest: Manifest, read: SettingsReader): Record<string, unknown> {
  const tree: Record<string, Record<string, unknown>> = {};
  for (const key of serverSettingKeys(manifest)) {
    const value = read(key);
    if (value === undefined) {
      continue;
    }
    const [group, name] = key.split('.', 2);
    (tree[group] ??= {})[name] = value;
  }
  return tree;
}

/** The `workspace/configuration` answer: the settings tree for section `codectx`, null otherwise. */
export function configurationAnswer(
  manifest: Manifest, items: { section?: string; scopeUri?: string }[],
  readerFor: (scopeUri?: string) => SettingsReader,
): unknown[] {
  return items.map((item) => (item.section === SECTION ? serverSettings(manifest, readerFor(item.scopeUri)) : null));
}

/**
 * The server command line: `<pythonPath> -m server.cli serve` when an interpreter is set,
 * else `<command> serve`; `server.args` follow, `server.env` is added to the environment.
 */
export function serverLaunch(read: SettingsReader): ServerLaunch {
  const python = stringSetting(read, 'server.pythonPath');
  const command = stringSetting(read, 'server.command') || 'codectx';
  const extra = read('server.args');
  const env = read('server.env');
  const args = Array.isArray(extra) ? extra.map(String) : [];
  return {
    command: python || command,
    args: [...(python ? ['-m', 'server.cli'] : []), 'serve', ...args],
    env: env && typeof env === 'object' ? Object.fromEntries(Object.entries(env).map(([k, v]) => [k, String(v)])) : {},
  };
}

/** The setting groups a running server keeps: how it starts, and what its session was built with (the
 * server's `RESTART_SECTIONS`: the model, how it computes, its caches, the engine it talks to, the workspace). */
export const RESTART_GROUPS = ['server', 'model', 'compute', 'memory', 'engine', 'context'];

/** The groups of `RESTART_GROUPS` a configuration change affects. */
export function restartGroups(affects: (section: string) => boolean): string[] {
  return RESTART_GROUPS.filter((group) => affects(`${SECTION}.${group}`));
}

/** True when a configuration change needs a server restart (one of `RESTART_GROUPS` changed). */
export function needsRestart(affects: (section: string) => boolean): boolean {
  return restartGroups(affects).length > 0;
}

function stringSetting(read: SettingsReader, key: string): string {
  const value = read(key);
  return typeof value === 'string' ? value.trim() : '';
}
