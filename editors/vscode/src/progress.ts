/**
 * Which `$/progress` reports VS Code shows.
 *
 * The server streams each answer delta as a progress report too (docs/protocol.md); the
 * ask panel already shows the text, so those reports are kept out of VS Code's progress
 * notification. Loading and prefill progress (begin, end, reports with a percentage) pass.
 */
import type { WorkDoneProgressBegin, WorkDoneProgressEnd, WorkDoneProgressReport } from 'vscode-languageserver-protocol';

export type ProgressValue = WorkDoneProgressBegin | WorkDoneProgressReport | WorkDoneProgressEnd;

/** True for an answer's text delta: a report without a percentage. */
export function isAnswerDelta(value: ProgressValue): boolean {
  return value.kind === 'report' && value.percentage === undefined;
}
