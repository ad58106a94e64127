"""Model specs with a query string: ``"<prefix><model>[?key=value&...]"``, read one way.

The LLM coach (``llm:<model>?...``) and API policies (``api:<model>?...``) both read
their specs with :func:`parse_model_spec`; :func:`parse_spec_bool` reads a boolean
option. Importable from :mod:`mappa_env.coach` too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl

__all__ = ["parse_model_spec", "parse_spec_bool"]


def parse_spec_bool(raw: str) -> bool:
    """``1/true/yes/on`` -> True, ``0/false/no/off`` -> False (case insensitive).

    Raises:
        ValueError: For any other text.
    """
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {raw!r}")


def parse_model_spec(
    spec: str,
    *,
    prefix: str,
    options: Mapping[str, Callable[[str], Any]],
    aliases: Mapping[str, str] | None = None,
    what: str = "model",
) -> tuple[str, dict[str, Any]]:
    """Split ``"<prefix><model>[?key=value&...]"`` into the model and its typed options.

    The one reader of model specs with a query string: the LLM coach
    (``llm:<model>?...``) and API policies (``api:<model>?...``, in
    :func:`mappa_agents.models.load_policy`) both use it, so both read
    ``?api_base=http://127.0.0.1:8000/v1&timeout_s=30`` the same way.

    Args:
        spec: The spec; ``prefix`` is optional in it.
        prefix: The backend prefix, e.g. ``"llm:"`` or ``"api:"``.
        options: Known option -> converter from its text (``int``, ``float``,
            :func:`parse_spec_bool`, ...).
        aliases: Other names of options, e.g. ``{"timeout": "timeout_s"}``.
        what: What the spec describes, for error messages (``"coach"``, ``"API policy"``).

    Returns:
        ``(model, options)``, e.g. ``("openai/judge", {"api_base": "http://...", "max_tokens":
        512})`` for ``"llm:openai/judge?api_base=http://...&max_tokens=512"``.

    Raises:
        ValueError: On an empty model, a malformed query, an unknown option or a value
            its converter rejects.
    """
    body = spec.strip()
    if body.startswith(prefix):
        body = body[len(prefix) :]
    model, _, query = body.partition("?")
    if not model.strip():
        raise ValueError(f"{what} spec {spec!r} names no model: use '{prefix}<model>[?key=value]'")
    aliases = dict(aliases or {})
    parsed: dict[str, Any] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise ValueError(f"cannot read the options of {what} spec {spec!r}: {exc}") from exc
    for key, raw in pairs:
        name = aliases.get(key, key)
        if name not in options:
            known = sorted({*options, *aliases})
            raise ValueError(f"unknown {what} option {key!r} in {spec!r}; known: {known}")
        try:
            parsed[name] = options[name](raw)
        except ValueError as exc:
            raise ValueError(f"{what} option {key}={raw!r} in {spec!r}: {exc}") from exc
    return model.strip(), parsed
