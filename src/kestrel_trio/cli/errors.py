"""How the ``kestrel-trio`` command reports a failure: one line, ``kestrel-trio: error: ...``, and an exit code.

trio's nurseries wrap an error in (nested) exception groups on its way out of
``trio.run``; the line names the error inside, not the wrapping. Exit codes:
2 for what the user must fix (a model folder, a prompt), 1 for runtime
failures (a port in use, a crash), 130 for Ctrl-C.
"""

from __future__ import annotations

import sys
import traceback

from kestrel_trio.errors import BadRequestError, KestrelError, ModelLoadError

if sys.version_info < (3, 11):  # trio depends on the backport there
    from exceptiongroup import BaseExceptionGroup

__all__ = ["report"]


def report(exc: BaseException, *, show_traceback: bool) -> int:
    """Print ``exc`` as one ``kestrel-trio: error:`` line (after its traceback when asked); the exit code."""
    errors = _leaves(exc)
    first = errors[0] if errors else exc
    if isinstance(first, KeyboardInterrupt):
        print("\nkestrel-trio: interrupted", file=sys.stderr)
        return 130
    if show_traceback:
        traceback.print_exception(exc)
    message, code = _describe(first)
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''}"
        message += ")" if show_traceback else "; --log-level DEBUG shows them)"
    elif code == 1 and not isinstance(first, (KestrelError, OSError)) and not show_traceback:
        message += " (--log-level DEBUG shows the traceback)"
    print(f"kestrel-trio: error: {message}", file=sys.stderr, flush=True)
    return code


def _leaves(exc: BaseException) -> list[BaseException]:
    """The errors inside ``exc``: trio's nurseries wrap them in (nested) exception groups; Cancelled is no error."""
    import trio

    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [] if isinstance(exc, trio.Cancelled) else [exc]


def _describe(error: BaseException) -> tuple[str, int]:
    """The one-line message of ``error`` and the exit code it means."""
    if isinstance(error, (ModelLoadError, BadRequestError)):
        return error.message, 2  # the user's to fix: the model folder, the prompt
    if isinstance(error, KestrelError):
        return error.message, 1
    if isinstance(error, OSError) and error.strerror:
        return error.strerror + (f": {error.filename}" if error.filename else ""), 1
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__, 1
