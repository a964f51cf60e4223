"""Which optimizer trains the model, by DeepSpeed 0.19.8's rules, and how it is stepped.

DeepSpeed's rules (``runtime/engine.py`` ``_configure_optimizer``,
``_configure_basic_optimizer``, ``_do_optimizer_sanity_check``):

- an optimizer passed in code wins over the config's ``optimizer`` section (DeepSpeed
  says nothing; zero warns); a callable is called with the model's parameters;
- otherwise the config's section builds it: ``Adam``/``AdamW`` as DeepSpeed's FusedAdam
  (``DeepSpeedCPUAdam`` with an offloaded optimizer), any other type as
  ``torch.optim.<type>(params, **params)``;
- the parameters (``model_parameters``, or all of the model's) go to it as given, so
  parameter groups carry their own ``lr``, ``weight_decay``, ``betas``, ...;
- with neither, there is no optimizer: forward passes only.

How zero steps it:

- **fused** (``torch.optim.Adam``/``AdamW`` and DeepSpeed's Adam classes, by exact
  type as DeepSpeed's ZeRO matches them): zero's fused Adam, with each parameter group's
  hyper-parameters read from the optimizer's ``param_groups`` at every step (so a client
  LR scheduler that writes ``param_groups[i]["lr"]`` drives it);
- **external** (any other optimizer, and by default a ``torch.optim.Adam``/``AdamW``
  passed in code, on CPU): the optimizer itself steps the rank's fp32 copy, as DeepSpeed
  steps a client optimizer: at stage 0 one view per parameter, shaped like it (DeepSpeed
  steps the parameters themselves), at stages 1–3 one flat tensor per parameter group,
  the rank's shard (``param_groups[i]["params"] = [flat fp32 partition]``). The engine
  reduces, unscales and clips the gradients before and rounds and gathers the parameters
  after. ``LBFGS`` and ``SparseAdam`` are refused by name (an engine's ``step()`` cannot
  drive them); optimizers whose update is not elementwise (``Adafactor``, ``Muon``) are
  refused at stages 1–3.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, TYPE_CHECKING, Tuple

import torch

from .errors import ConfigError, UnsupportedError
from .optim import ADAM_CLASSES, DeepSpeedCPUAdam, FusedAdam

if TYPE_CHECKING:
    from ._native import NativeEngine, ResolvedConfig, StepOutcome

FUSED_TYPES = (torch.optim.Adam, torch.optim.AdamW) + ADAM_CLASSES
"""Stepped by zero's fused Adam (matched by exact type, as DeepSpeed's ZeRO does)."""

NOT_STEPPABLE = {
    "LBFGS": "it needs a closure that re-evaluates the model, and engine.step() has none (DeepSpeed's fails the same way)",
    "SparseAdam": "it steps sparse gradients, and the engine reduces dense ones",
}
"""torch optimizers an engine's ``step()`` cannot drive, in any stage."""

NOT_ELEMENTWISE = {
    "Adafactor": "its second moment is factored along each tensor's rows and columns",
    "Muon": "it orthogonalizes each weight matrix as a whole",
}
"""torch optimizers whose update of an element depends on more than that element: stage 0
steps them on tensors shaped like the parameters; stages 1–3 cannot (each rank holds a flat
shard)."""

DEEPSPEED_TESTED = {"Adam", "AdamW", "FusedAdam", "DeepSpeedCPUAdam", "Adagrad", "DeepSpeedCPUAdagrad"}
"""The optimizer types DeepSpeed's ZeRO accepts without ``zero_allow_untested_optimizer``
(``runtime/zero/utils.py`` ``ZERO_SUPPORTED_OPTIMIZERS``)."""


@dataclass
class Plan:
    """The resolved optimizer."""

    kind: str
    """``"fused"``, ``"external"`` or ``"none"``."""
    basic: Optional[torch.optim.Optimizer]
    """The torch optimizer whose ``param_groups`` hold the hyper-parameters (the client's,
    or built from the config); ``None`` without an optimizer."""
    group_of: Dict[int, int] = field(default_factory=dict)
    """Each trained parameter's (``id``) group index."""
    base_lrs: List[float] = field(default_factory=list)
    """Each group's ``lr`` when the engine was made (what a config schedule starts from)."""

    def section(self) -> Optional[Dict[str, Any]]:
        """The ``optimizer`` section zero's Rust engine gets."""
        if self.basic is None:
            return None
        if self.kind == "external":
            return {"type": type(self.basic).__name__, "params": {}}
        h = hyper(self.basic, self.basic.param_groups[0])
        return {
            "type": "AdamW" if h["decoupled"] else "Adam",
            "params": {
                "lr": h["lr"],
                "betas": list(h["betas"]),
                "eps": h["eps"],
                "weight_decay": h["weight_decay"],
                "adam_w_mode": h["decoupled"],
                "bias_correction": h["bias_correction"],
            },
        }


def _float(x: Any) -> float:
    return float(x.item() if isinstance(x, torch.Tensor) else x)


def hyper(opt: torch.optim.Optimizer, group: Dict[str, Any]) -> Dict[str, Any]:
    """A fused-Adam group's hyper-parameters as the engine takes them."""
    if isinstance(opt, ADAM_CLASSES):
        decoupled = opt.decoupled(group)
        bias = bool(group.get("bias_correction", True))
    else:
        decoupled = isinstance(opt, torch.optim.AdamW) or bool(group.get("decoupled_weight_decay", False))
        bias = True
    b1, b2 = group["betas"]
    return {
        "lr": _float(group["lr"]),
        "betas": (_float(b1), _float(b2)),
        "eps": _float(group["eps"]),
        "weight_decay": _float(group["weight_decay"]),
        "decoupled": decoupled,
        "bias_correction": bias,
    }


def _params_arg(model: torch.nn.Module, model_parameters: Optional[Iterable[Any]]) -> List[Any]:
    """``model_parameters`` as DeepSpeed passes it to the optimizer (all of the model's
    parameters when it is not given)."""
    if model_parameters is None:
        return list(model.parameters())
    out = []
    for item in model_parameters:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], torch.Tensor):
            out.append(item[1])  # named_parameters()
        else:
            out.append(item)
    return out


def _from_config(resolved: ResolvedConfig, params: List[Any]) -> torch.optim.Optimizer:
    """The optimizer a config's ``optimizer`` section makes (DeepSpeed's
    ``_configure_basic_optimizer``), over ``params``."""
    o = resolved.optimizer
    assert o is not None, "the config has an optimizer section"
    o_params: Dict[str, Any] = json.loads(o.params_json)
    adam = o.adam
    if adam is not None:
        common: Dict[str, Any] = dict(
            lr=adam.lr,
            betas=(adam.beta1, adam.beta2),
            eps=adam.eps,
            weight_decay=adam.weight_decay,
        )
        if o_params.get("torch_adam") and not resolved.offload_optimizer:
            # DeepSpeed's `torch_adam`: torch's own Adam/AdamW, with torch's defaults.
            cls = torch.optim.AdamW if adam.decoupled else torch.optim.Adam
            return cls(params, foreach=o_params.get("foreach"), **common)
        ds = DeepSpeedCPUAdam if resolved.offload_optimizer else FusedAdam
        mode = {"adamw_mode" if ds is DeepSpeedCPUAdam else "adam_w_mode": adam.decoupled}
        return ds(params, bias_correction=adam.bias_correction, **common, **mode)
    name = o.name
    cls = getattr(torch.optim, name, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise UnsupportedError(
            f"optimizer.type `{name}` is not a supported DeepSpeed optimizer: use Adam, AdamW, "
            "or the exact name of a torch.optim optimizer (DeepSpeed builds torch.optim.<type>)"
        )
    try:
        return cls(params, **o_params)
    except TypeError as e:
        raise ConfigError(f"optimizer.params does not fit torch.optim.{name}: {e}") from None


def resolve(
    model: torch.nn.Module,
    client: Any,
    model_parameters: Optional[Iterable[Any]],
    cfg: Dict[str, Any],
    resolved: ResolvedConfig,
    device: torch.device = torch.device("cpu"),
) -> Plan:
    """The plan for ``initialize``'s ``optimizer=`` (``client``), ``model_parameters`` and
    the config (``cfg`` as given, ``resolved`` by zero's parser), for a model on
    ``device``."""
    params = _params_arg(model, model_parameters)
    if client is not None and not isinstance(client, torch.optim.Optimizer):
        if not callable(client):
            raise UnsupportedError(
                f"optimizer={type(client).__name__}: pass a torch.optim.Optimizer, or a callable "
                "that makes one from the model's parameters"
            )
        client = client(params)
        if not isinstance(client, torch.optim.Optimizer):
            raise UnsupportedError(f"the optimizer callable returned a {type(client).__name__}, not a torch.optim.Optimizer")
    if client is not None and resolved.optimizer is not None:
        warnings.warn(
            f"initialize() got an optimizer ({type(client).__name__}) and the config has an "
            "optimizer section: the optimizer passed in code is used, as DeepSpeed does",
            stacklevel=3,
        )
    basic = client
    if basic is None and resolved.optimizer is not None:
        basic = _from_config(resolved, params)
    if basic is None:
        return Plan(kind="none", basic=None)
    basic.param_groups[:] = [g for g in basic.param_groups if len(g["params"]) != 0]
    kind = _kind(basic, cfg, resolved, device)
    group_of: Dict[int, int] = {}
    for g, group in enumerate(basic.param_groups):
        for p in group["params"]:
            if id(p) in group_of:
                raise ConfigError(
                    f"a parameter of shape {tuple(p.shape)} is in parameter groups {group_of[id(p)]} "
                    f"and {g} of the optimizer: each parameter belongs to one group"
                )
            group_of[id(p)] = g
    return Plan(
        kind=kind,
        basic=basic,
        group_of=group_of,
        base_lrs=[_float(g["lr"]) for g in basic.param_groups],
    )


CLIENT_ADAM_VARIABLE = "ZERO_TORCH_CLIENT_ADAM"
"""``fused`` or ``torch``: how a ``torch.optim.Adam``/``AdamW`` passed in code steps (see
:func:`_client_adam_fused`)."""


def _client_adam_fused(device: torch.device) -> bool:
    """Whether a ``torch.optim.Adam``/``AdamW`` (passed in code, or the config's with
    ``torch_adam``) runs as zero's fused Adam. DeepSpeed steps torch's optimizer itself
    there, so by default torch steps it here too, on each rank's fp32 shard (the same
    arithmetic, so DeepSpeed's bits); zero's fused kernel is faster and agrees to an ulp per
    step (``ZERO_TORCH_CLIENT_ADAM=fused``). On a GPU the fused kernel is the default: the
    shard path crosses to the host each step."""
    wanted = os.environ.get(CLIENT_ADAM_VARIABLE, "").strip().lower()
    if wanted not in ("", "fused", "torch"):
        raise ConfigError(f"{CLIENT_ADAM_VARIABLE}={wanted!r}: expected 'fused' or 'torch'")
    if wanted:
        return wanted == "fused"
    return device.type == "cuda"


def _kind(basic: torch.optim.Optimizer, cfg: Dict[str, Any], resolved: ResolvedConfig, device: torch.device) -> str:
    name = type(basic).__name__
    torch_adam = type(basic) in (torch.optim.Adam, torch.optim.AdamW)
    # Offloaded, zero's fused Adam steps it (DeepSpeed would want its DeepSpeedCPUAdam).
    torch_steps = torch_adam and not resolved.offload_optimizer and not _client_adam_fused(device)
    if type(basic) in FUSED_TYPES and not torch_steps and not any(
        g.get("amsgrad") or g.get("maximize") or g.get("capturable") or g.get("differentiable")
        for g in basic.param_groups
    ):
        return "fused"
    stage = resolved.stage
    if type(basic).__module__.startswith("torch.optim"):
        if name in NOT_STEPPABLE:
            raise UnsupportedError(f"{name} cannot be an engine's optimizer: {NOT_STEPPABLE[name]}")
        if name in NOT_ELEMENTWISE and stage >= 1:
            raise UnsupportedError(
                f"{name} cannot step a rank's shard of the parameters: {NOT_ELEMENTWISE[name]} (ZeRO "
                "stages 1-3 step each rank's flat fp32 shard, as DeepSpeed's do); it works at stage 0"
            )
    if resolved.offload_optimizer:
        raise UnsupportedError(
            f"offload_optimizer steps zero's fused Adam, and the optimizer is {name}: use "
            "DeepSpeedCPUAdam / Adam / AdamW, or do not offload (DeepSpeed refuses this too, "
            "unless zero_force_ds_cpu_optimizer is false)"
        )
    if stage >= 1 and name not in DEEPSPEED_TESTED and not cfg.get("zero_allow_untested_optimizer"):
        raise UnsupportedError(
            f"{name} is an untested ZeRO optimizer: add \"zero_allow_untested_optimizer\": true "
            "to the config to step it on each rank's fp32 shard (DeepSpeed asks for the same); "
            "its update must depend on each element alone"
        )
    if stage >= 1 and name not in DEEPSPEED_TESTED:
        warnings.warn(
            f"{name}: zero steps it on each rank's flat fp32 shard; its update must depend on each "
            "element alone (as DeepSpeed's zero_allow_untested_optimizer assumes)",
            stacklevel=4,
        )
    return "external"


def config_without_optimizer_keys(cfg: Dict[str, Any], plan: Plan) -> Dict[str, Any]:
    """``cfg`` with the optimizer section the Rust engine is to use."""
    out = json.loads(json.dumps(cfg))
    section = plan.section()
    if section is None:
        out.pop("optimizer", None)
    else:
        out["optimizer"] = section
    return out


def _initial_state(opt: torch.optim.Optimizer) -> None:
    """The state an optimizer makes for its parameters when it is built (``Adagrad``'s
    ``sum``, made in ``__init__``), for the shards that replaced them: a copy of the
    optimizer built over the shards gives it (DeepSpeed re-creates ``Adagrad`` over its
    flat partitions the same way). Optimizers that make their state at the first step
    give none."""
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": g["params"]} for g in opt.param_groups]
    try:
        fresh = type(opt)(groups)
    except Exception:  # a class whose constructor needs more than its groups
        return
    for p, st in fresh.state.items():
        opt.state[p] = st


class Driver:
    """Steps the engine's optimizer at an accumulation boundary, with the plan's
    hyper-parameters as they are at that moment."""

    def __init__(self, plan: Plan, config_schedule: bool, stage: int = 0,
                 param_at: Optional[Callable[[int, int], torch.Tensor]] = None) -> None:
        self.plan = plan
        self.config_schedule = config_schedule
        """A schedule from the config (run by the engine) sets every group's LR."""
        self.stage = stage
        self.param_at = param_at
        """The model's parameter ``k`` of engine module ``m`` (to shape stage 0's views)."""
        self.sent: List[Optional[tuple]] = []
        self.shards: List[torch.Tensor] = []
        """External optimizers: each group's flat fp32 shard, as the engine reads it."""
        self.grads: List[torch.Tensor] = []
        """Each group's flat gradients, read at each step."""
        self.views: List[List[Tuple[torch.Tensor, int, int]]] = []
        """What the optimizer steps in each group, with where it lies in the shard: the
        shard itself (stages 1–3, as DeepSpeed's ZeRO hands an optimizer its flat
        partition), or a view shaped like each parameter (stage 0, where DeepSpeed steps
        the parameters themselves: per-tensor optimizers such as Adafactor work, and the
        arithmetic is DeepSpeed's to the bit)."""

    def on_built(self, native: Any) -> None:
        """The engine exists: fused groups get their hyper-parameters, external ones their
        shards (which replace the model's parameters in the optimizer's groups, as in
        DeepSpeed)."""
        basic = self.plan.basic
        if basic is None:
            return
        count = native.group_count()
        if count != len(basic.param_groups):
            raise ConfigError(
                f"the engine has {count} parameter group(s) and the optimizer {len(basic.param_groups)}: "
                "every group needs at least one trained parameter"
            )
        self.sent = [None] * count
        if self.plan.kind == "fused":
            self.send(native)
            return
        for g, group in enumerate(basic.param_groups):
            # A config schedule starts from each group's lr (the engine computes it).
            native.set_group_lr(g, self.plan.base_lrs[g])
            shard = torch.zeros(native.external_group_len(g), dtype=torch.float32)
            views = self._views(native, g, group["params"], shard)
            for p in group["params"]:
                basic.state.pop(p, None)
            group["params"] = [v for v, _, _ in views]
            self.shards.append(shard)
            self.grads.append(torch.zeros_like(shard))
            self.views.append(views)
            self._attach_grads(g)
        _initial_state(basic)

    def _views(self, native: Any, g: int, params: List[torch.Tensor], shard: torch.Tensor) -> List[Tuple[torch.Tensor, int, int]]:
        if self.stage != 0 or self.param_at is None:
            return [(shard, 0, shard.numel())]
        where = {}
        for piece in native.external_group_pieces(g):
            p = self.param_at(piece.module, piece.param)
            assert (piece.element_start, piece.element_end) == (0, p.numel()), "stage 0 holds every parameter whole"
            where[id(p)] = (piece.shard_start, piece.shard_end)
        views = []
        for p in params:
            if id(p) in where:  # frozen parameters have no place (DeepSpeed skips them: no grad)
                s0, s1 = where[id(p)]
                views.append((shard[s0:s1].view(p.shape), s0, s1))
        return views

    def _attach_grads(self, g: int) -> None:
        """Each stepped tensor's ``.grad`` is its stretch of the group's gradients (again
        after a ``zero_grad(set_to_none=True)`` on the optimizer)."""
        for v, s0, s1 in self.views[g]:
            v.grad = self.grads[g][s0:s1].view(v.shape)

    def adam_state_from_engine(self, native: Any, step: int) -> None:
        """An external torch Adam/AdamW takes the moments the engine holds (imported from
        another framework's checkpoint) as its state over each stepped tensor, at Adam step
        ``step``."""
        basic = self.plan.basic
        assert basic is not None
        for g, shard in enumerate(self.shards):
            m, v = torch.zeros_like(shard), torch.zeros_like(shard)
            native.external_read(g, "exp_avg", m)
            native.external_read(g, "exp_avg_sq", v)
            for t, s0, s1 in self.views[g]:
                basic.state[t] = {
                    "step": torch.tensor(float(step)),
                    "exp_avg": m[s0:s1].view(t.shape).clone(),
                    "exp_avg_sq": v[s0:s1].view(t.shape).clone(),
                }

    def send(self, native: Any) -> None:
        """Fused: each group's hyper-parameters to the engine, where they changed. With a
        config schedule the LR sent is the group's base LR (the schedule applies itself)."""
        basic = self.plan.basic
        assert basic is not None
        for g, group in enumerate(basic.param_groups):
            h = hyper(basic, group)
            lr = self.plan.base_lrs[g] if self.config_schedule else h["lr"]
            key = (lr, h["betas"], h["eps"], h["weight_decay"], h["decoupled"], h["bias_correction"])
            if key != self.sent[g]:
                native.set_group(g, lr, h["betas"][0], h["betas"][1], h["eps"], h["weight_decay"], h["decoupled"], h["bias_correction"])
                self.sent[g] = key

    def step(self, native: NativeEngine) -> StepOutcome:
        """The optimizer step; returns the engine's outcome."""
        if self.plan.kind == "fused":
            self.send(native)
            out = native.step()
        else:
            out = self._external_step(native)
        self.show_lrs(native)
        return out

    def _external_step(self, native: NativeEngine) -> StepOutcome:
        basic = self.plan.basic
        assert basic is not None
        begun = native.step_external_begin()
        if begun is not None:
            return begun
        try:
            lrs = native.group_lrs() if self.config_schedule else None
            for g, shard in enumerate(self.shards):
                native.external_read(g, "master", shard)
                native.external_read(g, "grad", self.grads[g])
                self._attach_grads(g)
                if lrs is not None:
                    basic.param_groups[g]["lr"] = lrs[g]
            basic.step()
            return native.step_external_finish(self.shards)
        except BaseException:
            native.step_external_abort()
            raise

    def show_lrs(self, native: Any) -> None:
        """With a config schedule, every group's ``lr`` shows the LR of the next step, as
        DeepSpeed's schedulers write it into ``param_groups``."""
        basic = self.plan.basic
        if basic is None or not self.config_schedule:
            return
        for group, lr in zip(basic.param_groups, native.group_lrs()):
            group["lr"] = lr
