/**
 * Activation: connects the server client, the ask panel, the status bar and the
 * commands. Every disposable goes into `context.subscriptions`.
 */
import * as vscode from 'vscode';

import { AskSession } from './ask';
import { AskPanel } from './askPanel';
import { ClientCommand, CommandContext, commandHandlers, offerRestart } from './commands';
import { loadManifest } from './config';
import { createLanguageClient } from './languageClient';
import { ServerClient } from './serverClient';
import { StatusBarController } from './statusBar';
import { StatusBarItemView, VscodeEditorHost } from './vscodeHost';

let client: ServerClient | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const log = vscode.window.createOutputChannel('codectx', { log: true });
  const host = new VscodeEditorHost();
  const statusView = new StatusBarItemView(ClientCommand.showStatus);
  const panel = new AskPanel(() => void ask.stop());
  const manifest = loadManifest(context.extensionPath);
  const server = new ServerClient({
    create: () => createLanguageClient(manifest, log, {
      ask: (args) => ask.run(args),
      progressEnded: () => void status.refresh(),
    }),
    report: (message) => host.error(message),
    log: (message) => log.info(message),
  });
  const ask: AskSession = new AskSession(server, panel, () => void status.refresh());
  const status: StatusBarController = new StatusBarController(server, statusView);
  client = server;
  context.subscriptions.push(log, host, statusView, panel, server, ask.listen(), status.listen());

  const ctx: CommandContext = {
    host, server, ask, status, restart: async () => { await server.restart(); },
  };
  const reportError = (err: unknown) => host.error(`codectx: ${err instanceof Error ? err.message : String(err)}`);
  for (const [id, handler] of Object.entries(commandHandlers(ctx))) {
    context.subscriptions.push(vscode.commands.registerCommand(id, (...args: unknown[]) => handler(...args).catch(reportError)));
  }
  context.subscriptions.push(vscode.workspace.onDidChangeConfiguration(
    (event) => offerRestart(ctx, (section) => event.affectsConfiguration(section)).catch(reportError)));

  await server.start(); // a failed start has been reported; the status bar shows the server stopped
}

export async function deactivate(): Promise<void> {
  await client?.stop();
  client = undefined;
}
