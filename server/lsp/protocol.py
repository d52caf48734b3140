"""pygls' LanguageServerProtocol with its request bookkeeping fixed.

pygls 2.1.1 runs `workspace/executeCommand`, `initialize`,
`shutdown` and the document notifications as generators that call the user's
handler under a fresh internal id. That has four consequences we fix here:

* `$/cancelRequest` cancels the generator's outer future, so the client gets
  -32800 while the async handler keeps running. We cancel the inner task
  instead; the outer future ends when it has (so a handler's own last words,
  such as an ask stream's `done`, go out before the -32800 answer), and
  cancelling the outer one (shutdown) still cancels the inner.
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

Every message enters through `receive` (the stdio transport, `server.lsp.stdio`,
calls it with decoded JSON), which answers what pygls would drop:

* a message that is not JSON-RPC gets -32600, params of the wrong shape get
  -32602 naming each bad field (pygls raised inside its read loop and never
  answered), a request after `shutdown` gets -32600 (LSP), and a client
  response we cannot read fails the request that waits for it;
* a notification that cannot be structured or whose handler fails is logged,
  and shown once per (method, document) with `window/showMessage` (at most
  `_MAX_SHOWN` in all);
* `exit` runs the user's exit handler and reports the status (0 after
  `shutdown`, 1 without) to the transport instead of raising SystemExit
  inside a handler;
* pygls' own copy of every open document is not kept: `DocumentStore` is the
  one copy, and pygls' re-joined the whole text on every edit.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import logging
import sys
import uuid
from functools import partial
from typing import Any, Callable

from lsprotocol import types
from pygls.exceptions import JsonRpcMethodNotFound
from pygls.feature_manager import is_thread_function
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method

from . import messages
from .errors import InvalidParamsError, InvalidRequestError, ServerNotInitializedError, to_rpc_error

logger = logging.getLogger(__name__)

_CANCELLED = (asyncio.CancelledError, concurrent.futures.CancelledError)
_MAX_SHOWN = 100  # problems shown per session; a client sending garbage for many documents is only logged
_work_done_token: contextvars.ContextVar[Any] = contextvars.ContextVar("work_done_token", default=None)


class CodectxProtocol(LanguageServerProtocol):
    """The protocol class `CodectxServer` runs with."""

    def __init__(self, server, converter) -> None:
        messages.register_strict_primitives(converter)
        super().__init__(server, converter)
        self.exit_code: int | None = None
        self.on_exit: Callable[[int], None] | None = None  # set by the transport
        self._shown: set[tuple[str, str | None]] = set()
        self._initialize_seen = False
        self._steps: dict[Any, asyncio.Future] = {}  # a generator request's outer future -> its running step

    # -- receiving --------------------------------------------------------

    def receive(self, data: Any) -> None:
        """Handles one decoded JSON message; every request among them gets an answer."""
        try:
            envelope = messages.envelope(data)
        except InvalidRequestError as err:
            self.reply_error(messages.message_id(data), err)
            return
        if self._shutdown and envelope.method != types.EXIT:
            if envelope.kind == "request":
                self.reply_error(envelope.id, InvalidRequestError(f"{envelope.method} after shutdown"))
            return
        if self._out_of_order(envelope):
            return
        what = f"params for {envelope.method}" if envelope.method else f"response to request {envelope.id}"
        try:
            message = messages.structure(self._converter, data, messages.message_type(self, data, envelope.kind),
                                         what)
        except InvalidParamsError as err:
            self._not_structured(envelope, data, err)
            return
        if envelope.kind == "request" and envelope.method == types.INITIALIZE:
            self._initialize_seen = True  # (one with bad params was answered above: the client may send another)
        self.handle_message(message)

    def _out_of_order(self, envelope: messages.Envelope) -> bool:
        """LSP's order, enforced (answered or logged): `initialize` once, and before it nothing but `exit`.
        A second `initialize` would have replaced the session (open buffers lost, the loaded model left behind)."""
        if envelope.kind == "response" or envelope.method == types.EXIT:
            return False
        if envelope.method == types.INITIALIZE and envelope.kind == "request":
            if self._initialize_seen:
                self.reply_error(envelope.id, InvalidRequestError("initialize may only be sent once"))
            return self._initialize_seen
        if self._initialize_seen:
            return False
        if envelope.kind == "request":
            self.reply_error(envelope.id, ServerNotInitializedError(f"{envelope.method} before initialize"))
        else:
            logger.warning("%s before initialize: dropped", envelope.method)
        return True

    def _not_structured(self, envelope: messages.Envelope, data: dict, err: InvalidParamsError) -> None:
        if envelope.kind == "request":
            self.reply_error(envelope.id, err)
        elif envelope.kind == "response":
            logger.warning("%s", err)
            if (future := self._request_futures.pop(envelope.id, None)) is not None and not future.done():
                future.set_exception(err)
        else:
            params = data.get("params")
            document = params.get("textDocument") if isinstance(params, dict) else None
            uri = document.get("uri") if isinstance(document, dict) else None
            self.notification_failed(envelope.method, uri if isinstance(uri, str) else None, err)

    def reply_error(self, msg_id: int | str | None, err: BaseException) -> None:
        """Answers request `msg_id` (None: one whose id is unknown) with `err`'s JSON-RPC error."""
        error = to_rpc_error(err)
        logger.warning("request %s rejected: %s (%s)", msg_id, error.message, error.code)
        if msg_id is None:  # lsprotocol would leave out the `"id": null` JSON-RPC requires here
            self._send_data({"jsonrpc": messages.JSONRPC_VERSION, "id": None,
                             "error": {"code": error.code, "message": error.message}})
        else:
            self._send_response(msg_id, error=error.to_response_error())

    def notification_failed(self, method: str, uri: str | None, err: BaseException) -> None:
        """Logs a notification that could not be applied; shows it once per (method, document)."""
        message = to_rpc_error(err).message
        logger.error("%s%s not applied: %s", method, f" ({uri})" if uri else "", message)
        if (method, uri) not in self._shown and len(self._shown) < _MAX_SHOWN:
            self._shown.add((method, uri))
            self.notify(types.WINDOW_SHOW_MESSAGE, types.ShowMessageParams(
                type=types.MessageType.Error, message=f"codectx: {method} not applied: {message}"))

    def _handle_request(self, msg_id, method_name, params):
        """pygls' dispatch, with failures answered through `errors.to_rpc_error`."""
        try:
            handler = self._get_handler(method_name)
        except JsonRpcMethodNotFound as err:
            logger.warning("request %s: unknown method %r", msg_id, method_name)
            self._send_response(msg_id, error=err.to_response_error())
            return
        self._ctx_msg_id.set(msg_id)
        try:
            self._execute_handler(msg_id, handler, partial(self._send_handler_result, msg_id=msg_id),
                                  args=(params,))
        except Exception as err:  # noqa: BLE001 - answered through the one error map
            self._request_futures.pop(msg_id, None)
            self.reply_error(msg_id, err)

    def _handle_cancel_notification(self, msg_id) -> None:
        """`$/cancelRequest`: a generator request's running step is cancelled, and its outer future with it once
        the step has ended (its cleanup sent); any other request as pygls cancels it."""
        step = self._steps.get(self._request_futures.get(msg_id))
        if step is not None and not step.done():
            step.cancel()
            return
        super()._handle_cancel_notification(msg_id)

    def _handle_notification(self, method_name, params):
        """pygls' dispatch, with failures logged and shown (`notification_failed`)."""
        if method_name == types.CANCEL_REQUEST:
            self._handle_cancel_notification(params.id)
            return
        try:
            handler = self._get_handler(method_name)
        except JsonRpcMethodNotFound:
            logger.info("ignoring notification for unknown method %r", method_name)
            return
        document = getattr(params, "text_document", None)
        done = partial(self._notification_done, method=method_name, uri=getattr(document, "uri", None))
        try:
            self._execute_handler(None, handler, done, args=(params,))
        except Exception as err:  # noqa: BLE001 - reported like a failing handler
            self.notification_failed(method_name, getattr(document, "uri", None), err)

    def _notification_done(self, future, *, method: str, uri: str | None) -> None:
        if not future.cancelled() and (exc := future.exception()) is not None:
            self.notification_failed(method, uri, exc)  # to_rpc_error logs an unexpected one's traceback

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
        if result_future not in self._steps:  # forgotten with the request
            result_future.add_done_callback(lambda outer: self._steps.pop(outer, None))
        self._steps[result_future] = step
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

    @lsp_method(types.EXIT)
    def lsp_exit(self, *args) -> None:
        """Runs the user's exit handler, then ends the transport (see `finish`)."""
        self.finish()

    def finish(self) -> int:
        """Runs the user's exit handler once and reports the exit status to the transport.

        Called for `exit` and by the transport at end of input. The status is 0 if
        `shutdown` came first, 1 otherwise (LSP). Without a transport callback it
        exits like pygls: closes the writer and raises SystemExit.

        Returns:
            The exit status.
        """
        if self.exit_code is not None:
            return self.exit_code
        self.exit_code = 0 if self._shutdown else 1
        if (handler := self.fm.features.get(types.EXIT)) is not None:
            try:
                handler(None)
            except Exception:  # noqa: BLE001 - the process ends either way
                logger.exception("the exit handler failed")
        if self.on_exit is not None:
            self.on_exit(self.exit_code)
            return self.exit_code
        if self.writer is not None:
            self.writer.close()
        sys.exit(self.exit_code)

    @lsp_method(types.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: types.DidOpenTextDocumentParams):
        """The user's handler only (no pygls copy); this document's problems may be shown again."""
        self._shown = {key for key in self._shown if key[1] != params.text_document.uri}
        if (user_handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_OPEN)) is not None:
            yield user_handler, (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams):
        """The user's handler only (no pygls copy)."""
        if (user_handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CHANGE)) is not None:
            yield user_handler, (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams):
        """The user's handler only (no pygls copy)."""
        if (user_handler := self.fm.features.get(types.TEXT_DOCUMENT_DID_CLOSE)) is not None:
            yield user_handler, (params,), None

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
