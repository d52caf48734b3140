/**
 * Starts the codectx server process (stdio). Used by the extension's LanguageClient and
 * by the end-to-end test, so both launch the server the same way. `StderrTail` keeps the
 * end of what the process wrote, so that a server that stops can be reported with its cause.
 */
import { ChildProcess, spawn } from 'child_process';
import { once } from 'events';
import { StringDecoder } from 'string_decoder';

import { ServerLaunch } from './config';

/** The server could not be started (for example the executable does not exist). */
export class ServerStartError extends Error {
  constructor(readonly launch: ServerLaunch, cause: Error) {
    super(`cannot start the codectx server '${[launch.command, ...launch.args].join(' ')}': ${cause.message}`);
    this.name = 'ServerStartError';
  }
}

/**
 * Spawns the server with stdin/stdout as the LSP channel and stderr piped for logs.
 *
 * @param launch The command line and extra environment (from `serverLaunch`).
 * @param cwd The working directory (the workspace folder).
 * @returns The running process once it has been spawned.
 * @throws ServerStartError when spawning fails.
 */
export async function startServerProcess(launch: ServerLaunch, cwd?: string): Promise<ChildProcess> {
  const child = spawn(launch.command, launch.args, {
    cwd, env: { ...process.env, ...launch.env }, stdio: ['pipe', 'pipe', 'pipe'],
  });
  try {
    await once(child, 'spawn');
  } catch (err) {
    throw new ServerStartError(launch, err as Error);
  }
  return child;
}

/** How a server process ended and the last lines it wrote to stderr. */
export interface ServerExit {
  /** `exit code 2`, `signal SIGKILL`; undefined while it runs or when none was started. */
  how?: string;
  /** Its last non-empty stderr lines, at most `LAST_LINES`. */
  lastLines: string[];
}

const LAST_LINES = 3;
const KEPT_CHARS = 4096;
const CLOSE_WAIT_MS = 1000;

/**
 * The end of what the latest server process wrote to stderr (its log, a Python traceback,
 * an argument error), and how it ended.
 */
export class StderrTail {
  private child: ChildProcess | undefined;
  private text = '';
  private how: string | undefined;
  private closed: Promise<void> = Promise.resolve();

  /** Follows a newly started process; what an earlier one wrote is forgotten. */
  follow(child: ChildProcess): void {
    const decoder = new StringDecoder('utf8');
    this.child = child;
    this.text = '';
    this.how = undefined;
    child.stderr?.on('data', (chunk: Buffer | string) => {
      if (this.child === child) {
        this.text = (this.text + (typeof chunk === 'string' ? chunk : decoder.write(chunk))).slice(-KEPT_CHARS);
      }
    });
    child.once('exit', (code, signal) => {
      if (this.child === child) {
        this.how = code !== null ? `exit code ${code}` : `signal ${signal}`;
      }
    });
    this.closed = new Promise((resolve) => child.once('close', () => resolve()));
  }

  /**
   * How the process ended and its last lines, once it has closed its output (its last
   * lines may come after the LSP connection closed), or after `waitMs` if it still runs.
   */
  async exit(waitMs = CLOSE_WAIT_MS): Promise<ServerExit> {
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.closed, new Promise<void>((resolve) => { timer = setTimeout(resolve, waitMs); })]);
    clearTimeout(timer);
    const lines = this.text.split(/\r?\n/).map((line) => line.trim()).filter((line) => line !== '');
    return { how: this.how, lastLines: lines.slice(-LAST_LINES) };
  }

  /** Ends the process if it still runs (a start that failed may leave one behind). */
  kill(): void {
    if (this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null) {
      this.child.kill();
    }
  }
}
