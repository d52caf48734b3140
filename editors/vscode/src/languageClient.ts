/**
 * The vscode-languageclient `LanguageClient` for `codectx serve` over stdio, one per start
 * (`ServerClient` builds a new one for each).
 *
 * Settings go to the server as `initializationOptions` and as the answer to
 * `workspace/configuration` (both built by `config.ts` from the same settings), the
 * server's log (stderr) and the `codectx.trace.server` trace go to one log channel.
 * The client never restarts the server itself and shows no message of its own when a start
 * fails: `ServerClient` restarts a server that stopped while running and reports a start
 * that failed once, with the end of the server's stderr (`StderrTail`).
 */
import * as vscode from 'vscode';
import type { CancellationToken } from 'vscode-languageserver-protocol';
import {
  CloseAction, ErrorAction, ErrorHandler, LanguageClient, LanguageClientOptions, ServerOptions, State, StaticFeature,
} from 'vscode-languageclient/node';

import { configurationAnswer, Manifest, SECTION, serverLaunch, serverSettings } from './config';
import { isAnswerDelta } from './progress';
import { AskArgs, EXPERIMENTAL_CAPABILITIES, ServerCommand, ServerState } from './protocol';
import type { ManagedClient } from './serverClient';
import { startServerProcess, StderrTail } from './serverProcess';
import { settingsReader } from './vscodeHost';

/** What the client hands over to the rest of the extension. */
export interface ClientHooks {
  /** Runs `codectx.ask` commands (from code actions) in the ask panel. */
  ask(args: AskArgs): Promise<unknown>;
  /** A server progress ended (the model loaded, an ask finished). */
  progressEnded(): void;
}

const STATES: Record<State, ServerState> = {
  [State.Starting]: 'starting',
  [State.Running]: 'running',
  [State.Stopped]: 'stopped',
};

/** Connection errors and the close stay in the log; `ServerClient` acts on the stop that follows. */
const ERROR_HANDLER: ErrorHandler = {
  error: (_error, _message, count) => ({
    action: count !== undefined && count <= 3 ? ErrorAction.Continue : ErrorAction.Shutdown, handled: true,
  }),
  closed: () => ({ action: CloseAction.DoNotRestart, message: 'the codectx server exited', handled: true }),
};

/**
 * Tells the server that the extension offers the restart itself when settings the running server keeps change
 * (`offerRestart`), so the server sends no notice of its own (`EXPERIMENTAL_CAPABILITIES`).
 */
const RESTART_OFFER: StaticFeature = {
  fillClientCapabilities: (capabilities) => {
    capabilities.experimental = { ...(capabilities.experimental as object | undefined), ...EXPERIMENTAL_CAPABILITIES };
  },
  initialize: () => undefined,
  getState: () => ({ kind: 'static' }),
  clear: () => undefined,
};

/** A `LanguageClient` that leaves the messages about a failed start to `ServerClient`. */
class CodectxLanguageClient extends LanguageClient {
  private starting = 0;

  override async start(): Promise<void> {
    this.starting += 1;
    try {
      await super.start();
    } finally {
      this.starting -= 1;
    }
  }

  override error(message: string, data?: unknown, showNotification: boolean | 'force' = true): void {
    super.error(message, data, this.starting > 0 ? false : showNotification);
  }

  override stop(timeout?: number): Promise<void> {
    // vscode-languageclient rejects a stop while a start fails or after it failed (its own stop
    // after a failed initialize would be an unhandled rejection); nothing runs then.
    return this.isRunning() || this.needsStart() ? super.stop(timeout) : Promise.resolve();
  }
}

/** Builds a client; `start()` launches the server with the settings current at that time. */
export function createLanguageClient(manifest: Manifest, log: vscode.LogOutputChannel, hooks: ClientHooks): ManagedClient {
  const stderr = new StderrTail();
  const serverOptions: ServerOptions = async () => {
    const launch = serverLaunch(settingsReader());
    log.info(`starting ${[launch.command, ...launch.args].join(' ')}`);
    const child = await startServerProcess(launch, vscode.workspace.workspaceFolders?.[0]?.uri.fsPath);
    stderr.follow(child);
    return child;
  };
  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: 'file' }],
    outputChannel: log,
    traceOutputChannel: log,
    initializationOptions: () => serverSettings(manifest, settingsReader()),
    synchronize: { configurationSection: SECTION },
    errorHandler: ERROR_HANDLER,
    initializationFailedHandler: () => false, // no retry, no message: ServerClient reports it
    middleware: {
      workspace: {
        configuration: (params) => configurationAnswer(manifest, params.items, settingsReader),
      },
      handleWorkDoneProgress: (token, params, next) => {
        if (!isAnswerDelta(params, token)) {
          next(token, params);
        }
        if (params.kind === 'end') {
          hooks.progressEnded();
        }
      },
      executeCommand: (command, args, next) => (
        command === ServerCommand.ask && args.length === 1 ? hooks.ask(args[0] as AskArgs) : next(command, args)),
    },
  };
  const client = new CodectxLanguageClient(SECTION, 'codectx', serverOptions, clientOptions);
  client.registerFeature(RESTART_OFFER);
  return {
    start: async () => {
      await client.start();
      if (!client.isRunning()) {
        // A server that exits during start-up: vscode-languageclient's start() resolves then.
        throw new Error('the server stopped while starting');
      }
    },
    dispose: async () => {
      const running = client.isRunning();
      await client.dispose().catch((err: unknown) => log.warn(`stopping the server: ${String(err)}`));
      if (!running) {
        stderr.kill(); // left over from a failed start
      }
    },
    sendRequest: <R>(method: string, params: unknown, token?: CancellationToken) => (
      token ? client.sendRequest<R>(method, params, token) : client.sendRequest<R>(method, params)),
    onNotification: (method, handler) => client.onNotification(method, handler),
    onDidChangeState: (listener) => client.onDidChangeState(({ newState }) => listener(STATES[newState])),
    exit: () => stderr.exit(),
  };
}
