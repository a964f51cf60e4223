"""The client suite's bootstrap (``test_clients.py``): runs one DeepSpeed training script
as its own ``__main__``, unchanged, and records every loss it trains on.

    python -u clients_harness.py SCRIPT ARGS...                  (under torchrun)
    deepspeed --num_gpus 2 clients_harness.py SCRIPT ARGS...     (the launcher adds --local_rank=N)

What it does, in order, before ``runpy.run_path(SCRIPT, run_name="__main__")``:

- ``sys.argv`` becomes what the script would get if it had been launched itself:
  ``[SCRIPT, ARGS...]``. The ``deepspeed`` launcher puts ``--local_rank=N`` right after
  the program it starts (here: this file, before SCRIPT); it is moved to right after
  SCRIPT, where the launcher puts it when it starts the script itself.
  ``ZT_CLIENT_LOCAL_RANK_ARG=1`` adds ``--local_rank=$LOCAL_RANK`` there when no
  ``--local_rank`` was given (what the deepspeed launcher passes; for a script whose
  ``--local_rank`` defaults to 0, run under torchrun).
- ``sys.path[0]`` becomes SCRIPT's folder (as ``python SCRIPT`` sets it), and the folders
  in ``ZT_CLIENT_SHIMS`` are appended at the end (stand-ins for packages the test
  environment lacks; an installed package comes first). ``torch.utils.tensorboard`` gets
  a no-op ``SummaryWriter`` when the ``tensorboard`` package is not installed (the real
  module cannot be imported then).
- ``ZT_CLIENT_SEED=s`` seeds ``random``, NumPy and torch with ``s + RANK`` (torch's
  generator starts from a random seed in every process: a script that seeds nothing
  would otherwise train on other weights and data in each run; different per rank, as
  unseeded processes are). A script's own seeding comes after this and wins.
- ``ZT_CLIENT_CLOCK=t`` makes ``datetime.datetime.now()`` return the time ``t`` (seconds
  since the epoch) on every rank, for scripts that name folders after the clock.
- Loss recording (test instrumentation; nothing in the script or in zero_torch changes):
  * the engine class's ``backward`` is wrapped as soon as its module is imported (a
    ``sys.meta_path`` finder that wraps the loader of ``deepspeed.runtime.engine`` for
    DeepSpeed's ``DeepSpeedEngine`` and of ``zero_torch.engine`` for zero's
    ``ZeroEngine``: the module is imported by the script itself, after its first line;
    a DeepSpeed reference rank forked from a zygote that imported DeepSpeed already has
    the module, whose class is wrapped at once).
    Each call records the loss it is given, and which engine got it (engines numbered
    in the order they first get a loss: the GAN's D is 0, G is 1);
  * ``torch.Tensor.backward`` is wrapped too: a scalar tensor's ``.backward()`` called
    while no engine ``backward`` is running is a loss the script backpropagates itself
    (``bf16_master_weight/train.py``'s PyTorch-style ``loss.backward()`` then
    ``engine.step()``), recorded with engine ``None``. The calls an engine makes inside
    its own ``backward`` are not recorded twice. This is more robust than reading the
    engine's forward outputs (a model returning logits gives no scalar there) or
    parsing printed losses (rounded, and only every few steps).
  Values are the loss tensor's value as a Python float (exact for fp32, bf16 and fp16).
  Each record also holds a hash of torch's default generator's state at that moment: a
  library that draws random numbers the other does not (during ``initialize``, say)
  changes every random draw the script makes after it (data, dropout), which a loss
  tolerance may not show.
  At exit, each rank writes ``{"losses": [...], "engines": [...], "deepspeed": version}``
  as JSON to ``ZT_CLIENT_RECORD`` with ``{rank}`` replaced by its ``RANK``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.util
import json
import os
import runpy
import sys
import threading
import types
from typing import Any, Dict, List, Optional

import ds_cpu_fp16  # beside this file: imported before main() points sys.path[0] at the script
import teardown

_ENGINE_MODULES = {"deepspeed.runtime.engine": "DeepSpeedEngine", "zero_torch.engine": "ZeroEngine"}
_LOSSES: List[Dict[str, Any]] = []
_ENGINES: List[Any] = []
_ENGINE_CLASSES: List[str] = []
_IN_ENGINE = threading.local()


def _engine_index(engine: Any) -> int:
    for i, e in enumerate(_ENGINES):
        if e is engine:
            return i
    _ENGINES.append(engine)
    return len(_ENGINES) - 1


def _record(via: str, engine: Any, loss: Any) -> None:
    import torch

    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        return
    _LOSSES.append({
        "via": via,
        "engine": None if engine is None else _engine_index(engine),
        "value": float(loss.detach().reshape(()).float().item()),
        "dtype": str(loss.dtype).replace("torch.", ""),
        "rng": hashlib.sha1(torch.random.get_rng_state().numpy().tobytes()).hexdigest()[:16],
    })


def _wrap_engine_class(cls: Any) -> None:
    if cls is None or getattr(cls.backward, "_zt_client_recorder", False):
        return
    name = f"{cls.__module__}.{cls.__qualname__}"
    if name not in _ENGINE_CLASSES:
        _ENGINE_CLASSES.append(name)
    original = cls.backward

    @functools.wraps(original)
    def backward(self: Any, loss: Any, *args: Any, **kwargs: Any) -> Any:
        _record("engine.backward", self, loss)
        _IN_ENGINE.depth = getattr(_IN_ENGINE, "depth", 0) + 1
        try:
            return original(self, loss, *args, **kwargs)
        finally:
            _IN_ENGINE.depth -= 1

    backward._zt_client_recorder = True  # type: ignore[attr-defined]
    cls.backward = backward


class _EngineModuleHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for the two engine modules it asks the finders after it and
    wraps the engine class once the module has run."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        cls_name = _ENGINE_MODULES.get(fullname)
        if cls_name is None:
            return None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_wrap(module: types.ModuleType) -> None:
            exec_module(module)
            _wrap_engine_class(getattr(module, cls_name, None))

        loader.exec_module = exec_and_wrap  # this spec's own loader object
        return spec


def _wrap_tensor_backward() -> None:
    import torch

    original = torch.Tensor.backward

    @functools.wraps(original)
    def backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        gradient = args[0] if args else kwargs.get("gradient")
        if getattr(_IN_ENGINE, "depth", 0) == 0 and gradient is None:
            _record("tensor.backward", None, self)
        return original(self, *args, **kwargs)

    torch.Tensor.backward = backward  # type: ignore[method-assign]


def _stub_tensorboard() -> None:
    """``from torch.utils.tensorboard import SummaryWriter`` without the tensorboard package."""
    if importlib.util.find_spec("tensorboard") is not None:
        return
    import torch.utils

    class SummaryWriter:
        """No-op stand-in (the client suite: tensorboard is not installed)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: None

    mod = types.ModuleType("torch.utils.tensorboard")
    mod.SummaryWriter = SummaryWriter  # type: ignore[attr-defined]
    sys.modules["torch.utils.tensorboard"] = mod
    torch.utils.tensorboard = mod  # type: ignore[attr-defined]


def _seed(base: int) -> None:
    import random

    import torch

    seed = base + int(os.environ.get("RANK", "0"))
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)


def _is_local_rank(arg: str) -> bool:
    return arg.startswith("--local_rank") or arg.startswith("--local-rank")


def script_argv(argv: List[str], add_local_rank: Optional[str] = None) -> List[str]:
    """``argv`` (this file's arguments, without its own name) as the script's ``sys.argv``:
    ``--local_rank`` given before SCRIPT (the deepspeed launcher's place for it) moves to
    right after SCRIPT; ``add_local_rank`` is put there when no ``--local_rank`` is given."""
    lead: List[str] = []
    i = 0
    while i < len(argv) and _is_local_rank(argv[i]):
        lead.append(argv[i])
        if "=" not in argv[i] and i + 1 < len(argv):
            lead.append(argv[i + 1])
            i += 1
        i += 1
    if i >= len(argv):
        raise SystemExit("usage: clients_harness.py SCRIPT [ARGS...]")
    script, rest = argv[i], argv[i + 1:]
    if not lead and add_local_rank is not None and not any(_is_local_rank(a) for a in rest):
        lead = [f"--local_rank={add_local_rank}"]
    return [script, *lead, *rest]


def _write(path: Optional[str]) -> None:
    if not path:
        return
    deepspeed = sys.modules.get("deepspeed")
    out = {
        "rank": int(os.environ.get("RANK", "0")),
        "losses": _LOSSES,
        "engines": _ENGINE_CLASSES,
        "deepspeed": getattr(deepspeed, "__version__", None),
    }
    target = path.format(rank=out["rank"])
    tmp = target + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, target)


def _freeze_clock(timestamp: float) -> None:
    """``datetime.datetime.now()`` returns ``timestamp`` on every rank (``ZT_CLIENT_CLOCK``,
    the test's one value for both): a script that names a folder after the second it
    reads the clock (HelloDeepSpeed's experiment folder) then names one folder on every
    rank however far apart the ranks start on a loaded machine."""
    import datetime

    base = datetime.datetime

    class _Frozen(base):  # type: ignore[misc, valid-type]
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return base.fromtimestamp(timestamp, tz)

    datetime.datetime = _Frozen  # type: ignore[misc]


def main() -> None:
    add = os.environ.get("LOCAL_RANK", "0") if os.environ.get("ZT_CLIENT_LOCAL_RANK_ARG") == "1" else None
    sys.argv = script_argv(sys.argv[1:], add)
    script = os.path.abspath(sys.argv[0])
    sys.path[0] = os.path.dirname(script)
    for folder in filter(None, os.environ.get("ZT_CLIENT_SHIMS", "").split(os.pathsep)):
        sys.path.append(folder)
    sys.meta_path.insert(0, _EngineModuleHook())
    for name, cls_name in _ENGINE_MODULES.items():  # imported before this process began (a forked rank)
        if name in sys.modules:
            _wrap_engine_class(getattr(sys.modules[name], cls_name, None))
    ds_cpu_fp16.install()
    _wrap_tensor_backward()
    _stub_tensorboard()
    if os.environ.get("ZT_CLIENT_SEED"):
        _seed(int(os.environ["ZT_CLIENT_SEED"]))
    if os.environ.get("ZT_CLIENT_CLOCK"):
        _freeze_clock(float(os.environ["ZT_CLIENT_CLOCK"]))
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        _write(os.environ.get("ZT_CLIENT_RECORD"))
    teardown.exit_before_teardown()


if __name__ == "__main__":
    main()
