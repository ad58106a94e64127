"""Test-suite settings shared by every test module."""

import os

# litellm fetches a model price list over the network at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# Generated tasks mix in the user's task secret (mappa_env.tasks.secret). A fixed one,
# whatever the caller's environment holds, gives the suite the same tasks on every
# machine and never writes a secret file into the home of whoever runs the tests.
os.environ["MAPPA_TASK_SECRET"] = "mappa-test-suite"
# No test reaches the Hugging Face Hub: a benchmark name that no local folder holds fails
# at once instead of downloading its public dataset (tests use local stand-ins).
os.environ["HF_HUB_OFFLINE"] = "1"
