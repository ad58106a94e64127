"""Former home of :mod:`mappa_train.ray.sync_modes`, where the code lives now.

This path stays importable for one release: it is the same module object, so what is
set on it (a test's ``monkeypatch``) is seen by the code that reads it.
"""

import sys

from mappa_train.ray import sync_modes

sys.modules[__name__] = sync_modes
