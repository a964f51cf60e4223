"""What each rank runs for ``test_one_copy.py``: torch's parameters are the engine's
buffers on the CPU (one copy of the weights)."""

from __future__ import annotations

import gc
from typing import Any, Dict, List

import torch

import models
import workers


def _inside(p: torch.Tensor, ranges: List[Any]) -> bool:
    ptr = p.data_ptr()
    end = ptr + p.numel() * p.element_size()
    return any(a <= ptr and end <= a + n for a, n in ranges)


def _rss() -> int:
    """This process's resident bytes, after glibc has given its free heap back (freed
    memory it keeps would otherwise count as held)."""
    import ctypes

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def placement(model: str, stage: int, dtype: str, steps: int, global_batch: int, frozen: bool = False, offload: bool = False,
              device: str = "cpu") -> Dict[str, Any]:
    """Trains ``steps`` steps; checks after each that every parameter torch holds whole is
    a view of an engine buffer at the same address as after the first step, and, in stage
    3, that gathered parameters view the gathered bucket during the forward; every parameter starts 512-byte aligned (as torch's CUDA
    allocator aligns its own blocks, whatever the sizes before it). Returns the memory
    reports, losses and what went wrong. ``device="cuda"``: the model on the GPU."""
    import zero_torch

    rank, world = workers.rank_world()
    m = models.build(model, 0).to(device)
    if frozen:
        for p in list(m.parameters())[:2]:
            p.requires_grad_(False)
    extra = {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}} if offload else None
    engine, _, _, _ = zero_torch.initialize(model=m, config=workers.config(stage, dtype, 1, global_batch, extra=extra))
    problems: List[str] = []
    during: List[Dict[str, int]] = []

    def in_forward(module: torch.nn.Module, args: Any, output: Any) -> None:
        ranges = engine._native.storage_ranges()
        for n, p in module.named_parameters(recurse=False):
            if p.numel() and not _inside(p, ranges):
                problems.append(f"{n} of {type(module).__name__} is not in an engine buffer during the forward")
            if p.numel() and p.data_ptr() % 512:
                problems.append(f"{n} of {type(module).__name__} starts at {p.data_ptr():#x}, not 512-byte aligned")
        during.append(engine.memory_report())

    handles = [mod.register_forward_hook(in_forward) for mod in m.modules() if list(mod.parameters(recurse=False))]
    first: Dict[str, int] = {}
    losses: List[float] = []
    reports: List[Dict[str, int]] = []
    for ids in models.batches(steps, global_batch, 1):
        loss = models.loss_of(engine, models.shard(ids, rank, world).to(device))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        ranges = engine._native.storage_ranges()
        for n, p in m.named_parameters():
            if p.numel() == 0:
                continue  # stage 3: partitioned, no storage at rest
            if not _inside(p, ranges):
                problems.append(f"{n} is not in an engine buffer after a step")
            if p.data_ptr() % 512:
                problems.append(f"{n} starts at {p.data_ptr():#x}, not 512-byte aligned")
            if first.setdefault(n, p.data_ptr()) != p.data_ptr():
                problems.append(f"{n} moved: a copy was made")
        reports.append(engine.memory_report())
    for h in handles:
        h.remove()
    tied = None
    if model == "gpt2":
        tied = m.lm_head.weight is m.transformer.wte.weight
    return {"problems": problems, "reports": reports, "during": during, "losses": losses, "tied": tied}


def grads_in_torch(stage: int, steps: int, global_batch: int) -> Dict[str, Any]:
    """Samples the ``.grad`` bytes torch holds whenever a parameter's gradient was
    accumulated (after zero took it): at most that one parameter's, never a full model."""
    import zero_torch

    rank, world = workers.rank_world()
    m = models.build("llama", 0)
    engine, _, _, _ = zero_torch.initialize(model=m, config=workers.config(stage, "fp32", 1, global_batch))
    samples: List[int] = []

    def hook(p: torch.Tensor) -> None:
        samples.append(sum(q.grad.numel() * q.grad.element_size() for q in m.parameters() if q.grad is not None))

    for p in m.parameters():
        p.register_post_accumulate_grad_hook(hook)  # after zero's own hook
    for ids in models.batches(steps, global_batch, 1):
        engine.backward(models.loss_of(engine, models.shard(ids, rank, world)))
        engine.step()
    largest = max(p.numel() * 4 for p in m.parameters())
    return {"samples": samples, "largest": largest, "report": engine.memory_report()}


def rss_growth(stage: int, dtype: str, steps: int) -> Dict[str, Any]:
    """RSS this rank grew by from before the model was built to after ``steps`` steps,
    beside what the memory report counts: a second copy of the parameters would show as
    the difference. A first run of a one-layer model pays what any run pays once (torch's
    kernels and thread pools, zero's library and its shared-memory group)."""
    import zero_torch

    rank, world = workers.rank_world()
    torch.manual_seed(0)
    x = torch.randn(8, 1024)
    y = torch.randn(8, 1024)
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    cfg = workers.config(stage, dtype, 1, 8 * world, extra={"zero_optimization": {"reduce_bucket_size": 1 << 20, "stage3_prefetch_bucket_size": 1 << 20}})

    def train(layers: int) -> Any:
        m = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(layers)])
        engine, _, _, _ = zero_torch.initialize(model=m, config=cfg)
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(engine(x.to(dt)).float(), y)
            engine.backward(loss)
            engine.step()
        return engine, m

    warm = train(1)
    del warm
    gc.collect()
    before = _rss()
    engine, m = train(8)
    report = engine.memory_report()
    return {"growth": _rss() - before, "report": report, "numel": report["numel"]}


def user_changes(stage: int, dtype: str, global_batch: int, save_dir: str, device: str = "cpu") -> Dict[str, Any]:
    """The script changes parameters itself after ``initialize``: ``load_state_dict``,
    ``p.data = ...`` and an in-place write. Each is taken by the engine (master weights
    too: a checkpoint saved right after holds the new values), a replaced parameter views
    the engine again, and training goes on from the new values."""
    import zero_torch
    from zero_torch.checkpoint import get_fp32_state_dict_from_zero_checkpoint

    rank, world = workers.rank_world()
    m = models.build("llama", 0).to(device)
    engine, _, _, _ = zero_torch.initialize(model=m, config=workers.config(stage, dtype, 1, global_batch))
    batches = [b.to(device) for b in models.batches(3, global_batch, 1)]
    engine.backward(models.loss_of(engine, models.shard(batches[0], rank, world)))
    engine.step()
    torch.manual_seed(7)
    other = models.build("llama", 7).to(device)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(0.5)
    m.load_state_dict(other.state_dict())
    norm = m.model.norm.weight
    norm.data = torch.full_like(norm, 0.75)
    with torch.no_grad():
        m.lm_head.weight[0].fill_(0.25)
    want = {n: p.detach().float().cpu().clone() for n, p in m.named_parameters()}
    engine.save_checkpoint(save_dir, tag="changed")
    state = get_fp32_state_dict_from_zero_checkpoint(save_dir, tag="changed")
    mismatched = [n for n, v in want.items() if not torch.equal(state[n], v)]
    ranges = engine._native.storage_ranges()
    outside = [n for n, p in m.named_parameters() if not _inside(p, ranges)]
    before = m.model.norm.weight.detach().clone()
    engine.backward(models.loss_of(engine, models.shard(batches[1], rank, world)))
    engine.step()
    moved = not torch.equal(before, m.model.norm.weight)
    return {"mismatched": mismatched, "outside": outside, "trained": moved}


def bad_changes(stage: int, change: str) -> Dict[str, Any]:
    """A change the engine cannot take: ``model.half()`` on a bf16 engine, or new data
    given to a partitioned (stage 3) parameter."""
    import zero_torch

    m = models.build("llama", 0)
    engine, _, _, _ = zero_torch.initialize(model=m, config=workers.config(stage, "bf16", 1, 2))
    ids = models.batches(2, 2, 1)
    engine.backward(models.loss_of(engine, ids[0]))
    engine.step()
    if change == "half":
        m.half()
    else:
        w = m.model.layers[0].mlp.up_proj.weight
        w.data = torch.zeros(64, 32, dtype=torch.bfloat16)
    models.loss_of(engine, ids[1])
    return {"raised": None}


def outlives_engine(stage: int, device: str = "cpu") -> Dict[str, Any]:
    """A parameter kept after its engine (and model) are gone keeps its values."""
    import weakref

    import zero_torch

    def train() -> Any:
        m = models.build("llama", 0).to(device)
        engine, _, _, _ = zero_torch.initialize(model=m, config=workers.config(stage, "fp32", 1, 2))
        engine.backward(models.loss_of(engine, models.batches(1, 2, 1)[0].to(device)))
        engine.step()
        kept = m.lm_head.weight
        engine.destroy()  # DeepSpeed's teardown: the hooks go, nothing refers to the engine
        return kept, kept.detach().clone(), weakref.ref(engine)

    kept, values, gone = train()
    gc.collect()
    junk = [torch.randn(1 << 16, device=device) for _ in range(64)]  # reuse of freed memory would show
    del junk
    return {"equal": bool(torch.equal(kept.detach(), values)), "numel": kept.numel(), "engine_alive": gone() is not None}


def save_formats(stage: int, out_dir: str) -> Dict[str, Any]:
    """Savers that look for tensors sharing storage (safetensors' ``save_file``,
    ``save_pretrained``) save a model whose parameters view the engine, and the files load
    back equal."""
    import safetensors.torch
    import zero_torch

    rank, world = workers.rank_world()
    m = models.build("llama", 0)
    engine, _, _, _ = zero_torch.initialize(model=m, config=workers.config(stage, "fp32", 1, 2 * world))
    engine.backward(models.loss_of(engine, models.shard(models.batches(1, 2 * world, 1)[0], rank, world)))
    engine.step()
    sd = {n: p.detach() for n, p in m.state_dict().items()}
    if rank == 0:
        safetensors.torch.save_file(sd, f"{out_dir}/model.safetensors")
        m.save_pretrained(f"{out_dir}/hf")
    torch.distributed.barrier()
    back = safetensors.torch.load_file(f"{out_dir}/model.safetensors")
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(f"{out_dir}/hf")
    bad = [n for n, v in sd.items() if not torch.equal(back[n], v)]
    bad += [n for n, v in hf.state_dict().items() if not torch.equal(v, sd[n])]
    return {"bad": bad}


def many(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Several runs of this module's tasks in one process: ``{"task": name, **args}``."""
    out = {}
    for i, r in enumerate(runs):
        args = dict(r)
        fn = globals()[args.pop("task")]
        out[i] = fn(**args)
    return out


def staging_bounds(stage: int, steps: int, global_batch: int, init: bool = False,
                   model: str = "llama") -> Dict[str, Any]:
    """Gradient staging (``buckets``) and gathered parameters sampled at every gradient
    arrival and before and after every module's forward, per step (forward and backward):
    the first step included, they stay within a few buckets (the first forward's uses say
    when each unit is complete). ``init``: the model is built inside ``zero.Init`` (the
    engine exists before the first forward). ``model``: ``llama``, or ``gpt2`` (its
    embedding tied to its head: one parameter used by two modules)."""
    import zero_torch

    rank, world = workers.rank_world()
    live = {"zero_optimization": {"stage3_max_live_parameters": 8192, "stage3_max_reuse_distance": 0}}
    cfg = workers.config(stage, "fp32", 1, global_batch, extra=live)
    if init:
        with zero_torch.zero.Init(config_dict_or_path=cfg):
            m = _bounds_model(model)
    else:
        m = models.build(model, 0)
    # Sizes before initialize: in stage 3 the engine releases the parameters it partitions.
    largest = max(p.numel() for p in m.parameters())
    unit = max(sum(p.numel() for p in mod.parameters(recurse=False)) for mod in m.modules())
    engine, _, _, _ = zero_torch.initialize(model=m, config=cfg)
    per_step: List[Dict[str, int]] = []

    def sample(where: str) -> None:
        if engine._runtime.native is None:
            return  # the first forward of a model built whole: the engine is built at its end
        r = engine.memory_report()
        cur = per_step[-1]
        cur["buckets"] = max(cur["buckets"], r["buckets"])
        cur["gathered"] = max(cur["gathered"], r["gathered"])
        cur[where] += 1

    for p in m.parameters():
        p.register_post_accumulate_grad_hook(lambda p: sample("grad_samples"))
    for module in m.modules():
        # After the engine's hooks (what it gathers for the module is in), and before its
        # forward hook (which releases it).
        module.register_forward_pre_hook(lambda mod, args: sample("forward_samples"))
        module.register_forward_hook(lambda mod, args, out: sample("forward_samples"), prepend=True)
    for ids in models.batches(steps, global_batch, 1):
        per_step.append({"buckets": 0, "gathered": 0, "grad_samples": 0, "forward_samples": 0})
        engine.backward(models.loss_of(engine, models.shard(ids, rank, world)))
        engine.step()
    r = engine.memory_report()
    return {"per_step": per_step, "whole": r["padded_numel"] * 4, "largest": largest, "unit": unit, "end": r,
            "modules": sum(1 for _ in m.modules())}


def _bounds_model(model: str) -> torch.nn.Module:
    """The test model ``model`` as its class builds it (inside ``zero.Init``: no values)."""
    from transformers import GPT2LMHeadModel, LlamaForCausalLM

    cls = {"llama": LlamaForCausalLM, "gpt2": GPT2LMHeadModel}[model]
    return cls(models.build_config(model))


def forward_holds_nothing_gathered(stage: int) -> Dict[str, Any]:
    """A stack of 16 ``Linear(1024, 1024)`` (4 MiB each) under ``stage``: resident memory
    after the forward, before the backward, against before it. ``F.linear`` saves
    ``weight.t()`` for its backward, a view of the gathered parameter: kept as is, it
    would hold every layer's gathered storage until the backward."""
    import zero_torch

    rank, world = workers.rank_world()
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(16)])
    cfg = workers.config(stage, "fp32", 1, 2 * world)
    cfg["zero_optimization"].update({"stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 0,
                                     "reduce_bucket_size": 1 << 20})
    engine, _, _, _ = zero_torch.initialize(model=m, config=cfg)
    x = torch.randn(2, 1024, generator=torch.Generator().manual_seed(rank))
    losses = []
    grown = []
    for _ in range(3):
        before = _rss()
        loss = engine(x).square().mean()
        grown.append(_rss() - before)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return {"grown": grown, "layer": 1024 * 1024 * 4, "losses": losses}
