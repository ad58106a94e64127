"""``python -m mappa_train``: the ``mappa`` command."""

import sys

from mappa_train.command import main

sys.exit(main())
