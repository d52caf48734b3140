/**
 * End to end: the real `codectx serve` driven over stdio the way the extension drives it:
 * the same launch (`serverLaunch` + `startServerProcess`), the same initializationOptions and
 * `workspace/configuration` answers (`config.ts`), the same ask session and status bar code,
 * on a `vscode-languageserver-protocol` connection instead of VS Code's LanguageClient.
 *
 * Environment (set by tests/editors/test_vscode_client.py):
 *   CODECTX_TEST_MODEL         a tiny random-weight model directory
 *   CODECTX_TEST_PYTHON        the Python interpreter with codectx's dependencies
 *   CODECTX_TEST_CAPABILITIES  a JSON file with VS Code's client capabilities (from pytest-lsp)
 */
import * as assert from 'node:assert/strict';
import { ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';

import {
  CancellationToken, ConfigurationRequest, createMessageConnection, InitializeRequest, InitializeResult, MessageConnection,
  ProgressToken, RegistrationRequest, ShowMessageNotification, ShowMessageParams, StreamMessageReader,
  StreamMessageWriter, WorkDoneProgressCreateRequest,
} from 'vscode-languageserver-protocol/node';

import { AskOutcome, AskSession, AskView } from '../../ask';
import { ClientCommand } from '../../commands';
import {
  configurationAnswer, loadManifest, manifestDefaults, serverLaunch, serverSettings, SettingsReader,
} from '../../config';
import { isAnswerDelta, ProgressValue } from '../../progress';
import {
  ContextLayout, executeCommand, EXPERIMENTAL_CAPABILITIES, ServerCommand, ServerConnection, STREAM_METHOD,
  StreamParams, WARMTH_METHOD,
} from '../../protocol';
import { startServerProcess } from '../../serverProcess';
import { describeStatus, StatusBarController, StatusSummary } from '../../statusBar';
import { LIMIT, MAIN, REPO, required, UTIL } from '../e2eWorkspace';

const LONG = 2000; // a decode budget the tiny model is still using when the test cancels
const ENDLESS = 'Write a long essay about util.py.'; // greedy output does not reach EOS (tests/server/test_ask.py)
const QUESTION = 'What does add do?';

/** Fans one connection's notifications out to several listeners (a connection keeps one per method). */
class Fanout implements ServerConnection {
  private readonly listeners = new Map<string, Set<(params: any) => void>>();

  constructor(private readonly connection: MessageConnection) {}

  sendRequest<R>(method: string, params: unknown, ...token: CancellationToken[]): Promise<R> {
    return this.connection.sendRequest(method, params, ...token) as Promise<R>;
  }

  onNotification(method: string, handler: (params: any) => void) {
    let set = this.listeners.get(method);
    if (set === undefined) {
      const created = new Set<(params: any) => void>();
      this.connection.onNotification(method, (params: unknown) => created.forEach((listener) => listener(params)));
      this.listeners.set(method, created);
      set = created;
    }
    set.add(handler);
    return { dispose: () => set!.delete(handler) };
  }

  /** Resolves with the next notification of `method` that satisfies `accept`. */
  next<T>(method: string, accept: (params: T) => boolean = () => true): Promise<T> {
    return new Promise((resolve) => {
      const subscription = this.onNotification(method, (params: T) => {
        if (accept(params)) {
          subscription.dispose();
          resolve(params);
        }
      });
    });
  }
}

/** An AskView that records and lets the test wait for the first streamed text. */
class View implements AskView {
  text = '';
  outcomes: AskOutcome[] = [];
  private firstText: (() => void) | undefined;

  begin(): void {
    this.text = '';
  }

  append(text: string): void {
    this.text += text;
    this.firstText?.();
    this.firstText = undefined;
  }

  end(outcome: AskOutcome): void {
    this.outcomes.push(outcome);
  }

  nextText(): Promise<void> {
    return new Promise((resolve) => { this.firstText = resolve; });
  }
}

const manifest = loadManifest();
let workspace: string;
let child: ChildProcess;
let stderr = '';
let connection: MessageConnection;
let server: Fanout;
let init: InitializeResult;
const view = new View();
const shown: StatusSummary[] = [];
const messages: ShowMessageParams[] = [];
const configurationAnswers: unknown[] = [];
const progress = new Map<ProgressToken, ProgressValue[]>();
const streams: StreamParams[] = [];
let session: AskSession;
let statusBar: StatusBarController;
let firstWarmth: Promise<unknown>;
let read: SettingsReader; // the settings the configuration answers give

function settings() {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'codectx-home-'));
  return manifestDefaults(manifest, {
    'model.name': required('CODECTX_TEST_MODEL'),
    'model.prefillChunk': 16,
    'ask.maxTokens': 12,
    'hover.maxTokens': 8,
    'hover.latencyBudgetMs': 60000,
    'memory.archiveEnabled': false,
    'server.pythonPath': required('CODECTX_TEST_PYTHON'),
    'server.args': ['--log-level', 'WARNING'],
    'server.env': { PYTHONPATH: REPO, CODECTX_HOME: home },
  });
}

describe('codectx serve, driven like the extension drives it', () => {
  before(async () => {
    read = settings();
    const capabilities = JSON.parse(fs.readFileSync(required('CODECTX_TEST_CAPABILITIES'), 'utf8')).capabilities;
    workspace = fs.mkdtempSync(path.join(os.tmpdir(), 'codectx-ws-'));
    fs.writeFileSync(path.join(workspace, 'util.py'), UTIL);
    fs.writeFileSync(path.join(workspace, 'main.py'), MAIN);

    child = await startServerProcess(serverLaunch(read), workspace);
    child.stderr!.on('data', (chunk: Buffer) => { stderr += chunk.toString(); });
    connection = createMessageConnection(new StreamMessageReader(child.stdout!), new StreamMessageWriter(child.stdin!));
    server = new Fanout(connection);
    connection.onRequest(ConfigurationRequest.type, (params) => {
      const answer = configurationAnswer(manifest, params.items, () => read);
      configurationAnswers.push(answer);
      return answer;
    });
    connection.onRequest(WorkDoneProgressCreateRequest.type, (params) => { progress.set(params.token, []); });
    connection.onRequest(RegistrationRequest.type, () => undefined);
    connection.onUnhandledProgress((params) => progress.get(params.token)?.push(params.value as ProgressValue));
    server.onNotification(ShowMessageNotification.method, (params: ShowMessageParams) => messages.push(params));
    server.onNotification(STREAM_METHOD, (params: StreamParams) => streams.push(params));
    firstWarmth = server.next(WARMTH_METHOD);
    session = new AskSession(server, view, () => void statusBar.refresh());
    session.listen();
    statusBar = new StatusBarController(server, { show: (summary) => shown.push(summary) });
    statusBar.listen();
    connection.listen();

    const rootUri = `file://${workspace}`;
    init = await connection.sendRequest(InitializeRequest.type, {
      processId: process.pid, rootUri, capabilities: {
        ...capabilities, general: { positionEncodings: ['utf-16'] },
        experimental: EXPERIMENTAL_CAPABILITIES, // as the extension's client declares it (languageClient.ts)
      },
      workspaceFolders: [{ uri: rootUri, name: 'ws' }], initializationOptions: serverSettings(manifest, read),
      clientInfo: { name: 'codectx e2e (vscode-languageserver-protocol)' },
    });
    await connection.sendNotification('initialized', {});
  }, LIMIT);

  after(async () => {
    if (child.exitCode === null) {
      child.kill();
    }
    process.stderr.write(`--- server stderr ---\n${stderr}\n`);
  });

  test('initialize: hover, the server commands, UTF-16; no command id shared with the extension', LIMIT, () => {
    assert.equal(init.capabilities.hoverProvider, true);
    assert.equal(init.capabilities.positionEncoding, 'utf-16');
    const commands = init.capabilities.executeCommandProvider?.commands ?? [];
    for (const command of Object.values(ServerCommand)) {
      assert.ok(commands.includes(command), `server lacks ${command}`);
    }
    assert.deepEqual(commands.filter((id) => (Object.values(ClientCommand) as string[]).includes(id)), []);
  });

  test('ask streams codectx/stream into the view; the text equals the result', LIMIT, async () => {
    const outcome = await session.run({ question: QUESTION });
    assert.equal(outcome.kind, 'answered', JSON.stringify(outcome));
    if (outcome.kind !== 'answered') return;
    assert.ok(outcome.result.text.length > 0);
    assert.equal(view.text, outcome.result.text);
    assert.ok(outcome.result.metrics.decode_tokens >= 1 && outcome.result.metrics.decode_tokens <= 12);
    const done = streams.filter((s) => s.done);
    assert.deepEqual(done.map((s) => s.finishReason), [outcome.result.finishReason]);
    // The $/progress reports the extension keeps out of VS Code's progress UI are exactly the deltas.
    const deltas = [...progress].map(([token, values]) => values.filter((value) => isAnswerDelta(value, token))
      .map((v) => (v as any).message).join(''));
    assert.ok(deltas.includes(outcome.result.text), JSON.stringify(deltas));
  });

  test('the load progress reaches VS Code whole: its stages and the scan, without answer deltas', LIMIT, () => {
    const loads = [...progress].filter(([token]) => String(token).startsWith('codectx-load-'));
    assert.equal(loads.length, 1, JSON.stringify([...progress.keys()]));
    const [token, values] = loads[0];
    assert.deepEqual(values.filter((value) => isAnswerDelta(value, token)), []);
    const reports = values.filter((value) => value.kind === 'report').map((value) => (value as any).message as string);
    assert.ok(reports.some((message) => message.startsWith(`scanning ${workspace}`)), JSON.stringify(reports));
    assert.equal(values.at(-1)?.kind, 'end');
  });

  test('the settings were accepted: answered once through workspace/configuration, no warning', LIMIT, () => {
    assert.equal(configurationAnswers.length, 1);
    assert.deepEqual(messages.filter((m) => m.type <= 2), []);
  });

  test('hover on a call shows the definition', LIMIT, async () => {
    const uri = `file://${workspace}/main.py`;
    await connection.sendNotification('textDocument/didOpen', {
      textDocument: { uri, languageId: 'python', version: 1, text: MAIN },
    });
    const line = MAIN.split('\n')[4];
    const hover: any = await connection.sendRequest('textDocument/hover', {
      textDocument: { uri }, position: { line: 4, character: line.indexOf('add(') + 1 },
    });
    assert.equal(hover.contents.kind, 'markdown');
    assert.ok(hover.contents.value.startsWith('**add** (function, `util.py:4`)'), hover.contents.value);
    assert.ok(hover.contents.value.includes('def add(a, b):'));
  });

  test('Stop cancels a running ask ($/cancelRequest); the next ask answers as before', LIMIT, async () => {
    const reference = view.outcomes[0];
    streams.length = 0;
    const firstText = view.nextText();
    const streamEnd = server.next<StreamParams>(STREAM_METHOD, (s) => s.done);
    const running = session.run({ question: ENDLESS, maxTokens: LONG });
    await firstText;
    await session.stop();
    assert.deepEqual(await running, { kind: 'cancelled' });
    assert.equal((await streamEnd).finishReason, 'cancelled');
    const after = await session.run({ question: QUESTION });
    assert.equal(after.kind, 'answered');
    assert.equal((after as any).result.text, (reference as any).result.text);
    const status = await statusBar.refresh();
    assert.equal(status?.counters.cancelled, 1);
    // The engine also counts hover preparations (hover.prefetch) that interactive requests interrupted.
    assert.ok((status?.engine as any).requests_cancelled >= 1);
    assert.ok((status?.engine as any).decode_tokens < 3 * 12 + LONG);
  });

  test('the status bar follows codectx.status and codectx/warmth', LIMIT, async () => {
    const before = await statusBar.refresh();
    await firstWarmth; // sent after the first finished warm-up; it may have come already
    const status = await statusBar.refresh();
    assert.ok(before !== undefined);
    assert.ok(status?.ready);
    assert.ok((status?.warmup?.runs ?? 0) >= 1);
    const model = path.basename(required('CODECTX_TEST_MODEL'));
    const last = shown.at(-1)!;
    assert.deepEqual(last, describeStatus(status));
    assert.match(last.text, new RegExp(`^\\$\\(database\\) ${model} · warm \\d+% · \\d+(\\.\\dk)? tok · TTFT \\d+\\.\\d\\ds$`));
  });

  test('show context returns the layout as markdown', LIMIT, async () => {
    const layout = await executeCommand<ContextLayout>(server, ServerCommand.showContext);
    assert.ok(layout.markdown.startsWith('# codectx context'));
    assert.ok(layout.segments.some((s) => s.key.endsWith('util.py')));
  });

  test('a change the server keeps until a restart: no notice from the server (the extension offers it)', LIMIT,
    async () => {
      const before = read;
      const changed: Record<string, unknown> = { 'compute.forward': 'mlx', 'hover.maxTokens': 'many' };
      read = (key) => (key in changed ? changed[key] : before(key));
      // The server sends a restart notice before its settings problems: once the second is here, so is the first.
      const problems = server.next<ShowMessageParams>(ShowMessageNotification.method,
        (params) => params.message.includes('invalid settings'));
      await connection.sendNotification('workspace/didChangeConfiguration', { settings: null });
      assert.match((await problems).message, /hover\.maxTokens/);
      assert.deepEqual(messages.filter((m) => m.message.includes('restart')), []);
    });

  test('shutdown and exit end the server with status 0', LIMIT, async () => {
    await connection.sendRequest('shutdown');
    const exited = once(child, 'exit');
    await connection.sendNotification('exit');
    const [code] = await exited;
    assert.equal(code, 0);
    connection.dispose();
  });
});
