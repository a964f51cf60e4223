"""``_native.pyi`` says what the built native module exports (issue 49, item 3): the same
functions, classes, exceptions and ``NativeEngine`` methods and properties, each function
with the parameter names and defaults PyO3 reports in ``__text_signature__``."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import zero_torch
from zero_torch import _native

STUB = Path(zero_torch.__file__).with_name("_native.pyi")
if not STUB.exists():  # an installed wheel without the stub: the source tree's
    STUB = Path(__file__).resolve().parents[2] / "python" / "zero_torch" / "_native.pyi"

Params = List[Tuple[str, bool]]
"""Each parameter's name and whether it has a default."""


def _stub_params(fn: ast.FunctionDef) -> Params:
    args = fn.args.args
    defaults = [False] * (len(args) - len(fn.args.defaults)) + [True] * len(fn.args.defaults)
    out = [(a.arg, d) for a, d in zip(args, defaults)]
    return [p for p in out if p[0] not in ("self", "cls")]


def _runtime_params(obj: object) -> Optional[Params]:
    sig = getattr(obj, "__text_signature__", None)
    if sig is None:
        return None
    inner = sig.strip()[1:-1]
    out: Params = []
    for part in re.split(r",\s*(?![^()\[\]]*[)\]])", inner):
        part = part.strip()
        if not part or part in ("$self", "$type", "/", "*"):
            continue
        name, _, default = part.partition("=")
        out.append((name.strip(), bool(default)))
    return out


def _stub() -> Tuple[Dict[str, ast.FunctionDef], Dict[str, ast.FunctionDef], set, set]:
    tree = ast.parse(STUB.read_text())
    functions: Dict[str, ast.FunctionDef] = {}
    methods: Dict[str, ast.FunctionDef] = {}
    classes, properties = set(), set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            classes.add(node.name)
            if node.name == "NativeEngine":
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        if any(isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list):
                            properties.add(item.name)
                        else:
                            methods[item.name] = item
    return functions, methods, classes, properties


def test_the_stub_names_every_export_of_the_native_module() -> None:
    functions, methods, classes, properties = _stub()
    exported = {n for n in dir(_native) if not n.startswith("_")}
    native_classes = {n for n in exported if isinstance(getattr(_native, n), type)}
    assert set(functions) == exported - native_classes, (set(functions) ^ (exported - native_classes))
    # The stub's own helper types (TypedDicts) are not exports; every exported class is in it.
    assert native_classes <= classes, native_classes - classes
    for name in ("ZeroError", "ConfigError", "CommError", "CheckpointError", "DeviceError", "OrderError"):
        stub_base = next(n for n in ast.parse(STUB.read_text()).body if isinstance(n, ast.ClassDef) and n.name == name)
        base = stub_base.bases[0]
        assert isinstance(base, ast.Name) and base.id == getattr(_native, name).__mro__[1].__name__, name
    engine = {n for n in vars(_native.NativeEngine) if not n.startswith("__")}
    getters = {n for n in engine if type(vars(_native.NativeEngine)[n]).__name__ == "getset_descriptor"}
    assert properties == getters, properties ^ getters
    assert set(methods) - {"__new__"} == engine - getters, (set(methods) - {"__new__"}) ^ (engine - getters)


def _stub_results() -> Dict[str, Tuple[List[str], set]]:
    """Each stub class with annotated attributes (the result classes): its attributes in
    order, and its methods."""
    out: Dict[str, Tuple[List[str], set]] = {}
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.ClassDef):
            attrs = [i.target.id for i in node.body if isinstance(i, ast.AnnAssign) and isinstance(i.target, ast.Name)]
            if attrs:
                out[node.name] = (attrs, {i.name for i in node.body if isinstance(i, ast.FunctionDef)})
    return out


def test_each_result_class_has_the_stubs_attributes() -> None:
    """The frozen result classes (step outcome, reports, resolved config, launch, pieces):
    the stub's attributes are the class's getters, and nothing can be set on them."""
    results = _stub_results()
    native = {
        n: c
        for n in dir(_native)
        if isinstance(c := getattr(_native, n), type) and n != "NativeEngine" and not issubclass(c, BaseException)
    }
    assert set(results) == set(native), set(results) ^ set(native)
    for name, (attrs, methods) in results.items():
        cls = native[name]
        members = {n: v for n, v in vars(cls).items() if not n.startswith("__")}
        getters = {n for n, v in members.items() if type(v).__name__ == "getset_descriptor"}
        assert set(attrs) == getters, (name, set(attrs) ^ getters)
        assert methods == set(members) - getters, (name, methods ^ (set(members) - getters))
        for method in methods:
            assert _stub_params(next(
                f for n in ast.parse(STUB.read_text()).body if isinstance(n, ast.ClassDef) and n.name == name
                for f in n.body if isinstance(f, ast.FunctionDef) and f.name == method
            )) == _runtime_params(getattr(cls, method)), f"{name}.{method}"


def test_result_classes_are_typed_and_frozen() -> None:
    """What crosses back is typed: the resolved config's fields have their Python types,
    the dict view has the same values, and a result cannot be changed."""
    import pytest

    cfg = _native.resolve_config(
        '{"train_batch_size": 8, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,'
        ' "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}},'
        ' "bf16": {"enabled": true}, "zero_optimization": {"stage": 3}}',
        2,
    )
    assert isinstance(cfg, _native.ResolvedConfig)
    assert (cfg.stage, cfg.dtype, cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu) == (3, "bfloat16", 8, 2)
    assert cfg.gradient_clipping == 1.0 and not cfg.scheduler and not cfg.offload_optimizer
    assert cfg.optimizer is not None and cfg.optimizer.name == "adamw"
    adam = cfg.optimizer.adam
    assert adam is not None and adam.decoupled
    # f32 hyper-parameters come back as the decimal the user wrote, not the f32's expansion.
    assert (adam.lr, adam.weight_decay) == (0.01, 0.1)
    d = cfg.as_dict()
    assert d["stage"] == 3 and d["notes"] == cfg.notes and d["optimizer"].name == "adamw"
    with pytest.raises(AttributeError):
        cfg.stage = 2  # type: ignore[misc]
    launch = _native.launch_info()
    assert launch.world_size >= 1 and 0 <= launch.rank < launch.world_size
    assert repr(launch).startswith(f"LaunchInfo(rank={launch.rank}, world_size={launch.world_size}, ")
    assert "adam=AdamHyper(lr=0.01, " in repr(cfg.optimizer)


def test_each_stub_signature_matches_pyo3s() -> None:
    functions, methods, _, _ = _stub()
    checked = 0
    for name, fn in functions.items():
        assert _stub_params(fn) == _runtime_params(getattr(_native, name)), name
        checked += 1
    for name, fn in methods.items():
        runtime = _native.NativeEngine if name == "__new__" else getattr(_native.NativeEngine, name)
        assert _stub_params(fn) == _runtime_params(runtime), f"NativeEngine.{name}"
        checked += 1
    assert checked >= 45, checked
