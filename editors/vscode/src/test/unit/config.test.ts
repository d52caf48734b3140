import * as assert from 'node:assert/strict';
import { test } from 'node:test';

import { ClientCommand } from '../../commands';
import {
  configurationAnswer, loadManifest, manifestDefaults, serverLaunch, serverSettingKeys, serverSettings,
} from '../../config';
import { ServerCommand } from '../../protocol';

const manifest = loadManifest();

test('server settings are every contributed codectx.* key except server.* and trace.*', () => {
  const keys = serverSettingKeys(manifest);
  assert.ok(keys.includes('model.name') && keys.includes('warmup.debounceMs'));
  assert.ok(!keys.some((key) => key.startsWith('server.') || key.startsWith('trace.')));
  const all = Object.keys(manifest.contributes.configuration.properties);
  assert.equal(keys.length + all.filter((k) => /^codectx\.(server|trace)\./.test(k)).length, all.length);
});

test('initializationOptions are the nested camelCase tree of the settings', () => {
  const tree = serverSettings(manifest, manifestDefaults(manifest, { 'model.name': '/models/tiny', 'ask.maxTokens': 7 }));
  assert.deepEqual(tree.model, { name: '/models/tiny', kvBits: 16, prefillChunk: 256, speculation: 'auto', draftModel: '', ggufBits: 4 });
  assert.deepEqual(tree.compute, { attention: 'auto', forward: 'auto', compile: true, blas: 'auto', blasThreads: 0, linear: 'auto', kernels: 'auto', room: 'auto' });
  assert.deepEqual(tree.ask, { maxTokens: 7, maxToolCalls: 4 });
  assert.deepEqual(tree.hover, {
    enabled: true, latencyBudgetMs: 0, maxTokens: 96, firstSentence: true, useWarmPrefix: true, prefetch: 64, prepareBatch: 4,
    prefetchHeads: true,
  });
  assert.deepEqual(tree.focus, { enabled: true, budgetTokens: 1024 });
  assert.deepEqual(tree.generation, { loopGuard: true, repetitionPenalty: 1 });
  assert.deepEqual(Object.keys(tree), ['model', 'compute', 'window', 'context', 'memory', 'hover', 'ask', 'focus', 'warmup', 'generation', 'engine']);
  assert.equal('server' in tree || 'trace' in tree, false);
});

test('unset settings are left out (the server keeps its defaults)', () => {
  const tree = serverSettings(manifest, (key) => (key === 'hover.enabled' ? false : undefined));
  assert.deepEqual(tree, { hover: { enabled: false } });
});

test('workspace/configuration answers section codectx with the same tree, other sections with null', () => {
  const scopes: (string | undefined)[] = [];
  const answer = configurationAnswer(manifest, [{ section: 'codectx', scopeUri: 'file:///w' }, { section: 'python' }],
    (scope) => { scopes.push(scope); return manifestDefaults(manifest); });
  assert.deepEqual(answer, [serverSettings(manifest, manifestDefaults(manifest)), null]);
  assert.deepEqual(scopes, ['file:///w']);
});

test('the server runs as `<command> serve` by default', () => {
  const launch = serverLaunch(manifestDefaults(manifest));
  assert.deepEqual(launch, { command: 'codectx', args: ['serve'], env: {} });
});

test('a Python interpreter runs `-m server.cli serve`, with extra args and env', () => {
  const launch = serverLaunch(manifestDefaults(manifest, {
    'server.pythonPath': ' /venv/bin/python ', 'server.args': ['--log-level', 'DEBUG'], 'server.env': { CODECTX_HOME: '/h' },
  }));
  assert.deepEqual(launch, {
    command: '/venv/bin/python', args: ['-m', 'server.cli', 'serve', '--log-level', 'DEBUG'], env: { CODECTX_HOME: '/h' },
  });
});

test('contributed commands are the client commands, none of them a server command id', () => {
  const contributed = (manifest as any).contributes.commands.map((c: { command: string }) => c.command).sort();
  assert.deepEqual(contributed, Object.values(ClientCommand).sort());
  const server = new Set<string>(Object.values(ServerCommand));
  assert.deepEqual(contributed.filter((id: string) => server.has(id)), []);
});
