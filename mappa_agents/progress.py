"""Progress bars of the libraries mappa loads models with, on or off with mappa's own.

``--no-progress`` hid mappa's bar while transformers still drew "Loading weights" and
"Writing model shards" (every checkpoint) and huggingface_hub its download bars.
:func:`library_progress_bars` turns those off for a block and back on after it, as far as
the libraries allow: they keep one switch per process, so bars drawn by other threads
during the block are hidden too.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from types import ModuleType

_TRANSFORMERS_LOGGING = "transformers.utils.logging"


def _hub_utils() -> ModuleType | None:
    """``huggingface_hub.utils``, or ``None`` where it is not installed."""
    try:
        return importlib.import_module("huggingface_hub.utils")
    except ImportError:
        return None


@contextlib.contextmanager
def library_progress_bars(enabled: bool) -> Iterator[None]:
    """Within the block, show the model libraries' progress bars only if ``enabled``.

    Off, huggingface_hub's bars (downloads; the ``datasets`` library's follow them) and
    transformers' (loading and saving weights) are disabled, and each is restored on
    exit to what it was: a library imported inside the block (transformers, loaded with
    the first model) is switched back on after it when the hub's bars were on before.
    ``HF_HUB_DISABLE_PROGRESS_BARS=0`` in the environment takes precedence (the hub says
    so in a warning). Neither library is imported unless installed; transformers is not
    imported here at all.

    Args:
        enabled: ``True`` leaves everything as it is.
    """
    hub = None if enabled else _hub_utils()
    if hub is None:  # nothing to do, or no library that draws bars: transformers needs the hub
        yield
        return
    hub_was_on = not hub.are_progress_bars_disabled()
    tf_logging = sys.modules.get(_TRANSFORMERS_LOGGING)
    tf_was_on = tf_logging.is_progress_bar_enabled() if tf_logging is not None else hub_was_on
    hub.disable_progress_bars()
    if tf_logging is not None:
        tf_logging.disable_progress_bar()
    try:
        yield
    finally:
        tf_logging = sys.modules.get(_TRANSFORMERS_LOGGING)
        if tf_logging is not None:
            # transformers keeps a switch of its own, read from the hub's at its import.
            if tf_was_on:
                tf_logging.enable_progress_bar()
            else:
                tf_logging.disable_progress_bar()
        if hub_was_on:
            hub.enable_progress_bars()
        else:
            hub.disable_progress_bars()
