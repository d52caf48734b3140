/**
 * The extension's connection to the server across restarts, failed starts and crashes.
 *
 * A vscode-languageclient `LanguageClient` cannot start again once a start has failed, so
 * every start builds a new client (which also reads the current settings) and disposes the
 * one before. A start that fails is reported once, with what the server wrote last, and not
 * retried. A server that stops while running is started again, unless that happened more
 * than `MAX_RESTARTS` times in `RESTART_WINDOW_MS`; then it is reported and left stopped.
 * Notification handlers and state listeners stay registered across clients.
 */
import { CancellationToken, Disposable } from 'vscode-languageserver-protocol';

import type { ServerConnection, ServerState } from './protocol';
import type { ServerExit } from './serverProcess';

/** One client and its server: it is started once (`languageClient.ts` builds them). */
export interface ManagedClient extends ServerConnection {
  start(): Promise<void>;
  /** Stops the server if it runs and releases the client; never rejects. */
  dispose(): Promise<void>;
  onDidChangeState(listener: (state: ServerState) => void): Disposable;
  /** How its server process ended and what it wrote last (waits a little for it to close). */
  exit(): Promise<ServerExit>;
}

export interface ServerClientOptions {
  /** Builds a client with the settings current now. */
  create(): ManagedClient;
  /** Tells the user (an error message). */
  report(message: string): void;
  /** Writes to the output channel. */
  log(message: string): void;
  /** The clock of the crash count (tests). */
  now?(): number;
}

export const MAX_RESTARTS = 4;
export const RESTART_WINDOW_MS = 3 * 60 * 1000;
const START_HINT = '(codectx.server.command, codectx.server.pythonPath and codectx.server.args choose how it starts)';

/** `exit code 2: line | line`, or as much of it as is known. */
export function describeExit(exit: ServerExit): string {
  const lines = exit.lastLines.join(' | ');
  return [exit.how, lines].filter(Boolean).join(': ');
}

/** The one message about a start that failed: the server's own words when it wrote or exited. */
export function startFailure(error: unknown, exit: ServerExit): string {
  if (exit.how !== undefined || exit.lastLines.length > 0) {
    return `codectx: the server stopped while starting (${describeExit(exit)}) ${START_HINT}`;
  }
  return `codectx: ${error instanceof Error ? error.message : String(error)} ${START_HINT}`;
}

/** A `ServerConnection` over whichever client runs now. */
export class ServerClient implements ServerConnection, Disposable {
  private client: ManagedClient | undefined;
  private subscriptions: Disposable[] = [];
  private readonly handlers = new Map<string, Set<(params: any) => void>>();
  private readonly stateListeners = new Set<(state: ServerState) => void>();
  private state: ServerState = 'stopped';
  private crashes: number[] = [];
  private queue: Promise<unknown> = Promise.resolve();

  constructor(private readonly options: ServerClientOptions) {}

  sendRequest<R>(method: string, params: unknown, token?: CancellationToken): Promise<R> {
    const client = this.client;
    if (client === undefined) {
      return Promise.reject(new Error('the codectx server is not running'));
    }
    return token ? client.sendRequest<R>(method, params, token) : client.sendRequest<R>(method, params);
  }

  onNotification(method: string, handler: (params: any) => void): Disposable {
    let set = this.handlers.get(method);
    if (set === undefined) {
      set = new Set();
      this.handlers.set(method, set);
      if (this.client !== undefined) {
        this.subscriptions.push(this.forward(this.client, method, set));
      }
    }
    const handlers = set;
    handlers.add(handler);
    return Disposable.create(() => handlers.delete(handler));
  }

  onDidChangeState(listener: (state: ServerState) => void): Disposable {
    this.stateListeners.add(listener);
    return Disposable.create(() => this.stateListeners.delete(listener));
  }

  /**
   * Starts the server with a new client (a running one is stopped first).
   *
   * @returns Whether it runs; a failed start has been reported.
   */
  start(): Promise<boolean> {
    return this.serial(() => this.startNow());
  }

  /** What "Restart server" does: a start that also forgets earlier crashes. */
  restart(): Promise<boolean> {
    return this.serial(() => {
      this.crashes = [];
      return this.startNow();
    });
  }

  /** Stops the server and releases the client. */
  stop(): Promise<void> {
    return this.serial(() => this.release());
  }

  dispose(): void {
    void this.stop();
  }

  private async startNow(): Promise<boolean> {
    await this.release();
    const client = this.options.create();
    this.client = client;
    this.subscriptions = [...this.handlers].map(([method, set]) => this.forward(client, method, set));
    this.subscriptions.push(client.onDidChangeState((state) => this.clientState(client, state)));
    try {
      await client.start();
      return true;
    } catch (err) {
      if (this.client === client) {
        this.options.report(startFailure(err, await client.exit()));
        await this.release();
      }
      return false;
    }
  }

  private async release(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    this.subscriptions.splice(0).forEach((subscription) => subscription.dispose());
    this.setState('stopped');
    await client?.dispose();
  }

  private clientState(client: ManagedClient, state: ServerState): void {
    const was = this.state;
    this.setState(state);
    if (state === 'stopped' && was === 'running') {
      void this.serial(() => this.crashed(client));
    }
  }

  /** The server stopped while running: start it again, unless it keeps stopping. */
  private async crashed(client: ManagedClient): Promise<void> {
    if (this.client !== client) {
      return; // restarted or stopped meanwhile
    }
    const now = this.options.now?.() ?? Date.now();
    this.crashes = [...this.crashes.filter((time) => now - time < RESTART_WINDOW_MS), now];
    const exit = describeExit(await client.exit()) || 'no output';
    if (this.crashes.length > MAX_RESTARTS) {
      this.options.report(`codectx: the server stopped ${this.crashes.length} times in ${RESTART_WINDOW_MS / 60_000} `
        + `minutes and is not started again; codectx: Restart server starts it (${exit})`);
      await this.release();
      return;
    }
    this.options.log(`the server stopped (${exit}); starting it again`);
    await this.startNow();
  }

  private forward(client: ManagedClient, method: string, handlers: Set<(params: any) => void>): Disposable {
    return client.onNotification(method, (params) => handlers.forEach((handler) => handler(params)));
  }

  private setState(state: ServerState): void {
    if (state !== this.state) {
      this.state = state;
      this.stateListeners.forEach((listener) => listener(state));
    }
  }

  /** Starts, restarts and stops one after another (a second restart waits for the first). */
  private serial<T>(operation: () => Promise<T>): Promise<T> {
    const next = this.queue.then(operation, operation);
    this.queue = next.catch(() => undefined);
    return next;
  }
}
