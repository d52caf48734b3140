"""Errors raised by `context`. The server maps them to user messages in one place."""


class ContextError(Exception):
    """Base class of every context error."""


class WorkspaceError(ContextError):
    """A workspace root that cannot be used (missing, not a directory)."""


class TemplateError(ContextError):
    """A chat template that cannot be rendered or split into fixed pieces and contents."""


class BudgetError(ContextError):
    """A token budget too small for the fixed segments (system, tools, template pieces)."""


class QueryFileError(ContextError):
    """A tag query (.scm) that is missing or does not compile against its grammar."""


class AccessDeniedError(ContextError):
    """A workspace path the access policy refuses (outside the root, a secret, ignored, ...)."""


class ScanStopped(Exception):
    """Raised by a scan's progress callback to stop the scan (Ctrl-C, shutdown); not a failure."""
