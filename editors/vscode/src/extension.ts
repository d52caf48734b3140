/**
 * Activation: connects the language client, the ask panel, the status bar and the
 * commands. Every disposable goes into `context.subscriptions`.
 */
import * as vscode from 'vscode';
import type { LanguageClient } from 'vscode-languageclient/node';

import { AskSession } from './ask';
import { AskPanel } from './askPanel';
import { ClientCommand, commandHandlers } from './commands';
import { loadManifest, SECTION } from './config';
import { createLanguageClient } from './languageClient';
import { StatusBarController } from './statusBar';
import { StatusBarItemView, VscodeEditorHost } from './vscodeHost';

let client: LanguageClient | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const log = vscode.window.createOutputChannel('codectx', { log: true });
  const host = new VscodeEditorHost();
  const statusView = new StatusBarItemView(ClientCommand.showStatus);
  const panel = new AskPanel(() => void ask.stop());
  const languageClient = createLanguageClient(loadManifest(context.extensionPath), log, {
    ask: (args) => ask.run(args),
    progressEnded: () => void status.refresh(),
  });
  const ask: AskSession = new AskSession(languageClient, panel, () => void status.refresh());
  const status: StatusBarController = new StatusBarController(languageClient, statusView);
  client = languageClient;
  context.subscriptions.push(log, host, statusView, panel, languageClient, ask.listen(), status.listen());

  const handlers = commandHandlers({
    host, server: languageClient, ask, status, restart: () => languageClient.restart(),
  });
  for (const [id, handler] of Object.entries(handlers)) {
    context.subscriptions.push(vscode.commands.registerCommand(id, (...args: unknown[]) => handler(...args).catch(
      (err: unknown) => host.error(`codectx: ${err instanceof Error ? err.message : String(err)}`))));
  }
  context.subscriptions.push(vscode.workspace.onDidChangeConfiguration(async (event) => {
    if (event.affectsConfiguration(`${SECTION}.server`)) {
      const choice = await vscode.window.showInformationMessage(
        'codectx: the server command changed.', 'Restart server');
      if (choice) {
        await vscode.commands.executeCommand(ClientCommand.restartServer);
      }
    }
  }));

  try {
    await languageClient.start();
  } catch (err) {
    host.error(`codectx: ${err instanceof Error ? err.message : String(err)} `
      + '(set codectx.server.command or codectx.server.pythonPath)');
    return;
  }
  await status.refresh();
}

export async function deactivate(): Promise<void> {
  await client?.stop();
  client = undefined;
}
