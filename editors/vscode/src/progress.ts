/**
 * Which `$/progress` reports VS Code shows.
 *
 * The server streams each answer delta as a progress report too, on the ask's progress token
 * (`codectx-ask-<n>`, server/lsp/stream.py; docs/protocol.md); the ask panel already shows the
 * text, so those reports are kept out of VS Code's progress notification. Everything else
 * passes: an ask's prefill reports (they have a percentage) and the whole load progress
 * (`codectx-load-<n>`: its stages and the scan's `parsing n/N files` counts have none).
 */
import type {
  ProgressToken, WorkDoneProgressBegin, WorkDoneProgressEnd, WorkDoneProgressReport,
} from 'vscode-languageserver-protocol';

export type ProgressValue = WorkDoneProgressBegin | WorkDoneProgressReport | WorkDoneProgressEnd;

/** The prefix of the progress tokens of asks. */
export const ASK_PROGRESS_PREFIX = 'codectx-ask-';

/** True for an answer's text delta: a report without a percentage on an ask's progress. */
export function isAnswerDelta(value: ProgressValue, token: ProgressToken): boolean {
  return typeof token === 'string' && token.startsWith(ASK_PROGRESS_PREFIX)
    && value.kind === 'report' && value.percentage === undefined;
}
