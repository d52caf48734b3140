"""pygls' LanguageServerProtocol with its request bookkeeping fixed.

pygls 2.1.1 (PLATFORM.md) runs `workspace/executeCommand`, `initialize`,
`shutdown` and the document notifications as generators that call the user's
handler under a fresh internal id. That has four consequences we fix here:

* `$/cancelRequest` cancels the generator's outer future, so the client gets
  -32800 while the async handler keeps running. We link the outer future to
  the inner task, so cancelling one cancels the other.
* An inner task that ends in CancelledError is not an `Exception`, so the
  generator step raised past pygls and the request was never answered. We
  answer it as cancelled.
* `shutdown` iterated `_request_futures` while cancelling, and cancel runs
  callbacks that pop from it ("dictionary changed size during iteration").
  We iterate over a copy.
* Every internal id was stored in `_request_futures` and never removed: one
  entry leaked per notification and per async command. Only a client
  request's own id is stored now (that is all `$/cancelRequest` needs).

It also hands a command handler the `workDoneToken` of its
`workspace/executeCommand` params (pygls passes only the arguments).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import logging
import uuid
from functools import partial
from typing import Any

from lsprotocol import types
from pygls.feature_manager import is_thread_function
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method

from .errors import to_rpc_error

logger = logging.getLogger(__name__)

_CANCELLED = (asyncio.CancelledError, concurrent.futures.CancelledError)
_work_done_token: contextvars.ContextVar[Any] = contextvars.ContextVar("work_done_token", default=None)


class CodectxProtocol(LanguageServerProtocol):
    """The protocol class `CodectxServer` runs with."""

    def _execute_handler(self, msg_id, handler, callback, args=None, kwargs=None):
        """Runs `handler`; returns its future. Only client request ids are tracked."""
        args, kwargs = args or (), kwargs or {}
        tracked = msg_id is not None and msg_id == self.msg_id
        if asyncio.iscoroutinefunction(handler):
            future = asyncio.ensure_future(handler(*args, **kwargs))
        elif is_thread_function(handler):
            future = self._server.thread_pool.submit(handler, *args, **kwargs)
        else:
            future = concurrent.futures.Future()
        if tracked:
            self._request_futures[msg_id] = future
        future.add_done_callback(callback)
        if inspect.isgeneratorfunction(handler):
            try:
                self._run_generator(None, gen=handler(*args, **kwargs), result_future=future)
            except Exception as exc:  # noqa: BLE001 - reported through the future
                future.set_exception(exc)
        elif not asyncio.iscoroutinefunction(handler) and not is_thread_function(handler):
            try:
                future.set_result(handler(*args, **kwargs))
            except Exception as exc:  # noqa: BLE001 - reported through the future
                future.set_exception(exc)
        return future

    def _run_generator(self, future, *, gen, result_future):
        """Runs one step of a generator handler, propagating cancellation both ways."""
        if result_future.done():
            gen.close()
            return
        try:
            value = future.result() if future is not None else None
            handler, args, kwargs = gen.send(value)
        except StopIteration as result:
            result_future.set_result(result.value)
            return
        except _CANCELLED:
            result_future.cancel()
            return
        except Exception as exc:  # noqa: BLE001 - reported through the future
            result_future.set_exception(exc)
            return
        step = self._execute_handler(
            str(uuid.uuid4()), handler,
            callback=partial(self._run_generator, gen=gen, result_future=result_future),
            args=args, kwargs=kwargs,
        )
        result_future.add_done_callback(lambda outer: step.cancel() if outer.cancelled() else None)

    def _send_handler_result(self, future, *, msg_id):
        """Answers a request; errors go through `errors.to_rpc_error` (the one mapping)."""
        if not future.cancelled() and (exc := future.exception()) is not None:
            self._request_futures.pop(msg_id, None)
            error = to_rpc_error(exc)
            logger.info("request %s failed: %s (%s)", msg_id, error.message, error.code)
            self._send_response(msg_id, error=error.to_response_error())
            return
        super()._send_handler_result(future, msg_id=msg_id)

    @lsp_method(types.WORKSPACE_EXECUTE_COMMAND)
    def lsp_workspace__execute_command(self, params: types.ExecuteCommandParams):
        """pygls' command dispatch, with the request's work-done token made visible to the handler."""
        # Set in the current context, like pygls' msg_id: the handler's task copies it.
        _work_done_token.set(params.work_done_token)
        return (yield from super().lsp_workspace__execute_command(params))

    @property
    def work_done_token(self) -> Any:
        """The client's `workDoneToken` of the command being run (None if it sent none)."""
        return _work_done_token.get()

    @lsp_method(types.SHUTDOWN)
    def lsp_shutdown(self, *args):
        """Cancels every other in-flight request, then runs the user's handler."""
        current_id = self.msg_id
        for msg_id, future in list(self._request_futures.items()):
            if msg_id != current_id and not future.done():
                future.cancel()
        if (user_handler := self.fm.features.get(types.SHUTDOWN)) is not None:
            yield user_handler, args, None
        self._shutdown = True
        return None

    def pending_requests(self) -> int:
        """Entries in the request table (client requests in flight + our requests)."""
        return len(self._request_futures)

    def progress_tokens(self) -> int:
        """Work-done progress tokens still registered."""
        return len(self.progress.tokens)

    def link_progress_cancel(self, token: Any, future: asyncio.Future) -> None:
        """Cancels `future` when the client cancels the progress `token`."""
        token_future = self.progress.tokens.get(token)
        if token_future is not None:
            token_future.add_done_callback(lambda f: future.cancel() if f.cancelled() else None)

    def end_progress(self, token: Any, message: str | None = None) -> None:
        """Ends a progress and forgets its token (pygls keeps them forever)."""
        self.progress.end(token, types.WorkDoneProgressEnd(message=message))
        self.progress.tokens.pop(token, None)
