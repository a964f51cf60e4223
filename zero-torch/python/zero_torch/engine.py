"""``ZeroEngine``: what ``zero_torch.initialize`` returns, with the members scripts written
for DeepSpeed's engine call."""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from . import _client_state, _native
from ._hooks import Runtime
from ._model import Registry, Unit, register
from .errors import OrderError, UnsupportedError

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ZeroEngine:
    """A model trained by zero's engine, with DeepSpeed's engine API.

    Call it as the model (``engine(batch)``), then ``engine.backward(loss)`` and
    ``engine.step()``; ``step`` applies the optimizer at the accumulation boundary only.
    The model is ``engine.module``; in stage 3 its partitioned parameters hold no storage
    between uses (gather them with ``zero_torch.zero.GatheredParameters``).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: Dict[str, Any],
        resolved: Dict[str, Any],
        trained: Optional[set] = None,
        timeout_s: float = 300.0,
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
        if next(model.parameters(), None) is None:
            raise ValueError("the model has no parameters: there is nothing to train")
        self._config = config
        self._resolved = resolved
        self._dtype = _DTYPES[resolved["dtype"]]
        rank, world, local = _native.launch_info()
        self.global_rank: int = rank
        self.world_size: int = world
        self.dp_world_size: int = world
        self.local_rank: int = local
        self.device: torch.device = choose_device(model, local)
        """Where the model trains: ``cuda:<n>`` (the local rank's GPU, NCCL) or ``cpu``."""
        model.to(device=self.device, dtype=self._dtype if self._dtype != torch.float32 else None)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.module = model
        self._timeout_s = timeout_s
        self._registry: Registry = register(model, trained)
        self._runtime = Runtime(model, self._registry, self._build, int(resolved["stage"]), self.device)
        self._runtime.install()
        self.micro_steps = 0
        self._last_step: Optional[Dict[str, Any]] = None
        self.optimizer = _OptimizerView(self)
        self.lr_scheduler = _SchedulerView(self)
        from . import zero

        zero._ENGINES.add(self)

    # ---- the engine ---------------------------------------------------------------

    def _build(self, order: List[Unit]) -> Any:
        modules = [
            (
                u.name,
                [
                    (p.name.rsplit(".", 1)[-1], list(p.shape), p.trainable_k is not None, list(p.aliases))
                    for p in u.params
                ],
            )
            for u in order
        ]
        # Initial values cross on the host (rank 0's are broadcast), whatever the device.
        values = [[p.param.data.detach().cpu() for p in u.params] for u in order]
        return _native.NativeEngine(json.dumps(self._config), modules, values, self._timeout_s, self.device.type)

    @property
    def _native(self) -> Any:
        self._runtime.ensure_built()
        return self._runtime.native

    # ---- the training loop ----------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the model (the first call also records the order in which its modules
        are first used, and builds the engine)."""
        return self.module(*args, **kwargs)

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True) -> torch.Tensor:
        """Backward of ``loss`` scaled by the loss scale (fp16) and divided by the
        accumulation steps, as DeepSpeed's ``backward`` does; gradients reach the engine as
        autograd produces them. Returns the loss as scaled for the accumulation."""
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError("backward() takes the scalar loss tensor")
        if not scale_wrt_gas:
            raise UnsupportedError("backward(scale_wrt_gas=False) is not supported: zero divides the loss by the accumulation steps")
        gas = self.gradient_accumulation_steps()
        pending = self._runtime.micro_steps_done - self.micro_steps
        if pending >= 1 and (self.micro_steps % gas) + pending >= gas:
            raise OrderError(
                "backward() was called again before step(): the accumulation boundary "
                f"({gas} micro-step(s)) was reached; call step() after each backward()"
            )
        factor = self._native.loss_scale_factor()
        (loss * factor).backward(retain_graph=retain_graph)
        if self._runtime.error is not None:
            err, self._runtime.error = self._runtime.error, None
            raise err
        return loss / gas

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether the next ``step()`` applies the optimizer."""
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def step(self, lr_kwargs: Optional[Dict[str, Any]] = None) -> None:
        """Counts a micro-step; at the accumulation boundary, the optimizer step
        (unscale, overflow check, clipping, fused Adam, LR schedule)."""
        if lr_kwargs:
            raise UnsupportedError("step(lr_kwargs=...) is not supported: the config's scheduler sets the learning rate")
        if self._runtime.micro_steps_done <= self.micro_steps:
            raise OrderError("step() was called before backward(): there are no gradients for this micro-step")
        boundary = self.is_gradient_accumulation_boundary()
        self.micro_steps += 1
        if boundary:
            self._last_step = dict(self._native.step())
            self._runtime.write_back()

    def zero_grad(self) -> None:
        """Nothing to do: the engine starts every step with zero gradients (as DeepSpeed's
        engine does after ``step``)."""

    def train(self, mode: bool = True) -> "ZeroEngine":
        self.module.train(mode)
        return self

    def eval(self) -> "ZeroEngine":
        self.module.eval()
        return self

    # ---- getters (methods, as DeepSpeed's) --------------------------------------------

    def train_batch_size(self) -> int:
        return int(self._resolved["train_batch_size"])

    def train_micro_batch_size_per_gpu(self) -> int:
        return int(self._resolved["train_micro_batch_size_per_gpu"])

    def gradient_accumulation_steps(self) -> int:
        return int(self._resolved["gradient_accumulation_steps"])

    def zero_optimization_stage(self) -> int:
        return int(self._resolved["stage"])

    def gradient_clipping(self) -> float:
        return float(self._resolved["gradient_clipping"])

    def fp16_enabled(self) -> bool:
        return self._dtype == torch.float16

    def bfloat16_enabled(self) -> bool:
        return self._dtype == torch.bfloat16

    def get_lr(self) -> List[float]:
        """The learning rate, one per parameter group (zero has one group)."""
        return [float(self._native.lr())]

    def get_global_grad_norm(self) -> Optional[float]:
        """The gradient norm of the last optimizer step, before clipping."""
        return None if self._last_step is None else float(self._last_step["grad_norm"])

    def was_step_applied(self) -> bool:
        """False if the last optimizer step was skipped (fp16 overflow)."""
        return self._last_step is not None and not self._last_step["skipped"]

    @property
    def global_steps(self) -> int:
        return int(self._native.step_counts()[2])

    @property
    def global_samples(self) -> int:
        return self.global_steps * self.train_batch_size()

    def zero_gather_16bit_weights_on_model_save(self) -> bool:
        return bool(self._resolved.get("gather_16bit_weights_on_model_save", False))

    def memory_report(self) -> Dict[str, int]:
        """Bytes this rank keeps per category (parameters, gradients, optimizer state,
        buckets), as the engine counts them."""
        return dict(self._native.memory_report())

    def comm_report(self) -> Dict[str, int]:
        """Elements this rank sent in the last step, by purpose, and the theory."""
        return dict(self._native.comm_report())

    # ---- checkpoints ------------------------------------------------------------------

    def save_checkpoint(
        self,
        save_dir: Union[str, os.PathLike],
        tag: Optional[str] = None,
        client_state: Optional[Dict[str, Any]] = None,
        save_latest: bool = True,
        exclude_frozen_parameters: bool = False,
    ) -> bool:
        """Saves the whole training state to ``save_dir/tag`` (default tag
        ``global_step<N>``) and points ``save_dir/latest`` at it; every rank calls it, at
        an accumulation boundary. It loads at any world size and stage. ``client_state``
        (anything ``torch.save`` can pickle; rank 0's is kept) and the model's persistent
        buffers are saved with it. If any rank fails, every rank raises
        :class:`~zero_torch.CheckpointError` and the previous checkpoint stays ``latest``."""
        if not save_latest:
            raise UnsupportedError(
                "save_checkpoint(save_latest=False) is not supported: zero commits a checkpoint "
                "by pointing `latest` at it, which is what keeps the previous one loadable "
                "when a save fails"
            )
        if exclude_frozen_parameters:
            raise UnsupportedError(
                "save_checkpoint(exclude_frozen_parameters=True) is not supported: frozen "
                "parameters are saved once per checkpoint, in frozen.safetensors"
            )
        stored = _client_state.pack(client_state or {}, _client_state.persistent_buffers(self.module))
        self._native.save_checkpoint(os.fspath(save_dir), tag, json.dumps(stored))
        return True

    def load_checkpoint(
        self,
        load_dir: Union[str, os.PathLike],
        tag: Optional[str] = None,
        load_module_strict: bool = True,
        load_optimizer_states: bool = True,
        load_lr_scheduler_states: bool = True,
        load_module_only: bool = False,
        custom_load_fn: Any = None,
    ) -> Tuple[Optional[str], Any]:
        """Loads checkpoint ``tag`` (default: the one ``load_dir/latest`` names), saved at
        any world size and stage; every rank calls it, at an accumulation boundary.
        Returns ``(path, client_state)``, or ``(None, None)`` with a warning when
        ``load_dir`` has no ``latest`` and no tag is given (as DeepSpeed does). Nothing
        changes on any rank unless every rank could read its part."""
        if custom_load_fn is not None:
            raise UnsupportedError("load_checkpoint(custom_load_fn=...) is not supported")
        load_dir = os.fspath(load_dir)
        if tag is None:
            latest = os.path.join(load_dir, "latest")
            if not os.path.isfile(latest):
                warnings.warn(
                    f"Unable to find latest file at {latest}, if trying to load latest "
                    "checkpoint please pass a tag or save a checkpoint first",
                    stacklevel=2,
                )
                return None, None
            with open(latest) as f:
                tag = f.read().strip()
        stored = json.loads(
            self._native.load_checkpoint(
                load_dir,
                tag,
                load_optimizer_states and not load_module_only,
                load_lr_scheduler_states and not load_module_only,
                load_module_only,
                load_module_strict,
            )
        )
        self._runtime.write_back()
        client, buffers = _client_state.unpack(stored)
        _client_state.load_buffers(self.module, buffers, load_module_strict)
        return os.path.join(load_dir, tag), client

    def save_16bit_model(
        self,
        save_dir: Union[str, os.PathLike],
        save_filename: str = "pytorch_model.bin",
        exclude_frozen_parameters: bool = False,
    ) -> bool:
        """Saves the model's weights whole, in the run's 16-bit dtype: rank 0 writes
        ``save_dir/save_filename`` (a ``torch.save`` state dict), or, for a name ending in
        ``.safetensors``, Hugging Face's sharded safetensors layout. Every rank calls it.
        Under stage 3 this gathers the weights module by module, which DeepSpeed asks to be
        enabled with ``stage3_gather_16bit_weights_on_model_save``; without it, like
        DeepSpeed, this warns and returns False."""
        if exclude_frozen_parameters:
            raise UnsupportedError("save_16bit_model(exclude_frozen_parameters=True) is not supported")
        rt = self._runtime
        rt.ensure_built()
        if rt.stage3 and not self.zero_gather_16bit_weights_on_model_save():
            warnings.warn(
                "Did not save the model because stage3_gather_16bit_weights_on_model_save is "
                "False: set it in zero_optimization to gather the sharded weights on save",
                stacklevel=2,
            )
            return False
        save_dir = os.fspath(save_dir)
        if save_filename.endswith(".safetensors"):
            self._native.save_16bit_model(save_dir)
            return True
        state = self._consolidated_state_dict()
        if self.global_rank == 0:
            os.makedirs(save_dir, exist_ok=True)
            torch.save(state, os.path.join(save_dir, save_filename))
        return True

    def _consolidated_state_dict(self) -> Dict[str, torch.Tensor]:
        """The model's ``state_dict`` with every parameter whole, on rank 0 (empty
        elsewhere); stage 3 gathers one module's parameters at a time."""
        from .zero import GatheredParameters

        values: Dict[int, torch.Tensor] = {}
        rt = self._runtime
        for u in rt.order:
            with GatheredParameters([p.param for p in u.params]):
                if self.global_rank == 0:
                    for p in u.params:
                        values[id(p.param)] = p.param.detach().clone()
        if self.global_rank != 0:
            return {}
        out: Dict[str, torch.Tensor] = {}
        for name, t in self.module.state_dict(keep_vars=True).items():
            out[name] = values[id(t)] if id(t) in values else t.detach().clone()
        return out

    def _take_modified(self, params: List[torch.nn.Parameter], modifier_rank: int) -> None:
        """Rank ``modifier_rank``'s values of ``params`` become every rank's (master
        weights included); torch's whole copies are refreshed."""
        reg = self._registry
        pairs = []
        for p in params:
            info = reg.by_id[id(p)]
            u = reg.units[info.unit]
            pairs.append((u.index, info.k, p.data.detach().cpu()))
        self._native.set_params(pairs, modifier_rank)
        rt = self._runtime
        for p in params:
            info = reg.by_id[id(p)]
            u = reg.units[info.unit]
            if not rt.stage3 or info.persistent:
                self._native.fill_param(u.index, info.k, p.data, rt.stream())
            elif rt.filled.get(u.index):
                rt._fill(u)

    def __getattr__(self, name: str) -> Any:
        # Anything else is the model's (as DeepSpeed's engine falls through to it).
        if name in ("module", "_runtime", "_registry"):
            raise AttributeError(name)
        return getattr(self.module, name)

    def destroy(self) -> None:
        """Removes the hooks (the engine is gone once this object is)."""
        self._runtime.remove()


def choose_device(model: torch.nn.Module, local_rank: int) -> torch.device:
    """The device the model trains on, as DeepSpeed picks its accelerator: a model already
    on a CUDA device trains there; otherwise ``DS_ACCELERATOR`` (``cpu`` or ``cuda``)
    decides, and without it the local rank's GPU where torch sees one (the one visible
    GPU, else ``cuda:<local_rank>``), else the CPU."""
    devices = {p.device for p in model.parameters()}
    if len(devices) > 1:
        raise UnsupportedError(
            f"the model's parameters are on several devices ({sorted(map(str, devices))}): "
            "zero trains a model on one device per rank"
        )
    (device,) = devices
    if device.type not in ("cpu", "cuda"):
        raise UnsupportedError(f"the model is on {device}: zero trains on the CPU or on CUDA GPUs")
    if device.type == "cuda":
        return torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
    wanted = os.environ.get("DS_ACCELERATOR", "").strip().lower()
    if wanted not in ("", "cpu", "cuda"):
        raise UnsupportedError(f"DS_ACCELERATOR={wanted!r}: zero trains on 'cpu' or 'cuda'")
    if wanted == "cpu" or (wanted == "" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UnsupportedError("DS_ACCELERATOR=cuda, but torch sees no CUDA GPU on this machine")
    count = torch.cuda.device_count()
    return torch.device("cuda", 0 if count == 1 else local_rank)


class _OptimizerView:
    """What ``initialize`` returns as the optimizer: the engine steps it, so ``step`` and
    ``zero_grad`` here do nothing (as DeepSpeed's ZeRO optimizer under its engine)."""

    def __init__(self, engine: ZeroEngine) -> None:
        self._engine = engine

    def step(self, *args: Any, **kwargs: Any) -> None:
        """No-op: ``engine.step()`` applies the optimizer."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """No-op: the engine starts every step with zero gradients."""

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        return [{"lr": self._engine.get_lr()[0], "params": list(self._engine.module.parameters())}]

    @property
    def cur_scale(self) -> float:
        """The current loss scale (1 unless fp16)."""
        return float(self._engine._native.loss_scale())

    loss_scale = cur_scale

    @property
    def overflow(self) -> bool:
        return not self._engine.was_step_applied() and self._engine._last_step is not None


class _SchedulerView:
    """What ``initialize`` returns as the LR scheduler: the engine runs the config's
    schedule, so ``step`` does nothing; ``get_last_lr`` reads it."""

    def __init__(self, engine: ZeroEngine) -> None:
        self._engine = engine

    def step(self, *args: Any, **kwargs: Any) -> None:
        """No-op: ``engine.step()`` advances the schedule."""

    def get_last_lr(self) -> List[float]:
        return self._engine.get_lr()

    def state_dict(self) -> Dict[str, Any]:
        return {}

