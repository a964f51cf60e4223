"""Train a small GPT-2 (Hugging Face transformers, built from a config: nothing is
downloaded) with a script written for DeepSpeed, on zero's engine.

    torchrun --nproc-per-node 2 zero-torch/examples/train_gpt2.py \\
        --deepspeed_config zero-torch/examples/ds_config.json

``--engine deepspeed`` runs the same script on DeepSpeed itself (on the CPU:
``DS_ACCELERATOR=cpu``), which is how docs/BENCHMARKS.md compares the two. The text is
drawn from a random first-order Markov chain over 64 tokens, whose entropy rate the script
computes, so the loss has a known floor.

Like DeepSpeed, zero_torch trains on the local rank's GPU where torch sees one (NCCL, one
process per GPU) and on the CPU otherwise; ``DS_ACCELERATOR=cpu`` keeps it on the CPU.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch


def markov_chain(vocab: int, seed: int) -> torch.Tensor:
    """A random transition matrix with a few likely successors per token."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(vocab, vocab, generator=g) * 2.5
    return torch.softmax(logits, dim=-1)


def entropy_rate(p: torch.Tensor) -> float:
    """Nats per token of the chain at its stationary distribution."""
    w = torch.full((p.shape[0],), 1.0 / p.shape[0], dtype=torch.float64)
    for _ in range(500):
        w = w @ p.double()
    h = -(p.double() * p.double().clamp_min(1e-30).log()).sum(-1)
    return float((w * h).sum())


def sample(p: torch.Tensor, batch: int, seq: int, g: torch.Generator) -> torch.Tensor:
    ids = torch.empty(batch, seq, dtype=torch.long)
    ids[:, 0] = torch.randint(0, p.shape[0], (batch,), generator=g)
    for t in range(1, seq):
        ids[:, t] = torch.multinomial(p[ids[:, t - 1]], 1, generator=g).squeeze(-1)
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["zero", "deepspeed"], default="zero")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps")
    parser.add_argument("--stage", type=int, default=None, help="override zero_optimization.stage")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--precision", choices=["config", "fp32", "bf16"], default="config",
                        help="override the config's precision")
    parser.add_argument("--save", default=None, help="save a checkpoint and the 16-bit model here")
    parser.add_argument("--seed", type=int, default=0)
    if "--engine" in os.sys.argv and "deepspeed" in os.sys.argv:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed as ds

        ds.init_distributed(dist_backend="gloo")
    else:
        import zero_torch as ds
    parser = ds.add_config_arguments(parser)
    args = parser.parse_args()

    import json

    from transformers import GPT2Config, GPT2LMHeadModel

    with open(args.deepspeed_config or os.path.join(os.path.dirname(__file__), "ds_config.json")) as f:
        config = json.load(f)
    if args.stage is not None:
        config["zero_optimization"]["stage"] = args.stage
    if args.precision != "config":
        config.pop("bf16", None)
        config.pop("fp16", None)
        if args.precision == "bf16":
            config["bf16"] = {"enabled": True}
    sched = config.get("scheduler", {}).get("params", {})
    if sched.get("total_num_steps") == "auto":  # DeepSpeed itself does not resolve "auto"
        sched["total_num_steps"] = args.steps
    if args.engine == "deepspeed":
        config["optimizer"]["params"]["torch_adam"] = True  # no JIT-built fused Adam on CPU

    torch.manual_seed(args.seed)
    vocab = 64
    model = GPT2LMHeadModel(GPT2Config(
        vocab_size=vocab, n_positions=args.seq, n_embd=args.width, n_layer=args.layers,
        n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=vocab - 1, eos_token_id=vocab - 1,
    ))
    engine, _, _, _ = ds.initialize(model=model, model_parameters=model.parameters(), config=config)
    rank, world = engine.global_rank, engine.world_size
    micro = engine.train_micro_batch_size_per_gpu()
    gas = engine.gradient_accumulation_steps()
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float32
    chain = markov_chain(vocab, args.seed)
    floor = entropy_rate(chain)
    n_params = sum(p.numel() for p in model.parameters()) if engine.zero_optimization_stage() < 3 else None
    if rank == 0:
        size = f"{n_params:,} parameters, " if n_params else ""
        print(f"{args.engine}: GPT-2 ({size}{args.layers} layers, width {args.width}), stage "
              f"{engine.zero_optimization_stage()}, {world} rank(s), micro-batch {micro} x {gas} "
              f"accumulation, {dtype}; entropy rate of the text {floor:.4f} nats/token", flush=True)
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    times = []
    loss_avg = None
    for step in range(args.steps):
        t0 = time.perf_counter()
        total = 0.0
        for _ in range(gas):
            ids = sample(chain, micro, args.seq, g).to(engine.device)
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            total += loss.item() / gas
        times.append(time.perf_counter() - t0)
        loss_avg = total if loss_avg is None else 0.9 * loss_avg + 0.1 * total
        if rank == 0 and (step % 20 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {total:.4f}  (smoothed {loss_avg:.4f}, floor {floor:.4f})  "
                  f"lr {engine.get_lr()[0]:.2e}  {times[-1] * 1000:.0f} ms/step", flush=True)
    steady = sorted(times[len(times) // 5:]) or times
    if rank == 0:
        print(f"median step {steady[len(steady) // 2] * 1000:.1f} ms; final smoothed loss {loss_avg:.4f} "
              f"(gap to the floor {loss_avg - floor:.4f})", flush=True)
    # This process's own peak and current RSS (VmHWM, VmRSS: getrusage's ru_maxrss keeps
    # the high-water mark of the process that started it, across exec).
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    peak, now = (int(status[k].split()[0]) / 1024 for k in ("VmHWM", "VmRSS"))
    # What torch storage holds of the parameters now, at rest, outside the engine's buffers
    # (zero on the CPU: none, the parameters are the engine's buffers; DeepSpeed: all of
    # them, or under stage 3 the persistent ones), next to the engine's own count of its
    # model states.
    if hasattr(engine, "memory_report"):
        report = engine.memory_report()
        held = report["torch_params"]
    else:
        held = sum({p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}.values())
    line = f"rank {rank}: peak RSS {peak:.0f} MiB, now {now:.0f} MiB; parameters in torch storage at rest {held / 2**20:.2f} MiB"
    if hasattr(engine, "memory_report"):
        line += f"; engine model states {report['model_states'] / 2**20:.2f} MiB"
    print(line, flush=True)
    if args.save:
        engine.save_checkpoint(args.save)
        engine.save_16bit_model(os.path.join(args.save, "hf"), "model.safetensors")
        if rank == 0:
            model.config.save_pretrained(os.path.join(args.save, "hf"))
            print(f"saved {args.save} (checkpoint) and {args.save}/hf (load with from_pretrained)")


if __name__ == "__main__":
    main()
