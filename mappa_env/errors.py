"""Errors whose message is the whole answer: what is wrong and what to do instead.

The ``mappa`` command prints these as one line (no traceback) and exits with a status
other than 0; library callers catch them like the built-in class they extend.
"""

from __future__ import annotations


class SettingsError(ValueError):
    """A setting the user gave cannot work; the message names it and the fix."""


class RunStoppedError(RuntimeError):
    """A run that stopped itself because going on could not help; the message says why."""
