"""What a learner reads of an action: :class:`TokenRows`, its prompt and response ids.

Its own module so that the learner seam (:mod:`mappa_train.learner`) and the update
(:mod:`mappa_train.update`) both name it without importing each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["TokenRows"]


class TokenRows(Protocol):
    """What a learner reads of an action: its exact prompt and response token ids."""

    @property
    def prompt_ids(self) -> Sequence[int]:
        """The prompt's token ids, as the agent's tokenizer made them."""
        ...

    @property
    def response_ids(self) -> Sequence[int]:
        """The sampled response's token ids."""
        ...
