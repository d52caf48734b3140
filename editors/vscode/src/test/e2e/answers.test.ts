/**
 * End to end, issue 17's answers in the extension's client code: a hover that shows the static
 * card with a pending line and the model's answer on a later hover, an empty question refused
 * with a clear error, focus in `codectx.showContext`, and the loop guard's finish reason in the
 * ask panel's footer and the status counters.
 *
 * The real `codectx serve`, launched like the extension launches it (`serverLaunch`,
 * `startServerProcess`, `config.ts`), on a `vscode-languageserver-protocol` connection, with a
 * tiny random-weight model whose greedy answers loop.
 *
 * Environment (set by tests/editors/test_vscode_client.py):
 *   CODECTX_TEST_LOOPING_MODEL  a tiny random-weight model directory whose greedy output loops
 *   CODECTX_TEST_PYTHON         the Python interpreter with codectx's dependencies
 *   CODECTX_TEST_PENDING_LINE   the line a hover shows while the model's answer is pending
 */
import * as assert from 'node:assert/strict';
import { ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { setTimeout as delay } from 'node:timers/promises';

import {
  ConfigurationRequest, createMessageConnection, ErrorCodes, InitializeRequest, MessageConnection, RegistrationRequest,
  ResponseError, StreamMessageReader, StreamMessageWriter, WorkDoneProgressCreateRequest,
} from 'vscode-languageserver-protocol/node';

import { AskOutcome, AskSession, AskView } from '../../ask';
import { outcomeFooter } from '../../askHtml';
import { configurationAnswer, loadManifest, manifestDefaults, serverLaunch, serverSettings } from '../../config';
import {
  AskResult, ContextLayout, executeCommand, ServerCommand, ServerStatus, STREAM_METHOD, StreamParams,
} from '../../protocol';
import { startServerProcess } from '../../serverProcess';
import { describeStatus } from '../../statusBar';
import { LIMIT, MAIN, REPO, required, UTIL } from '../e2eWorkspace';

const POLL_MS = 20; // between hovers while waiting for the answer to land
const ANSWER_TOKENS = 96; // more than the loop guard's rule needs to fire first (engine/loop_guard.py)

/** An AskView that keeps what the ask panel would show. */
class View implements AskView {
  text = '';
  footer = '';

  begin(): void {
    this.text = '';
    this.footer = '';
  }

  append(text: string): void {
    this.text += text;
  }

  end(outcome: AskOutcome): void {
    this.footer = outcomeFooter(outcome);
  }
}

const manifest = loadManifest();
const view = new View();
const streams: StreamParams[] = [];
let child: ChildProcess;
let stderr = '';
let connection: MessageConnection;
let session: AskSession;
let mainUri: string;

function settings() {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'codectx-home-'));
  return manifestDefaults(manifest, {
    'model.name': required('CODECTX_TEST_LOOPING_MODEL'),
    'model.prefillChunk': 16,
    'ask.maxTokens': ANSWER_TOKENS,
    'hover.maxTokens': 8,
    'hover.latencyBudgetMs': 0, // the default: a hover never waits for the model
    'hover.prefetch': 0, // no answer is prepared before the test hovers
    'hover.prefetchHeads': false,
    'warmup.enabled': false,
    'memory.archiveEnabled': false,
    'server.pythonPath': required('CODECTX_TEST_PYTHON'),
    'server.args': ['--log-level', 'WARNING'],
    'server.env': { PYTHONPATH: REPO, CODECTX_HOME: home },
  });
}

function hover(character: number): Promise<any> {
  return connection.sendRequest('textDocument/hover', { textDocument: { uri: mainUri }, position: { line: 4, character } });
}

function status(): Promise<ServerStatus> {
  return executeCommand<ServerStatus>(connection, ServerCommand.status);
}

describe('issue 17 answers, through the extension client code', () => {
  before(async () => {
    const read = settings();
    const workspace = fs.mkdtempSync(path.join(os.tmpdir(), 'codectx-ws-'));
    fs.writeFileSync(path.join(workspace, 'util.py'), UTIL);
    fs.writeFileSync(path.join(workspace, 'main.py'), MAIN);
    child = await startServerProcess(serverLaunch(read), workspace);
    child.stderr!.on('data', (chunk: Buffer) => { stderr += chunk.toString(); });
    connection = createMessageConnection(new StreamMessageReader(child.stdout!), new StreamMessageWriter(child.stdin!));
    connection.onRequest(ConfigurationRequest.type, (params) => configurationAnswer(manifest, params.items, () => read));
    connection.onRequest(WorkDoneProgressCreateRequest.type, () => undefined);
    connection.onRequest(RegistrationRequest.type, () => undefined);
    // A connection keeps one handler per method: the test records the stream the session reads.
    session = new AskSession({
      sendRequest: (method, params, ...token) => connection.sendRequest(method, params, ...token),
      onNotification: (method, handler) => connection.onNotification(method, (params: StreamParams) => {
        streams.push(params);
        handler(params);
      }),
    }, view);
    session.listen();
    connection.listen();
    const rootUri = `file://${workspace}`;
    await connection.sendRequest(InitializeRequest.type, {
      processId: process.pid, rootUri, capabilities: { general: { positionEncodings: ['utf-16'] } },
      workspaceFolders: [{ uri: rootUri, name: 'ws' }], initializationOptions: serverSettings(manifest, read),
    });
    await connection.sendNotification('initialized', {});
    await executeCommand(connection, ServerCommand.showContext); // answers once the model is loaded
    mainUri = `${rootUri}/main.py`;
    await connection.sendNotification('textDocument/didOpen', {
      textDocument: { uri: mainUri, languageId: 'python', version: 1, text: MAIN },
    });
  }, LIMIT);

  after(async () => {
    if (child.exitCode === null) {
      await connection.sendRequest('shutdown');
      const exited = once(child, 'exit');
      await connection.sendNotification('exit');
      assert.deepEqual(await exited, [0, null]);
    }
    connection.dispose();
    process.stderr.write(`--- server stderr ---\n${stderr}\n`);
  });

  test('hover shows the card with the pending line at once, the answer on a later hover', LIMIT, async () => {
    const pending = required('CODECTX_TEST_PENDING_LINE');
    const at = MAIN.split('\n')[4].indexOf('add(') + 1;
    const first = (await hover(at)).contents.value as string;
    assert.ok(first.startsWith('**add** (function, `util.py:4`)'), first);
    assert.ok(first.includes('def add(a, b):') && first.includes('Returns a + b.'), first);
    assert.ok(first.endsWith(pending), first);
    const explained = (text: string) => text.split('\n\n')[1].startsWith('`add`');
    let later = first;
    while (!explained(later)) { // the test's timeout bounds the wait
      await delay(POLL_MS);
      later = (await hover(at)).contents.value as string;
    }
    assert.ok(later.startsWith('**add** (function, `util.py:4`)') && later.includes('def add(a, b):'), later);
    assert.ok(!later.includes(pending), later);
    const counted = (await status()).counters as ServerStatus['counters'] & { outcomes: Record<string, any> };
    assert.ok(counted.hoverCacheHits >= 1 && counted.hovers >= 2, JSON.stringify(counted));
    assert.equal(counted.outcomes.hover?.error, undefined, JSON.stringify(counted.outcomes));
  });

  test('an empty or blank question is refused with InvalidParams; the next ask answers', LIMIT, async () => {
    for (const question of ['', '   \n\t']) {
      await assert.rejects(executeCommand(connection, ServerCommand.ask, { question }), (err: unknown) => {
        assert.ok(err instanceof ResponseError, String(err));
        assert.equal(err.code, ErrorCodes.InvalidParams);
        assert.match(err.message, /question is empty/);
        return true;
      });
    }
    const refused = await session.run({ question: '  ' });
    assert.equal(refused.kind, 'failed');
    assert.match(view.footer, /^Failed: .*question is empty/);
    const counters = (await status()).counters as ServerStatus['counters'] & { outcomes: Record<string, any> };
    assert.equal(counters.asks, 0, 'a refused question is not an ask');
    const answered = await session.run({ question: 'What does add do?', maxTokens: 4 });
    assert.equal(answered.kind, 'answered', JSON.stringify(answered));
  });

  test('showContext with a question shows the definition it names in the focus', LIMIT, async () => {
    const shown = await executeCommand<ContextLayout>(connection, ServerCommand.showContext,
      { question: 'What does greet() return?' });
    assert.deepEqual(shown.focus?.items.map((i) => [i.path, i.name]), [['util.py', 'greet']]);
    assert.ok(shown.focus!.tokens <= shown.focus!.budget, JSON.stringify(shown.focus));
    assert.ok(shown.markdown.includes('util.py:9-10 greet'), shown.markdown);
    assert.ok(shown.markdown.includes('named in the question (greet())'), shown.markdown);
    const plain = await executeCommand<ContextLayout>(connection, ServerCommand.showContext);
    assert.equal(plain.focus, null);
  });

  test('a looping answer stops as "repetition": in the stream, the footer and the status', LIMIT, async () => {
    streams.length = 0;
    const before = await status();
    const outcome = await session.run({ question: 'What does add do?' });
    assert.equal(outcome.kind, 'answered', JSON.stringify(outcome));
    const result = (outcome as { result: AskResult }).result;
    assert.equal(result.finishReason, 'repetition');
    const metrics = result.metrics as Record<string, number>;
    const { decode_tokens: decoded, loop_period: period, loop_tokens: looped } = metrics;
    assert.ok(decoded < ANSWER_TOKENS && period >= 1 && looped >= 2 * period, JSON.stringify(result.metrics));
    assert.equal(view.text, result.text);
    assert.deepEqual(streams.filter((s) => s.done).map((s) => s.finishReason), ['repetition']);
    assert.ok(view.footer.endsWith('tok/s (stopped on repetition)'), view.footer);
    const after = await status();
    const outcomes = (s: ServerStatus) => (s.counters as any).outcomes.ask ?? {};
    assert.equal((outcomes(after).repetition ?? 0) - (outcomes(before).repetition ?? 0), 1, JSON.stringify(after.counters));
    assert.equal(after.counters.asks, before.counters.asks + 1);
    assert.ok(describeStatus(after).tooltip.includes('asks: 2'), describeStatus(after).tooltip);
  });
});
