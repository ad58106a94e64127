"""Training configuration: one dataclass, a docstring per field, the paper's defaults."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mappa_env.credit import CREDIT_MODES, CreditSettings
from mappa_env.errors import SettingsError
from mappa_env.typecheck import check_fields

logger = logging.getLogger(__name__)

#: The ways new weights can reach rollout engine actors (see ``TrainConfig.weight_sync``).
WEIGHT_SYNC_MODES = ("auto", "object_store", "cuda_ipc", "broadcast")


@dataclass
class TrainConfig:
    """Settings of a MAPPA training run (REINFORCE++ with per-action coach rewards).

    Defaults follow the paper's MathChat runs where one exists; ``mappa train --help``
    and YAML files override any field.
    """

    # ------------------------------------------------------------------ what to train
    env: str = "MathChat-v0"
    """A registered environment id (``MathChat-v0``, ``DSBench-v0``, or one registered with
    ``mappa_env.register``) or the import path of an environment class, ``module:Class``."""

    env_options: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for the training environment (``tasks``, ``turns``, ...)."""

    eval_env_options: dict[str, Any] | None = None
    """Keyword arguments of the held-out evaluation environment (its ``tasks``);
    ``None`` reuses ``env_options``."""

    eval_sets: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Further held-out task sets, evaluated beside the main one at every evaluation:
    name -> environment options laid over ``eval_env_options`` (e.g. ``{"out_of_family":
    {"tasks": "more.json"}}``). Logged as ``eval/<name>/...``, episodes saved under
    ``eval/<name>/``; so held-out problems of other kinds are reported apart."""

    system: str | dict[str, str] = "smollm2-135m"
    """Initial model of every agent (``smollm2-135m``, an HF id or local path), or a
    mapping agent -> model. Each agent gets its own trainable copy and its own frozen
    reference (the initial weights)."""

    train_agents: list[str] | None = None
    """Agents to train (``None``: every agent); on the command line a comma-separated
    list, e.g. ``--train-agents problem_solver,code_executor``. The others are frozen:
    they still act (their ``system`` model, local or ``api:``) and are scored, recorded
    and logged, but get no optimizer, reference model, update or checkpoint."""

    coach: str = "rules"
    """Coach spec: ``rules`` (offline) or ``llm:<litellm model>``."""

    isolation: str = "auto"
    """How agents' code is confined: ``auto`` (Linux namespaces where bubblewrap works,
    else none with a warning), ``namespaces`` (or stop) or ``none``; passed to the
    environments (see :mod:`mappa_env.sandbox.isolation`). An agent being trained finds
    any way to its reward that skips the task: keep it confined."""

    # ------------------------------------------------------------------ rollouts
    steps: int = 128
    """Rollout + update steps (the paper: 128 for MathChat, 8 passes over 512 prompts)."""

    prompts_per_step: int = 32
    """Tasks sampled per step (32 for MathChat, 16 for DSBench in the reference code)."""

    samples_per_prompt: int = 2
    """Episodes per task per step (2 in the reference code)."""

    concurrency: int = 64
    """Episodes in flight during rollouts."""

    rollout_schedule: str = "ticks"
    """How the rollout runner batches generation (see :mod:`mappa_agents.runner`):
    ``"ticks"`` (deterministic batches, so a seeded run and a resumed one give the same
    rollouts), ``"continuous"`` (each policy serves requests as they arrive and a slow
    episode holds up only itself; rollouts then depend on timing, so a resumed run no
    longer repeats the original one exactly) or ``"episodes"`` (every episode on its own,
    one unseeded request per turn into policies that batch continuously, the others
    served as in ``"continuous"``; not repeatable either). Weights change only between
    steps, so every schedule's rollouts are on-policy."""

    rollout_engine: str = "hf"
    """What the trained agents generate with: ``"hf"`` (the very modules being trained,
    through transformers' ``generate``) or ``"vllm"`` (one in-process vLLM engine per
    trained agent, the ``vllm`` extra; the new weights are loaded into it after each
    update and its prefix cache reset). Full fine-tuning only; with ``distributed: ray``
    the engines are the rollout engine actors (``engines_per_agent`` >= 1)."""

    vllm_options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of ``vllm.LLM`` for ``rollout_engine="vllm"`` (``max_model_len``,
    ``enforce_eager``, ...). By default each engine gets the model's dtype and
    ``gpu_memory_utilization = 0.45 / engines``, leaving over half the GPU to training
    (as a Ray actor: 0.9 of its ``gpus_per_engine``)."""

    max_new_tokens: int = 4096
    """Tokens per action (the paper's budget; lower it for CPU runs)."""

    temperature: float = 1.0
    """Rollout sampling temperature (the paper: 1.0). Old, new and reference log-probs are
    computed at this temperature, so the PPO ratio and the KL refer to the distribution
    that was sampled."""

    top_p: float = 1.0
    """Rollout nucleus sampling mass. Values below 1 sample from a truncated distribution
    the loss does not model (a warning says so); keep 1.0 for on-policy updates."""

    # ------------------------------------------------------------------ the algorithm
    credit_mode: str = "process"
    """Reward of each action: ``process`` (the coach's score, the paper), ``outcome``
    (the episode's correctness to every action, the paper's baseline), ``agent_oracle``
    (whether the acting agent's own final answer is right), ``mixed``, ``backprop`` (see
    :mod:`mappa_env.credit`). The environment computes the reward, so this is passed to
    the environments the trainer makes; episodes paid under other credit are refused."""

    outcome_weight: float = 0.5
    """Weight of the outcome in ``mixed`` credit (passed to the environments)."""

    backprop_decay: float = 0.5
    """Decay of the passed-back outcome error per action in ``backprop`` credit (passed to
    the environments)."""

    advantage_estimator: str = "reinforce_pp"
    """A registered advantage estimator: ``reinforce_pp`` (batch whitening, the paper),
    ``grpo`` or ``rloo`` (group baselines, meaningful only for agents whose samples share
    prompts), or one added with :func:`mappa_train.register_estimator` (before the trainer
    is built, which looks the name up)."""

    normalize_scope: str = "agent"
    """Whitening scope of REINFORCE++ advantages: ``agent`` (each agent's tokens, as the
    reference code) or ``all`` (all agents' tokens together)."""

    kl_coef: float = 0.01
    """``beta``: weight of the per-token KL penalty to the reference model."""

    kl_estimator: str = "k1"
    """KL estimator: ``k1`` (the paper), ``k2`` or ``k3``. REINFORCE++ folds it into the
    token rewards; ``grpo``/``rloo`` add ``kl_coef`` x it to the loss instead."""

    gamma: float = 1.0
    """Discount factor of token returns."""

    clip_eps: float = 0.2
    """PPO clip range."""

    clip_eps_high: float | None = None
    """Upper clip range (``None``: same as ``clip_eps``)."""

    mask_truncated: bool = True
    """Leave responses cut by ``max_new_tokens`` (no EOS) out of the loss, as the paper
    does: their reward judges an unfinished answer."""

    stop_unscored_rate: float = 1.0
    """A step counts toward the stop rule when at least this share of the trained agents'
    actions got no usable reward (an invalid coach verdict: garbage, a timeout, an HTTP
    error, a dead server; see :mod:`mappa_train.stop_rules`). 1.0: only steps where no
    action could be scored, i.e. that trained nothing."""

    stop_unscored_steps: int = 2
    """Stop the run, naming the coach's last error, after this many counting steps in a
    row (0: never). 2 lets a one-step coach outage cost that step's rewards, not the run."""

    # ------------------------------------------------------------------ optimisation
    lr: float = 1e-6
    """Learning rate (Adam)."""

    adam_betas: tuple[float, float] = (0.9, 0.95)
    """Adam betas."""

    weight_decay: float = 0.0
    """Decoupled weight decay."""

    grad_clip: float = 1.0
    """Global gradient-norm clip."""

    warmup_ratio: float = 0.03
    """Share of rollout steps spent in linear warm-up before the cosine decay (the learning
    rate is constant within a step)."""

    train_batch_size: int = 16
    """Actions per optimizer step (per agent); a step's rollouts are used once (one epoch)."""

    old_logprob_pass: str = "auto"
    """Whether the update's no-grad pass for the old log-probs runs: ``auto`` skips it
    for an agent whose usable actions fit in one optimizer step (at most
    ``train_batch_size``) when the advantage estimator does not read old log-probs
    (``grpo``, ``rloo``; not ``reinforce_pp``, whose KL is in the rewards). The loss
    pass's own detached log-probs are then the ratio's denominator (ratio 1, the plain
    policy gradient, as TRL's GRPOTrainer does). ``always`` runs it every step, to
    compare."""

    micro_batch_size: int = 4
    """Actions per forward/backward pass (gradient accumulation up to ``train_batch_size``).
    Actions of a mini-batch are grouped by length into micro-batches, so little of a
    pass is spent on padding; the summed gradient does not depend on the grouping."""

    micro_batch_tokens: int = 0
    """When > 0, micro-batches (of the update and of the log-prob passes) are formed by this
    many padded tokens instead of ``micro_batch_size`` rows: rows sorted by length are
    grouped while ``rows x longest row`` fits (a longer row goes alone, and no group
    exceeds ``train_batch_size`` rows). Short rows then share one pass instead of paying
    the per-pass overhead four at a time. 0 keeps ``micro_batch_size``."""

    rollout_batch_size: int = 64
    """Largest number of prompts one agent's model generates at once during rollouts
    (local models); prompts of similar length are batched together."""

    compile_decode: bool = True
    """Decode rollouts on CUDA by replaying each model's decode step as a CUDA graph over
    a static KV cache (``HFPolicy``'s ``compile_decode``): eager decoding is bound by
    kernel launches, not by the GPU. mappa records the graphs itself, one per batch rows
    and cache length, the first time a policy meets that shape (no compiler runs).
    Ignored on CPU and with LoRA (adapters switch at every call)."""

    logprob_chunk_size: int = 1024
    """Response positions per output-head chunk when computing log-probs."""

    recompute_logits: bool = True
    """Recompute each chunk's output-head logits in the backward pass rather than keep
    them: off skips the recompute but holds 4 bytes x vocabulary per trained response token
    (2.5 GB for a micro-batch of 4,096 response tokens with a 152k vocabulary)."""

    lora_rank: int = 0
    """0 trains every agent's full weights (separate copies, the paper). Above 0, agents
    share one frozen base model and each trains its own LoRA adapter of this rank; the
    reference is the base with adapters off. Needs one base model for all agents."""

    lora_alpha: int = 32
    """LoRA scale numerator (the update is scaled by ``lora_alpha / lora_rank``)."""

    lora_target_modules: str = "all-linear"
    """Modules that get adapters (``all-linear``: every linear layer but the output head)."""

    gradient_checkpointing: bool | Literal["auto"] = "auto"
    """Recompute decoder activations in the backward pass to save memory. ``"auto"``
    decides before each agent's update from its model and rows: off (faster) when the
    largest micro-batch's activations (:func:`mappa_train.memory.activation_bytes`) fit
    in half the free device memory, else on; the log says when the choice changes.
    ``True`` / ``False`` fix it. Switching leaves decoding alone: layers read the setting
    only when training with gradients on, and recorded decode graphs (``compile_decode``)
    replay the kernels they were recorded with. The Ray learners treat ``"auto"`` as
    ``True``."""

    dtype: str = "auto"
    """Model dtype: ``auto`` (bf16 on CUDA, fp32 on CPU), ``bfloat16`` or ``float32``
    (``float16`` is refused: it needs loss scaling, which the trainer does not do)."""

    mixed_precision: bool = True
    """With bf16 models and full fine-tuning: the optimizer keeps float32 master weights,
    gradients and Adam states, and rounds the masters into the bf16 model after each
    step (forward and backward passes, rollouts and the reference stay pure bf16). Off,
    Adam updates the bf16 weights in place: 8 bytes per parameter less per agent, but a
    bf16 weight has 8 bits of mantissa, so steps at the paper's lr 1e-6 are mostly
    rounded away. No effect with LoRA (peft keeps adapters in float32) or float32."""

    device: str = "auto"
    """Torch device (``auto``: CUDA when available)."""

    # ------------------------------------------------------------------ distributed
    distributed: str = "none"
    """``none``: one process trains every agent. ``ray``: each trained agent's learner is
    a group of ``ranks_per_agent`` Ray actors that shard its model, reference and AdamW
    with FSDP2 (:mod:`mappa_train.ray.trainer`); the loop, rollouts, coach, credit and
    advantages stay in the driver, which gets the new weights after each update."""

    ranks_per_agent: int = 1
    """Ranks (Ray actors) in each trained agent's learner group (``distributed: ray``)."""

    gpus_per_rank: float = 1.0
    """GPUs Ray gives each learner rank when CUDA is used: 1 gives each rank its own GPU;
    a fraction places several agents' ranks on one GPU (ranks of one agent still need
    a GPU each: NCCL refuses two ranks of a group on one device). Ignored on CPU."""

    engines_per_agent: int = 0
    """Rollout engines (Ray actors, each an HF copy of the agent, or a vLLM engine with
    ``rollout_engine: vllm``) per trained agent (``distributed: ray``); 0: the driver
    acts with its own copy. Calls go to an agent's engines in turn; new weights reach
    them after each update as ``weight_sync`` says."""

    gpus_per_engine: float = 1.0
    """GPUs Ray gives each rollout engine when CUDA is used (fractions share a GPU)."""

    colocate_engines: bool = True
    """Where the rollout engines go on GPUs. ``True``: engine ``e`` of each agent joins
    the placement bundle of rank ``e % ranks_per_agent``, so when the bundle's shares
    fit one GPU (``gpus_per_rank`` and ``gpus_per_engine`` small enough) the engine
    shares its rank's GPU and gets weights by CUDA IPC. ``False``: the engines get
    bundles of their own, on GPUs no rank uses (split placement; weights by
    broadcast)."""

    agents_in_parallel: bool | Literal["auto"] = "auto"
    """Run the agents' log-prob passes and updates at once, each agent's group in its
    own processes (``distributed: ray``); ``False``: one agent after another (the
    single-process order). ``"auto"``: at once unless two agents' groups of several
    ranks share a GPU, where one group's collectives would wait while another's
    kernels hold it. At once, agents that share a GPU hold their activations at the
    same time."""

    weight_sync: str = "auto"
    """How new weights reach the rollout engine actors (:mod:`mappa_train.ray.weight_sync`):
    ``"cuda_ipc"`` (an engine on the GPU of one of its group's ranks copies from that
    rank's buffer on the GPU), ``"broadcast"`` (rank 0 broadcasts to the engines over a
    process group of their own: NCCL on GPUs, for engines on other GPUs; gloo on CPU),
    ``"object_store"`` (through Ray's object store and host memory), or ``"auto"``:
    ``cuda_ipc`` when every engine shares a GPU with a rank, ``broadcast`` when none
    does and no two share one, else (and on CPU) ``object_store``. The driver's own rollout copies
    (``engines_per_agent: 0``) always use the object store."""

    weight_sync_bucket_mb: float = 1024.0
    """Most MiB of weights (in the engines' dtype) sent at once by ``cuda_ipc`` and
    ``broadcast``: each rank that sends, and each receiving engine, holds one buffer of
    this size (smaller when the whole model fits); a vLLM engine also keeps copies of a
    sync's earlier buckets in host memory until it reloads."""

    ray_address: str | None = None
    """Ray cluster to join (``"auto"``: the one this machine runs; an address such as
    ``"ray://head:10001"``); ``None`` starts a local one."""

    # ------------------------------------------------------------------ evaluation, logging
    eval_every: int = 0
    """Evaluate on held-out tasks every this many steps (0: never; also at the end if > 0)."""

    eval_at_start: bool = False
    """Also evaluate before the first step (logged as step 0): the untrained system's
    score on the same held-out tasks and sampling seeds as the later evaluations."""

    eval_episodes: int = 32
    """Episodes per evaluation."""

    eval_temperature: float = 0.6
    """Evaluation sampling temperature (0.6 in the paper)."""

    save_every: int = 10
    """Write a checkpoint every this many steps (0: only at the end)."""

    keep_checkpoints: int = 2
    """Complete checkpoints kept on disk (older ones are removed). Each holds every
    agent's weights and optimizer: 14 bytes per parameter per agent with bf16 master
    weights (2 weights + 4 master + 8 Adam), 6 in bf16 without, 12 in float32."""

    output_dir: str = "runs/train"
    """Where metrics, checkpoints and plots go. A run whose ``output_dir`` holds
    checkpoints resumes from the newest one, which must be of the same environment,
    trained agents, LoRA rank and models (:mod:`mappa_train.resume`)."""

    resume_intact: bool = False
    """When the newest checkpoint is damaged (a file cut by a kill or a full disk), resume
    from the newest intact one, renaming the damaged one ``<name>.damaged``; off, the
    run stops naming both."""

    tensorboard: bool = True
    """Also log metrics to TensorBoard (needs the ``tensorboard`` package)."""

    wandb_project: str | None = None
    """Log to this Weights & Biases project (needs ``wandb``); ``None`` disables."""

    progress: bool = True
    """Show a progress bar over steps.

    Off (``--no-progress``), ``mappa train`` hides the model libraries' bars too (loading
    weights, writing checkpoints)."""

    seed: int = 0
    """Seeds task sampling, rollouts and mini-batch order; a resumed run continues exactly."""

    def __post_init__(self) -> None:
        self.train_agents = _agent_list(self.train_agents)
        # Every field against its own annotation (YAML's "false" is text, not False).
        check_fields(self)
        # Only the form of the name: the registry is asked when the trainer is built, so
        # an estimator may be registered after its config exists.
        if not isinstance(self.advantage_estimator, str) or not self.advantage_estimator:
            raise SettingsError(
                "advantage_estimator must name a registered estimator (see "
                f"mappa_train.estimator_names()), got {self.advantage_estimator!r}"
            )
        if not isinstance(self.eval_sets, dict) or not all(
            isinstance(options, dict) for options in self.eval_sets.values()
        ):
            raise SettingsError(
                "eval_sets must map a set name to environment options, e.g. "
                f"{{'out_of_family': {{'tasks': 'more.json'}}}}; got {self.eval_sets!r}"
            )
        for name in self.eval_sets:
            if not isinstance(name, str) or not name or "/" in name:
                raise SettingsError(
                    f"eval set names become metric and folder names: use a non-empty name "
                    f"without '/', got {name!r}"
                )
        choices = {
            "credit_mode": CREDIT_MODES,
            "normalize_scope": ("agent", "all"),
            "kl_estimator": ("k1", "k2", "k3"),
            "isolation": ("auto", "namespaces", "none"),
            "rollout_schedule": ("ticks", "continuous", "episodes"),
            "rollout_engine": ("hf", "vllm"),
            "distributed": ("none", "ray"),
            "weight_sync": WEIGHT_SYNC_MODES,
            "old_logprob_pass": ("auto", "always"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise SettingsError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.rollout_engine == "vllm" and self.lora_rank > 0:
            raise SettingsError(
                "rollout_engine='vllm' loads each trained agent's full weights into its "
                "engine after every update: it needs lora_rank=0"
            )
        if (
            self.rollout_engine == "vllm"
            and self.distributed == "ray"
            and (self.engines_per_agent < 1)
        ):
            raise SettingsError(
                "rollout_engine='vllm' with distributed='ray' runs the vLLM engines as "
                "rollout engine actors: set engines_per_agent to 1 or more"
            )
        for name in ("gradient_checkpointing", "agents_in_parallel"):
            value = getattr(self, name)
            if not (isinstance(value, bool) or value == "auto"):
                raise SettingsError(f"{name} must be true, false or 'auto', got {value!r}")
        positive = (
            "steps",
            "prompts_per_step",
            "samples_per_prompt",
            "concurrency",
            "max_new_tokens",
            "train_batch_size",
            "micro_batch_size",
            "rollout_batch_size",
            "ranks_per_agent",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise SettingsError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.micro_batch_size > self.train_batch_size:
            raise SettingsError("micro_batch_size must not exceed train_batch_size")
        if self.micro_batch_tokens < 0:
            raise SettingsError(
                f"micro_batch_tokens must be >= 0 (0: by micro_batch_size), "
                f"got {self.micro_batch_tokens}"
            )
        if self.lr <= 0:
            raise SettingsError(f"lr must be positive, got {self.lr}")
        ranges = {
            "outcome_weight": (0.0, 1.0),
            "backprop_decay": (0.0, 1.0),
            "warmup_ratio": (0.0, 1.0),
            "gamma": (0.0, 1.0),
            "top_p": (1e-9, 1.0),
            "stop_unscored_rate": (0.0, 1.0),
        }
        for name, (low, high) in ranges.items():
            if not low <= getattr(self, name) <= high:
                raise SettingsError(f"{name} must be in [{low}, {high}], got {getattr(self, name)}")
        for name in (
            "kl_coef",
            "clip_eps",
            "grad_clip",
            "weight_decay",
            "lora_rank",
            "stop_unscored_steps",
        ):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.temperature <= 0:
            raise SettingsError(
                f"temperature must be positive for training, got {self.temperature}"
            )
        if self.distributed == "ray" and self.lora_rank > 0:
            raise SettingsError(
                "distributed: ray trains full weights only (sharded learners do not hold "
                "LoRA adapters yet): set lora_rank: 0, or train LoRA in one process"
            )
        for name in ("gpus_per_rank", "gpus_per_engine"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name} must be positive, got {getattr(self, name)}")
        if self.engines_per_agent < 0:
            raise SettingsError(f"engines_per_agent must be >= 0, got {self.engines_per_agent}")
        if self.weight_sync in ("cuda_ipc", "broadcast") and self.engines_per_agent < 1:
            raise SettingsError(
                f"weight_sync: {self.weight_sync} sends the weights to rollout engine "
                "actors, and engines_per_agent is 0 (the driver acts with its own copies, "
                "synced through the object store): set engines_per_agent to 1 or more, "
                "or weight_sync: auto"
            )
        if self.weight_sync_bucket_mb <= 0:
            raise SettingsError(
                f"weight_sync_bucket_mb must be positive, got {self.weight_sync_bucket_mb}"
            )
        if self.top_p < 1.0:
            logger.warning(
                "top_p=%s samples from a truncated distribution that the loss does not model",
                self.top_p,
            )

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> TrainConfig:
        """Read a YAML or JSON file of field values, then apply ``overrides``.

        Raises:
            SettingsError: Naming unknown fields, a file that does not exist, or where
                a file is not valid YAML/JSON.
        """
        data = read_config_file(path)
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Build from a dict, rejecting unknown keys with the list of known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SettingsError(f"unknown config fields {unknown}; known fields: {sorted(known)}")
        return cls(**data)

    @property
    def credit(self) -> CreditSettings:
        """The credit the run's environments pay, as one value (mode and weights).

        Made from :attr:`credit_mode`, :attr:`outcome_weight` and :attr:`backprop_decay`;
        what the trainer passes to its environments and holds episodes to.
        """
        return CreditSettings(self.credit_mode, self.outcome_weight, self.backprop_decay)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON/YAML-serialisable)."""
        data = dataclasses.asdict(self)
        data["adam_betas"] = list(self.adam_betas)
        return data


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML or JSON config file holds (YAML read as 1.2 reads numbers).

    Raises:
        SettingsError: For a file that does not exist, is not valid YAML/JSON (naming the
            line), or does not hold a mapping.
    """
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise SettingsError(
            f"config file {path} does not exist: pass an existing .yaml or .json file to --config"
        ) from None
    if str(path).endswith((".yaml", ".yml")):
        import yaml

        try:
            data = yaml.load(text, Loader=_yaml_loader()) or {}  # a SafeLoader subclass
        except yaml.YAMLError as exc:
            raise SettingsError(
                f"{path} is not valid YAML ({_yaml_problem(exc)}): fix that line; "
                "each line is 'field: value'"
            ) from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SettingsError(
                f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}, column "
                f"{exc.colno}): fix it, or write the config as YAML (.yaml)"
            ) from None
    if not isinstance(data, dict):
        raise SettingsError(
            f"{path} must hold a mapping of config fields (field: value lines), got "
            f"{type(data).__name__}"
        )
    return data


def _yaml_problem(exc: Exception) -> str:
    """A YAML parser error on one line: what it met, and where (1-based line/column)."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"


def _yaml_loader() -> Any:
    """YAML's safe loader, reading ``1e-3`` as a number as YAML 1.2 and JSON do.

    YAML 1.1 (PyYAML) reads a float without a dot (``lr: 1e-3``) as the text ``"1e-3"``.
    """
    import yaml

    loader = type("ConfigLoader", (yaml.SafeLoader,), {})
    loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )
    return loader


def _agent_list(value: str | list[str] | tuple[str, ...] | None) -> list[str] | None:
    """``train_agents`` as a list: ``"a,b"`` (the command line) or ``["a", "b"]``.

    Raises:
        ValueError: For an empty list, empty or repeated names, or another type.
    """
    if value is None:
        return None
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise SettingsError(
            f"train_agents must be agent names (a list, or 'a,b' on the command line), "
            f"got {value!r}"
        )
    names = [n.strip() for n in names]
    if not names or not all(names):
        raise SettingsError(
            f"train_agents must name at least one agent, with no empty names, got {value!r} "
            "(leave it unset to train every agent)"
        )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise SettingsError(f"train_agents names {repeated} more than once")
    return names
