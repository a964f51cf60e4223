"""What each rank runs for ``test_zero_init.py``: models built inside ``zero.Init`` (no
parameter holds values until the engine fills them, one unit at a time) or loaded with
``zero_torch.from_pretrained`` (each rank reading its own byte ranges), against the
ordinary path (the whole model, then ``initialize``)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

import models
import workers


def _model(name: str) -> torch.nn.Module:
    """The test model ``name``, built as it comes (no seeding, no cast)."""
    from transformers import GPT2LMHeadModel, LlamaForCausalLM

    cls = {"llama": LlamaForCausalLM, "gpt2": GPT2LMHeadModel}[name]
    return cls(models.build_config(name))


def _train(engine: Any, steps: int, gas: int, global_batch: int) -> List[float]:
    rank, world = workers.rank_world()
    losses = []
    for ids in models.batches(steps, global_batch, 3):
        mine = models.shard(ids, rank, world).to(engine.device)
        total = 0.0
        for k in range(gas):
            loss = models.loss_of(engine, models.micro(mine, k, gas))
            engine.backward(loss)
            engine.step()
            total += loss.item()
        losses.append(total / gas)
    return losses


def _on(device: str) -> None:
    """Where ``initialize`` puts the model: ``cpu`` or ``cuda`` (the one GPU, world size 1),
    as a DeepSpeed script chooses it (``DS_ACCELERATOR``). On a GPU torch's peak count of
    allocated bytes starts from zero here."""
    import os

    os.environ["DS_ACCELERATOR"] = device
    if device == "cuda":
        torch.use_deterministic_algorithms(True)
        torch.cuda.reset_peak_memory_stats()


def _torch_peak(device: str) -> int:
    """The most bytes torch's CUDA allocator held since :func:`_on` (0 on the CPU). zero's
    own buffers are not torch's: what a model costs torch is the model itself."""
    return int(torch.cuda.max_memory_allocated()) if device == "cuda" else 0


def _host(values: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    return {n: t.cpu() for n, t in values.items()}


def seeded(model: str, stage: int, dtype: str, gas: int, steps: int, global_batch: int, lazy: bool,
           clip: float = 0.0, seed: int = 7, device: str = "cpu", moved: bool = False,
           extra: Optional[Dict[str, Any]] = None, frozen: bool = False, budget: bool = False) -> Dict[str, Any]:
    """Builds ``model`` inside ``zero.Init(seed=seed)`` (``lazy``) or whole inside
    ``zero.Init(seed=None)`` then fills it with ``zero.init_weights`` (the ordinary path),
    trains on ``device``, and returns the parameters before and after, the losses, whether
    any parameter held values before ``initialize``, and torch's peak CUDA allocation
    through ``initialize`` (``device="cuda"``). ``moved``: the whole model is put on the
    GPU by the script (``model.cuda()``) before ``initialize``. ``extra``: more config
    sections; ``frozen``: a LoRA-style frozen base (``models.freeze_base``); ``budget``: no
    gather before training, and the memory report right after it (before any gather of
    the whole model), so ``allocator_peak`` is training's."""
    import zero_torch

    _on(device)
    cfg = workers.config(stage, dtype, gas, global_batch, clip=clip, extra=extra)
    with zero_torch.zero.Init(config_dict_or_path=cfg, seed=seed if lazy else None):
        m = _model(model)
    if frozen:
        models.freeze_base(m)
    placeholders = all(getattr(p, "_zero_lazy", None) is not None for p in m.parameters())
    held = sum(p.untyped_storage().nbytes() for p in m.parameters())
    if not lazy:
        zero_torch.zero.init_weights(m, seed=seed)
    if moved:
        m.to(device)
    engine, _, _, _ = zero_torch.initialize(model=m, config=cfg)
    peak = _torch_peak(device)
    start = {} if budget else _host(workers.gathered(engine))
    losses = _train(engine, steps, gas, global_batch)
    memory = engine.memory_report()
    return {"start": start, "params": _host(workers.gathered(engine)), "losses": losses,
            "placeholders": placeholders, "held_before": held, "torch_peak_at_initialize": peak,
            "device": str(engine.device), "memory": memory}


def unfilled() -> Dict[str, Any]:
    """A module whose parameter no initializer writes, built inside ``zero.Init``."""
    import zero_torch

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.gain = torch.nn.Parameter(torch.ones(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * self.gain

    cfg = workers.config(3, "fp32", 1, 2 * workers.rank_world()[1])
    with zero_torch.zero.Init(config_dict_or_path=cfg):
        m = Scaled()
    zero_torch.initialize(model=m, config=cfg)
    return {}


def pretrained(path: str, stage: int, dtype: str, steps: int = 2, model_class: Optional[str] = None,
               paths: Optional[Dict[str, str]] = None, gas: int = 1, clip: float = 0.0,
               global_batch: Optional[int] = None, ordinary: bool = False,
               torch_dtype: Optional[str] = None, device: str = "cpu") -> Dict[str, Any]:
    """``from_pretrained`` then ``initialize``: the parameters, logits on a fixed batch, the
    load report, the bytes the parameters held before ``initialize``, and the losses of
    ``steps`` steps of ``gas`` micro-steps (``global_batch``, default ``2 * world * gas``),
    clipped at ``clip``. ``ordinary``: the reference path instead, transformers'
    ``from_pretrained`` of the same folder (the whole model, float32 unless
    ``torch_dtype``), then ``initialize``. ``torch_dtype`` (a torch dtype's name) is passed
    on to either ``from_pretrained``. ``device``: as :func:`seeded`'s."""
    import transformers

    import zero_torch

    _on(device)
    rank, world = workers.rank_world()
    global_batch = global_batch or 2 * world * gas
    cfg = workers.config(stage, dtype, gas, global_batch, clip=clip)
    cls = getattr(transformers, model_class) if model_class is not None else None
    where = (paths or {}).get(str(rank), path)
    tdtype = getattr(torch, torch_dtype) if torch_dtype is not None else None
    if ordinary:
        m = (cls or transformers.AutoModelForCausalLM).from_pretrained(where, dtype=tdtype or torch.float32)
    else:
        m = zero_torch.from_pretrained(where, cls, config=cfg, torch_dtype=tdtype)
    held = sum(p.untyped_storage().nbytes() for p in m.parameters())
    training = m.training
    built = {"class": type(m).__name__, "dtypes": sorted({str(p.dtype) for p in m.parameters()})}
    try:
        engine, _, _, _ = zero_torch.initialize(model=m, config=cfg)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}", "exception": type(e).__name__, "at": "initialize"}
    peak = _torch_peak(device)
    params = _host(workers.gathered(engine))
    ids = models.batches(1, 2, 3)[0].to(engine.device)
    with torch.no_grad():
        logits = engine(input_ids=ids).logits.float().cpu()
    losses = _train(engine, steps, gas, global_batch)
    return {"params": params, "logits": logits, "report": engine.load_report(), "held_before": held,
            "training": training, "losses": losses, "trained": _host(workers.gathered(engine)),
            "torch_peak_at_initialize": peak, "device": str(engine.device), **built}


def save_hf(path: str, stage: int, dtype: str, steps: int = 2, save_dtype: Optional[str] = None,
            fail_on_rank0: bool = False, model: str = "llama") -> Dict[str, Any]:
    """Trains ``steps`` steps, then ``engine.save_hf_checkpoint(path)`` (in shards of 40 KB);
    returns the parameters and logits on a fixed batch. ``fail_on_rank0``: writing the
    config fails on rank 0 after the weights were written."""
    import zero_torch

    rank, world = workers.rank_world()
    cfg = workers.config(stage, dtype, 1, 2 * world)
    engine, _, _, _ = zero_torch.initialize(model=models.build(model, 3), config=cfg)
    _train(engine, steps, 1, 2 * world)
    params = workers.gathered(engine)
    ids = models.batches(1, 2, 3)[0]
    with torch.no_grad():
        logits = engine(input_ids=ids).logits.float()
    if fail_on_rank0 and rank == 0:
        def refuse(*args: Any, **kwargs: Any) -> None:
            raise OSError("no space left on device (injected)")

        engine.module.config.save_pretrained = refuse
    kwargs: Dict[str, Any] = {"max_shard_size": "40KB"}
    if save_dtype is not None:
        kwargs["dtype"] = getattr(torch, save_dtype)
    try:
        written = engine.save_hf_checkpoint(path, **kwargs)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}", "exception": type(e).__name__, "params": params}
    return {"params": params, "logits": logits, "written": written}


def modify_gathered(stage: int) -> Dict[str, Any]:
    """A model built inside ``zero.Init``: rank 0 rewrites a weight inside
    ``GatheredParameters(..., modifier_rank=0)``; every rank's values after it."""
    import zero_torch

    rank, world = workers.rank_world()
    cfg = workers.config(stage, "fp32", 1, 2 * world)
    with zero_torch.zero.Init(config_dict_or_path=cfg, seed=3):
        m = _model("llama")
    engine, _, _, _ = zero_torch.initialize(model=m, config=cfg)
    weight = m.model.embed_tokens.weight
    with zero_torch.zero.GatheredParameters([weight], modifier_rank=0):
        if rank == 0:
            with torch.no_grad():
                weight.fill_(0.5)
    losses = _train(engine, 1, 1, 2 * world)
    return {"params": workers.gathered(engine), "losses": losses}


def written(stage: int, mode: str = "load", device: str = "cpu") -> Dict[str, Any]:
    """transformers' loading under ZeRO-3, by hand: the model built inside
    ``deepspeed.zero.Init`` (zero's :class:`DeepSpeedInit`) while torch's initializers are
    off (``no_init_weights``), then every module's values written by rank 0 inside
    ``GatheredParameters(..., modifier_rank=0)`` (from a whole model seeded with 0), before
    any engine exists. ``mode``: ``load`` (all written, then trained), ``partial``
    (``model.norm.weight`` never written), ``raise`` (rank 0's block for ``model.norm``
    raises), ``ordinary`` (the whole seeded model, then
    ``initialize``: the reference). ``device="cuda"``: on the one GPU, torch's group NCCL
    (the shards still cross gloo), with torch's peak CUDA allocation through
    ``initialize``."""
    import zero_torch
    from transformers.initialization import no_init_weights

    _on(device)
    rank, world = workers.rank_world()
    cfg = workers.config(stage, "fp32", 1, 2 * world)
    torch.manual_seed(0)
    source = _model("llama")
    if mode == "ordinary":
        engine, _, _, _ = zero_torch.initialize(model=source, config=cfg)
        peak = _torch_peak(device)
        return {"params": _host(workers.gathered(engine)), "losses": _train(engine, 2, 1, 2 * world),
                "torch_peak_at_initialize": peak}
    zero_torch.comm.init_distributed("nccl" if device == "cuda" else "gloo")
    with no_init_weights(), zero_torch.zero.DeepSpeedInit(config_dict_or_path=cfg):
        m = _model("llama")
    values = dict(source.named_parameters())
    for prefix, module in m.named_modules():
        own = [(f"{prefix}.{n}" if prefix else n, p) for n, p in module.named_parameters(recurse=False)]
        if mode == "partial":
            own = [(n, p) for n, p in own if n != "model.norm.weight"]
        if not own:
            continue
        with zero_torch.zero.GatheredParameters([p for _, p in own], modifier_rank=0):
            if mode == "raise" and rank == 0 and prefix == "model.norm":
                raise ValueError("rank 0's load of model.norm failed")
            if rank == 0:
                with torch.no_grad():
                    for name, p in own:
                        p.copy_(values[name])
    loaded = list({id(p): p for p in m.parameters()}.values())
    held = {"storage_bytes": sum(p.untyped_storage().nbytes() for p in loaded),
            "shard_numel": sum(getattr(p, "_zero_shard", torch.empty(0)).numel() for p in loaded),
            "numel": sum(p.numel() for p in loaded), "params": len(loaded)}
    # A read-only gather before the engine gives every rank rank 0's values.
    q = m.model.layers[0].self_attn.q_proj.weight
    with zero_torch.zero.GatheredParameters([q]):
        read = q.detach().clone()
    engine, _, _, _ = zero_torch.initialize(model=m, config=cfg)
    peak = _torch_peak(device)
    return {"params": _host(workers.gathered(engine)), "losses": _train(engine, 2, 1, 2 * world), "held": held,
            "read_equal": bool(torch.equal(read, values["model.layers.0.self_attn.q_proj.weight"])),
            "torch_peak_at_initialize": peak, "device": str(engine.device)}


def heap_after_initialize(inside_init: bool) -> Dict[str, Any]:
    """Where glibc puts a 4 MiB tensor after an 8 MiB one was freed, once a stage-3 engine
    exists for a model built inside ``zero.Init`` (``inside_init``) or whole: mapped (the
    threshold pinned at 1 MiB), or in the heap (glibc raised its threshold past 4 MiB when
    the 8 MiB block was freed)."""
    import ctypes
    import contextlib

    import zero_torch

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Mallinfo2
    cfg = workers.config(3, "fp32", 1, 2 * workers.rank_world()[1])
    with zero_torch.zero.Init(config_dict_or_path=cfg) if inside_init else contextlib.nullcontext():
        m = torch.nn.Linear(8, 8)
    engine, _, _, _ = zero_torch.initialize(model=m, config=cfg)
    big = torch.ones(2 << 20)  # 8 MiB
    del big
    before = libc.mallinfo2().hblkhd
    block = torch.ones(1 << 20)  # 4 MiB
    mapped = libc.mallinfo2().hblkhd - before
    del block, engine
    return {"mapped": int(mapped)}


class _Reused(torch.nn.Module):
    """A regression model whose forward applies ``sub`` ``times`` times (set before each
    step), each use under a reentrant ``torch.utils.checkpoint`` segment where
    ``reentrant`` (each segment's backward accumulates ``sub``'s gradient on its own)."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(8, 16)
        self.sub = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 1)
        self.times = 1
        self.reentrant = reentrant

    def _sub(self, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.sub(h))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        h = torch.tanh(self.inp(x))
        for _ in range(self.times):
            if self.reentrant and torch.is_grad_enabled():
                h = checkpoint(self._sub, h, use_reentrant=True)
            else:
                h = self._sub(h)
        return ((self.head(h).squeeze(-1) - y) ** 2).mean()


def reused(stage: int, init: bool, reentrant: bool, times: List[int], global_batch: int = 8) -> Dict[str, Any]:
    """``_Reused`` (built inside ``zero.Init(seed=5)`` where ``init``, else whole from
    torch's generator) trained one step per entry of ``times`` (how often its forward uses
    ``sub`` in that step: more than in the first forward, from the second step on). Returns
    the losses, the trained parameters and the same training by plain PyTorch (AdamW, the
    whole batch) from the engine's initial values; or the error of the step that raised,
    and which step it was."""
    import zero_torch

    rank, world = workers.rank_world()
    cfg = workers.config(stage, "fp32", 1, global_batch)
    cfg["zero_optimization"].update({"reduce_bucket_size": 300, "stage3_prefetch_bucket_size": 300,
                                     "stage3_param_persistence_threshold": 20})
    if init:
        with zero_torch.zero.Init(config_dict_or_path=cfg, seed=5):
            m = _Reused(reentrant)
    else:
        torch.manual_seed(5)
        m = _Reused(reentrant)
    engine, _, _, _ = zero_torch.initialize(model=m, config=cfg)
    start = workers.gathered(engine)
    data = models.regression(len(times), global_batch)
    losses: List[float] = []
    for step, ((x, y), n) in enumerate(zip(data, times)):
        m.times = n
        try:
            loss = engine(models.shard(x, rank, world), models.shard(y, rank, world))
            engine.backward(loss)
            engine.step()
        except Exception as e:
            return {"error": f"{type(e).__name__}: {e}", "exception": type(e).__name__, "step": step,
                    "losses": losses}
        losses.append(loss.item())
    ref = _Reused(False)
    ref.load_state_dict(start)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    for (x, y), n in zip(data, times):
        ref.times = n
        ref(x, y).backward()
        opt.step()
        opt.zero_grad()
    return {"losses": losses, "params": workers.gathered(engine),
            "reference": {k: p.detach().clone() for k, p in ref.named_parameters()}}
