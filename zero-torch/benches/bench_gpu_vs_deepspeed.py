"""zero_torch against DeepSpeed 0.19.8 on the same GPU (issue 48, item 8): one process per
configuration (so each peak is its own), world size 1, bf16, stages 0-3, for GPT-2 124M and
a 1.1B Llama built from a config (random weights: the step time and the memory do not
depend on the values; built on the GPU, as a script that calls ``.cuda()`` first). Each row: the median step time (forward, backward, step; after two
warm-up steps, each step synchronized) and the peak device memory: torch's allocator peak
(``torch.cuda.max_memory_allocated``: activations, and DeepSpeed's everything) plus, for
zero, its own memory pool's peak (``memory_report()["allocator_peak"]``: zero's buffers
live outside torch's allocator).

    python zero-torch/benches/bench_gpu_vs_deepspeed.py [--steps N] [--models gpt2 llama1b]

DeepSpeed runs only where it imports (``ZERO_BENCH_DS_PATH``: a folder prepended to its
processes' ``sys.path``, as ``.ci/gpu_first_run.sh`` installs it apart from zero_torch);
its optimizer is ``torch.optim.AdamW`` (``torch_adam``: no JIT build, which needs nvcc),
zero's is its own fused Adam. Prints a markdown table; without a GPU, a visible skip."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List

MODELS = {
    "gpt2": "GPT-2 124M (12 x 768), batch 8 x 1024",
    "llama1b": "Llama 1.1B (22 x 2048, GQA 32/4, MLP 5632), batch 4 x 1024",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model(name: str) -> Any:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    # Built on the GPU (a 1.1B model's initializers take a while on the CPU): both engines
    # then start from the whole model on the device, as a script that calls .cuda() does.
    with torch.device("cuda"):
        if name == "gpt2":
            return GPT2LMHeadModel(GPT2Config(n_embd=768, n_layer=12, n_head=12, resid_pdrop=0.0, embd_pdrop=0.0,
                                              attn_pdrop=0.0))
        return LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                            num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                                            max_position_embeddings=2048))


def _config(stage: int, batch: int, engine: str) -> Dict[str, Any]:
    adam: Dict[str, Any] = {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}
    if engine == "deepspeed":
        adam["torch_adam"] = True
    return {"train_batch_size": batch, "train_micro_batch_size_per_gpu": batch, "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": adam},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 5e7, "stage3_prefetch_bucket_size": 5e7,
                                  "stage3_param_persistence_threshold": 1e5},
            "steps_per_print": 10**9}


def run_case(engine: str, model: str, stage: int, steps: int) -> Dict[str, Any]:
    """One configuration in this process: its median step time and peaks."""
    import torch

    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(_free_port()), "DS_ACCELERATOR": "cuda"})
    batch = 8 if model == "gpt2" else 4
    m = _model(model)
    vocab = m.config.vocab_size
    ids = torch.randint(0, vocab, (batch, 1024), generator=torch.Generator().manual_seed(1)).cuda()
    torch.cuda.reset_peak_memory_stats()
    if engine == "zero":
        import zero_torch

        eng, _, _, _ = zero_torch.initialize(model=m, config=_config(stage, batch, engine))
    else:
        import deepspeed

        eng, _, _, _ = deepspeed.initialize(model=m, model_parameters=m.parameters(),
                                            config=_config(stage, batch, engine))
    times: List[float] = []
    for k in range(steps + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = eng(input_ids=ids, labels=ids).loss
        eng.backward(loss)
        eng.step()
        torch.cuda.synchronize()
        if k >= 2:
            times.append(time.perf_counter() - t0)
    times.sort()
    out = {"ms": times[len(times) // 2] * 1e3, "torch_peak": int(torch.cuda.max_memory_allocated()),
           "zero_peak": 0, "loss": float(loss.item()),
           "params": sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in m.parameters())}
    if engine == "zero":
        out["zero_peak"] = int(eng.memory_report()["allocator_peak"])
    return out


_CHILD: List[Any] = []
"""The configuration's process running now (killed with this one: a ``timeout`` around
the bench must not leave it on the GPU)."""


def _stop(signum: int, _frame: Any) -> None:
    for child in _CHILD:
        child.kill()
    sys.exit(128 + signum)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["gpt2", "llama1b"])
    ap.add_argument("--stages", type=int, nargs="+", choices=[0, 1, 2, 3], default=[0, 1, 2, 3])
    ap.add_argument("--case", help=argparse.SUPPRESS)  # engine:model:stage, in a child process
    args = ap.parse_args()
    if args.case:
        engine, model, stage = args.case.split(":")
        print("RESULT " + json.dumps(run_case(engine, model, int(stage), args.steps)), flush=True)
        return
    import signal

    import torch

    signal.signal(signal.SIGTERM, _stop)
    if not torch.cuda.is_available():
        print("SKIPPED zero_torch against DeepSpeed on a GPU: torch sees no CUDA GPU on this machine", flush=True)
        return
    print(f"# zero_torch against DeepSpeed 0.19.8 on {torch.cuda.get_device_name()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, bf16, world size 1, median of {args.steps} steps\n")
    ds_path = os.environ.get("ZERO_BENCH_DS_PATH", "")
    for model in args.models:
        print(f"\n{MODELS[model]}\n")
        print("| stage | zero ms/step | DeepSpeed ms/step | zero / DS | zero peak GiB (torch + zero) | DeepSpeed peak GiB |")
        print("|---|---|---|---|---|---|")
        for stage in args.stages:
            row: Dict[str, Any] = {}
            for engine in ("zero", "deepspeed"):
                env = dict(os.environ)
                if engine == "deepspeed" and ds_path:
                    env["PYTHONPATH"] = os.pathsep.join([ds_path, env.get("PYTHONPATH", "")])
                cmd = [sys.executable, __file__, "--case", f"{engine}:{model}:{stage}", "--steps", str(args.steps)]
                child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                _CHILD[:] = [child]
                text, _ = child.communicate()
                lines = [l for l in text.splitlines() if l.startswith("RESULT ")]
                if child.returncode != 0 or not lines:
                    tail = "\n".join(text.splitlines()[-8:])
                    print(f"<!-- {engine} stage {stage} failed (exit {child.returncode}):\n{tail}\n-->", flush=True)
                    continue
                row[engine] = json.loads(lines[-1][len("RESULT "):])
            z, d = row.get("zero"), row.get("deepspeed")
            gib = 1 << 30
            zs = f"{z['ms']:.1f}" if z else "failed"
            ds = f"{d['ms']:.1f}" if d else "not run"
            ratio = f"{z['ms'] / d['ms']:.2f}" if z and d else ""
            zp = f"{(z['torch_peak'] + z['zero_peak']) / gib:.2f} ({z['torch_peak'] / gib:.2f} + {z['zero_peak'] / gib:.2f})" if z else ""
            dp = f"{d['torch_peak'] / gib:.2f}" if d else ""
            print(f"| {stage} | {zs} | {ds} | {ratio} | {zp} | {dp} |", flush=True)


if __name__ == "__main__":
    main()
