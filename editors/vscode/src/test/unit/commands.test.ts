import * as assert from 'node:assert/strict';
import { test } from 'node:test';

import { AskSession } from '../../ask';
import {
  ClientCommand, commandHandlers, EXPLAIN_QUESTION, isSelection, offerRestart, RESTART_ACTION, Selection, statusLine,
} from '../../commands';
import { StatusBarController } from '../../statusBar';
import { FakeConnection, FakeHost, RecordingView } from '../fakes';

const SELECTION: Selection = { uri: 'file:///w/util.py', range: { start: { line: 3, character: 0 }, end: { line: 5, character: 16 } } };

function setup(answer: string | undefined, selection: Selection | undefined) {
  const server = new FakeConnection();
  const host = new FakeHost(answer, selection);
  const view = new RecordingView();
  const ask = new AskSession(server, view);
  const status = new StatusBarController(server, { show: () => undefined });
  let restarts = 0;
  const ctx = { host, server, ask, status, restart: async () => { restarts += 1; } };
  const handlers = commandHandlers(ctx);
  return { server, host, view, handlers, ctx, restarts: () => restarts };
}

async function answerFirst(server: FakeConnection, result: unknown): Promise<any> {
  const [sent] = await server.requests(1);
  sent.resolve(result);
  return sent.params;
}

const ANSWER = { text: 'ok', finishReason: 'stop', conversationId: 'c', metrics: {} };

test('every client command has a handler', () => {
  assert.deepEqual(Object.keys(setup(undefined, undefined).handlers).sort(), Object.values(ClientCommand).sort());
});

test('ask about workspace sends the typed question', async () => {
  const { server, handlers, host } = setup('How is it built?', undefined);
  const done = handlers[ClientCommand.askWorkspace]();
  assert.deepEqual((await answerFirst(server, ANSWER)).arguments, [{ question: 'How is it built?' }]);
  await done;
  assert.equal(host.prompts.length, 1);
});

test('a dismissed question box sends nothing', async () => {
  const { server, handlers } = setup(undefined, SELECTION);
  await handlers[ClientCommand.askWorkspace]();
  await handlers[ClientCommand.askAboutSelection]();
  assert.equal(server.sent.length, 0);
});

test('ask about selection uses the code action argument before the editor selection', async () => {
  const fromAction: Selection = { uri: 'file:///w/main.py', range: { start: { line: 0, character: 0 }, end: { line: 1, character: 0 } } };
  const { server, handlers } = setup('Why?', SELECTION);
  const done = handlers[ClientCommand.askAboutSelection](fromAction);
  assert.deepEqual((await answerFirst(server, ANSWER)).arguments, [{ question: 'Why?', ...fromAction }]);
  await done;
});

test('explain selection asks the explain question about the editor selection', async () => {
  const { server, handlers, host } = setup(undefined, SELECTION);
  const done = handlers[ClientCommand.explainSelection]();
  assert.deepEqual((await answerFirst(server, ANSWER)).arguments, [{ question: EXPLAIN_QUESTION, ...SELECTION }]);
  await done;
  assert.equal(host.prompts.length, 0);
});

test('selection commands without a selection say so', async () => {
  const { server, handlers, host } = setup('Why?', undefined);
  await handlers[ClientCommand.explainSelection]();
  await handlers[ClientCommand.askAboutSelection]({ uri: 1 });
  assert.deepEqual(host.messages, ['error:codectx: select some code first.', 'error:codectx: select some code first.']);
  assert.equal(server.sent.length, 0);
});

test('show context opens the markdown layout', async () => {
  const { server, handlers, host } = setup(undefined, undefined);
  const done = handlers[ClientCommand.openContext]();
  const params = await answerFirst(server, { segments: [], markdown: '# codectx context\n' });
  await done;
  assert.equal(params.command, 'codectx.showContext');
  assert.deepEqual(host.opened, [{ name: 'context.md', text: '# codectx context\n' }]);
});

test('status shows one line; restart stops the ask, restarts and refreshes', async () => {
  const { server, handlers, host, restarts } = setup(undefined, undefined);
  const state = {
    ready: true, model: 'smollm2-135m', warmup: null, lastMetrics: null, engine: null,
    counters: { asks: 0, hovers: 0, hoverCacheHits: 0, cancelled: 0, warmups: 0 },
  };
  const shown = handlers[ClientCommand.showStatus]();
  await answerFirst(server, state);
  await shown;
  assert.deepEqual(host.messages, [`info:${statusLine(state)}`]);
  assert.match(statusLine(state), /smollm2-135m ready; warm 0%/);
  const restarted = handlers[ClientCommand.restartServer]();
  (await server.requests(2))[1].resolve(state);
  await restarted;
  assert.equal(restarts(), 1);
});

test('isSelection accepts only { uri, range }', () => {
  assert.equal(isSelection(SELECTION), true);
  assert.equal(isSelection({ uri: 'file:///x' }), false);
  assert.equal(isSelection(undefined), false);
});

test('status before any ask (lastMetrics {}, as the server sent it) shows a line, not an error', async () => {
  const { server, handlers, host } = setup(undefined, undefined);
  const state = {
    ready: true, model: 'smollm2-135m', warmup: null, lastMetrics: {}, engine: null,
    counters: { asks: 0, hovers: 0, hoverCacheHits: 0, cancelled: 0, warmups: 0 },
  };
  const shown = handlers[ClientCommand.showStatus]();
  await answerFirst(server, state);
  await shown;
  assert.equal(host.messages.length, 1);
  assert.match(host.messages[0], /^info:codectx: smollm2-135m ready; .*last TTFT none yet; 0 asks/);
  assert.match(statusLine({ ...state, lastMetrics: { ttft_s: null } } as any), /last TTFT none yet/);
});

/** `affectsConfiguration` of a change to these settings. */
function changed(...keys: string[]): (section: string) => boolean {
  return (section) => keys.some((key) => key === section || key.startsWith(`${section}.`));
}

test('a change of codectx.model.* or codectx.compute.* offers a restart; pressing it restarts', async () => {
  const { server, host, ctx, restarts } = setup(undefined, undefined);
  await offerRestart(ctx, changed('codectx.model.name'));
  assert.deepEqual(host.messages,
    [`offer:codectx: codectx.model.* changed; the server uses the new settings after a restart. [${RESTART_ACTION}]`]);
  assert.equal(restarts(), 0);
  host.choice = true;
  const done = offerRestart(ctx, changed('codectx.compute.attention', 'codectx.server.args'));
  (await server.requests(1))[0].resolve({ ready: false, model: null });
  await done;
  assert.match(host.messages[1], /^offer:codectx: codectx\.server\.\*, codectx\.compute\.\* changed;/);
  assert.equal(restarts(), 1);
  assert.equal(server.sent[0].params.command, 'codectx.status');
});

test('other settings reach the running server: no restart offered', async () => {
  const { host, ctx, restarts } = setup(undefined, undefined);
  await offerRestart(ctx, changed('codectx.hover.enabled', 'codectx.warmup.debounceMs', 'codectx.trace.server', 'editor.fontSize'));
  assert.deepEqual(host.messages, []);
  assert.equal(restarts(), 0);
});
