"""One line at the top of a DeepSpeed script makes ``deepspeed`` mean zero:

.. code-block:: python

    import zero_torch.deepspeed_compat  # the one added line, before any other import
    import deepspeed                    # zero's engine, with DeepSpeed's API
    from deepspeed.accelerator import get_accelerator
    import deepspeed.comm as dist

Importing this module puts :class:`DeepSpeedFinder` first in ``sys.meta_path``. From then
on, in this process:

- ``import deepspeed`` and every ``deepspeed.a.b`` resolve to ``zero_torch._deepspeed`` and
  ``zero_torch._deepspeed.a.b`` by aliasing: ``sys.modules["deepspeed.a.b"]`` is the module
  object ``zero_torch._deepspeed.a.b`` itself (one object per module). A ``deepspeed.*``
  module zero does not serve raises :class:`~zero_torch.errors.NotProvidedModuleError`
  naming it;
- ``importlib.util.find_spec("deepspeed")`` finds zero's module, and ``importlib.metadata``
  (``version``, ``metadata``, ``distribution``) finds a ``deepspeed`` distribution whose
  version is ``0.19.8+zero.<zero_torch version>`` ahead of any installed DeepSpeed: the
  checks of Hugging Face transformers and accelerate see DeepSpeed 0.19.8.

Real DeepSpeed may stay installed: it is simply no longer what ``deepspeed`` means. Nothing
in torch is patched. Importing this module again does nothing; importing it after a
``deepspeed`` module was already imported raises
:class:`~zero_torch.errors.LateCompatImportError` (the script's other modules may already
hold that DeepSpeed's objects). ``import zero_torch as deepspeed`` keeps working without it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, Optional, Sequence

from .errors import LateCompatImportError, NotProvidedModuleError

NAME = "deepspeed"
"""The import and distribution name served."""

SERVED_PACKAGE = "zero_torch._deepspeed"
"""The package served as ``deepspeed``."""


def distribution_version() -> str:
    """The version of the ``deepspeed`` distribution record, ``deepspeed.__version__``:
    DeepSpeed's API version with zero's version as its local label,
    ``0.19.8+zero.<zero_torch.__version__>`` (PEP 440: above 0.19.8, so every ``>=`` check
    on DeepSpeed's version passes)."""
    from ._deepspeed.git_version_info import version

    return version


def served_name(fullname: str) -> Optional[str]:
    """``deepspeed.a.b`` → ``zero_torch._deepspeed.a.b``; ``None`` for other names."""
    if fullname == NAME or fullname.startswith(NAME + "."):
        return SERVED_PACKAGE + fullname[len(NAME):]
    return None


def _is_served(module: Any) -> bool:
    name = getattr(module, "__name__", None)
    return isinstance(name, str) and (name == SERVED_PACKAGE or name.startswith(SERVED_PACKAGE + "."))


class _AliasLoader(importlib.abc.Loader):
    """Loads ``deepspeed.a.b`` as the module object ``zero_torch._deepspeed.a.b`` (imported
    if need be), leaving that module's own ``__spec__`` in place."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._own_spec: Optional[importlib.machinery.ModuleSpec] = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        """Returns the served module itself (imported on first use)."""
        module = importlib.import_module(self.target)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The served module ran when it was imported; only its own spec, which the import
        system has just replaced by the alias's, is put back."""
        if self._own_spec is not None:
            module.__spec__ = self._own_spec


class DeepSpeedDistribution(importlib.metadata.Distribution):
    """The ``deepspeed`` distribution record ``importlib.metadata`` finds while the compat
    layer is on: name ``deepspeed``, version :func:`distribution_version`."""

    def read_text(self, filename: str) -> Optional[str]:
        """The record's files: ``METADATA`` (and ``PKG-INFO``), ``top_level.txt``; no other."""
        if filename in ("METADATA", "PKG-INFO"):
            return (
                "Metadata-Version: 2.1\n"
                f"Name: {NAME}\n"
                f"Version: {distribution_version()}\n"
                "Summary: DeepSpeed's API on zero's ZeRO engine (served by "
                "zero_torch.deepspeed_compat in place of DeepSpeed)\n"
                "License: MIT OR Apache-2.0\n"
                "Requires-Python: >=3.10\n"
                "Requires-Dist: torch>=2.1\n"
            )
        if filename == "top_level.txt":
            return f"{NAME}\n"
        return None

    def locate_file(self, path: Any) -> Path:
        """Paths resolve next to the zero_torch package (the record has no files)."""
        return Path(__file__).resolve().parent.parent / str(path)


class DeepSpeedFinder(importlib.abc.MetaPathFinder):
    """The ``sys.meta_path`` finder that serves ``deepspeed`` from zero_torch (module
    aliases and the distribution record)."""

    zero_torch_deepspeed_finder = True
    """Marks the finder (idempotence survives a reload of this module)."""

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]] = None, target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        """A spec for ``deepspeed`` or ``deepspeed.*`` whose loader returns the served module;
        :class:`~zero_torch.errors.NotProvidedModuleError` for a module zero does not
        serve; ``None`` for every other name."""
        served = served_name(fullname)
        if served is None:
            return None
        own = importlib.util.find_spec(served)
        if own is None:
            from ._deepspeed._missing import message

            raise NotProvidedModuleError(message(fullname), name=fullname)
        spec = importlib.machinery.ModuleSpec(
            fullname,
            _AliasLoader(served),
            origin=own.origin,
            is_package=own.submodule_search_locations is not None,
        )
        if own.submodule_search_locations is not None:
            spec.submodule_search_locations = list(own.submodule_search_locations)
        return spec

    def find_distributions(self, context: Any = None) -> Iterator[importlib.metadata.Distribution]:
        """The ``deepspeed`` record, for a query of that name or of every distribution."""
        name = getattr(context, "name", None)
        if name is None or re.sub(r"[-_.]+", "-", str(name)).lower() == NAME:
            yield DeepSpeedDistribution()

    def invalidate_caches(self) -> None:
        """Nothing is cached."""


def _late_import_error() -> Optional[LateCompatImportError]:
    names = [key for key in list(sys.modules) if key == NAME or key.startswith(NAME + ".")]
    for key in sorted(names, key=len):
        module = sys.modules.get(key)
        if module is not None and not _is_served(module):
            where = getattr(module, "__file__", None) or "an unknown location"
            return LateCompatImportError(
                f"`import zero_torch.deepspeed_compat` came after `{key}` was imported (from "
                f"{where}): put it first in the script, before any import of deepspeed, "
                "transformers or accelerate (they may already hold that DeepSpeed's objects)",
                name=key,
            )
    return None


def install() -> DeepSpeedFinder:
    """Puts :class:`DeepSpeedFinder` first in ``sys.meta_path`` (once; later calls return
    the installed finder). Raises :class:`~zero_torch.errors.LateCompatImportError` if a
    ``deepspeed`` module other than zero's was already imported."""
    for finder in sys.meta_path:
        if getattr(finder, "zero_torch_deepspeed_finder", False):
            if sys.meta_path[0] is not finder:
                sys.meta_path.remove(finder)
                sys.meta_path.insert(0, finder)
            return finder  # type: ignore[return-value]
    error = _late_import_error()
    if error is not None:
        raise error
    finder = DeepSpeedFinder()
    sys.meta_path.insert(0, finder)
    importlib.invalidate_caches()
    return finder


def is_installed() -> bool:
    """Whether ``deepspeed`` means zero in this process."""
    return any(getattr(f, "zero_torch_deepspeed_finder", False) for f in sys.meta_path)


install()

__all__ = [
    "DeepSpeedDistribution",
    "DeepSpeedFinder",
    "distribution_version",
    "install",
    "is_installed",
    "served_name",
]
