"""``ZeroEngine``: what ``zero_torch.initialize`` returns, with the members scripts written
for DeepSpeed's engine call."""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Dict, List, Optional, TYPE_CHECKING, Tuple, Union

import torch

from . import _dist, _gloo_tier, _hooks, _lazy_init, _native, _param_protocol, _placeholder
from ._ckpt import CheckpointMethods
from ._engine_api import DEEPSPEED_ENGINE_MEMBERS, DeepSpeedEngineAPI
from ._hf import HfCheckpointMethods
from ._hooks import Runtime
from ._model import Registry, Unit, register
from ._optim import Driver, Plan
from ._throughput import ThroughputTimer
from .errors import ConfigError, OrderError, UnsupportedError

if TYPE_CHECKING:
    from ._native import ResolvedConfig, StepOutcome

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ZeroEngine(CheckpointMethods, HfCheckpointMethods, DeepSpeedEngineAPI):
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
        resolved: ResolvedConfig,
        plan: Optional[Plan] = None,
        lr_scheduler: Any = None,
        timeout_s: float = 300.0,
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
        if next(model.parameters(), None) is None:
            raise ValueError("the model has no parameters: there is nothing to train")
        self._config = config
        self.config: Dict[str, Any] = config
        """The DeepSpeed config as given (a dict), as DeepSpeed's ``engine.config``."""
        self._resolved = resolved
        self._dtype = _DTYPES[resolved.dtype]
        launch = _native.launch_info()
        self.global_rank: int = launch.rank
        self.world_size: int = launch.world_size
        self.dp_world_size: int = launch.world_size
        self.local_rank: int = launch.local_rank
        self.device: torch.device = choose_device(model, launch.local_rank)
        """Where the model trains: ``cuda:<n>`` (the local rank's GPU, NCCL) or ``cpu``."""
        # As DeepSpeed 0.19.8 casts (`_cast_module_mixed_precision`): the parameters to the
        # 16-bit dtype; buffers keep theirs (rotary frequencies, BatchNorm statistics).
        lazy = [p for p in model.parameters() if _lazy_init.spec_of(p) is not None]
        self._staged: Dict[int, torch.Tensor] = {}
        """A GPU engine's initial values still on the host: the parameters of a model built
        on the CPU, read one at a time by the engine's build at ``initialize`` (each cast to
        the run's dtype as it is read), so neither torch nor the engine ever holds the
        model whole on the device (issue 48, item 2). Empty once the engine is built."""
        for p in model.parameters():
            cast = p.is_floating_point() and p.dtype != self._dtype and self._dtype != torch.float32
            dtype = self._dtype if cast else p.dtype
            if _lazy_init.spec_of(p) is not None:
                # A placeholder moves as its one poison element: never whole, on any device
                # (model.to would copy the expanded shape). The engine fills it unit by unit.
                _placeholder.retype(p, dtype, self.device)
            elif self.device.type == "cuda" and p.device.type == "cpu" and id(p) not in self._staged:
                # Its host values wait for the build; on the device it is poison, as a
                # placeholder is.
                self._staged[id(p)] = p.data
                _placeholder.retype(p, dtype, self.device)
        model.to(device=self.device)
        if self._dtype != torch.float32:
            for p in model.parameters():
                if p.is_floating_point() and p.dtype != self._dtype and _lazy_init.spec_of(p) is None:
                    p.data = p.data.to(self._dtype)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.module = model
        self._timeout_s = timeout_s
        # Taken now, in the order every rank builds its engines: whether the CPU ranks span
        # machines (then each machine's shared-memory group has its own key, and gloo
        # carries what crosses machines: _gloo_tier), and rank 0's id, which reaches the
        # others through torch's store under this engine's own key (_dist.id_exchange).
        self._cpu_tier = _gloo_tier.cpu_tier(timeout_s) if self.device.type == "cpu" else None
        scope = None if self._cpu_tier is None else f"machine/{self._cpu_tier.machine}"
        self._id_exchange = _dist.id_exchange(scope)
        self._plan = plan if plan is not None else Plan(kind="none", basic=None)
        self.client_lr_scheduler = lr_scheduler
        """A scheduler given to ``initialize``. What ``step()`` steps is
        ``engine.lr_scheduler``, which starts as this one."""
        self._driver = Driver(
            self._plan,
            config_schedule=resolved.scheduler and lr_scheduler is None,
            stage=resolved.stage,
            param_at=lambda m, k: self._runtime.order[m].params[k].param,
        )
        trained = set(self._plan.group_of) if self._plan.basic is not None else None
        names = {id(p): n for n, p in model.named_parameters()}
        self._trained_names: List[str] = (
            []
            if self._plan.basic is None
            else [names[id(p)] for g in self._plan.basic.param_groups for p in g["params"] if id(p) in names]
        )
        """The optimizer's parameters by name, in its order (what a DeepSpeed stage-0
        checkpoint's optimizer state is in)."""
        self._declared: Optional[bool] = None
        """A boundary declared before the engine was built, handed to it at its build (it
        keeps the micro-step counters and the declared boundary from then on)."""
        self._registry: Registry = register(model, trained, self._plan.group_of)
        self._runtime = Runtime(
            model, self._registry, self._build, resolved.stage, self.device,
            resolved.param_persistence_threshold,
        )
        self._runtime.on_built = self._driver.on_built
        self._runtime.install()
        _param_protocol.adopt(self._runtime, model)
        from . import zero

        zero.apply_pending(self._runtime)
        if lazy or self._staged:
            # Built now, filling the model unit by unit (placeholders) or parameter by
            # parameter (a host model for a GPU engine): its first forward needs values.
            self._runtime.ensure_built()
        self._last_step: Optional[StepOutcome] = None
        self.optimizer: Optional[ZeroOptimizer] = ZeroOptimizer(self) if self._plan.basic is not None else None
        """What ``initialize`` returns as the optimizer (``None`` without one, as DeepSpeed)."""
        self.basic_optimizer: Optional[torch.optim.Optimizer] = self._plan.basic
        """The torch optimizer holding the parameter groups (the one passed in, or the one
        the config's section made)."""
        self.lr_scheduler: Any = None
        """The scheduler ``step()`` steps after every optimizer step that was not skipped,
        as DeepSpeed's ``engine.lr_scheduler``: the one given to ``initialize``, else a view
        of the config's schedule (which runs inside the engine), else ``None``. A script may
        assign it: ``None`` (Lightning does, then steps the scheduler itself) or another
        scheduler takes effect at the next step."""
        if lr_scheduler is not None:
            self.lr_scheduler = lr_scheduler
        elif resolved.scheduler:
            self.lr_scheduler = _SchedulerView(self)
        self.tput_timer = ThroughputTimer(
            config, batch_size=self.train_batch_size(), steps_per_output=self.steps_per_print(), device=self.device
        )
        """DeepSpeed's throughput timer (started at every forward, stopped at every
        ``step()``)."""
        zero._ENGINES.add(self)

    # ---- the engine ---------------------------------------------------------------

    def _build(self, order: List[Unit]) -> Any:
        modules = [
            (
                u.name,
                [
                    (p.name.rsplit(".", 1)[-1], list(p.shape), p.trainable_k is not None, list(p.aliases), p.group)
                    for p in u.params
                ],
            )
            for u in order
        ]
        # Initial values cross on the host (rank 0's are broadcast), whatever the device;
        # a zero.Init placeholder's come from its fill, one unit at a time.
        fill = _lazy_init.UnitFill(self.module)
        values = [[self._initial(fill, u, p) for p in u.params] for u in order]
        if self.device.type == "cuda":
            # Two allocators share the GPU: what torch's cache holds unused goes back before
            # the engine allocates its buffers (on every rank alike, so no rank retries a
            # collective the others do not: issue 30, M4).
            torch.cuda.empty_cache()
        try:
            native = _native.NativeEngine(
                json.dumps(self._native_config), modules, values, self._timeout_s, str(self.device),
                self._id_exchange,
                None if self._cpu_tier is None else self._cpu_tier.machines,
                None if self._cpu_tier is None else self._cpu_tier.relay,
            )
        finally:
            fill.release()
            self._staged.clear()
        if self._declared is not None:
            native.declare_boundary(self._declared)
        if fill.checkpoints:
            paths = dict(fill.checkpoints)
            self._runtime.after_built = lambda: self._fill_from(paths)
        return native

    def _initial(self, fill: "_lazy_init.UnitFill", unit: Unit, p: Any) -> Any:
        """What the engine's build reads for parameter ``p`` of ``unit``: a host tensor, or a
        callable giving one when the build reaches it (a placeholder's fill, a staged host
        value cast to the parameter's dtype, a device tensor copied off the GPU), so at
        most one parameter (one unit, for a fill) is on the host apart from the model's own."""
        if _lazy_init.spec_of(p.param) is not None:
            return fill.source(unit, p)
        host = self._staged.get(id(p.param))
        if host is not None:
            dtype = p.param.dtype
            return lambda: host.detach().to(dtype)
        data = p.param.data
        if data.device.type != "cpu":
            return lambda: data.detach().cpu()
        return data.detach()

    def _fill_from(self, paths: Dict[str, Optional[torch.dtype]]) -> None:
        """zero.Init's checkpoints into the just-built engine (every parameter they fill
        is in one of them: strict), each rounded to the dtype the model was made in."""
        for path, dtype in paths.items():
            self._load_hf(path, True, dtype)

    @property
    def _native_config(self) -> Dict[str, Any]:
        """The config the Rust engine gets: the optimizer section is the plan's (a client
        optimizer wins over the config's); a client scheduler wins over the config's."""
        from ._optim import config_without_optimizer_keys

        cfg = config_without_optimizer_keys(self._config, self._plan)
        if self.client_lr_scheduler is not None:
            cfg.pop("scheduler", None)
        return cfg

    @property
    def _native(self) -> Any:
        self._runtime.ensure_built()
        return self._runtime.native

    # ---- the training loop ----------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the model (the first call also records the order in which its modules
        are first used, and builds the engine). Outputs that need a gradient are marked so
        that a plain ``loss.backward()`` is scaled as ``engine.backward(loss)`` scales it
        (by the loss scale over the accumulation steps)."""
        self.tput_timer.start()
        out = self.module(*args, **kwargs)
        self._runtime.settle_collectives()
        if torch.is_grad_enabled():
            hook = self._output_hook
            for t in _hooks._tensors_in(out):
                if t.requires_grad:
                    t.register_hook(hook)
        return out

    def _output_hook(self, grad: torch.Tensor) -> torch.Tensor:
        # engine.backward() scaled the loss already; a plain loss.backward() did not.
        if _hooks.backward_owner() is not None:
            return grad
        return grad * self._native.loss_scale_factor()

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True) -> torch.Tensor:
        """Backward of ``loss`` scaled by the loss scale (fp16) and divided by the
        accumulation steps (unless ``scale_wrt_gas=False``), as DeepSpeed's ``backward``
        does; gradients reach the engine as autograd produces them. A second ``backward``
        before ``step()`` adds its gradients to the first's. Returns the loss as scaled for
        the accumulation."""
        if self._plan.kind == "none":
            raise ConfigError(
                "backward() needs an optimizer: the config has no optimizer section and "
                "initialize() got no optimizer= (DeepSpeed: must provide optimizer during init "
                "in order to use backward)"
            )
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError("backward() takes the scalar loss tensor")
        gas = self.gradient_accumulation_steps()
        native = self._native
        native.backward_call()
        factor = native.loss_scale_factor() if scale_wrt_gas else native.loss_scale()
        previous = _hooks._BACKWARD_OWNER[0]
        _hooks._BACKWARD_OWNER[0] = self._runtime
        try:
            (loss * factor).backward(retain_graph=retain_graph)
        finally:
            _hooks._BACKWARD_OWNER[0] = previous
        if self._runtime.error is not None:
            err, self._runtime.error = self._runtime.error, None
            raise err
        return loss / gas if scale_wrt_gas else loss

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether the next ``step()`` applies the optimizer: what
        ``set_gradient_accumulation_boundary`` last said, else whether this micro-step
        completes ``gradient_accumulation_steps`` (as DeepSpeed decides)."""
        native = self._runtime.native
        if native is None:  # nothing counted yet
            return self._declared if self._declared is not None else self.gradient_accumulation_steps() == 1
        return bool(native.is_gradient_accumulation_boundary())

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """Says whether the next ``step()`` applies the optimizer, instead of counting
        micro-steps (as DeepSpeed's, which accelerate calls before every ``backward``: its
        loop calls ``step()`` only at a boundary, and at an epoch's end a window shorter than
        ``gradient_accumulation_steps`` still steps). It holds until set again. A window of
        several micro-steps needs ``gradient_accumulation_steps`` > 1 in the config (the
        accumulation buffers): ``False`` with 1 raises :class:`~zero_torch.OrderError` at
        the next ``backward``."""
        native = self._runtime.native
        if native is None:
            self._declared = bool(is_boundary)
        else:
            native.declare_boundary(bool(is_boundary))

    @property
    def micro_steps(self) -> int:
        """DeepSpeed's ``engine.micro_steps``: ``step()`` calls so far (less those of a
        window ``zero_grad`` discarded). The engine counts them."""
        native = self._runtime.native
        return 0 if native is None else int(native.micro_steps())

    def step(self, lr_kwargs: Optional[Dict[str, Any]] = None) -> None:
        """Counts a micro-step; at the accumulation boundary, the optimizer step
        (unscale, overflow check, clipping, the optimizer, the config's LR schedule; after
        a step that was not skipped, ``engine.lr_scheduler.step(**lr_kwargs)`` when it is a
        scheduler object)."""
        if self._plan.kind == "none":
            raise ConfigError("step() needs an optimizer: the config has no optimizer section and initialize() got no optimizer=")
        if lr_kwargs and not self._steps_client_scheduler():
            raise UnsupportedError(
                "step(lr_kwargs=...) needs a scheduler object in engine.lr_scheduler (one given to "
                "initialize(lr_scheduler=...) or assigned since)"
            )
        rt = self._runtime
        rt.check_grads()
        if rt.native is None:
            raise OrderError("step() was called before backward(): no forward or backward ran yet, so there are no gradients")
        # The engine counts the micro-step and says whether it ends the window.
        boundary = rt.native.step_call()
        if boundary:
            rt.sync_user_changes()
            self._last_step = self._driver.step(self._native)
            rt.write_back()
            if not self._last_step.skipped:
                self._step_scheduler(lr_kwargs)
        self.tput_timer.stop(global_step=boundary, report_speed=boundary and self.global_rank == 0)

    def _steps_client_scheduler(self) -> bool:
        """Whether ``engine.lr_scheduler`` is a scheduler object the engine steps itself
        (the config's schedule runs inside the engine; ``None`` steps nothing)."""
        return self.lr_scheduler is not None and not isinstance(self.lr_scheduler, _SchedulerView)

    def _step_scheduler(self, lr_kwargs: Optional[Dict[str, Any]]) -> None:
        """After an optimizer step that was not skipped, as DeepSpeed's
        ``_take_model_step``: ``engine.lr_scheduler`` as it is now is stepped (a script
        that assigned ``None``, as Lightning does to step the scheduler itself, steps
        nothing; another scheduler assigned is the one stepped), with ``lr_kwargs``, and
        with ``train_batch_size()`` where that raises ``TypeError`` (DeepSpeed's fallback for
        Megatron-style schedulers). The torch optimizer is first marked as stepped, as
        torch's scheduler wrapper marks it when ``optimizer.step()`` runs: the engine stepped
        its parameters, so torch's "lr_scheduler.step() before optimizer.step()" warning,
        which DeepSpeed never causes, does not fire."""
        if not self._steps_client_scheduler():
            return
        if self._plan.basic is not None:
            self._plan.basic._opt_called = True  # type: ignore[attr-defined]
        try:
            self.lr_scheduler.step(**(lr_kwargs or {}))
        except TypeError:
            self.lr_scheduler.step(self.train_batch_size())

    def zero_grad(self) -> None:
        """Clears the model's ``.grad`` (what another engine's backward left there), and
        discards the gradients of a step begun and not taken (every rank must call it at
        the same point then, as it is a collective): the accumulation starts over."""
        for p in self.module.parameters():
            p.grad = None
        rt = self._runtime
        if rt.native is not None and rt.native.passes_since_step() > 0:
            rt.native.zero_grad()  # the engine discards the window's counters too

    def train(self, mode: bool = True) -> "ZeroEngine":
        self.module.train(mode)
        return self

    def eval(self) -> "ZeroEngine":
        self.module.eval()
        return self

    # ---- getters (methods, as DeepSpeed's) --------------------------------------------

    def train_batch_size(self) -> int:
        return self._resolved.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self._resolved.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self._resolved.gradient_accumulation_steps

    def zero_optimization_stage(self) -> int:
        return self._resolved.stage

    def gradient_clipping(self) -> float:
        return self._resolved.gradient_clipping

    def fp16_enabled(self) -> bool:
        return self._dtype == torch.float16

    def bfloat16_enabled(self) -> bool:
        return self._dtype == torch.bfloat16

    def get_lr(self) -> List[float]:
        """The learning rate of the next step, one per parameter group."""
        if self._plan.basic is None:
            return []
        if self._driver.config_schedule:
            return [float(x) for x in self._native.group_lrs()]
        return [float(g["lr"]) for g in self._plan.basic.param_groups]

    def get_mom(self) -> List[Any]:
        """Each parameter group's momentum (Adam's betas), as DeepSpeed's ``get_mom``."""
        if self._plan.basic is None:
            return []
        return [g.get("betas", g.get("momentum")) for g in self._plan.basic.param_groups]

    def optimizer_name(self) -> Optional[str]:
        """The optimizer's class name (DeepSpeed's ``optimizer_name``)."""
        return None if self._plan.basic is None else type(self._plan.basic).__name__

    def steps_per_print(self) -> Optional[int]:
        """The config's ``steps_per_print`` (DeepSpeed's default: 10)."""
        return self._config.get("steps_per_print", 10)

    def wall_clock_breakdown(self) -> bool:
        return bool(self._config.get("wall_clock_breakdown", False))

    def get_global_grad_norm(self) -> Optional[float]:
        """The gradient norm of the last optimizer step, before clipping."""
        return None if self._last_step is None else self._last_step.grad_norm

    def was_step_applied(self) -> bool:
        """False if the last optimizer step was skipped (fp16 overflow)."""
        return self._last_step is not None and not self._last_step.skipped

    @property
    def global_steps(self) -> int:
        return self._native.step_counts().global_steps

    @property
    def global_samples(self) -> int:
        return self.global_steps * self.train_batch_size()

    @property
    def skipped_steps(self) -> int:
        return self._native.step_counts().skipped_steps

    def zero_gather_16bit_weights_on_model_save(self) -> bool:
        return self._resolved.gather_16bit_weights_on_model_save

    def memory_report(self) -> Dict[str, int]:
        """Bytes this rank holds for the model, by category: the engine's (``params``,
        ``grads``, ``master``, ``exp_avg``, ``exp_avg_sq``, ``grad_accum``, ``buckets``,
        ``gathered``, ``frozen``, ``host`` for offloaded state in RAM, ``comm`` for the
        shared-memory group's windows; ``model_states`` and the paper's ``formula``;
        ``released``, the part of ``grads`` whose pages went back to the kernel between a
        step and the next backward, on the CPU, as DeepSpeed frees its gradients) and
        torch's: ``torch_params``, parameter storage torch holds
        outside the engine's buffers (none on the CPU, where the parameters are views of
        them; on a GPU torch's own copies), and ``torch_grads``, the ``.grad`` tensors
        alive. ``total`` is all of it: what the process holds for the model. On a GPU two
        allocators hold device memory, zero's (every engine category above) and torch's
        caching allocator: ``torch_cuda_allocated`` and ``torch_cuda_reserved`` are
        torch's own figures for this device (activations and the script's tensors
        included, so not in ``total``; 0 on the CPU). ``device_total`` sums the engine's
        device categories, and ``allocator_used`` is what the CUDA driver counts in use in
        the device's default memory pool, which every zero buffer draws from (read after
        the device's queued work ran; 0 on the CPU): with one engine in the process the
        two agree, which ``test_cuda.py`` checks. ``allocator_peak`` is the most that pool
        ever held at once in this process (the driver's high-water mark; 0 on the CPU): a
        run's peak of zero's device memory, beside torch's
        ``torch.cuda.max_memory_allocated``. ``device_bound`` is the engine's bound on that
        peak (its buffers at rest, the most gathered at once, their partitions as the
        gathers' inputs, and one released bucket whose stream-ordered free has not run);
        what the script holds comes on top."""
        r: Dict[str, int] = self._native.memory_report().as_dict()
        r["torch_params"], r["torch_grads"] = self._runtime.torch_bytes()
        on_gpu = self.device.type == "cuda"
        r["torch_cuda_allocated"] = int(torch.cuda.memory_allocated(self.device)) if on_gpu else 0
        r["torch_cuda_reserved"] = int(torch.cuda.memory_reserved(self.device)) if on_gpu else 0
        r["total"] = sum(
            r[k]
            for k in (
                "params",
                "grads",
                "master",
                "exp_avg",
                "exp_avg_sq",
                "grad_accum",
                "buckets",
                "gathered",
                "frozen",
                "host",
                "comm",
                "torch_params",
                "torch_grads",
            )
        ) - r["released"]
        return r

    def comm_report(self) -> Dict[str, int]:
        """Elements this rank sent in the last step, by purpose, and the theory."""
        return self._native.comm_report().as_dict()

    def _take_modified(self, params: List[torch.nn.Parameter], modifier_rank: int) -> None:
        """Rank ``modifier_rank``'s values of ``params`` become every rank's (master
        weights included); torch's whole copies are refreshed."""
        reg = self._registry
        pairs = []
        for p in params:
            info = reg.by_id[id(p)]
            u = reg.units[info.unit]
            pairs.append((u.index, info.k, p.data.detach().cpu()))
        rt = self._runtime
        rt.cross()
        self._native.set_params(pairs, modifier_rank)
        rt.cross()
        for p in params:
            # The parameter is the engine's buffer (stage 3: the gathered one), which now
            # holds the new values.
            reg.by_id[id(p)].version = p._version

    def __getattr__(self, name: str) -> Any:
        # Anything else is the model's (as DeepSpeed's engine falls through to it); a
        # DeepSpeed engine member zero lacks is a named error.
        if name in ("module", "_runtime", "_registry") or name.startswith("__"):
            raise AttributeError(name)
        try:
            return getattr(self.module, name)
        except AttributeError as e:
            if name in DEEPSPEED_ENGINE_MEMBERS:
                raise self.not_provided(name) from None
            raise AttributeError(
                f"'{type(self).__name__}' object has no attribute '{name}', and neither has its model "
                f"({type(self.module).__name__}), which the engine's attributes fall through to"
            ) from e

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


class ZeroOptimizer:
    """What ``initialize`` returns as the optimizer, as DeepSpeed returns its ZeRO
    optimizer: ``param_groups`` are the torch optimizer's (a scheduler that writes their
    ``lr`` drives the engine), ``step()`` is the engine's ``step()``, ``zero_grad()`` the
    engine's, ``backward(loss)`` the engine's."""

    def __init__(self, engine: ZeroEngine) -> None:
        self._engine = engine

    @property
    def optimizer(self) -> Optional[torch.optim.Optimizer]:
        """The torch optimizer inside (DeepSpeed's ``optimizer.optimizer``)."""
        return self._engine._plan.basic

    def step(self, closure: Any = None) -> None:
        """The engine's ``step()`` (DeepSpeed's ZeRO optimizer steps the model when called
        directly)."""
        if closure is not None:
            raise UnsupportedError("optimizer.step(closure) is not supported: zero steps after backward()")
        self._engine.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The engine's ``zero_grad()``."""
        del set_to_none
        self._engine.zero_grad()

    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> None:
        """The engine's ``backward(loss)`` (DeepSpeed's older FP16 optimizer API)."""
        self._engine.backward(loss, retain_graph=retain_graph)

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        basic = self._engine._plan.basic
        return [] if basic is None else basic.param_groups

    @property
    def state(self) -> Any:
        basic = self._engine._plan.basic
        return {} if basic is None else basic.state

    def state_dict(self) -> Dict[str, Any]:
        """The torch optimizer's ``state_dict`` (its ``param_groups``; for an external
        optimizer also its state over this rank's shard), with the loss scaler's state."""
        basic = self._engine._plan.basic
        out = {} if basic is None else dict(basic.state_dict())
        out["loss_scaler"] = {"cur_scale": self.cur_scale}
        return out

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
        """No-op: ``engine.step()`` advances the schedule (a script that also calls this
        does not advance it twice, as it would in DeepSpeed)."""

    def get_last_lr(self) -> List[float]:
        return self._engine.get_lr()

    def get_lr(self) -> List[float]:
        return self._engine.get_lr()

    def state_dict(self) -> Dict[str, Any]:
        """DeepSpeed's schedulers' state: ``last_batch_iteration``."""
        return {"last_batch_iteration": self._engine.global_steps - self._engine.skipped_steps - 1}

