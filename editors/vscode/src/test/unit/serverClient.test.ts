import * as assert from 'node:assert/strict';
import { test } from 'node:test';

import { ServerState, STREAM_METHOD } from '../../protocol';
import { ManagedClient, MAX_RESTARTS, RESTART_WINDOW_MS, ServerClient } from '../../serverClient';
import { ServerExit, startServerProcess, StderrTail } from '../../serverProcess';
import { FakeConnection } from '../fakes';

/** A client whose start the test scripts: it fails with `failure`, or runs. */
class FakeClient extends FakeConnection implements ManagedClient {
  starts = 0;
  disposed = false;

  constructor(private readonly failure?: Error, private readonly ended: ServerExit = { lastLines: [] }) {
    super();
  }

  async start(): Promise<void> {
    this.starts += 1;
    this.changeState('starting');
    if (this.failure !== undefined) {
      this.changeState('stopped');
      throw this.failure;
    }
    this.changeState('running');
  }

  async dispose(): Promise<void> {
    this.disposed = true;
  }

  async exit(): Promise<ServerExit> {
    return this.ended;
  }
}

/** A ServerClient over scripted clients (the next one built is `script.shift()`), recording what it says. */
function setup(...script: FakeClient[]) {
  const created: FakeClient[] = [];
  const reports: string[] = [];
  const logs: string[] = [];
  const states: ServerState[] = [];
  let clock = 0;
  let wake: (() => void) | undefined;
  const server = new ServerClient({
    create: () => {
      const client = script.shift() ?? new FakeClient();
      created.push(client);
      wake?.();
      return client;
    },
    report: (message) => reports.push(message),
    log: (message) => logs.push(message),
    now: () => clock,
  });
  server.onDidChangeState((state) => states.push(state));
  /** Resolves once `count` clients have been built. */
  async function clients(count: number): Promise<FakeClient[]> {
    while (created.length < count) {
      await new Promise<void>((resolve) => { wake = resolve; });
    }
    return created;
  }
  return { server, created, reports, logs, states, clients, advance: (ms: number) => { clock += ms; } };
}

const NO_MODULE: ServerExit = {
  how: 'exit code 1',
  lastLines: ['  File "<frozen runpy>", line 88, in _run_code', "ModuleNotFoundError: No module named 'lsprotocol'"],
};

test('a server that exits while starting is reported once, with its last words, and not started again', async () => {
  const { server, created, reports, states } = setup(
    new FakeClient(new Error('Pending response rejected since connection got disposed'), NO_MODULE));
  assert.equal(await server.start(), false);
  assert.equal(created.length, 1);
  assert.equal(created[0].starts, 1);
  assert.equal(created[0].disposed, true);
  assert.equal(reports.length, 1);
  assert.match(reports[0],
    /^codectx: the server stopped while starting \(exit code 1: .* \| ModuleNotFoundError: No module named 'lsprotocol'\)/);
  assert.doesNotMatch(reports[0], /Pending response/);
  assert.deepEqual(states, ['starting', 'stopped']);
  await assert.rejects(server.sendRequest('workspace/executeCommand', {}), /not running/);
});

test('a command that cannot run is reported with the error and where to set it', async () => {
  const { server, reports } = setup(new FakeClient(
    new Error("cannot start the codectx server '/nonexistent/codectx serve': spawn /nonexistent/codectx ENOENT")));
  assert.equal(await server.start(), false);
  assert.deepEqual(reports, ["codectx: cannot start the codectx server '/nonexistent/codectx serve': spawn /nonexistent/codectx "
    + 'ENOENT (codectx.server.command, codectx.server.pythonPath and codectx.server.args choose how it starts)']);
});

test('Restart server after a failed start builds a new client, which gets the requests and notifications', async () => {
  const { server, created, reports, states } = setup(new FakeClient(new Error('spawn /nonexistent/codectx ENOENT')));
  const streamed: unknown[] = [];
  server.onNotification(STREAM_METHOD, (params) => streamed.push(params));
  assert.equal(await server.start(), false);
  assert.equal(await server.restart(), true);
  assert.equal(created.length, 2);
  assert.equal(created[1].starts, 1);
  assert.equal(reports.length, 1);
  assert.deepEqual(states, ['starting', 'stopped', 'starting', 'running']);
  created[0].notify(STREAM_METHOD, { text: 'from the failed client' });
  created[1].notify(STREAM_METHOD, { text: 'from the new client' });
  assert.deepEqual(streamed, [{ text: 'from the new client' }]);
  const answer = server.sendRequest('workspace/executeCommand', { command: 'codectx.status', arguments: [] });
  (await created[1].requests(1))[0].resolve({ ready: true });
  assert.deepEqual(await answer, { ready: true });
  assert.equal(created[0].sent.length, 0);
});

test('Restart server stops the running server before it starts the next', async () => {
  const { server, created, states } = setup();
  assert.equal(await server.start(), true);
  assert.equal(await server.restart(), true);
  assert.equal(created[0].disposed, true);
  assert.equal(created[1].disposed, false);
  assert.deepEqual(states, ['starting', 'running', 'stopped', 'starting', 'running']);
  await server.stop();
  assert.equal(created[1].disposed, true);
  assert.equal(states.at(-1), 'stopped');
});

test('a server that stops while running is started again, until it stopped too often; then it is reported', async () => {
  const { server, created, reports, logs, states, clients, advance } = setup();
  await server.start();
  for (let crash = 1; crash <= MAX_RESTARTS; crash += 1) {
    created[crash - 1].changeState('stopped');
    await clients(crash + 1);
    advance(1000);
  }
  assert.equal(logs.length, MAX_RESTARTS);
  assert.equal(reports.length, 0);
  advance(RESTART_WINDOW_MS); // the crashes so far are out of the window
  for (let crash = 0; crash < MAX_RESTARTS; crash += 1) {
    created.at(-1)!.changeState('stopped');
    await clients(MAX_RESTARTS + 2 + crash);
  }
  assert.equal(reports.length, 0);
  const last = created.at(-1)!;
  last.changeState('stopped');
  await server.stop(); // runs after the crash is handled
  assert.equal(created.length, 2 * MAX_RESTARTS + 1);
  assert.ok(last.disposed);
  assert.deepEqual(reports, [`codectx: the server stopped ${MAX_RESTARTS + 1} times in 3 minutes and is not started again; `
    + 'codectx: Restart server starts it (no output)']);
  assert.equal(states.at(-1), 'stopped');
});

test('StderrTail keeps the last lines of the process it follows and how it ended', async () => {
  const script = "process.stderr.write('usage: codectx serve [-h]\\n\\ncodectx serve: error: unrecognized arguments: '); "
    + "process.stderr.write('--bogus\\n'); process.exit(2)";
  const tail = new StderrTail();
  const child = await startServerProcess({ command: process.execPath, args: ['-e', script], env: {} });
  tail.follow(child);
  assert.deepEqual(await tail.exit(60_000), {
    how: 'exit code 2', lastLines: ['usage: codectx serve [-h]', 'codectx serve: error: unrecognized arguments: --bogus'],
  });
  tail.kill(); // ended already: nothing to do
});

test('StderrTail ends a process left running and forgets the one before', async () => {
  const tail = new StderrTail();
  const first = await startServerProcess({ command: process.execPath, args: ['-e', "console.error('first'); process.exit(3)"], env: {} });
  tail.follow(first);
  assert.equal((await tail.exit(60_000)).how, 'exit code 3');
  const second = await startServerProcess({
    command: process.execPath, args: ['-e', "console.error('one'); console.error('two'); setInterval(() => undefined, 1000)"], env: {},
  });
  tail.follow(second);
  await new Promise<void>((resolve) => {
    let text = '';
    second.stderr!.on('data', (chunk: Buffer) => { text += chunk.toString(); if (text.includes('two')) resolve(); });
  });
  tail.kill();
  assert.deepEqual(await tail.exit(60_000), { how: 'signal SIGTERM', lastLines: ['one', 'two'] });
});
