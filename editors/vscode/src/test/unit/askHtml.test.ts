import * as assert from 'node:assert/strict';
import { test } from 'node:test';

import { askPanelHtml, endMessage, makeNonce, outcomeFooter } from '../../askHtml';
import { isAnswerDelta } from '../../progress';

const METRICS = { prompt_tokens: 812, cached_tokens: 768, recomputed_tokens: 44, prefill_tps: 209.5, ttft_s: 0.234,
  decode_tokens: 57, decode_tps: 18.44 };

test('the footer gives tokens, cache use, TTFT, decode speed and why an answer was cut', () => {
  const outcome = { kind: 'answered' as const, result: { text: 'hi', finishReason: 'length', conversationId: 'c', metrics: METRICS } };
  assert.equal(outcomeFooter(outcome),
    '812 prompt tokens (768 cached, 44 computed) · TTFT 0.23 s · 57 tokens at 18.4 tok/s (length limit)');
  assert.deepEqual(endMessage(outcome), { type: 'end', text: 'hi', footer: outcomeFooter(outcome), failed: false });
  const looped = { kind: 'answered' as const, result: { ...outcome.result, finishReason: 'repetition' } };
  assert.ok(outcomeFooter(looped).endsWith('57 tokens at 18.4 tok/s (stopped on repetition)'), outcomeFooter(looped));
  const stopped = { kind: 'answered' as const, result: { ...outcome.result, finishReason: 'stop' } };
  assert.ok(outcomeFooter(stopped).endsWith('tok/s'), outcomeFooter(stopped));
  const trimmed = { kind: 'answered' as const, result: { ...outcome.result, droppedTurns: 4 } };
  assert.ok(outcomeFooter(trimmed).endsWith('(length limit) · 4 earlier turns left out to fit the context'),
    outcomeFooter(trimmed));
  assert.deepEqual(endMessage({ kind: 'cancelled' }), { type: 'end', text: undefined, footer: 'Stopped.', failed: false });
  assert.deepEqual(endMessage({ kind: 'failed', message: 'no model' }),
    { type: 'end', text: undefined, footer: 'Failed: no model', failed: true });
});

test('the page allows only its own nonce-tagged script and the theme styles', () => {
  const nonce = makeNonce();
  assert.notEqual(nonce, makeNonce());
  const html = askPanelHtml(nonce, 'vscode-resource:');
  assert.ok(html.includes(`default-src 'none'; style-src vscode-resource: 'nonce-${nonce}'; script-src 'nonce-${nonce}';`));
  assert.equal(html.match(/<script/g)!.length, 1);
  assert.ok(html.includes(`<script nonce="${nonce}">`));
  assert.ok(!/innerHTML/.test(html), 'text must be rendered with textContent');
  assert.ok(html.includes("postMessage({ type: 'stop' })"));
});

test('answer deltas stay out of VS Code progress; prefill progress passes', () => {
  assert.equal(isAnswerDelta({ kind: 'report', message: 'def ' }, 'codectx-ask-3'), true);
  assert.equal(isAnswerDelta({ kind: 'report', message: 'reading the repository: 16/64 tokens', percentage: 25 }, 'codectx-ask-3'),
    false);
  assert.equal(isAnswerDelta({ kind: 'begin', title: 'codectx: answering' }, 'codectx-ask-3'), false);
  assert.equal(isAnswerDelta({ kind: 'end', message: 'stop' }, 'codectx-ask-3'), false);
});

test('the load progress passes whole: its stages and the scan counts have no percentage', () => {
  const load = [
    { kind: 'begin' as const, title: 'codectx: loading model', percentage: 0 },
    { kind: 'report' as const, message: 'scanning /home/me/repo' },
    { kind: 'report' as const, message: 'scanning /home/me/repo: parsing 1/2 files' },
    { kind: 'report' as const, message: 'scanning /home/me/repo: tokenizing 5/9 files' },
    { kind: 'end' as const, message: 'ready' },
  ];
  assert.deepEqual(load.filter((value) => isAnswerDelta(value, 'codectx-load-1')), []);
  assert.equal(isAnswerDelta({ kind: 'report', message: 'a token of another client' }, 7), false);
});

test('the footer of an answer whose metrics lack numbers says so instead of failing', () => {
  const outcome = { kind: 'answered' as const, result: { text: 'hi', finishReason: 'stop', conversationId: 'c', metrics: {} as any } };
  assert.equal(outcomeFooter(outcome), '? prompt tokens (? cached, ? computed) · TTFT ? s · ? tokens at ? tok/s');
  const partial = { ...outcome, result: { ...outcome.result, metrics: { ...METRICS, ttft_s: null, decode_tps: undefined } as any } };
  assert.equal(outcomeFooter(partial), '812 prompt tokens (768 cached, 44 computed) · TTFT ? s · 57 tokens at ? tok/s');
});
