/**
 * The VS Code API behind the small interfaces the client modules use (`EditorHost`,
 * `StatusView`, `SettingsReader`), so those modules run and are tested in plain Node.
 */
import * as vscode from 'vscode';

import type { EditorHost, Selection } from './commands';
import { SECTION, SettingsReader } from './config';
import type { StatusSummary, StatusView } from './statusBar';

const DOCUMENT_SCHEME = 'codectx';

/** Reads `codectx.*` settings for a resource (or the window). */
export function settingsReader(scopeUri?: string): SettingsReader {
  const configuration = vscode.workspace.getConfiguration(SECTION, scopeUri ? vscode.Uri.parse(scopeUri) : undefined);
  return (key) => configuration.get(key);
}

/** Messages, input, the active selection and read-only markdown documents. */
export class VscodeEditorHost implements EditorHost, vscode.Disposable {
  private readonly documents = new Map<string, string>();
  private readonly changed = new vscode.EventEmitter<vscode.Uri>();
  private readonly registration: vscode.Disposable;

  constructor() {
    this.registration = vscode.workspace.registerTextDocumentContentProvider(DOCUMENT_SCHEME, {
      onDidChange: this.changed.event,
      provideTextDocumentContent: (uri) => this.documents.get(uri.toString()) ?? '',
    });
  }

  askQuestion(prompt: string): Promise<string | undefined> {
    return Promise.resolve(vscode.window.showInputBox({ prompt, ignoreFocusOut: true }));
  }

  selection(): Selection | undefined {
    const editor = vscode.window.activeTextEditor;
    if (editor === undefined || editor.selection.isEmpty) {
      return undefined;
    }
    const { start, end } = editor.selection;
    return {
      uri: editor.document.uri.toString(),
      range: { start: { line: start.line, character: start.character }, end: { line: end.line, character: end.character } },
    };
  }

  async openMarkdown(name: string, text: string): Promise<void> {
    const uri = vscode.Uri.from({ scheme: DOCUMENT_SCHEME, path: `/${name}` });
    this.documents.set(uri.toString(), text);
    this.changed.fire(uri);
    const document = await vscode.workspace.openTextDocument(uri);
    await vscode.languages.setTextDocumentLanguage(document, 'markdown');
    await vscode.window.showTextDocument(document, { preview: true });
  }

  info(message: string): void {
    void vscode.window.showInformationMessage(message);
  }

  error(message: string): void {
    void vscode.window.showErrorMessage(message);
  }

  async offer(message: string, action: string): Promise<boolean> {
    return (await vscode.window.showInformationMessage(message, action)) === action;
  }

  dispose(): void {
    this.registration.dispose();
    this.changed.dispose();
  }
}

/** A status bar item that shows `StatusSummary`s and opens the Status command on click. */
export class StatusBarItemView implements StatusView, vscode.Disposable {
  private readonly item = vscode.window.createStatusBarItem('codectx.status', vscode.StatusBarAlignment.Right, 100);

  constructor(command: string) {
    this.item.name = 'codectx';
    this.item.command = command;
    this.item.show();
  }

  show(summary: StatusSummary): void {
    this.item.text = summary.text;
    this.item.tooltip = summary.tooltip;
  }

  dispose(): void {
    this.item.dispose();
  }
}
