"""How a torch model maps onto the engine: a *unit* is a torch module that owns
parameters directly (``named_parameters(recurse=False)``); it becomes one engine module.
A parameter belongs to the first module that holds it; a module that holds a parameter
another owns (tied weights: GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``)
uses the owner's unit, and the parameter's other names are its aliases."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set

import torch


@dataclass
class Param:
    """One registered parameter."""

    param: torch.nn.Parameter
    unit: int
    """Index of the owning unit."""
    k: int
    """Index among the unit's parameters."""
    trainable_k: Optional[int]
    """Index among the unit's trainable parameters (None: frozen)."""
    name: str
    """Its name in the model's ``state_dict``."""
    aliases: List[str] = field(default_factory=list)
    """Other names of the same tensor (tied weights)."""
    shape: torch.Size = torch.Size()
    numel: int = 0
    persistent: bool = True
    """Kept whole in torch storage at rest (set once the engine exists)."""
    group: int = 0
    """Its optimizer parameter group."""
    ptr: int = 0
    """Where its storage was when the engine last placed it (views of the engine's
    buffers, on the CPU): another address means the script replaced it."""
    version: int = 0
    """Its version counter then: another value means the script wrote it in place."""


@dataclass
class Unit:
    """One engine module: a torch module's own parameters."""

    name: str
    module: torch.nn.Module
    params: List[Param] = field(default_factory=list)
    index: int = -1
    """Its engine module index (set once the order is known)."""
    sharded: List["Param"] = field(default_factory=list)
    """Its parameters stage 3 partitions (set once the engine exists)."""

    @property
    def trainable(self) -> List[Param]:
        return [p for p in self.params if p.trainable_k is not None]


@dataclass
class Registry:
    """Every unit, every parameter by identity, and which units each module uses."""

    units: List[Unit]
    by_id: Dict[int, Param]
    uses: Dict[int, List[Unit]]
    """For each module (by ``id``) with parameters: the units it needs gathered."""


def register(
    model: torch.nn.Module, trained: Optional[Set[int]], group_of: Optional[Dict[int, int]] = None
) -> Registry:
    """Units of ``model`` in definition order. ``trained`` (ids of the parameters the
    optimizer steps) narrows the trainable set; a parameter with ``requires_grad=False``
    is frozen either way. ``group_of`` gives each trained parameter's optimizer group."""
    units: List[Unit] = []
    by_id: Dict[int, Param] = {}
    uses: Dict[int, List[Unit]] = {}
    for mod_name, module in model.named_modules(remove_duplicate=False):
        owned = [(n, p) for n, p in module.named_parameters(recurse=False)]
        if not owned:
            continue
        needed: List[Unit] = []
        unit: Optional[Unit] = None
        for local, p in owned:
            full = f"{mod_name}.{local}" if mod_name else local
            known = by_id.get(id(p))
            if known is not None:
                if full != known.name and full not in known.aliases:
                    known.aliases.append(full)
                owner = units[known.unit]
                if owner not in needed:
                    needed.append(owner)
                continue
            if unit is None:
                unit = Unit(name=mod_name, module=module)
                units.append(unit)
                needed.append(unit)
            train = p.requires_grad and (trained is None or id(p) in trained)
            info = Param(
                param=p,
                unit=len(units) - 1,
                k=len(unit.params),
                trainable_k=len(unit.trainable) if train else None,
                name=full,
                shape=p.shape,
                numel=p.numel(),
                group=(group_of or {}).get(id(p), 0),
            )
            unit.params.append(info)
            by_id[id(p)] = info
        if id(module) in uses:
            for u in needed:
                if u not in uses[id(module)]:
                    uses[id(module)].append(u)
        else:
            uses[id(module)] = needed
    return Registry(units=units, by_id=by_id, uses=uses)
