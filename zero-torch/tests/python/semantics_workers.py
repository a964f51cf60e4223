"""The same training code driven by DeepSpeed 0.19.8 or by zero_torch, for the tests that
compare their meaning (``test_deepspeed_semantics.py``). Each case builds a model, an
optimizer and a config the way a DeepSpeed script does, trains a few steps on fixed data,
and returns every step's loss and the final parameters (fp32, whole).

Run as ``workers.main`` tasks (``semantics_workers.run_cases``), one process per rank.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

import models

STEPS = 6


def library(lib: str) -> Any:
    """``deepspeed`` (the real one, on its CPU accelerator) or ``zero_torch``."""
    if lib == "deepspeed":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed

        return deepspeed
    import zero_torch

    return zero_torch


def rank_world() -> Tuple[int, int]:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class Net(torch.nn.Module):
    """A small regression model: biases and a LayerNorm (for "no decay" groups), and an
    optional multi-head attention (which reads ``out_proj.weight`` without calling
    ``out_proj``)."""

    def __init__(self, seed: int = 0, attention: bool = False, d: int = 16) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.inp = torch.nn.Linear(8, d)
        self.norm = torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, 2, batch_first=True) if attention else None
        self.mid = torch.nn.Linear(d, d)
        self.head = torch.nn.Linear(d, 1)
        # A buffer that differs by seed (a rank-seeded script's): initialize broadcasts it.
        self.register_buffer("offset", torch.full((1,), float(seed)))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.norm(self.inp(x)))
        if self.attn is not None:
            # Three distinct tokens (identical ones would give attention no gradient).
            s = torch.stack([h, h.flip(-1), torch.sin(3 * h)], 1)
            a, _ = self.attn(s, s, s)
            h = h + a.mean(1)
        h = torch.tanh(self.mid(h))
        return ((self.head(h).squeeze(-1) + 0 * self.offset - y) ** 2).mean()


def data(steps: int, batch: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    return models.regression(steps, batch, seed=5)


def base_config(stage: int, batch: int, gas: int = 1, **extra: Any) -> Dict[str, Any]:
    cfg: Dict[str, Any] = {
        "train_batch_size": batch,
        "gradient_accumulation_steps": gas,
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 200, "stage3_param_persistence_threshold": 10},
    }
    cfg.update(extra)
    return cfg


def whole(lib: Any, engine: Any) -> Dict[str, torch.Tensor]:
    params = list(engine.module.parameters())
    with lib.zero.GatheredParameters(params):
        return {n: p.detach().float().clone() for n, p in engine.module.named_parameters()}


def groups_of(model: torch.nn.Module, decay: float) -> List[Dict[str, Any]]:
    """The usual "no weight decay on biases and norms" parameter groups."""
    no = [p for n, p in model.named_parameters() if n.endswith("bias") or "norm" in n]
    yes = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "norm" in n)]
    return [{"params": yes, "weight_decay": decay}, {"params": no, "weight_decay": 0.0}]


def train(lib: Any, engine: Any, batches: List[Tuple[torch.Tensor, torch.Tensor]], gas: int, double: bool = False, direct: bool = False) -> List[float]:
    """Optimizer steps over ``batches``: each rank's shard, ``gas`` micro-steps each;
    ``double`` runs two backwards per micro-step (the two halves of the shard), ``direct``
    calls ``loss.backward()`` instead of ``engine.backward(loss)``."""
    rank, world = rank_world()
    dtype = next(engine.module.parameters()).dtype
    losses = []
    for x, y in batches:
        x, y = models.shard(x, rank, world).to(dtype), models.shard(y, rank, world).to(dtype)
        total = 0.0
        for k in range(gas):
            xm, ym = models.micro(x, k, gas), models.micro(y, k, gas)
            parts = [(models.micro(xm, 0, 2), models.micro(ym, 0, 2)), (models.micro(xm, 1, 2), models.micro(ym, 1, 2))] if double else [(xm, ym)]
            for xp, yp in parts:
                loss = engine(xp, yp)
                if direct:
                    loss.backward()
                else:
                    engine.backward(loss)
                total += loss.float().item()
            engine.step()
        losses.append(total / gas)
    return losses


def case(lib: Any, name: str, stage: int) -> Dict[str, Any]:
    """One named case at ``stage``; see ``CASES``."""
    rank, world = rank_world()
    batch = 4 * world
    batches = data(STEPS, batch)
    model = Net(seed=rank if name == "per_rank_seed" else 0, attention=name == "attention")
    gas = 2 if name in ("direct_backward", "client_scheduler") else 1
    kwargs: Dict[str, Any] = {}
    cfg = base_config(stage, batch, gas)
    if name in ("per_rank_seed", "attention", "double_backward", "direct_backward"):
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01, "torch_adam": True}}
    elif name == "groups":
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}
        kwargs["model_parameters"] = groups_of(model, 0.1)
    elif name == "client_scheduler":
        opt = torch.optim.AdamW(groups_of(model, 0.05), lr=0.02)
        kwargs["optimizer"] = opt
        kwargs["lr_scheduler"] = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    elif name == "callable_scheduler":
        kwargs["optimizer"] = lambda params: torch.optim.Adam(params, lr=0.02, betas=(0.8, 0.99))
        kwargs["lr_scheduler"] = lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    elif name == "sgd":
        cfg["optimizer"] = {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}
        cfg["zero_allow_untested_optimizer"] = True
    elif name == "client_rmsprop":
        kwargs["optimizer"] = torch.optim.RMSprop(model.parameters(), lr=0.01)
        cfg["zero_allow_untested_optimizer"] = True
    else:
        raise ValueError(name)
    engine, optimizer, _, scheduler = lib.initialize(model=model, config=cfg, **kwargs)
    at_start = whole(lib, engine)
    at_start.update({f"buffer:{n}": b.detach().clone() for n, b in engine.module.named_buffers()})
    losses = train(lib, engine, batches, gas, double=name == "double_backward", direct=name == "direct_backward")
    lrs = [g["lr"] for g in optimizer.param_groups]
    return {"losses": losses, "params": whole(lib, engine), "at_start": at_start, "lrs": lrs}


def run_cases(lib: str, cases: List[Tuple[str, int]]) -> Dict[str, Any]:
    """Every ``(case, stage)`` in one process (torch and the library imported once)."""
    mod = library(lib)
    mod.init_distributed(dist_backend="gloo") if lib == "deepspeed" else None
    out = {}
    for name, stage in cases:
        out[f"{name}@{stage}"] = case(mod, name, stage)
    return out


def grid_config(entry: Dict[str, Any], stage: int, batch: int) -> Dict[str, Any]:
    """A config of the grid: ``entry`` holds the sections to try (optimizer, scheduler,
    clipping, accumulation, precision, data types)."""
    gas = int(entry.get("gas", 1))
    cfg = base_config(stage, batch, gas)
    for key in ("optimizer", "scheduler", "gradient_clipping", "fp16", "bf16", "zero_allow_untested_optimizer", "data_types"):
        if key in entry:
            cfg[key] = entry[key]
    return cfg


def run_grid(lib: str, grid: List[Dict[str, Any]], steps: int = 4) -> Dict[str, Any]:
    """Every entry of ``grid`` at its stage: losses, final parameters and the LR of each
    step."""
    mod = library(lib)
    if lib == "deepspeed":
        mod.init_distributed(dist_backend="gloo")
    rank, world = rank_world()
    out = {}
    for entry in grid:
        batch = 4 * world
        model = Net(seed=0)
        cfg = grid_config(entry, int(entry["stage"]), batch)
        engine, optimizer, _, _ = mod.initialize(model=model, config=cfg, model_parameters=model.parameters())
        dtype = next(engine.module.parameters()).dtype
        gas = int(entry.get("gas", 1))
        losses, lrs = [], []
        for x, y in data(steps, batch):
            x, y = models.shard(x, rank, world).to(dtype), models.shard(y, rank, world).to(dtype)
            total = 0.0
            for k in range(gas):
                loss = engine(models.micro(x, k, gas), models.micro(y, k, gas))
                engine.backward(loss)
                engine.step()
                total += loss.float().item()
            losses.append(total / gas)
            lrs.append([float(g["lr"]) for g in optimizer.param_groups])
        out[entry["name"]] = {"losses": losses, "params": whole(mod, engine), "lrs": lrs}
    return out


def stage0_bf16_first_step(lib: str) -> Dict[str, Any]:
    """One bf16 AdamW step at stage 0 (world size 1) through ``lib``, and two references
    computed here with ``torch.optim.AdamW`` on fp32 copies of the bf16 parameters, the
    bf16 gradients widened, the result rounded to bf16: ``plain`` steps once; ``warm``
    first steps once with zero gradients, as DeepSpeed's ``FP16_UnfusedOptimizer`` does
    when it is built (``initialize_optimizer_states``), so Adam's step count starts at 1
    and decoupled weight decay is applied once more."""
    mod = library(lib)
    if lib == "deepspeed":
        mod.init_distributed(dist_backend="gloo")
    ((x, y),) = data(1, 4)
    x, y = x.bfloat16(), y.bfloat16()
    adamw = {"lr": 0.01, "weight_decay": 0.1}
    entry = {"stage": 0, "bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {**adamw, "torch_adam": True}}}
    model = Net(seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine, _, _, _ = mod.initialize(model=model, config=grid_config(entry, 0, 4), model_parameters=model.parameters())
    engine.backward(engine(x, y))
    engine.step()
    out: Dict[str, Any] = {"params": whole(mod, engine), "warned": [str(w.message) for w in caught if "stage 0" in str(w.message)]}
    ref = Net(seed=0).bfloat16()
    ref(x, y).backward()
    named = list(ref.named_parameters())
    for warm in (False, True):
        masters = [p.detach().float().clone() for _, p in named]
        opt = torch.optim.AdamW(masters, **adamw)
        if warm:
            for m in masters:
                m.grad = torch.zeros_like(m)
            opt.step()
        for m, (_, p) in zip(masters, named):
            m.grad = p.grad.float()
        opt.step()
        out["warm" if warm else "plain"] = {n: m.bfloat16().float() for (n, _), m in zip(named, masters)}
    return out


def ds_checkpoint_then(lib: str, stage: int, dtype: str, save_dir: str, steps: int = 3) -> Dict[str, Any]:
    """DeepSpeed (``lib == "deepspeed"``) trains ``steps`` steps, saves a checkpoint into
    ``save_dir`` (client state included) and trains ``steps`` more; zero_torch
    (``lib == "zero"``) loads that checkpoint into a model built from another seed and
    trains the same ``steps`` more. Both return the losses after the save."""
    mod = library(lib)
    if lib == "deepspeed":
        mod.init_distributed(dist_backend="gloo")
    rank, world = rank_world()
    batch = 4 * world
    cfg = base_config(stage, batch)
    cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01, "torch_adam": True}}
    cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    batches = data(2 * steps, batch)
    model = Net(seed=0 if lib == "deepspeed" else 77)
    engine, optimizer, _, _ = mod.initialize(model=model, config=cfg, model_parameters=model.parameters())
    client = None
    path = None
    if lib == "deepspeed":
        train(mod, engine, batches[:steps], 1)
        engine.save_checkpoint(save_dir, client_state={"epoch": 4})
    else:
        path, client = engine.load_checkpoint(save_dir)
    after = train(mod, engine, batches[steps:], 1)
    counters = {"global_steps": int(engine.global_steps), "lr": [float(g["lr"]) for g in optimizer.param_groups]}
    return {
        "losses": after,
        "params": whole(mod, engine),
        "client": {"epoch": client.get("epoch")} if isinstance(client, dict) else None,
        "path": path,
        "counters": counters,
    }


def load_broken(save_dir: str, stage: int) -> Dict[str, Any]:
    """zero_torch loads a DeepSpeed checkpoint the test broke: every rank must raise, naming
    DeepSpeed's format and the file."""
    import zero_torch

    rank, world = rank_world()
    cfg = base_config(stage, 4 * world)
    cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}
    engine, _, _, _ = zero_torch.initialize(model=Net(), config=cfg)
    try:
        engine.load_checkpoint(save_dir)
    except zero_torch.ZeroError as e:
        return {"raised": type(e).__name__, "message": str(e)}
    return {"raised": None}


class Generator(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.a = torch.nn.Linear(4, 12)
        self.b = torch.nn.Linear(12, 8)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.b(torch.relu(self.a(z))))


class Discriminator(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.a = torch.nn.Linear(8, 12)
        self.norm = torch.nn.BatchNorm1d(12)
        self.b = torch.nn.Linear(12, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.b(torch.relu(self.norm(self.a(x))))).squeeze(-1)


def gan(lib: str, stage: int, steps: int = 5) -> Dict[str, Any]:
    """Two engines, as DeepSpeedExamples' GAN: the discriminator takes two backwards per
    step (real, then fake); the generator's backward runs through the discriminator's
    modules (its gradients there are not the discriminator's micro-step; the script's
    ``netD.zero_grad()`` clears them). Forward passes call the modules themselves."""
    mod = library(lib)
    if lib == "deepspeed":
        mod.init_distributed(dist_backend="gloo")
    rank, world = rank_world()
    g, d = Generator(), Discriminator()
    cfg = base_config(stage, 4 * world)
    cfg["optimizer"] = {"type": "Adam", "params": {"lr": 0.002, "betas": [0.5, 0.999]}}
    opt_d = torch.optim.Adam(d.parameters(), lr=0.002, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(g.parameters(), lr=0.002, betas=(0.5, 0.999))
    eng_d, _, _, _ = mod.initialize(model=d, model_parameters=d.parameters(), optimizer=opt_d, config=cfg)
    eng_g, _, _, _ = mod.initialize(model=g, model_parameters=g.parameters(), optimizer=opt_g, config=cfg)
    bce = torch.nn.BCELoss()
    gen = torch.Generator().manual_seed(9)
    losses = []
    for _ in range(steps):
        real = torch.randn(4 * world, 8, generator=gen)[rank * 4:(rank + 1) * 4]
        z = torch.randn(4 * world, 4, generator=gen)[rank * 4:(rank + 1) * 4]
        d.zero_grad()
        err_real = bce(d(real), torch.ones(4))
        eng_d.backward(err_real)
        fake = g(z)
        err_fake = bce(d(fake.detach()), torch.zeros(4))
        eng_d.backward(err_fake)
        eng_d.step()
        g.zero_grad()
        err_g = bce(d(fake), torch.ones(4))
        eng_g.backward(err_g)
        eng_g.step()
        losses.append([err_real.item(), err_fake.item(), err_g.item()])
    return {"losses": losses, "d": whole(mod, eng_d), "g": whole(mod, eng_g)}


def bad_input(case: str) -> Dict[str, Any]:
    """One kind of bad input, on every rank: whatever it raises, by name."""
    rank, world = rank_world()
    try:
        if case == "compat_too_late":
            import deepspeed  # noqa: F401  (the real one)
            import zero_torch.deepspeed_compat  # noqa: F401
        elif case == "name_zero_lacks":
            import zero_torch.deepspeed_compat  # noqa: F401
            from deepspeed.pipe import PipelineModule  # noqa: F401
        elif case == "enabled_feature":
            import zero_torch.deepspeed_compat  # noqa: F401
            import deepspeed

            cfg = base_config(1, 4 * world, torch_autocast={"enabled": True, "dtype": "bfloat16"})
            cfg["optimizer"] = {"type": "AdamW"}
            deepspeed.initialize(model=Net(), config=cfg)
        else:
            raise ValueError(case)
    except Exception as e:  # the named error is the result
        return {"raised": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "message": str(e)}
    return {"raised": None}
