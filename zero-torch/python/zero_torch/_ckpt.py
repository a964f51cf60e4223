"""The engine's checkpoint methods: zero's own checkpoints (any world size and stage),
DeepSpeed's (read, to continue a run begun on DeepSpeed), and the 16-bit model.

An external optimizer's state (a torch optimizer stepping the rank's fp32 shard) is its
``state_dict`` over that shard, one file per rank (``torch_optimizer_rank<r>.pt``), written
into the tag's folder before the engine commits the checkpoint, so a failed save still
leaves the previous one ``latest``; it loads at the same world size and stage.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from . import _client_state
from .errors import CheckpointError, UnsupportedError

PathLike = Union[str, os.PathLike]


def _external_state_path(path: str, rank: int) -> str:
    return os.path.join(path, f"torch_optimizer_rank{rank}.pt")


class CheckpointMethods:
    """``save_checkpoint``, ``load_checkpoint``, ``save_16bit_model`` of ``ZeroEngine``."""

    def save_checkpoint(
        self,
        save_dir: PathLike,
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
        :class:`~zero_torch.CheckpointError` and the previous checkpoint stays ``latest``.
        ``exclude_frozen_parameters`` (what transformers' Trainer passes for a PEFT model)
        leaves the frozen parameters out: ``load_checkpoint(..., load_module_strict=False)``
        then keeps the model's own frozen values, as DeepSpeed's does. Rank 0 then writes
        DeepSpeed's recovery scripts, ``zero_to_fp32.py`` and ``zero_to_torch.py``, into
        ``save_dir`` (:func:`zero_torch.checkpoint.write_recovery_scripts`)."""
        if not save_latest:
            raise UnsupportedError(
                "save_checkpoint(save_latest=False) is not supported: zero commits a checkpoint "
                "by pointing `latest` at it, which is what keeps the previous one loadable "
                "when a save fails"
            )
        native = self._native
        self._runtime.sync_user_changes()
        if tag is None:
            tag = f"global_step{self.global_steps}"
        if self._plan.kind == "external":
            path = os.path.join(os.fspath(save_dir), tag)
            os.makedirs(path, exist_ok=True)
            tmp = _external_state_path(path, self.global_rank) + ".tmp"
            torch.save(self._plan.basic.state_dict(), tmp)
            os.replace(tmp, _external_state_path(path, self.global_rank))
        state = dict(client_state or {})
        if self._steps_client_scheduler() and hasattr(self.lr_scheduler, "state_dict"):
            state["__zero_lr_scheduler__"] = self.lr_scheduler.state_dict()
        stored = _client_state.pack(state, _client_state.persistent_buffers(self.module))
        native.save_checkpoint(os.fspath(save_dir), tag, json.dumps(stored), exclude_frozen_parameters)
        if self.global_rank == 0:
            # DeepSpeed's recovery scripts, for zero's format (after the commit, as DeepSpeed).
            from .checkpoint import write_recovery_scripts

            write_recovery_scripts(save_dir)
        return True

    def load_checkpoint(
        self,
        load_dir: PathLike,
        tag: Optional[str] = None,
        load_module_strict: bool = True,
        load_optimizer_states: bool = True,
        load_lr_scheduler_states: bool = True,
        load_module_only: bool = False,
        custom_load_fn: Any = None,
    ) -> Tuple[Optional[str], Any]:
        """Loads checkpoint ``tag`` (default: the one ``load_dir/latest`` names); every
        rank calls it, at an accumulation boundary. A zero checkpoint loads at any world
        size and stage; one DeepSpeed 0.19.8 wrote (``global_step*/``,
        ``*_model_states.pt``, ``*_optim_states.pt``) loads too, and the run continues
        with DeepSpeed's numbers. Returns ``(path, client_state)``, or ``(None, None)``
        with a warning when ``load_dir`` has no ``latest`` and no tag is given (as
        DeepSpeed does). Nothing changes on any rank unless every rank could read its
        part."""
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
        path = os.path.join(load_dir, tag)
        from . import _ds_checkpoint

        if _ds_checkpoint.is_deepspeed_checkpoint(load_dir, tag):
            client = self._load_deepspeed(
                load_dir, tag, load_module_strict, load_optimizer_states, load_lr_scheduler_states, load_module_only
            )
            return path, client
        self._runtime.cross()
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
        if isinstance(client, dict):
            sched = client.pop("__zero_lr_scheduler__", None)
            if sched is not None and load_lr_scheduler_states and not load_module_only and self._steps_client_scheduler():
                self.lr_scheduler.load_state_dict(sched)
        if self._plan.kind == "external" and load_optimizer_states and not load_module_only:
            self._load_external_state(path)
        return path, client

    def _load_external_state(self, path: str) -> None:
        f = _external_state_path(path, self.global_rank)
        if not os.path.isfile(f):
            raise CheckpointError(
                f"{f} is missing: the checkpoint holds no state of the {type(self._plan.basic).__name__} "
                "optimizer for this rank (it loads at the world size and stage that saved it; pass "
                "load_optimizer_states=False to start the optimizer afresh)"
            )
        try:
            state = torch.load(f, map_location="cpu", weights_only=True)
            self._plan.basic.load_state_dict(state)
        except (RuntimeError, ValueError, KeyError) as e:
            raise CheckpointError(
                f"{f}: the optimizer state does not fit this run ({e}); it loads at the world size "
                "and stage that saved it (pass load_optimizer_states=False to start afresh)"
            ) from None

    def _load_deepspeed(
        self,
        load_dir: str,
        tag: str,
        strict: bool,
        load_optimizer_states: bool,
        load_lr_scheduler_states: bool,
        load_module_only: bool,
    ) -> Dict[str, Any]:
        """Continues from a checkpoint DeepSpeed wrote: its fp32 master weights and Adam
        moments (every rank reads every rank's files), counters, loss scaler and
        schedule, buffers and client state."""
        from . import _ds_checkpoint

        moments = load_optimizer_states and not load_module_only
        ck = _ds_checkpoint.read_deepspeed_checkpoint(
            load_dir, tag, load_optimizer_states=moments, trainable_names=self._trained_names or None
        )
        torch_adam = type(self._plan.basic) in (torch.optim.Adam, torch.optim.AdamW)
        if moments and self._plan.kind == "external" and not torch_adam:
            raise UnsupportedError(
                f"{ck.path}: the state of a {type(self._plan.basic).__name__} optimizer in a DeepSpeed "
                "checkpoint cannot be mapped onto zero's shards (only Adam's moments can); pass "
                "load_optimizer_states=False (the fp32 weights load, the optimizer starts afresh)"
            )
        params: List[Any] = []
        for name, st in ck.params.items():
            m = v = None
            if moments and st.exp_avg is not None and st.exp_avg_sq is not None:
                m, v = st.exp_avg.float().contiguous(), st.exp_avg_sq.float().contiguous()
            params.append((name, st.master.float().contiguous(), m, v))
        own = {n for n, _ in self.module.named_parameters()}
        for name, t in list(ck.frozen.items()) + list(ck.module.items()):
            if name in own and name not in ck.params and t.numel() > 0 and all(name != p[0] for p in params):
                params.append((name, t.float().contiguous(), None, None))
        scaler = ck.loss_scaler or {}
        loss_scale = None
        if "cur_scale" in scaler and not load_module_only:
            dynamic = None
            if scaler.get("dynamic"):
                dynamic = (
                    int(scaler.get("cur_iter", 0)),
                    int(scaler.get("last_overflow_iter", -1)),
                    int(scaler.get("cur_hysteresis", 1)),
                )
            loss_scale = (float(scaler["cur_scale"]), dynamic)
        sched = ck.lr_scheduler or {}
        lr_it = None
        if load_lr_scheduler_states and not load_module_only and self.client_lr_scheduler is None:
            if "last_batch_iteration" in sched:
                lr_it = int(sched["last_batch_iteration"])
        counters = (0, 0, 0) if load_module_only else (
            int(ck.optimizer_step or 0) if moments else 0,
            int(ck.skipped_steps),
            int(ck.global_steps),
        )
        self._runtime.cross()
        self._native.import_state(params, counters[0], counters[1], counters[2], loss_scale, lr_it, strict)
        self._runtime.write_back()
        if moments and self._plan.kind == "external":
            self._driver.adam_state_from_engine(self._native, counters[0])
        buffers = {n: t for n, t in ck.module.items() if n not in own}
        _client_state.load_buffers(self.module, buffers, strict=False)
        if (
            load_lr_scheduler_states
            and not load_module_only
            and self._steps_client_scheduler()
            and ck.lr_scheduler is not None
        ):
            self.lr_scheduler.load_state_dict(ck.lr_scheduler)
        return ck.client_state

    def save_16bit_model(
        self,
        save_dir: PathLike,
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
        rt.sync_user_changes()
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

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters: bool = False) -> Dict[str, torch.Tensor]:
        """DeepSpeed's: the model's ``state_dict`` with every parameter whole, in the run's
        dtype, on rank 0 (empty elsewhere), gathered one module at a time; every rank calls
        it (accelerate's ``get_state_dict`` and the Trainer's ``save_model`` do). With
        ``exclude_frozen_parameters``, parameters that do not train are left out."""
        state = self._consolidated_state_dict()
        if exclude_frozen_parameters:
            frozen = {n for n, p in self.module.named_parameters() if not p.requires_grad}  # type: ignore[attr-defined]
            state = {n: t for n, t in state.items() if n not in frozen}
        return state

    def _consolidated_state_dict(self) -> Dict[str, torch.Tensor]:
        """The model's ``state_dict`` with every parameter whole, on rank 0 (empty
        elsewhere), in host memory as DeepSpeed's: stage 3 gathers one module's parameters
        at a time and each gathered tensor is copied to the host before the next gather, so
        no device holds more than one module whole (tied names share one tensor)."""
        from .zero import GatheredParameters

        values: Dict[int, torch.Tensor] = {}
        rt = self._runtime
        for u in rt.order:
            with GatheredParameters([p.param for p in u.params]):
                if self.global_rank == 0:
                    for p in u.params:
                        values[id(p.param)] = p.param.detach().to("cpu", copy=True)
        if self.global_rank != 0:
            return {}
        out: Dict[str, torch.Tensor] = {}
        for name, t in self.module.state_dict(keep_vars=True).items():
            out[name] = values[id(t)] if id(t) in values else t.detach().to("cpu", copy=True)
        return out
