import * as assert from 'node:assert/strict';
import { test } from 'node:test';

import { ServerStatus, WARMTH_METHOD } from '../../protocol';
import {
  describeState, describeStatus, formatTokens, modelLabel, StatusBarController, StatusSummary, StatusView, warmPercent,
} from '../../statusBar';
import { FakeConnection } from '../fakes';

function status(overrides: Partial<ServerStatus> = {}): ServerStatus {
  return {
    ready: true, model: '/home/me/models/tiny-llama',
    warmup: { warm: true, running: false, pending: false, prefixTokens: 812, runs: 1, lastError: null },
    counters: { asks: 3, hovers: 2, hoverCacheHits: 1, cancelled: 1, warmups: 1 },
    lastMetrics: { prompt_tokens: 900, cached_tokens: 812, recomputed_tokens: 88, prefill_tps: 200, ttft_s: 0.234,
      decode_tokens: 10, decode_tps: 15 },
    engine: { cache: { live_tokens: 1530 } },
    ...overrides,
  };
}

test('a remote engine is named in the tooltip, and an unreachable one in the item', () => {
  const url = 'http://127.0.0.1:8080/v1';
  const up = describeStatus(status({ engine: { engine: 'remote', url, reachable: true, cache: { live_tokens: 900 } } }));
  assert.equal(up.text, '$(database) tiny-llama · warm 100% · 900 tok · TTFT 0.23s');
  assert.match(up.tooltip, /engine: http:\/\/127\.0\.0\.1:8080\/v1\n/);
  const down = describeStatus(status({
    engine: { engine: 'remote', url, reachable: false, last_error: 'cannot reach the engine', cache: {} },
  }));
  assert.equal(down.text, '$(warning) tiny-llama · warm 100% · 0 tok · engine unreachable · TTFT 0.23s');
  assert.match(down.tooltip, /engine: http:\/\/127\.0\.0\.1:8080\/v1 \(unreachable: cannot reach the engine\)/);
  assert.doesNotMatch(describeStatus(status()).tooltip, /engine:/);
});

class Recorder implements StatusView {
  readonly shown: StatusSummary[] = [];
  private wake: (() => void) | undefined;

  show(summary: StatusSummary): void {
    this.shown.push(summary);
    this.wake?.();
  }

  next(): Promise<void> {
    return new Promise((resolve) => { this.wake = resolve; });
  }
}

test('the item shows model, warm %, tokens cached and the last TTFT', () => {
  const summary = describeStatus(status());
  assert.equal(summary.text, '$(database) tiny-llama · warm 100% · 1.5k tok · TTFT 0.23s');
  assert.match(summary.tooltip, /prefix 812 tokens/);
  assert.match(summary.tooltip, /asks: 3 \(1 cancelled\)/);
});

test('a load that failed shows as no model, with the reason, not as loading forever', () => {
  const failed = describeStatus(status({ ready: false, model: null, loadError: 'model not found: nope' }));
  assert.equal(failed.text, '$(error) codectx: no model');
  assert.match(failed.tooltip, /did not load: model not found: nope/);
  assert.equal(describeStatus(status({ ready: false, model: null, loadError: null })).text, '$(sync~spin) codectx: loading');
});

test('a cold prefix shows the share of the last prompt served from the cache', () => {
  const cold = status({ warmup: { warm: false, running: true, pending: false, prefixTokens: 812, runs: 1, lastError: 'boom' } });
  assert.equal(warmPercent(cold), 90);
  assert.match(describeStatus(cold).tooltip, /warm: 90% \(warming up\)/);
  assert.match(describeStatus(cold).tooltip, /last warm-up error: boom/);
  assert.equal(warmPercent(status({ warmup: null, lastMetrics: null })), 0);
});

test('loading, not running and no metrics yet', () => {
  assert.equal(describeStatus(status({ ready: false })).text, '$(sync~spin) codectx: loading');
  assert.deepEqual(describeStatus(undefined, 'Client is not running'),
    { text: '$(circle-slash) codectx', tooltip: 'codectx: Client is not running' });
  assert.equal(describeStatus(status({ lastMetrics: null, engine: null })).text, '$(database) tiny-llama · warm 100% · 0 tok');
});

test('token counts and model labels', () => {
  assert.deepEqual([0, 999, 1000, 1530, 9999, 12_345].map(formatTokens), ['0', '999', '1.0k', '1.5k', '10.0k', '12k']);
  assert.equal(modelLabel('smollm2-135m'), 'smollm2-135m');
  assert.equal(modelLabel('C:\\models\\qwen\\'), 'qwen');
  assert.equal(modelLabel(null), 'no model');
});

test('the controller asks codectx.status and refreshes on codectx/warmth', async () => {
  const server = new FakeConnection();
  const view = new Recorder();
  const controller = new StatusBarController(server, view);
  assert.equal(view.shown[0].text, '$(circle-slash) codectx');
  const listening = controller.listen();
  const shown = view.next();
  server.notify(WARMTH_METHOD, { warm: true });
  const [sent] = await server.requests(1);
  assert.deepEqual(sent.params, { command: 'codectx.status', arguments: [] });
  sent.resolve(status());
  await shown;
  assert.equal(view.shown.at(-1)!.text, describeStatus(status()).text);
  assert.equal(controller.status?.model, '/home/me/models/tiny-llama');
  listening.dispose();
  assert.equal(server.listeners(WARMTH_METHOD), 0);
});

test('a failed status request says why', async () => {
  const server = new FakeConnection();
  const view = new Recorder();
  const controller = new StatusBarController(server, view);
  const refreshed = controller.refresh();
  (await server.requests(1))[0].reject(new Error('Client is not running'));
  assert.equal(await refreshed, undefined);
  assert.equal(view.shown.at(-1)!.tooltip, 'codectx: Client is not running');
});

test('a status whose metrics lack numbers (lastMetrics {} before the first ask) shows no TTFT', () => {
  const empty = status({ warmup: null, lastMetrics: {} as any, engine: { cache: { live_tokens: null as any } } });
  assert.equal(describeStatus(empty).text, '$(database) tiny-llama · warm 0% · 0 tok');
  assert.match(describeStatus(empty).tooltip, /last time to first token: none yet/);
  const nullTtft = status({ lastMetrics: { ...status().lastMetrics!, ttft_s: null as any } });
  assert.equal(describeStatus(nullTtft).text, '$(database) tiny-llama · warm 100% · 1.5k tok');
});

test('a server that stopped for good is shown stopped; a started one is asked for its status', async () => {
  const server = new FakeConnection();
  const view = new Recorder();
  const controller = new StatusBarController(server, view);
  const listening = controller.listen();
  const running = view.next();
  server.changeState('running');
  (await server.requests(1))[0].resolve(status());
  await running;
  assert.equal(view.shown.at(-1)!.text, describeStatus(status()).text);
  const late = controller.refresh(); // asked just before the server crashed; the answer comes after
  const [, sent] = await server.requests(2);
  server.changeState('stopped');
  assert.deepEqual(view.shown.at(-1), describeState('stopped'));
  assert.equal(view.shown.at(-1)!.text, '$(circle-slash) codectx: stopped');
  assert.equal(controller.status, undefined);
  sent.resolve(status());
  await late;
  assert.deepEqual(view.shown.at(-1), describeState('stopped'));
  server.changeState('starting');
  assert.equal(view.shown.at(-1)!.text, '$(sync~spin) codectx: starting');
  listening.dispose();
  assert.equal(server.stateListenerCount(), 0);
});
