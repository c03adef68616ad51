"""Exception classes shared by every part of pepsi-dispatch.

The command line maps them to exit codes: :class:`UsageError` (and its
subclass :class:`pepsi_dispatch.config.ConfigError`) exits 2, :class:`FatalError`
exits 1. ``str(exc)`` is always one line an operator can act on.
"""

from __future__ import annotations


class PepsiError(Exception):
    """Base class of every error pepsi-dispatch reports to an operator."""

    exit_code: int = 1


class UsageError(PepsiError):
    """Bad usage or configuration (bad file, bad graph, unknown user, lock held): exit 2."""

    exit_code = 2


class FatalError(PepsiError):
    """A fatal runtime error (for example a reloaded graph that does not parse): exit 1."""

    exit_code = 1
