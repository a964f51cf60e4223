"""The hooks that drive the engine from PyTorch's forward and backward.

The parameters are the engine's own memory: once the engine is built, every parameter
kept whole (all of them below stage 3, stage 3's persistent ones) has storage that is a
view of the engine buffer that holds it (``NativeEngine.views``, DLPack over a lease, on
the CPU or the engine's GPU), so there is one copy of the weights and the optimizer step
writes them in place; in stage 3 a gathered parameter views the gathered bucket the
all-gather wrote, and is dropped before the engine frees it. On a GPU, torch's current
stream and the engine's stream are ordered both ways (``NativeEngine.cross``) before every
engine write into the parameters or free of a gathered bucket (a step, a load, an
adoption of the script's own changes, a release) and after every engine write torch then
reads (a step, a load, a gather).

Per module that holds parameters:

- forward pre-hook: the units it uses are gathered (stage 3: ``fetch``, then the
  parameters pointed at the gathered bucket);
- forward hook: they are released (stage 3: ``release``, the storage dropped) and, when a
  backward can follow, every output that needs a gradient gets a tensor hook: autograd
  calls it with the output's gradient, just before the module's own backward runs, and it
  gathers the units again.

Per trainable parameter, a post-accumulate-grad hook hands the gradient to the engine as
soon as autograd has it (and drops ``.grad``). The engine counts the arrivals and decides
when a unit's gradients are complete (once each of its trainable parameters arrived as
many times as in the first backward: ``zero-runtime``'s ``engine/arrivals.rs``); it then
declares the unit ready, its bucket's reduction starts while backward goes on, and in
stage 3 the hook releases the unit. One callback at the end of backward has the engine
declare the rest ready (parameters that got no gradient count as zero) and releases what
is still gathered.

During backward nothing is released by the forward hooks: activation checkpointing runs
forward again inside backward (non-reentrant recompute, or reentrant segments), and what
it gathers stays until the unit's gradients are done.

The first forward records the order in which units are first used and whether each was
used with gradients enabled; the engine is built at its end (parameters are registered in
that order). A unit the first forward used only with gradients enabled gets each
parameter's gradient once per backward (autograd sums a leaf's uses before accumulating
it), so the engine is told to expect that (``predict_grads``) and the first backward
already reduces it as soon as it is complete: gradient staging and, in stage 3, gathered
parameters stay within their bounds from the first step on. The engine then expects the
first backward's own counts of the later ones (a reentrant checkpoint segment accumulates
once more per segment).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import torch

from . import _access
from ._model import Param, Registry, Unit
from ._saved_views import SavedViews
from .errors import OrderError, UnsupportedError, ZeroError

if TYPE_CHECKING:
    from ._native import NativeEngine


def _tensors_in(obj: Any) -> List[torch.Tensor]:
    """Every tensor in a module's output (tensors, tuples, lists, dicts, dataclasses).

    A loop, not a recursive closure: a nested function that calls itself is a reference
    cycle (the function, its own cell), which kept the list it filled, the outputs, their
    hooks (and through them the engine) and their whole autograd graph alive until
    Python's cyclic collector ran: an activation's worth of memory per forward, seen
    growing step after step, and an engine that outlived ``destroy()``."""
    found: List[torch.Tensor] = []
    todo = [obj]
    while todo:
        x = todo.pop()
        if isinstance(x, torch.Tensor):
            found.append(x)
        elif isinstance(x, (list, tuple)):
            todo.extend(reversed(x))
        elif isinstance(x, dict):
            todo.extend(reversed(list(x.values())))
        elif hasattr(x, "__dataclass_fields__"):
            todo.extend(reversed([getattr(x, name, None) for name in x.__dataclass_fields__]))
    return found


_BACKWARD_OWNER: List[Any] = [None]
"""The runtime whose engine's ``backward()`` is running (``[None]`` otherwise). A backward
started by another engine (a GAN's generator through the discriminator's modules) is not
this engine's micro-step: its gradients stay in ``.grad`` as plain PyTorch leaves them. A
backward no engine started (``loss.backward()``) belongs to every engine it reaches, as
DeepSpeed's hooks take it at stages 1-3."""


def backward_owner() -> Any:
    """The runtime whose engine's ``backward()`` is running, or ``None``."""
    return _BACKWARD_OWNER[0]


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
"""The engine's dtype names as torch dtypes."""


def _used_on_current_stream(t: torch.Tensor) -> None:
    """A CUDA tensor (a gradient) an engine crossing is about to read: its memory must not
    go to another tensor before the crossing ran. Every crossing makes torch's current
    stream wait for the engine's copies, which covers memory allocated on the current
    stream; a tensor allocated on another stream (a gradient autograd made on the forward's
    side stream) is recorded on the
    current stream, so the caching allocator reuses it only after the work queued there,
    the wait included (``Tensor.record_stream``; a no-op for the allocation stream)."""
    if t.is_cuda:
        t.record_stream(torch.cuda.current_stream(t.device))


class Runtime:
    """The state the hooks share: the registry, the native engine (once built, it keeps the
    micro-step: ``engine/arrivals.rs``, ``engine/window.rs``) and what is gathered."""

    def __init__(
        self,
        model: torch.nn.Module,
        registry: Registry,
        build: Callable[[List[Unit]], Any],
        stage: int,
        device: torch.device = torch.device("cpu"),
        persistence_threshold: int = 0,
    ):
        self.model = model
        self.persistence_threshold = persistence_threshold
        """``stage3_param_persistence_threshold``: parameters of at most this many
        elements are kept whole in stage 3."""
        self.device = device
        self.stream: Callable[[], int] = (
            (lambda: torch.cuda.current_stream(device).cuda_stream) if device.type == "cuda" else (lambda: 0)
        )
        """Torch's current stream (its raw handle; 0 on the CPU): the engine's copies to and
        from CUDA tensors are ordered with it by events."""
        self.reg = registry
        self._build = build
        self.native: Optional[NativeEngine] = None
        """The native engine once built (its methods and results: ``_native.pyi``)."""
        self.stage3 = stage == 3
        """Below stage 3 parameters are always whole, so the module hooks only record the
        order."""
        self.bound: List[Param] = []
        """The parameters kept whole as views of the engine's buffers (every one below
        stage 3, the persistent ones in stage 3): checked for the script's own changes."""
        self.order: List[Unit] = []
        self.in_backward = False
        self.backward_ran = True
        self.refs: Dict[int, int] = {}
        self.filled: Dict[int, bool] = {u_id: True for u_id in range(len(registry.units))}
        self.recording_uses = True
        """Whether forwards still record ``first_uses``: until the engine expects something
        of a backward (a prediction from them, or the first backward's counts)."""
        self.unhooked = False
        """Below stage 3: the per-module hooks were removed after the first backward."""
        self.first_uses: Dict[int, bool] = {}
        """Per unit (by ``id``) used in the first forward: whether every use had gradients
        enabled. Each such parameter gets its gradient once in a backward (autograd sums
        the uses of a leaf before accumulating it), so the first backward can reduce a unit
        as soon as it is complete instead of holding every bucket's gradients to its end. A
        unit used without gradients (a reentrant checkpoint segment, which accumulates
        again in its own backward) is not predicted."""
        self.callback_queued = False
        self.handles: List[Any] = []
        self.module_handles: List[Any] = []
        """The per-module forward hooks (removed below stage 3 after the first backward)."""
        self.hooked: set = set()
        """Modules (by ``id``) with the per-module forward hooks."""
        self.pre_backward: Dict[int, Callable[[torch.Tensor], None]] = {}
        """Per module (by ``id``): the hook its outputs get."""
        self.empty: Dict[torch.dtype, torch.Tensor] = {}
        """Per dtype: the one empty tensor every released parameter holds."""
        self.saved = SavedViews()
        """Stage 3: the saved tensors that view gathered parameters (``_saved_views.py``)."""
        self.param_count = sum(1 for _ in model.parameters())
        self.modules_seen = {id(mod) for mod in model.modules()}
        """The model's modules at initialize(): a parameter or submodule registered on one of
        them afterwards (torch's global registration hooks) makes the next forward count the
        parameters again, instead of every forward walking the whole model."""
        self.structure_moved = False
        self.pass_is_mine = True
        """Whether the backward under way is this engine's (see ``_BACKWARD_OWNER``)."""
        self.on_built: Optional[Callable[[Any], None]] = None
        self.after_built: Optional[Callable[[], None]] = None
        """Called once the engine is built and its parameters placed (zero.Init's
        checkpoint load)."""
        self.failed: Optional[BaseException] = None
        """Why filling the built engine failed: it is unusable (nothing trains on partly
        filled parameters)."""
        self.broken_grads: Dict[int, str] = {}
        """Units whose gradients a crossing into the engine left half added: the step is
        refused, naming them (the backward that failed also leaves the engine unusable:
        its error is raised again at the next forward)."""
        """Called with the native engine once it is built."""
        self.stack: List[torch.nn.Module] = []
        """Modules whose forward is running (innermost last): a parameter read during a
        forward is registered as used by the innermost one (stage 3)."""
        self.error: Optional[BaseException] = None

    # ---- installation -------------------------------------------------------------

    def install(self) -> None:
        m = self.model
        registration = torch.nn.modules.module
        self.handles.append(registration.register_module_parameter_registration_hook(self._registered))
        self.handles.append(registration.register_module_module_registration_hook(self._registered))
        self.handles.append(m.register_forward_pre_hook(self._root_pre, prepend=True))
        self.handles.append(m.register_forward_hook(self._root_post))
        # The root's own forward may read parameters of modules it does not call.
        self.reg.uses.setdefault(id(m), [])
        for module in m.modules():
            if id(module) in self.reg.uses:
                self.hook_module(module)
        if self.stage3:
            _access.install(list(m.modules()), self.notice)
        for info in self.reg.by_id.values():
            if info.trainable_k is not None:
                self.handles.append(info.param.register_post_accumulate_grad_hook(self._grad_hook))

    def hook_module(self, module: torch.nn.Module) -> None:
        """Gives ``module`` the per-module forward hooks (once; below stage 3 only until
        the first backward has taught the engine what to expect)."""
        if id(module) in self.hooked or self.unhooked:
            return
        self.hooked.add(id(module))
        self.module_handles.append(module.register_forward_pre_hook(self._pre))
        self.module_handles.append(module.register_forward_hook(self._post))

    def _unhook_modules(self) -> None:
        """Below stage 3 the per-module hooks only record the order of first use and the
        first forward's uses; once the first backward has run they have nothing left to
        do, and a module without hooks takes torch's fast call path (issue 31: about 4 µs
        per module per forward)."""
        self.unhooked = True
        for h in self.module_handles:
            h.remove()
        self.module_handles.clear()
        self.stack.clear()

    def notice(self, p: torch.Tensor) -> None:
        """Stage 3: parameter ``p`` is read; inside a forward it becomes a use of the
        innermost module running (and is gathered now if it is not)."""
        if not self.stack:
            return
        info = self.reg.by_id.get(id(p))
        if info is None:
            return
        u = self.reg.units[info.unit]
        uses = self.reg.uses[id(self.stack[-1])]
        if u in uses:
            return
        self.add_use(self.stack[-1], u, running=True)

    def add_use(self, module: torch.nn.Module, u: Unit, running: bool = False) -> None:
        """``module`` uses unit ``u`` (gathered before its forward and backward, released
        after): an external parameter (``register_external_parameter``, or one read by
        attribute in its forward, where ``running`` says the forward is under way)."""
        uses = self.reg.uses.setdefault(id(module), [])
        if u in uses:
            return
        uses.append(u)
        self.hook_module(module)
        if self.native is None:
            if running and u not in self.order:
                self.order.append(u)
            if running:
                self._first_use(u)
            return
        if running and self.stage3:
            if self.in_backward:
                if not self.filled.get(u.index) and not self.native.grads_complete(u.index):
                    self.fetch(u)
                return
            n = self.refs.get(u.index, 0)
            if n == 0:
                self.fetch(u)
            self.refs[u.index] = n + 1

    def _predict(self) -> None:
        """The engine expects one gradient in the first backward for each trainable
        parameter of a unit the first forward used (only with gradients enabled; see
        ``first_uses``)."""
        predicted = [u.index for u in self.order if u.trainable and self.first_uses.get(id(u))]
        if predicted and self.native.predict_grads(predicted):
            self.recording_uses = False

    def _first_use(self, u: Unit) -> None:
        """Records a use of unit ``u`` in the first forward (see ``first_uses``)."""
        grad = torch.is_grad_enabled()
        self.first_uses[id(u)] = grad and self.first_uses.get(id(u), True)

    # ---- building -----------------------------------------------------------------

    def ensure_built(self) -> None:
        """Builds the engine now (units never used so far follow in definition order)."""
        if self.failed is not None:
            raise ZeroError(f"the engine's parameters could not be filled, so it cannot train: {self.failed}")
        if self.native is not None:
            return
        seen = {id(u) for u in self.order}
        order = self.order + [u for u in self.reg.units if id(u) not in seen]
        for i, u in enumerate(order):
            u.index = i
        self.order = order
        self.native = self._build(order)
        if self.on_built is not None:
            self.on_built(self.native)
        self._predict()
        for u in order:
            for p in u.params:
                p.persistent = self.native.param_persistent(u.index, p.k)
            whole = [p for p in u.params if p.persistent]
            self._bind(u, whole)
            self.bound.extend(whole)
            u.sharded = [p for p in u.params if not p.persistent]
        if self.stage3:
            for u in order:
                self._drop(u)
        # Torch reads the views only after the engine's writes of them so far.
        self.cross()
        if self.after_built is not None:
            try:
                self.after_built()
            except BaseException as e:
                self.failed = e
                raise

    # ---- storage ------------------------------------------------------------------

    def _bind(self, u: Unit, params: List[Param]) -> None:
        """Points each of ``params`` (of unit ``u``) at the engine buffer that holds it now:
        its storage becomes a view of the engine's memory."""
        if not params:
            return
        capsules = self.native.views(u.index, [p.k for p in params])
        for p, capsule in zip(params, capsules):
            p.param.data = torch.from_dlpack(capsule)
            p.ptr = p.param.data_ptr()
            p.version = p.param._version

    def cross(self) -> None:
        """On a GPU: the engine's stream waits for what torch queued on its current stream so
        far, and torch's stream for what the engine queued (``NativeEngine.cross``), so
        neither reads memory the other is still writing, nor the engine frees what torch
        still reads. Called before every engine write into the parameters and every free of
        a gathered bucket, and after every engine write torch reads; nothing on the CPU."""
        if self.device.type == "cuda" and self.native is not None:
            self.native.cross(self.stream())

    def sync_user_changes(self) -> None:
        """Takes what the script wrote into whole parameters itself since the engine last
        placed them: ``load_state_dict`` or an in-place write (the version counter moved),
        or ``p.data = tensor`` (the storage moved). Their values become the engine's on
        this rank, fp32 master weights included, and a replaced parameter views the
        engine's buffer again. A parameter whose dtype, device or shape changed
        (``model.half()``, ``.to(...)`` after ``initialize``) is an error naming it."""
        if self.native is None:
            return
        # Every engine write into the parameters follows a call of this one (a step, a
        # save, a load): torch's work on them so far comes first.
        self.cross()
        changed = [p for p in self.bound if p.param.data_ptr() != p.ptr or p.param._version != p.version]
        if not changed:
            return
        engine_dtype = _DTYPES[self.native.dtype]
        pairs = []
        for p in changed:
            t = p.param
            if t.dtype != engine_dtype or t.device != self.device or t.shape != p.shape:
                raise UnsupportedError(
                    f"parameter {p.name} is now {str(t.dtype).replace('torch.', '')} of shape "
                    f"{tuple(t.shape)} on {t.device}, but the engine trains it as "
                    f"{str(engine_dtype).replace('torch.', '')} of shape {tuple(p.shape)} on "
                    f"{self.device}: model.half(), .to(dtype or device) and replacing a "
                    "parameter by another shape are not supported after initialize() "
                    "(choose the dtype in the config, move the model before initialize)"
                )
            pairs.append((self.reg.units[p.unit].index, p.k, t.detach().cpu()))
        self.native.adopt_params(pairs)
        self.cross()
        for p in changed:
            if p.param.data_ptr() != p.ptr:
                self._bind(self.reg.units[p.unit], [p])
            else:
                p.version = p.param._version

    def torch_bytes(self) -> Tuple[int, int]:
        """Bytes torch holds for the model outside the engine: parameter storage that is not
        a view of an engine buffer, and the ``.grad`` tensors alive (each storage once)."""
        ranges = self.native.storage_ranges() if self.native is not None else []
        seen: set = set()
        params = grads = 0
        for p in self.model.parameters():
            if p.numel() == 0:
                continue
            ptr = p.data_ptr()
            if not any(a <= ptr < a + n for a, n in ranges):
                storage = p.untyped_storage()
                if storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    params += storage.nbytes()
            if p.grad is not None:
                storage = p.grad.untyped_storage()
                if storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    grads += storage.nbytes()
        return params, grads

    def _fill(self, u: Unit) -> None:
        """Stage 3: the unit's sharded parameters view the gathered bucket (fetched)."""
        sharded = u.sharded
        if not sharded:
            return
        for p in sharded:
            if p.param.numel() != 0:
                raise UnsupportedError(
                    f"parameter {p.name} was given new data while partitioned (stage 3): its "
                    "change would be lost; change partitioned parameters inside "
                    "zero_torch.zero.GatheredParameters(params, modifier_rank=0)"
                )
        self._bind(u, sharded)
        self.saved.gathered(sharded)
        self.filled[u.index] = True

    def _drop(self, u: Unit) -> None:
        """Stage 3: the unit's sharded parameters give their storage back."""
        self.saved.released(u.sharded)
        for p in u.sharded:
            dtype = p.param.dtype
            empty = self.empty.get(dtype)
            if empty is None:
                empty = self.empty[dtype] = torch.empty(0, dtype=dtype, device=self.device)
            p.param.data = empty
        self.filled[u.index] = False

    def check_grads(self) -> None:
        """Refuses a step over gradients a failed crossing left half added."""
        if self.broken_grads:
            names = ", ".join(f"{self.reg.units[i].name or 'the root module'} ({why})"
                              for i, why in sorted(self.broken_grads.items()))
            raise ZeroError(
                f"the gradients of {names} are incomplete, so the step would use them half "
                "added: the parameters stay as they are"
            )

    def fetch(self, u: Unit) -> None:
        """Makes the unit's values available (``NativeEngine.fetch``: an all-gather in stage 3)."""
        self.native.fetch(u.index)
        if self.stage3 and not self.filled[u.index]:
            self._fill(u)
            # Torch reads the gathered values only after the all-gather wrote them.
            self.cross()

    def release(self, u: Unit) -> None:
        """The unit is done for now (``NativeEngine.release``; stage 3 frees it): its parameters stop viewing the
        bucket first, and the engine frees it only after torch's work so far."""
        if self.stage3:
            self._drop(u)
            self.cross()
        self.native.release(u.index)

    def abandon(self) -> None:
        """Frees everything gathered (the engine's ``abandon_pass``): stage 3's gathered
        parameters are dropped first, and the engine frees the buckets only after torch's
        work so far."""
        if self.stage3:
            for u in self.order:
                if self.filled.get(u.index):
                    self._drop(u)
            self.cross()
        self.native.abandon_pass()

    def write_back(self) -> None:
        """After an engine write (a step, a load): the parameters the engine keeps whole
        (all of them in stages 0-2; stage 3's persistent ones) are its buffers, which it
        wrote in place; on a GPU torch's stream then waits for those writes."""
        self.cross()

    # ---- forward ------------------------------------------------------------------

    def _root_pre(self, module: torch.nn.Module, args: Any) -> None:
        self.saved.stop()  # a forward that raised left them in force
        if self.error is not None:
            raise self.error
        self.sync_user_changes()
        if self.structure_moved:
            self.structure_moved = False
            self._check_no_new_parameters()
        if self.native is not None and not self.backward_ran:
            # The last forward had no backward: what it gathered is freed, and it does
            # not count as a pass.
            self.abandon()
            self.refs.clear()
        self.backward_ran = False
        if self.stage3 and self.native is not None and torch.is_grad_enabled():
            self.saved.start()

    def _check_no_new_parameters(self) -> None:
        """A parameter or submodule was registered on the model since initialize(): a
        parameter the engine does not hold is an error naming it (a replaced one, the
        same count, is taken by :meth:`sync_user_changes` as before)."""
        count = sum(1 for _ in self.model.parameters())
        if count != self.param_count:
            new = [n for n, p in self.model.named_parameters() if id(p) not in self.reg.by_id]
            raise UnsupportedError(
                f"the model has parameters it did not have at initialize(): {new}; "
                "add parameters before calling zero_torch.initialize()"
            )

    def _registered(self, module: torch.nn.Module, name: str, value: Any) -> None:
        """torch's global parameter and module registration hooks: a registration on one of
        the model's modules makes the next forward check the parameters."""
        if id(module) in self.modules_seen:
            self.structure_moved = True

    def _root_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.saved.stop()
        if self.native is None:
            self.ensure_built()
        elif self.recording_uses:
            # Built before its first forward (zero.Init): predict from this one, a
            # forward without gradients predicts nothing.
            if torch.is_grad_enabled():
                self._predict()
            else:
                self.first_uses.clear()
        if not torch.is_grad_enabled():
            self.abandon()
            self.backward_ran = True
            self.refs.clear()

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        self.stack.append(module)
        units = self.reg.uses[id(module)]
        if self.native is None:
            for u in units:
                if u not in self.order:
                    self.order.append(u)
                self._first_use(u)
            return
        if self.recording_uses:
            for u in units:
                self._first_use(u)
        if not self.stage3:
            return
        for u in units:
            if self.in_backward:
                # Activation checkpointing's recompute: gathered until the unit's
                # gradients are done.
                if self.native.grads_complete(u.index):
                    # Its gradients were reduced and its storage released: a recompute
                    # now would run on empty parameters.
                    learned = self.native.expectation() == "learned"
                    before = "the first backward" if learned else "its uses in the first forward"
                    self.error = OrderError(
                        f"module {u.name or '(the model)'} runs again in this backward after its "
                        f"gradients were complete by the count {before} gave (used in more "
                        "reentrant checkpoint segments than before?); its bucket was already reduced"
                    )
                    raise self.error
                if not self.filled.get(u.index):
                    self.fetch(u)
                continue
            n = self.refs.get(u.index, 0)
            if n == 0:
                self.fetch(u)
            self.refs[u.index] = n + 1

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self.stack and self.stack[-1] is module:
            self.stack.pop()
        if not self.stage3:
            return
        units = self.reg.uses[id(module)]
        if self.native is not None and not self.in_backward:
            for u in units:
                n = self.refs.get(u.index, 1) - 1
                self.refs[u.index] = n
                if n == 0:
                    self.release(u)
        if not torch.is_grad_enabled():
            return
        hook = self.pre_backward.get(id(module))
        if hook is None:
            hook = self.pre_backward[id(module)] = self._pre_backward_hook(units)
        for t in _tensors_in(output):
            if t.requires_grad:
                t.register_hook(hook)

    def _pre_backward_hook(self, units: List[Unit]) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            self.before_module_backward(units)

        return hook

    # ---- backward -----------------------------------------------------------------

    def _enter_backward(self) -> None:
        if not self.in_backward:
            self.in_backward = True
            self.backward_ran = True
            owner = backward_owner()
            self.pass_is_mine = owner is None or owner is self
            if self.pass_is_mine:
                # A second backward before step() reopens the micro-step: its gradients
                # add to the first's (the engine counts the passes).
                self.native.begin_pass()
        if not self.callback_queued:
            self.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)

    def before_module_backward(self, units: List[Unit]) -> None:
        """A module's backward is next: its units are gathered (again, in stage 3)."""
        self._enter_backward()
        for u in units:
            if self.stage3 and not self.filled.get(u.index) and not self.native.grads_complete(u.index):
                self.fetch(u)

    def _grad_hook(self, param: torch.Tensor) -> None:
        try:
            self._take_grad(param)
        except BaseException as e:  # autograd would hide the cause in a chain; keep it
            self.error = e
            raise

    def _take_grad(self, param: torch.Tensor) -> None:
        # The per-parameter path of every backward (issue 31): lookups kept to one each.
        if not (self.in_backward and self.callback_queued):
            self._enter_backward()
        if not self.pass_is_mine:
            return  # another engine's backward: the gradient stays in .grad
        grad = param.grad
        if grad is None:
            return
        info: Param = self.reg.by_id[id(param)]
        u = self.reg.units[info.unit]
        if grad.layout != torch.strided or not grad.is_contiguous():
            grad = grad.contiguous()
        _used_on_current_stream(grad)
        try:
            # The engine counts the arrival and says whether the unit is now complete
            # (declared ready, its reduction started).
            complete = self.native.put_grad(u.index, info.trainable_k, grad, self.stream())
        except OrderError:
            raise  # refused before anything was written (its bucket was already reduced)
        except BaseException as e:
            self.broken_grads[u.index] = f"adding {info.name}'s gradient failed: {type(e).__name__}: {e}"
            raise
        param.grad = None
        if complete and self.stage3 and self.filled.get(u.index):
            self.release(u)

    def settle_collectives(self) -> None:
        """Where torch's default group is NCCL, waits for zero's collectives in flight
        (``overlap_comm``'s reductions, stage 3's prefetched gathers): two NCCL
        communicators whose collectives interleave in different orders on different ranks
        can deadlock the GPU, so the script's own collectives (an ``all_reduce`` of the
        loss between backward and step) start only after zero's are done."""
        from . import _dist

        if self.native is not None and _dist.torch_uses_nccl():
            self.native.wait_collectives()

    def _end_of_backward(self) -> None:
        if not self.pass_is_mine:
            # Another engine's backward went through these modules: what it gathered is
            # freed, and it is no pass of this engine's.
            try:
                self.abandon()
            finally:
                self.refs.clear()
                self.in_backward = False
                self.callback_queued = False
                self.pass_is_mine = True
            return
        try:
            # Stage 3: what is still gathered stops viewing the buckets first; the engine
            # frees each after torch's work so far, a unit it declares ready right after
            # its declaration (before the last one rewinds the fetch trace).
            gathered = [u for u in self.order if self.stage3 and self.filled.get(u.index)]
            for u in gathered:
                self._drop(u)
            if gathered:
                self.cross()
            # The engine declares the units not yet complete ready (in reverse order) and,
            # after the first backward, expects its counts of every later one.
            if self.native.end_backward([u.index for u in gathered]):
                self.recording_uses = False
                if not self.stage3:
                    self._unhook_modules()
            self.settle_collectives()
        finally:
            self.refs.clear()
            self.in_backward = False
            self.callback_queued = False

    def remove(self) -> None:
        for h in self.handles + self.module_handles:
            h.remove()
        self.handles.clear()
        self.module_handles.clear()
        self.hooked.clear()
        _access.remove(list(self.model.modules()))


Sizes = Tuple[int, ...]
