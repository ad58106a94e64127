"""Trainer throughput on a GPU: rollout tokens/s, training tokens/s and MFU.

Trains MathChat-v0's three agents (separate weights, separate frozen references) for a
few steps and reads the trainer's own per-step timings. Models are either random
weights at real shapes (``0.5b``, ``1.5b``: Qwen2-style, 151,936-token vocabulary) with a
word-level tokenizer covering the whole vocabulary, or a real model directory.

MFU counts model FLOPs only, with ``N`` the parameters without the input embedding (a
lookup, not a matmul): ``6 N`` per trained token (forward + backward) plus ``2 N`` per
token for each of the two no-grad log-prob passes (old policy, reference), against the
bf16 peak given by ``--peak-tflops`` (796 measured on an H200). Random
models never emit EOS, so every response runs to ``--max-new-tokens`` and is trained on
(``mask_truncated=False``).

Run:  python -m benchmarks.bench_train_gpu --shape 0.5b --steps 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

SHAPES = {
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
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = word_level_tokenizer(VOCAB)
    config = Qwen2Config(
        vocab_size=VOCAB,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        **SHAPES[shape],
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def profile_one_step(trainer, step: int, out: Path) -> str:
    """Run ``step`` under torch.profiler; write and return the top-operator table."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        trainer.train(until=step)
    sort_by = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    table = prof.key_averages().table(sort_by=sort_by, row_limit=30)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"profile_step{step}.txt").write_text(table + "\n")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="0.5b", help="0.5b, 1.5b, or a model directory / spec")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--train-batch", type=int, default=64)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument(
        "--train-truncated",
        action="store_true",
        help="train on responses cut by the length limit (default for random-weight shapes)",
    )
    parser.add_argument("--peak-tflops", type=float, default=796.0)
    parser.add_argument(
        "--profile-step",
        type=int,
        default=0,
        help="run this step (1-based) under torch.profiler and write the top operators",
    )
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    args = parser.parse_args()

    import torch

    from mappa_train.config import TrainConfig
    from mappa_train.trainer import Trainer

    work = Path(tempfile.mkdtemp(prefix="mappa-bench-"))
    system = (
        str(random_model_dir(args.shape, work / "model")) if args.shape in SHAPES else args.shape
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
        gradient_checkpointing=args.gradient_checkpointing,
        save_every=0,
        keep_checkpoints=1,
        tensorboard=False,
        progress=False,
        output_dir=str(work / "run"),
        lr=1e-6,
    )
    started = time.perf_counter()
    trainer = Trainer(config)
    trainer.setup()
    model = next(iter(trainer.learners.values())).model
    # The input embedding is a lookup, not a matmul: leave it out of the 6N count.
    n_params = (
        sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    )
    setup_s = time.perf_counter() - started
    if args.profile_step:
        # Steps before the profiled one, the profiled one, then the rest (one schedule).
        trainer.train(until=args.profile_step - 1)
        profile_table = profile_one_step(trainer, args.profile_step, Path(args.out))
        print(profile_table)
    history = trainer.train()
    rows = []
    for m in history:
        tokens = m["train/tokens"]
        flops_update = 6 * n_params * tokens
        flops_logprob = 2 * 2 * n_params * tokens
        peak = args.peak_tflops * 1e12
        rows.append(
            {
                "step": m["step"],
                "rollout_s": round(m["rollout/seconds"], 2),
                "rollout_tok_s": round(m["rollout/tokens_per_s"]),
                "train_s": round(m["train/seconds"], 2),
                "train_tok_s": round(tokens / m["train/seconds"]),
                "mfu_train_phase": round(
                    (flops_update + flops_logprob) / m["train/seconds"] / peak, 4
                ),
                "mfu_update_only": round(flops_update / m["train/update_seconds"] / peak, 4),
            }
        )
    steady = rows[1:] or rows
    summary = {
        "shape": args.shape,
        "params_per_agent": n_params,
        "agents": len(trainer.agents),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "setup_s": setup_s,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "steps": rows,
        "steady_median": {
            key: statistics.median(r[key] for r in steady)
            for key in ("rollout_tok_s", "train_tok_s", "mfu_train_phase", "mfu_update_only")
        },
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30
        if torch.cuda.is_available()
        else None,
    }
    # Model copies, optimizer states and the final checkpoint take gigabytes per run.
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(summary, indent=2))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"train_gpu_{Path(args.shape).name}.json").write_text(
        json.dumps(summary, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
