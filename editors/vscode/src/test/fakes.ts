/** Stand-ins for the server connection and the editor in unit tests. */
import { CancellationToken, Disposable } from 'vscode-languageserver-protocol';

import type { AskOutcome, AskView } from '../ask';
import type { EditorHost, Selection } from '../commands';
import type { ServerConnection, ServerState } from '../protocol';

/** One request the client sent; the test answers it. */
export interface SentRequest {
  method: string;
  params: any;
  token?: CancellationToken;
  resolve(result: unknown): void;
  reject(error: unknown): void;
}

/** A `ServerConnection` whose requests the test answers and whose notifications it sends. */
export class FakeConnection implements ServerConnection {
  readonly sent: SentRequest[] = [];
  private readonly handlers = new Map<string, Set<(params: any) => void>>();
  private readonly stateListeners = new Set<(state: ServerState) => void>();
  private waiters: (() => void)[] = [];

  sendRequest<R>(method: string, params: unknown, ...rest: (CancellationToken | undefined)[]): Promise<R> {
    if (rest.length > 0 && rest[0] === undefined) {
      // vscode-jsonrpc would send [params, null] as the params: the server rejects that.
      return Promise.reject(new Error(`${method}: an undefined token makes the params an array`));
    }
    const token = rest[0];
    return new Promise<R>((resolve, reject) => {
      this.sent.push({ method, params, token, resolve: resolve as (r: unknown) => void, reject });
      this.waiters.splice(0).forEach((wake) => wake());
    });
  }

  onNotification(method: string, handler: (params: any) => void): Disposable {
    const set = this.handlers.get(method) ?? new Set();
    set.add(handler);
    this.handlers.set(method, set);
    return { dispose: () => set.delete(handler) };
  }

  onDidChangeState(listener: (state: ServerState) => void): Disposable {
    this.stateListeners.add(listener);
    return { dispose: () => this.stateListeners.delete(listener) };
  }

  /** The connection starts, runs or stops (a restart starts a new one). */
  changeState(state: ServerState): void {
    this.stateListeners.forEach((listener) => listener(state));
  }

  notify(method: string, params: unknown): void {
    this.handlers.get(method)?.forEach((handler) => handler(params));
  }

  listeners(method: string): number {
    return this.handlers.get(method)?.size ?? 0;
  }

  stateListenerCount(): number {
    return this.stateListeners.size;
  }

  /** Resolves once `count` requests have been sent. */
  async requests(count: number): Promise<SentRequest[]> {
    while (this.sent.length < count) {
      await new Promise<void>((wake) => this.waiters.push(wake));
    }
    return this.sent;
  }
}

/** An `AskView` that records what it was shown. */
export class RecordingView implements AskView {
  readonly events: string[] = [];
  readonly outcomes: AskOutcome[] = [];
  text = '';

  begin(question: string): void {
    this.events.push(`begin:${question}`);
    this.text = '';
  }

  append(text: string): void {
    this.events.push(`append:${text}`);
    this.text += text;
  }

  end(outcome: AskOutcome): void {
    this.events.push(`end:${outcome.kind}`);
    this.outcomes.push(outcome);
  }
}

/** An `EditorHost` with a scripted answer, selection and choice (of an offer's button). */
export class FakeHost implements EditorHost {
  readonly messages: string[] = [];
  choice = false;
  readonly opened: { name: string; text: string }[] = [];
  readonly prompts: string[] = [];

  constructor(public answer: string | undefined, public current: Selection | undefined) {}

  async askQuestion(prompt: string): Promise<string | undefined> {
    this.prompts.push(prompt);
    return this.answer;
  }

  selection(): Selection | undefined {
    return this.current;
  }

  async openMarkdown(name: string, text: string): Promise<void> {
    this.opened.push({ name, text });
  }

  info(message: string): void {
    this.messages.push(`info:${message}`);
  }

  error(message: string): void {
    this.messages.push(`error:${message}`);
  }

  async offer(message: string, action: string): Promise<boolean> {
    this.messages.push(`offer:${message} [${action}]`);
    return this.choice;
  }
}
