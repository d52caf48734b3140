/**
 * The extension's commands as plain functions over an `EditorHost`.
 *
 * Their ids differ from the server's commands (`codectx.ask`, `codectx.status`, ...):
 * vscode-languageclient registers those as VS Code commands itself.
 * `codectx.askAboutSelection` is also what the server's "Ask about selection" code
 * action resolves to, with `{ uri, range }` (docs/protocol.md). `offerRestart` is what a
 * settings change does.
 */
import type { Range } from 'vscode-languageserver-protocol';

import { AskSession } from './ask';
import { needsRestart, restartGroups, SECTION } from './config';
import { fixed } from './numbers';
import { ContextLayout, executeCommand, ServerCommand, ServerConnection, ServerStatus } from './protocol';
import { cachedTokens, modelLabel, StatusBarController, warmPercent } from './statusBar';

export const ClientCommand = {
  askWorkspace: 'codectx.askWorkspace',
  askAboutSelection: 'codectx.askAboutSelection',
  explainSelection: 'codectx.explainSelection',
  openContext: 'codectx.openContext',
  showStatus: 'codectx.showStatus',
  restartServer: 'codectx.restartServer',
  stopAsk: 'codectx.stopAsk',
} as const;

/** The button of the restart offer after a settings change. */
export const RESTART_ACTION = 'Restart server';

/** The same question the server's "Explain" code action asks. */
export const EXPLAIN_QUESTION = 'Explain the selected code.';

/** A selection in LSP terms (UTF-16 columns, as VS Code counts them). */
export interface Selection {
  uri: string;
  range: Range;
}

/** What the commands need from the editor; `vscodeHost.ts` implements it with the VS Code API. */
export interface EditorHost {
  askQuestion(prompt: string): Promise<string | undefined>;
  selection(): Selection | undefined;
  openMarkdown(name: string, text: string): Promise<void>;
  info(message: string): void;
  error(message: string): void;
  /** Shows `message` with one button; true when it was pressed. */
  offer(message: string, action: string): Promise<boolean>;
}

/** Everything the command handlers act on. */
export interface CommandContext {
  host: EditorHost;
  server: ServerConnection;
  ask: AskSession;
  status: StatusBarController;
  restart(): Promise<void>;
}

/** True for a `{ uri, range }` argument (from the code action). */
export function isSelection(value: unknown): value is Selection {
  const candidate = value as Selection | undefined;
  return typeof candidate?.uri === 'string' && typeof candidate.range?.start?.line === 'number'
    && typeof candidate.range?.end?.line === 'number';
}

/** One line about the server for the Status command. */
export function statusLine(status: ServerStatus): string {
  if (!status.ready && status.loadError) {
    return `codectx: the model did not load: ${status.loadError}`;
  }
  if (!status.ready) {
    return `codectx: loading ${status.model ?? 'the model'}`;
  }
  const seconds = fixed(status.lastMetrics?.ttft_s, 3);
  const ttft = seconds !== undefined ? `${seconds} s` : 'none yet';
  return `codectx: ${modelLabel(status.model)} ready; warm ${warmPercent(status)}% `
    + `(prefix ${status.warmup?.prefixTokens ?? 0} tokens), ${cachedTokens(status)} tokens cached, `
    + `last TTFT ${ttft}; ${status.counters.asks} asks (${status.counters.cancelled} cancelled), `
    + `${status.counters.hovers} hovers`;
}

/** "Restart server": stops the running ask, restarts the server, refreshes the status. */
async function restartServer(ctx: CommandContext): Promise<void> {
  await ctx.ask.stop();
  await ctx.restart();
  await ctx.status.refresh();
}

/**
 * After a settings change: offers a restart when the change needs one (`needsRestart`: how
 * the server starts, the model, how it computes; the running server keeps those).
 *
 * @param affects The change's `affectsConfiguration`.
 */
export async function offerRestart(ctx: CommandContext, affects: (section: string) => boolean): Promise<void> {
  if (!needsRestart(affects)) {
    return;
  }
  const changed = restartGroups(affects).map((group) => `${SECTION}.${group}.*`).join(', ');
  if (await ctx.host.offer(`codectx: ${changed} changed; the server uses the new settings after a restart.`, RESTART_ACTION)) {
    await restartServer(ctx);
  }
}

/** The handlers, keyed by command id. */
export function commandHandlers(ctx: CommandContext): Record<string, (...args: unknown[]) => Promise<unknown>> {
  const { host, server, ask, status } = ctx;

  async function askAbout(selection: Selection | undefined, question: string | undefined): Promise<void> {
    if (selection === undefined) {
      host.error('codectx: select some code first.');
      return;
    }
    if (question) {
      await ask.run({ question, uri: selection.uri, range: selection.range });
    }
  }

  return {
    [ClientCommand.askWorkspace]: async () => {
      const question = await host.askQuestion('Ask codectx about the workspace');
      if (question) {
        await ask.run({ question });
      }
    },
    [ClientCommand.askAboutSelection]: async (arg?: unknown) => {
      const selection = isSelection(arg) ? arg : host.selection();
      await askAbout(selection, selection && await host.askQuestion('Ask codectx about the selection'));
    },
    [ClientCommand.explainSelection]: async () => askAbout(host.selection(), EXPLAIN_QUESTION),
    [ClientCommand.openContext]: async () => {
      const layout = await executeCommand<ContextLayout>(server, ServerCommand.showContext);
      await host.openMarkdown('context.md', layout.markdown);
    },
    [ClientCommand.showStatus]: async () => {
      const current = await status.refresh();
      if (current === undefined) {
        host.error('codectx: the server did not answer; see the codectx output channel.');
      } else {
        host.info(statusLine(current));
      }
    },
    [ClientCommand.restartServer]: async () => restartServer(ctx),
    [ClientCommand.stopAsk]: async () => ask.stop(),
  };
}
