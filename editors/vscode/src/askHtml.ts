/**
 * The ask panel's page and the messages between it and the extension.
 *
 * The page renders text only (`textContent`), runs one inline script allowed by a nonce,
 * and loads nothing else (Content-Security-Policy `default-src 'none'`).
 */
import { randomBytes } from 'crypto';

import type { AskOutcome } from './ask';
import { count, fixed } from './numbers';

/** Extension -> page. */
export type PanelMessage =
  | { type: 'begin'; question: string }
  | { type: 'append'; text: string }
  | { type: 'end'; text?: string; footer: string; failed: boolean };

/** Page -> extension. */
export type PageMessage = { type: 'stop' };

/** A fresh nonce for the page's script. */
export function makeNonce(): string {
  return randomBytes(16).toString('base64');
}

/** What the footer adds for an answer that did not end on its own. */
const FINISH_NOTES: Record<string, string> = {
  length: ' (length limit)',
  repetition: ' (stopped on repetition)',
};

/** The footer under an answer: tokens, cache use and speed; or why there is no answer. */
export function outcomeFooter(outcome: AskOutcome): string {
  if (outcome.kind === 'cancelled') {
    return 'Stopped.';
  }
  if (outcome.kind === 'failed') {
    return `Failed: ${outcome.message}`;
  }
  const m: Partial<Record<string, unknown>> = outcome.result.metrics ?? {};
  const finish = FINISH_NOTES[outcome.result.finishReason] ?? '';
  const dropped = outcome.result.droppedTurns
    ? ` · ${outcome.result.droppedTurns} earlier turns left out to fit the context` : '';
  return `${count(m.prompt_tokens)} prompt tokens (${count(m.cached_tokens)} cached, `
    + `${count(m.recomputed_tokens)} computed) · TTFT ${fixed(m.ttft_s, 2) ?? '?'} s · `
    + `${count(m.decode_tokens)} tokens at ${fixed(m.decode_tps, 1) ?? '?'} tok/s${finish}${dropped}`;
}

/** The message that ends an ask in the page; an answer's final text replaces the streamed one. */
export function endMessage(outcome: AskOutcome): PanelMessage {
  return {
    type: 'end',
    text: outcome.kind === 'answered' ? outcome.result.text : undefined,
    footer: outcomeFooter(outcome),
    failed: outcome.kind === 'failed',
  };
}

/**
 * The page.
 *
 * @param nonce Allows the inline script.
 * @param cspSource The webview's `cspSource` (styles of the VS Code theme).
 */
export function askPanelHtml(nonce: string, cspSource: string): string {
  return `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="UTF-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src ${cspSource} 'nonce-${nonce}'; script-src 'nonce-${nonce}';">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<style nonce="${nonce}">
  body { font-family: var(--vscode-font-family); color: var(--vscode-foreground); }
  #question { font-weight: bold; margin: 0.5em 0; }
  #answer { white-space: pre-wrap; font-family: var(--vscode-editor-font-family); }
  #footer { color: var(--vscode-descriptionForeground); margin-top: 0.8em; }
  #footer.failed { color: var(--vscode-errorForeground); }
</style>
</head>
<body>
<button id="stop" disabled>Stop</button>
<div id="question"></div>
<div id="answer"></div>
<div id="footer"></div>
<script nonce="${nonce}">
  const vscode = acquireVsCodeApi();
  const stop = document.getElementById('stop');
  const question = document.getElementById('question');
  const answer = document.getElementById('answer');
  const footer = document.getElementById('footer');
  stop.addEventListener('click', () => { stop.disabled = true; vscode.postMessage({ type: 'stop' }); });
  window.addEventListener('message', (event) => {
    const message = event.data;
    if (message.type === 'begin') {
      question.textContent = message.question;
      answer.textContent = '';
      footer.textContent = '';
      footer.className = '';
      stop.disabled = false;
    } else if (message.type === 'append') {
      answer.textContent += message.text;
    } else if (message.type === 'end') {
      if (typeof message.text === 'string') { answer.textContent = message.text; }
      footer.textContent = message.footer;
      footer.className = message.failed ? 'failed' : '';
      stop.disabled = true;
    }
  });
</script>
</body>
</html>`;
}
