"""Gymnasium spaces for text observations and actions.

``gymnasium.spaces.Text`` only admits characters from a fixed charset (alphanumerics by
default), so real model output with punctuation, newlines or unicode is "out of bounds"
and PettingZoo's API test fails on it. :class:`UnicodeText` accepts any string up to a
length bound and samples bounded random unicode strings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gymnasium import spaces

# Sampling draws from a mix of scripts so random play exercises non-ASCII handling,
# including characters that are awkward for parsers (backticks, braces, backslashes).
_SAMPLE_ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    " \n\t.,;:!?()[]{}<>+-*/=_^$#%&|~`'\"\\"
    "éüßçñøåæœ"  # Latin-1 supplement and extended
    "αβγδεπσωΣΩ"  # Greek
    "√∑∫≤≥≠∞±×÷"  # math symbols
    "中文数学答案"  # CJK
    "🙂🚀🔥"  # astral-plane emoji
)


class UnicodeText(spaces.Space[str]):
    """Any Python ``str`` of at most ``max_length`` characters.

    Args:
        max_length: Largest accepted length in characters.
        max_sample_length: Largest length produced by :meth:`sample` (sampling huge
            strings would only slow random play down). Defaults to ``min(max_length, 256)``.
        seed: Seed for the space's random generator.
    """

    def __init__(
        self, max_length: int, max_sample_length: int | None = None, seed: int | None = None
    ) -> None:
        if max_length < 0:
            raise ValueError(f"max_length must be >= 0, got {max_length}")
        self.max_length = int(max_length)
        self.max_sample_length = min(
            self.max_length, 256 if max_sample_length is None else int(max_sample_length)
        )
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        """Text cannot be flattened into a fixed-size array."""
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random string of 0..``max_sample_length`` characters from a mixed alphabet."""
        if mask is not None or probability is not None:
            raise ValueError("UnicodeText.sample takes no mask or probability")
        length = int(self.np_random.integers(0, self.max_sample_length + 1))
        idx = self.np_random.integers(0, len(_SAMPLE_ALPHABET), size=length)
        return "".join(_SAMPLE_ALPHABET[i] for i in idx)

    def contains(self, x: Any) -> bool:
        """True for a ``str`` no longer than ``max_length``."""
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnicodeText) and other.max_length == self.max_length

    def __hash__(self) -> int:
        return hash(("UnicodeText", self.max_length))

    def to_jsonable(self, sample_n: Sequence[str]) -> list[str]:
        """Strings are already JSON-serialisable."""
        return list(sample_n)

    def from_jsonable(self, sample_n: Sequence[str]) -> list[str]:
        """Inverse of :meth:`to_jsonable`."""
        return list(sample_n)


def chat_messages_space(max_chars: int) -> spaces.Sequence:
    """Space of a chat transcript: a tuple of ``{"role": str, "content": str}`` dicts."""
    message = spaces.Dict(
        {"role": UnicodeText(32, max_sample_length=9), "content": UnicodeText(max_chars)}
    )
    return spaces.Sequence(message, stack=False)


def text_observation_space(max_chars: int) -> spaces.Dict:
    """Observation space of the text environments.

    An observation is ``{"text": str, "messages": tuple[dict, ...]}``: the readable
    prompt and the chat messages a policy should be prompted with (role instructions
    included), so policies need no environment-specific prompt code.
    """
    return spaces.Dict({"text": UnicodeText(max_chars), "messages": chat_messages_space(max_chars)})


def make_observation(messages: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    """Build an observation from chat messages; ``text`` is the messages joined for reading."""
    frozen = tuple({"role": m["role"], "content": m["content"]} for m in messages)
    text = "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in frozen)
    return {"text": text, "messages": frozen}


__all__ = ["UnicodeText", "chat_messages_space", "make_observation", "text_observation_space"]
