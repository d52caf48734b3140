/**
 * The vscode-languageclient `LanguageClient` for `codectx serve` over stdio.
 *
 * Settings go to the server as `initializationOptions` and as the answer to
 * `workspace/configuration` (both built by `config.ts` from the same settings), the
 * server's log (stderr) and the `codectx.trace.server` trace go to one log channel.
 */
import * as vscode from 'vscode';
import { LanguageClient, LanguageClientOptions, ServerOptions } from 'vscode-languageclient/node';

import { configurationAnswer, Manifest, SECTION, serverLaunch, serverSettings } from './config';
import { isAnswerDelta } from './progress';
import { AskArgs, ServerCommand } from './protocol';
import { startServerProcess } from './serverProcess';
import { settingsReader } from './vscodeHost';

/** What the client hands over to the rest of the extension. */
export interface ClientHooks {
  /** Runs `codectx.ask` commands (from code actions) in the ask panel. */
  ask(args: AskArgs): Promise<unknown>;
  /** A server progress ended (the model loaded, an ask finished). */
  progressEnded(): void;
}

/** Builds the client; `start()` launches the server with the settings current at that time. */
export function createLanguageClient(manifest: Manifest, log: vscode.LogOutputChannel, hooks: ClientHooks): LanguageClient {
  const serverOptions: ServerOptions = async () => {
    const launch = serverLaunch(settingsReader());
    log.info(`starting ${[launch.command, ...launch.args].join(' ')}`);
    return startServerProcess(launch, vscode.workspace.workspaceFolders?.[0]?.uri.fsPath);
  };
  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: 'file' }],
    outputChannel: log,
    traceOutputChannel: log,
    initializationOptions: () => serverSettings(manifest, settingsReader()),
    synchronize: { configurationSection: SECTION },
    middleware: {
      workspace: {
        configuration: (params) => configurationAnswer(manifest, params.items, settingsReader),
      },
      handleWorkDoneProgress: (token, params, next) => {
        if (!isAnswerDelta(params)) {
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
  return new LanguageClient(SECTION, 'codectx', serverOptions, clientOptions);
}
