import * as assert from 'node:assert/strict';
import { test } from 'node:test';

import { LSPErrorCodes, ResponseError } from 'vscode-languageserver-protocol';

import { AskSession } from '../../ask';
import { AskResult, STREAM_METHOD } from '../../protocol';
import { FakeConnection, RecordingView } from '../fakes';

function result(text: string): AskResult {
  return {
    text, finishReason: 'stop', conversationId: 'conv-1',
    metrics: { prompt_tokens: 10, cached_tokens: 8, recomputed_tokens: 2, prefill_tps: 100, ttft_s: 0.1, decode_tokens: 3, decode_tps: 20 },
  };
}

/** A session listening for stream notifications on a fake connection, with a recording view. */
function listeningSession(): { server: FakeConnection; view: RecordingView; session: AskSession } {
  const server = new FakeConnection();
  const view = new RecordingView();
  const session = new AskSession(server, view);
  session.listen();
  return { server, view, session };
}

function stream(requestId: number, index: number, text: string, kind = 'ask') {
  return { requestId, kind, index, text, done: false };
}

test('an ask is workspace/executeCommand codectx.ask with one object argument', async () => {
  const server = new FakeConnection();
  const session = new AskSession(server, new RecordingView());
  const running = session.run({ question: 'What does add do?', maxTokens: 5 });
  const [sent] = await server.requests(1);
  assert.equal(sent.method, 'workspace/executeCommand');
  assert.deepEqual(sent.params, { command: 'codectx.ask', arguments: [{ question: 'What does add do?', maxTokens: 5 }] });
  sent.resolve(result('x'));
  assert.equal((await running).kind, 'answered');
  assert.equal(session.running, false);
});

test('deltas of the ask are streamed into the view; other requests and kinds are not', async () => {
  const server = new FakeConnection();
  const view = new RecordingView();
  const finished: string[] = [];
  const session = new AskSession(server, view, (outcome) => finished.push(outcome.kind));
  const listening = session.listen();
  const running = session.run({ question: 'q' });
  const [sent] = await server.requests(1);
  server.notify(STREAM_METHOD, stream(7, 0, 'Hel'));
  server.notify(STREAM_METHOD, stream(5, 0, 'an earlier request'));
  server.notify(STREAM_METHOD, stream(7, 1, 'hover', 'hover'));
  server.notify(STREAM_METHOD, stream(7, 1, 'lo'));
  server.notify(STREAM_METHOD, { requestId: 7, kind: 'ask', index: 2, text: '', done: true, finishReason: 'stop' });
  sent.resolve(result('Hello'));
  await running;
  assert.deepEqual(view.events, ['begin:q', 'append:Hel', 'append:lo', 'end:answered']);
  assert.deepEqual(finished, ['answered']);
  listening.dispose();
  assert.equal(server.listeners(STREAM_METHOD), 0);
});

test('stop cancels the request token and ends the ask as cancelled', async () => {
  const { server, view, session } = listeningSession();
  const running = session.run({ question: 'long' });
  const [sent] = await server.requests(1);
  server.notify(STREAM_METHOD, stream(3, 0, 'partial'));
  sent.token!.onCancellationRequested(() => sent.reject(new ResponseError(LSPErrorCodes.RequestCancelled, 'cancelled')));
  assert.equal(sent.token!.isCancellationRequested, false);
  await session.stop();
  assert.equal(sent.token!.isCancellationRequested, true);
  assert.deepEqual(await running, { kind: 'cancelled' });
  assert.deepEqual(view.events, ['begin:long', 'append:partial', 'end:cancelled']);
});

test('a new ask stops the running one first, then streams under its own id', async () => {
  const { server, view, session } = listeningSession();
  const first = session.run({ question: 'first' });
  const [firstSent] = await server.requests(1);
  firstSent.token!.onCancellationRequested(() => firstSent.reject(new ResponseError(LSPErrorCodes.RequestCancelled, 'c')));
  server.notify(STREAM_METHOD, stream(1, 0, 'one'));
  const second = session.run({ question: 'second' });
  assert.deepEqual(await first, { kind: 'cancelled' });
  const sent = await server.requests(2);
  server.notify(STREAM_METHOD, stream(2, 0, 'two'));
  sent[1].resolve(result('two'));
  assert.equal((await second).kind, 'answered');
  assert.deepEqual(view.events, ['begin:first', 'append:one', 'end:cancelled', 'begin:second', 'append:two', 'end:answered']);
});

test('a failed request is reported, not thrown', async () => {
  const server = new FakeConnection();
  const view = new RecordingView();
  const session = new AskSession(server, view);
  const running = session.run({ question: 'q' });
  (await server.requests(1))[0].reject(new ResponseError(-31001, 'model not found: nope'));
  assert.deepEqual(await running, { kind: 'failed', message: 'model not found: nope' });
  assert.equal(session.running, false);
});

test('stop without a running ask does nothing', async () => {
  const server = new FakeConnection();
  await new AskSession(server, new RecordingView()).stop();
  assert.equal(server.sent.length, 0);
});

test('late deltas of a cancelled ask do not reach the next one', async () => {
  const { server, view, session } = listeningSession();
  const first = session.run({ question: 'first' });
  const [firstSent] = await server.requests(1);
  server.notify(STREAM_METHOD, stream(4, 0, 'one'));
  firstSent.reject(new ResponseError(LSPErrorCodes.RequestCancelled, 'cancelled at once'));
  await first;
  const second = session.run({ question: 'second' });
  const sent = await server.requests(2);
  server.notify(STREAM_METHOD, stream(4, 1, ' tail of one'));
  server.notify(STREAM_METHOD, { requestId: 4, kind: 'ask', index: 2, text: '', done: true, finishReason: 'cancelled' });
  server.notify(STREAM_METHOD, stream(6, 0, 'two'));
  sent[1].resolve(result('two'));
  await second;
  assert.deepEqual(view.events, ['begin:first', 'append:one', 'end:cancelled', 'begin:second', 'append:two', 'end:answered']);
});

test('an unseen earlier request is replaced by the larger id of the running ask', async () => {
  const { server, view, session } = listeningSession();
  const running = session.run({ question: 'q' });
  const [sent] = await server.requests(1);
  server.notify(STREAM_METHOD, stream(2, 5, 'stale'));
  server.notify(STREAM_METHOD, stream(3, 0, 'fresh'));
  server.notify(STREAM_METHOD, stream(2, 6, 'stale again'));
  sent.resolve(result('fresh'));
  await running;
  assert.deepEqual(view.events, ['begin:q', 'append:stale', 'begin:q', 'append:fresh', 'end:answered']);
  assert.equal(view.text, 'fresh');
});

test('after the connection restarts, its requests numbered from 0 again stream into the view', async () => {
  const { server, view, session } = listeningSession();
  const before = session.run({ question: 'before' });
  const [first] = await server.requests(1);
  server.notify(STREAM_METHOD, stream(30, 0, 'old'));
  first.resolve(result('old'));
  await before;
  server.changeState('stopped');
  server.changeState('starting'); // "Restart server": a new server, a new connection
  server.changeState('running');
  const after = session.run({ question: 'after' });
  const sent = await server.requests(2);
  server.notify(STREAM_METHOD, stream(1, 0, 'new'));
  server.notify(STREAM_METHOD, stream(1, 1, ' text'));
  sent[1].resolve(result('new text'));
  await after;
  assert.deepEqual(view.events, ['begin:before', 'append:old', 'end:answered', 'begin:after', 'append:new', 'append: text',
    'end:answered']);
});

test('listen follows the connection state and stops following it on dispose', () => {
  const server = new FakeConnection();
  const listening = new AskSession(server, new RecordingView()).listen();
  assert.equal(server.stateListenerCount(), 1);
  listening.dispose();
  assert.equal(server.stateListenerCount(), 0);
  assert.equal(server.listeners(STREAM_METHOD), 0);
});
