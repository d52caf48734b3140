/**
 * Starts the codectx server process (stdio). Used by the extension's LanguageClient and
 * by the end-to-end test, so both launch the server the same way.
 */
import { ChildProcess, spawn } from 'child_process';
import { once } from 'events';

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
