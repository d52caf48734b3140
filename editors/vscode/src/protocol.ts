/**
 * The codectx server's custom protocol as the client sees it (docs/protocol.md).
 *
 * Only types and method names: no VS Code import, so every module that talks to
 * the server can run in plain Node against either the extension's LanguageClient
 * or a bare `vscode-languageserver-protocol` connection (the end-to-end test).
 */
import type { CancellationToken, Disposable, Range } from 'vscode-languageserver-protocol';

export const STREAM_METHOD = 'codectx/stream';
export const WARMTH_METHOD = 'codectx/warmth';

/**
 * What the extension adds to its client capabilities under `experimental` (docs/protocol.md): it offers the
 * restart itself after a change to settings the running server keeps (`offerRestart`), so the server sends no
 * notice of its own.
 */
export const EXPERIMENTAL_CAPABILITIES = { codectx: { restartOffer: true } };

/** Server commands run through `workspace/executeCommand` (one object argument each). */
export const ServerCommand = {
  ask: 'codectx.ask',
  status: 'codectx.status',
  showContext: 'codectx.showContext',
  reset: 'codectx.reset',
  reindex: 'codectx.reindex',
  findBugs: 'codectx.findBugs',
} as const;

/** Arguments of `codectx.ask`. */
export interface AskArgs {
  question: string;
  conversationId?: string;
  uri?: string;
  range?: Range;
  maxTokens?: number;
  tools?: boolean;
}

/** Engine counters of one request (snake_case, as the server sends them). */
export interface AskMetrics {
  prompt_tokens: number;
  cached_tokens: number;
  recomputed_tokens: number;
  prefill_tps: number;
  ttft_s: number;
  decode_tokens: number;
  decode_tps: number;
  [name: string]: unknown;
}

/** Result of `codectx.ask`. */
export interface AskResult {
  text: string;
  finishReason: string;
  conversationId: string;
  metrics: AskMetrics;
  toolCalls?: { name: string; resultChars: number }[];
  /** The conversation's oldest turns that left the prompt to fit the model's context. */
  droppedTurns?: number;
}

/** Params of a `codectx/stream` notification. */
export interface StreamParams {
  requestId: number | string;
  kind: string;
  index: number;
  text: string;
  done: boolean;
  finishReason?: string;
}

/** Params of `codectx/warmth`, also `warmup` in the status. */
export interface WarmthState {
  warm: boolean;
  running: boolean;
  pending: boolean;
  prefixTokens: number;
  runs: number;
  lastError: string | null;
}

/** Result of `codectx.status` (the fields the client reads). */
export interface ServerStatus {
  ready: boolean;
  /** Why the model did not load (the error's message); null while loading and once loaded. */
  loadError?: string | null;
  model: string | null;
  warmup: WarmthState | null;
  counters: { asks: number; hovers: number; hoverCacheHits: number; cancelled: number; warmups: number };
  lastMetrics: AskMetrics | null;
  engine: {
    cache?: { live_tokens?: number; checkpoints?: number; checkpoint_bytes?: number };
    /** "remote" when the model runs on an engine server (`engine.url`), with its address and health. */
    engine?: string;
    url?: string;
    reachable?: boolean;
    last_error?: string | null;
  } | null;
  [name: string]: unknown;
}

/** One definition or file of a request's focus: what it is, where, and why it was taken. */
export interface FocusItem {
  kind: string;
  path: string;
  name: string;
  lines: [number, number];
  tokens: number;
  reason: string;
}

/** The focus segments a request gets (`focus` of `codectx.ask` and `codectx.showContext`). */
export interface Focus {
  budget: number;
  tokens: number;
  items: FocusItem[];
  leftOut: (FocusItem & { why: string })[];
}

/** Result of `codectx.showContext`; `focus` is null without a question. */
export interface ContextLayout {
  segments: { kind: string; key: string; tokens: number; reason?: string }[];
  markdown: string;
  focus?: Focus | null;
  /** The prefix's token budget (`context.budgetTokens`, or less where the model's context needs room for an ask). */
  budget?: number | null;
}

/** Where the connection to the server is: a new connection numbers its requests from 0 again. */
export type ServerState = 'starting' | 'running' | 'stopped';

/**
 * What the client modules need from a connection. `ServerClient` (the extension's, over
 * vscode-languageclient) and `MessageConnection` (vscode-languageserver-protocol) provide it.
 */
export interface ServerConnection {
  sendRequest<R>(method: string, params: unknown, token?: CancellationToken): Promise<R>;
  onNotification(method: string, handler: (params: any) => void): Disposable;
  /** Connections that restart (`ServerClient`) tell when they start, run and stop. */
  onDidChangeState?(listener: (state: ServerState) => void): Disposable;
}

/** Runs one server command through `workspace/executeCommand`. */
export function executeCommand<R>(
  server: ServerConnection, command: string, args?: object, token?: CancellationToken,
): Promise<R> {
  const params = { command, arguments: args ? [args] : [] };
  // An explicit `undefined` token would make vscode-jsonrpc send the params as an array.
  return token ? server.sendRequest<R>('workspace/executeCommand', params, token)
    : server.sendRequest<R>('workspace/executeCommand', params);
}
