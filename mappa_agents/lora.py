"""Agents that share one base model, each with its own LoRA adapter (peft).

Separate weights per agent is the method's point, but three full copies of a model (plus
three frozen references when training) cost three times the memory. With LoRA, the agents
share one frozen base and each trains only its adapter; the reference model is the base
with adapters disabled, which is exactly every agent's initial policy (peft initialises
LoRA's B matrix to zero).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mappa_env._optional import require


@dataclass(frozen=True)
class LoRASettings:
    """LoRA adapter settings.

    Attributes:
        rank: Rank ``r`` of each adapter's low-rank update.
        alpha: Scale numerator: the update is multiplied by ``alpha / rank``.
        dropout: Dropout on the adapter's input during training.
        target_modules: Module names to adapt; ``"all-linear"`` adapts every linear layer
            except the output head.
    """

    rank: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: str | tuple[str, ...] = "all-linear"

    def peft_config(self) -> Any:
        """The equivalent ``peft.LoraConfig``."""
        peft = require("peft", "agents", purpose="LoRA adapters per agent")
        targets = (
            self.target_modules
            if isinstance(self.target_modules, str)
            else list(self.target_modules)
        )
        return peft.LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=targets,
            task_type="CAUSAL_LM",
        )


def shared_lora_model(
    base: Any,
    agents: Sequence[str],
    settings: LoRASettings | None = None,
    adapter_dirs: dict[str, str | Path] | None = None,
) -> Any:
    """Wrap ``base`` in a peft model with one adapter per agent.

    Args:
        base: A loaded transformers causal LM (frozen by peft).
        agents: Adapter names, one per agent.
        settings: Settings of new adapters.
        adapter_dirs: Saved adapters to load instead of new ones (agent -> directory
            written by ``save_pretrained``), e.g. to resume training.

    Returns:
        The ``peft.PeftModel``; the first agent's adapter is active.
    """
    peft = require("peft", "agents", purpose="LoRA adapters per agent")
    settings = settings or LoRASettings()
    adapter_dirs = dict(adapter_dirs or {})
    model = None
    for agent in agents:
        saved = adapter_dirs.get(agent)
        if model is None:
            model = (
                peft.PeftModel.from_pretrained(
                    base, str(saved), adapter_name=agent, is_trainable=True
                )
                if saved
                else peft.get_peft_model(base, settings.peft_config(), adapter_name=agent)
            )
        elif saved:
            model.load_adapter(str(saved), adapter_name=agent, is_trainable=True)
        else:
            model.add_adapter(agent, settings.peft_config())
    if model is None:
        raise ValueError("shared_lora_model needs at least one agent")
    model.set_adapter(agents[0])
    return model


def adapter_parameters(model: Any, agent: str) -> list[Any]:
    """The trainable parameters of ``agent``'s adapter."""
    marker = f".{agent}."
    params = [p for name, p in model.named_parameters() if marker in name and "lora_" in name]
    if not params:
        raise ValueError(f"the model has no LoRA adapter named {agent!r}")
    return params


def lora_system(
    source: str | Path,
    agents: Sequence[str],
    settings: LoRASettings | None = None,
    *,
    device: str = "auto",
    dtype: Any = "auto",
) -> Any:
    """An :class:`~mappa_agents.system.AgentSystem` of agents sharing one base model.

    Args:
        source: HF model id or local path (or a short name such as ``smollm2-135m``).
        agents: The environment's agent ids.
        settings: LoRA settings.
        device: Torch device (``auto``: CUDA when available).
        dtype: Model dtype (``auto``: bf16 on CUDA, fp32 on CPU).

    Returns:
        The system; each agent's :class:`~mappa_agents.hf.HFPolicy` activates its adapter.
    """
    transformers = require("transformers", "agents", purpose="LoRA adapters per agent")
    from mappa_agents.hf import HFPolicy, resolve_device, resolve_dtype
    from mappa_agents.models import resolve_model
    from mappa_agents.system import AgentSystem

    path = str(resolve_model(str(source)))
    device = resolve_device(device)
    base = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=resolve_dtype(dtype, device)
    ).to(device)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = shared_lora_model(base, agents, settings)
    return AgentSystem(
        {
            agent: HFPolicy(model, tokenizer, adapter=agent, name=f"{agent}:lora:{Path(path).name}")
            for agent in agents
        }
    )
