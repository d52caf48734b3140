/**
 * One ask at a time: `codectx.ask` through `workspace/executeCommand`, its `codectx/stream`
 * deltas shown as they come, and Stop as `$/cancelRequest` of that request.
 *
 * The client cannot learn the JSON-RPC id its connection gives a request, so the first
 * `kind: "ask"` stream notification after the request is sent names it. That is
 * unambiguous because asks are serialized: a new ask first stops the running one and
 * waits for its answer, and the server sends a request's last stream notification
 * before the answer.
 */
import { CancellationTokenSource, Disposable, LSPErrorCodes, ResponseError } from 'vscode-languageserver-protocol';

import { AskArgs, AskResult, executeCommand, ServerCommand, ServerConnection, STREAM_METHOD, StreamParams } from './protocol';

/** How an ask ended. */
export type AskOutcome =
  | { kind: 'answered'; result: AskResult }
  | { kind: 'cancelled' }
  | { kind: 'failed'; message: string };

/** Where an ask is shown (the ask panel in VS Code, a recorder in tests). */
export interface AskView {
  begin(question: string): void;
  append(text: string): void;
  end(outcome: AskOutcome): void;
}

interface RunningAsk {
  source: CancellationTokenSource;
  requestId?: number | string;
  finished: Promise<AskOutcome>;
}

/** Runs asks one at a time against a server connection and streams them into a view. */
export class AskSession {
  private current: RunningAsk | undefined;

  /**
   * @param server The connection (`LanguageClient` in the extension).
   * @param view Where questions, deltas and outcomes go.
   * @param onFinished Called after every ask (the status bar refreshes then).
   */
  constructor(
    private readonly server: ServerConnection,
    private readonly view: AskView,
    private readonly onFinished: (outcome: AskOutcome) => void = () => undefined,
  ) {}

  /** Subscribes to `codectx/stream`; dispose to unsubscribe. */
  listen(): Disposable {
    return this.server.onNotification(STREAM_METHOD, (params: StreamParams) => this.onStream(params));
  }

  /** Whether an ask is running. */
  get running(): boolean {
    return this.current !== undefined;
  }

  /**
   * Asks a question; a running ask is stopped first.
   *
   * @returns The outcome (also given to the view); never rejects.
   */
  async run(args: AskArgs): Promise<AskOutcome> {
    while (this.current !== undefined) {
      await this.stop(); // asks waiting together: each stops the one before it, the last runs
    }
    const source = new CancellationTokenSource();
    this.view.begin(args.question);
    const running: RunningAsk = { source, finished: this.request(args, source) };
    this.current = running;
    const outcome = await running.finished;
    if (this.current === running) {
      this.current = undefined;
    }
    source.dispose();
    this.view.end(outcome);
    this.onFinished(outcome);
    return outcome;
  }

  /** Cancels the running ask (if any) and waits until the server has answered it. */
  async stop(): Promise<void> {
    const running = this.current;
    if (running === undefined) {
      return;
    }
    running.source.cancel();
    await running.finished;
  }

  private async request(args: AskArgs, source: CancellationTokenSource): Promise<AskOutcome> {
    try {
      const result = await executeCommand<AskResult>(this.server, ServerCommand.ask, args, source.token);
      return { kind: 'answered', result };
    } catch (err) {
      if (err instanceof ResponseError && err.code === LSPErrorCodes.RequestCancelled) {
        return { kind: 'cancelled' };
      }
      return { kind: 'failed', message: err instanceof Error ? err.message : String(err) };
    }
  }

  private onStream(params: StreamParams): void {
    const running = this.current;
    if (running === undefined || params.kind !== 'ask') {
      return;
    }
    running.requestId ??= params.requestId;
    if (params.requestId === running.requestId && params.text) {
      this.view.append(params.text);
    }
  }
}
