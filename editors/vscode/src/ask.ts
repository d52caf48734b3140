/**
 * One ask at a time: `codectx.ask` through `workspace/executeCommand`, its `codectx/stream`
 * deltas shown as they come, and Stop as `$/cancelRequest` of that request.
 *
 * The client cannot learn the JSON-RPC id its connection gives a request, so the stream
 * notifications of `kind: "ask"` that arrive while the ask runs name it. Asks are
 * serialized (a new ask stops the running one and waits for its answer), but a cancelled
 * ask is answered at once and its last deltas and its `done` may arrive later. Request ids
 * grow, so ids seen during earlier asks are ignored, and a larger id replaces a smaller one
 * (the earlier stream was such a tail). The final text comes from the result anyway. A
 * restarted server's connection numbers its requests from 0 again, so the ids seen are
 * forgotten when a connection starts (`onDidChangeState`).
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
  question: string;
  source: CancellationTokenSource;
  /** Ids up to this one belong to earlier asks. */
  floor: number | undefined;
  requestId?: number | string;
  finished: Promise<AskOutcome>;
}

/** Runs asks one at a time against a server connection and streams them into a view. */
export class AskSession {
  private current: RunningAsk | undefined;
  private highestId: number | undefined;

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

  /** Subscribes to `codectx/stream` and to the connection's starts; dispose to unsubscribe. */
  listen(): Disposable {
    const stream = this.server.onNotification(STREAM_METHOD, (params: StreamParams) => this.onStream(params));
    const state = this.server.onDidChangeState?.((state) => {
      if (state === 'starting') {
        this.connectionStarting();
      }
    });
    return Disposable.create(() => {
      stream.dispose();
      state?.dispose();
    });
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
    const running: RunningAsk = {
      question: args.question, source, floor: this.highestId, finished: this.request(args, source),
    };
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

  /** A new connection: the ids of the old one say nothing about the new one's. */
  private connectionStarting(): void {
    this.highestId = undefined;
    if (this.current !== undefined) {
      this.current.floor = undefined;
      this.current.requestId = undefined;
    }
  }

  private onStream(params: StreamParams): void {
    if (params.kind !== 'ask') {
      return;
    }
    const id = params.requestId;
    if (typeof id === 'number') {
      this.highestId = Math.max(this.highestId ?? id, id);
    }
    const running = this.current;
    if (running === undefined || (typeof id === 'number' && running.floor !== undefined && id <= running.floor)) {
      return;
    }
    if (running.requestId === undefined) {
      running.requestId = id;
    } else if (typeof id === 'number' && typeof running.requestId === 'number' && id > running.requestId) {
      running.requestId = id;
      this.view.begin(running.question);
    }
    if (id === running.requestId && params.text) {
      this.view.append(params.text);
    }
  }
}
