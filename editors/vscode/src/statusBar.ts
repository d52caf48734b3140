/**
 * The status bar item: model, warm %, tokens cached and the last time to first token,
 * from `codectx.status`, refreshed when the server reports something new
 * (`codectx/warmth`, the end of a progress, an answered ask, a started server); while no
 * server runs (it is starting, it could not start, it stopped for good) it says so.
 */
import { Disposable } from 'vscode-languageserver-protocol';

import { fixed, isNumber } from './numbers';
import { executeCommand, ServerCommand, ServerConnection, ServerState, ServerStatus, WARMTH_METHOD } from './protocol';

/** What the status bar item shows. */
export interface StatusSummary {
  text: string;
  tooltip: string;
}

/** Where the summary goes (a `StatusBarItem` in VS Code). */
export interface StatusView {
  show(summary: StatusSummary): void;
}

/**
 * How much of the prefix is served from the cache, in percent.
 *
 * The server reports only whether the current prefix is warm (`warmup.warm`); between an
 * edit and the next warm-up the share of the last prompt restored from checkpoints
 * (`cached_tokens / prompt_tokens`) is the best estimate it gives.
 */
export function warmPercent(status: ServerStatus): number {
  if (status.warmup?.warm) {
    return 100;
  }
  const prompt = status.lastMetrics?.prompt_tokens;
  const cached = status.lastMetrics?.cached_tokens;
  return isNumber(prompt) && isNumber(cached) && prompt > 0 ? Math.round((100 * cached) / prompt) : 0;
}

/** Tokens held in the model's cache (the live KV cache of the engine). */
export function cachedTokens(status: ServerStatus): number {
  const live = status.engine?.cache?.live_tokens;
  return isNumber(live) ? live : 0;
}

/** A token count for humans: 950, 1.2k, 34k. */
export function formatTokens(count: number): string {
  if (count < 1000) {
    return String(count);
  }
  return count < 10_000 ? `${(count / 1000).toFixed(1)}k` : `${Math.round(count / 1000)}k`;
}

/** The last path component of a model directory, or the model name itself. */
export function modelLabel(model: string | null): string {
  if (!model) {
    return 'no model';
  }
  const parts = model.split(/[\\/]/).filter(Boolean);
  return parts.length ? parts[parts.length - 1] : model;
}

/** The status bar text and tooltip while the server is starting or not running. */
export function describeState(state: Exclude<ServerState, 'running'>): StatusSummary {
  return state === 'starting'
    ? { text: '$(sync~spin) codectx: starting', tooltip: 'codectx: starting the server' }
    : {
      text: '$(circle-slash) codectx: stopped',
      tooltip: 'codectx: the server is not running (codectx: Restart server starts it; the codectx output channel has its log)',
    };
}

/**
 * The status bar text and tooltip.
 *
 * @param status The `codectx.status` result, or undefined when there is none.
 * @param problem Why there is no status (server not running, request failed).
 */
export function describeStatus(status: ServerStatus | undefined, problem?: string): StatusSummary {
  if (status === undefined) {
    return { text: '$(circle-slash) codectx', tooltip: `codectx: ${problem ?? 'not running'}` };
  }
  if (!status.ready && status.loadError) {
    return { text: '$(error) codectx: no model', tooltip: `codectx: the model did not load: ${status.loadError}` };
  }
  if (!status.ready) {
    return { text: '$(sync~spin) codectx: loading', tooltip: `codectx: loading ${status.model ?? 'the model'}` };
  }
  const warm = warmPercent(status);
  const ttft2 = fixed(status.lastMetrics?.ttft_s, 2);
  const ttft3 = fixed(status.lastMetrics?.ttft_s, 3);
  const remote = status.engine?.engine === 'remote' ? status.engine : undefined;
  const down = remote !== undefined && remote.reachable === false;
  const parts = [modelLabel(status.model), `warm ${warm}%`, `${formatTokens(cachedTokens(status))} tok`];
  if (down) {
    parts.push('engine unreachable');
  }
  if (ttft2 !== undefined) {
    parts.push(`TTFT ${ttft2}s`);
  }
  const warming = status.warmup?.running ? ' (warming up)' : '';
  const lines = [
    `model: ${status.model}`,
    `warm: ${warm}%${warming}, prefix ${status.warmup?.prefixTokens ?? 0} tokens`,
    `tokens cached: ${cachedTokens(status)}`,
    `last time to first token: ${ttft3 !== undefined ? `${ttft3} s` : 'none yet'}`,
    `asks: ${status.counters.asks} (${status.counters.cancelled} cancelled), hovers: ${status.counters.hovers}`,
  ];
  if (remote !== undefined) {
    lines.splice(1, 0, `engine: ${remote.url}${down ? ` (unreachable: ${remote.last_error ?? 'no answer'})` : ''}`);
  }
  if (status.warmup?.lastError) {
    lines.push(`last warm-up error: ${status.warmup.lastError}`);
  }
  return { text: `$(${down ? 'warning' : 'database'}) ${parts.join(' · ')}`, tooltip: lines.join('\n') };
}

/** Keeps a `StatusView` up to date from the server. */
export class StatusBarController {
  private last: ServerStatus | undefined;
  /** Counts the connection's state changes: a status asked for before one is not shown after it. */
  private changes = 0;

  constructor(private readonly server: ServerConnection, private readonly view: StatusView) {
    view.show(describeStatus(undefined, 'starting'));
  }

  /**
   * Refreshes on every `codectx/warmth` and when the server runs; shows a server that is
   * starting or stopped as such. Dispose to unsubscribe.
   */
  listen(): Disposable {
    const warmth = this.server.onNotification(WARMTH_METHOD, () => void this.refresh());
    const state = this.server.onDidChangeState?.((state) => this.onState(state));
    return Disposable.create(() => {
      warmth.dispose();
      state?.dispose();
    });
  }

  /** The last status received. */
  get status(): ServerStatus | undefined {
    return this.last;
  }

  /**
   * Asks the server for its status and shows it.
   *
   * @returns The status, or undefined when the request failed (the view says why).
   */
  async refresh(): Promise<ServerStatus | undefined> {
    const changes = this.changes;
    let status: ServerStatus;
    try {
      status = await executeCommand<ServerStatus>(this.server, ServerCommand.status);
    } catch (err) {
      if (changes === this.changes) {
        this.last = undefined;
        this.view.show(describeStatus(undefined, err instanceof Error ? err.message : String(err)));
      }
      return undefined;
    }
    if (changes === this.changes) {
      this.last = status;
      this.view.show(describeStatus(status));
    }
    return status;
  }

  private onState(state: ServerState): void {
    this.changes += 1;
    if (state === 'running') {
      void this.refresh();
      return;
    }
    this.last = undefined;
    this.view.show(describeState(state));
  }
}
