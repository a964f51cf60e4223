"""Stage 3's saved tensors: what autograd keeps of a tensor that views a gathered
parameter during the forward.

``F.linear`` saves ``weight.t()`` for its backward, say: kept as it is, it would hold the
gathered bucket's storage from the forward to the backward, so releasing the unit would
free nothing. While a stage-3 forward runs, torch's saved-tensor hooks keep such a tensor
as the parameter and the view's geometry instead (the way DeepSpeed's memory-efficient
linear saves the parameter), and rebuild it from the parameter's storage when the
backward reads it, by which time the unit is gathered again.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch

from ._model import Param
from .errors import OrderError


class _SavedView:
    """A saved tensor that viewed a gathered parameter: the parameter and the view's
    geometry (offset in elements from the parameter's first)."""

    __slots__ = ("param", "shape", "stride", "offset")

    def __init__(self, param: Param, shape: Tuple[int, ...], stride: Tuple[int, ...], offset: int) -> None:
        self.param = param
        self.shape = shape
        self.stride = stride
        self.offset = offset


class SavedViews:
    """The gathered parameters a saved tensor may view, and the saved-tensor hooks in force
    during a stage-3 forward."""

    __slots__ = ("_live", "_hooks")

    def __init__(self) -> None:
        self._live: Dict[int, List[Tuple[Param, int, int]]] = {}
        """Per storage (by data pointer) of gathered parameters, the parameters in it and
        their byte ranges (what ``pack`` recognizes)."""
        self._hooks: Any = None
        """The saved-tensor hooks in force, or ``None``."""

    def gathered(self, params: List[Param]) -> None:
        """The parameters now view a gathered bucket."""
        live = self._live
        for p in params:
            # The parameter itself, not `.data` (a new tensor object per read): stage 3
            # fills and drops every unit twice a step (issue 31).
            t = p.param
            start = t.data_ptr()
            live.setdefault(t.untyped_storage().data_ptr(), []).append(
                (p, start, start + t.numel() * t.element_size()))

    def released(self, params: List[Param]) -> None:
        """The parameters give their gathered storage back."""
        live = self._live
        for p in params:
            if p.param.numel() != 0:
                key = p.param.untyped_storage().data_ptr()
                entries = [e for e in live.get(key, []) if e[0] is not p]
                if entries:
                    live[key] = entries
                else:
                    live.pop(key, None)

    def start(self) -> None:
        """A stage-3 forward with gradients begins: the hooks are put in force."""
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        self._hooks.__enter__()

    def stop(self) -> None:
        """The forward ended (or one that raised left the hooks in force)."""
        if self._hooks is not None:
            hooks, self._hooks = self._hooks, None
            hooks.__exit__(None, None, None)

    def pack(self, t: torch.Tensor) -> Any:
        """What autograd keeps of ``t``: a tensor viewing a gathered parameter is kept as
        the parameter and the view's geometry; everything else as it is."""
        if not self._live or t.layout != torch.strided:
            return t
        entries = self._live.get(t.untyped_storage().data_ptr())
        if entries is None:
            return t
        at = t.data_ptr()
        for p, start, end in entries:
            if start <= at < end and t.dtype == p.param.dtype:
                return _SavedView(p, tuple(t.shape), tuple(t.stride()), (at - start) // t.element_size())
        return t

    def unpack(self, saved: Any) -> torch.Tensor:
        """The tensor ``pack`` kept, from the parameter's storage now (gathered again
        before its module's backward)."""
        if not isinstance(saved, _SavedView):
            return saved
        base = saved.param.param.data
        if base.numel() == 0:
            raise OrderError(
                f"parameter {saved.param.name} is needed by the backward but is not gathered "
                "(used outside the forward of a module that holds it?)"
            )
        return base.as_strided(saved.shape, saved.stride, base.storage_offset() + saved.offset)
