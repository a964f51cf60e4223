"""Stage 3: a parameter read during a forward without its module being called is gathered.

``nn.MultiheadAttention`` passes ``self.out_proj.weight`` to a functional call without
calling ``out_proj``, and models reach shared or tied weights by attribute. Under stage 3
such a parameter holds no storage between uses, so the read must gather it. As DeepSpeed
does (``ZeROOrderedDict`` in ``runtime/zero/parameter_offload.py``), each module's
``_parameters`` becomes a dict that notices reads (``nn.Module.__getattr__`` reads
parameters from it): a parameter read while a module's forward runs is registered as used
by that module (the innermost one running), so it is gathered now, released with the
module, and gathered again before the module's backward, and from then on like any
parameter the module owns. Only the module objects of the model are changed; nothing of
torch is patched.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch


class NoticingParameters(dict):
    """A module's ``_parameters`` that tells ``notice`` of each parameter read."""

    __slots__ = ("notice",)

    def __init__(self, params: Dict[str, Optional[torch.nn.Parameter]], notice: Callable[[torch.Tensor], None]) -> None:
        super().__init__(params)
        self.notice = notice

    def __getitem__(self, key: str) -> Any:
        p = dict.__getitem__(self, key)
        if p is not None:
            self.notice(p)
        return p

    def __reduce__(self) -> Any:
        # Pickled and copied as the plain dict torch made.
        return (dict, (dict(self),))


def install(modules: List[torch.nn.Module], notice: Callable[[torch.Tensor], None]) -> None:
    """Makes each module's ``_parameters`` notice reads."""
    for m in modules:
        if m._parameters and not isinstance(m._parameters, NoticingParameters):
            m._parameters = NoticingParameters(m._parameters, notice)


def remove(modules: List[torch.nn.Module]) -> None:
    """Gives each module back a plain ``_parameters`` dict."""
    for m in modules:
        if isinstance(m._parameters, NoticingParameters):
            m._parameters = dict(m._parameters)
