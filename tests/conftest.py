"""Test-suite settings shared by every test module."""

import os

# litellm fetches a model price list over the network at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
