/**
 * The ask panel: a webview beside the editor that shows the question, the answer as it
 * streams, a footer with the request's metrics, and a Stop button.
 */
import * as vscode from 'vscode';

import type { AskOutcome, AskView } from './ask';
import { askPanelHtml, endMessage, makeNonce, PageMessage, PanelMessage } from './askHtml';

const VIEW_TYPE = 'codectx.ask';
const ASKING_CONTEXT = 'codectx.asking';

/** The `AskView` of the extension; the panel is created on the first ask and reused. */
export class AskPanel implements AskView, vscode.Disposable {
  private panel: vscode.WebviewPanel | undefined;

  /** @param onStop Called when the user presses Stop. */
  constructor(private readonly onStop: () => void) {}

  begin(question: string): void {
    this.open();
    void vscode.commands.executeCommand('setContext', ASKING_CONTEXT, true);
    this.post({ type: 'begin', question });
  }

  append(text: string): void {
    this.post({ type: 'append', text });
  }

  end(outcome: AskOutcome): void {
    void vscode.commands.executeCommand('setContext', ASKING_CONTEXT, false);
    this.post(endMessage(outcome));
  }

  dispose(): void {
    this.panel?.dispose();
  }

  private open(): void {
    if (this.panel !== undefined) {
      this.panel.reveal(vscode.ViewColumn.Beside, true);
      return;
    }
    const panel = vscode.window.createWebviewPanel(VIEW_TYPE, 'codectx', { viewColumn: vscode.ViewColumn.Beside, preserveFocus: true },
      { enableScripts: true, retainContextWhenHidden: true, localResourceRoots: [] });
    panel.webview.html = askPanelHtml(makeNonce(), panel.webview.cspSource);
    panel.webview.onDidReceiveMessage((message: PageMessage) => {
      if (message.type === 'stop') {
        this.onStop();
      }
    });
    panel.onDidDispose(() => {
      this.panel = undefined;
      this.onStop();
    });
    this.panel = panel;
  }

  private post(message: PanelMessage): void {
    void this.panel?.webview.postMessage(message);
  }
}
