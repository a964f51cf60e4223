"""``import zero_torch.deepspeed_compat``: one line makes ``deepspeed`` mean zero, with real
DeepSpeed 0.19.8 installed on the path.

Every test runs in a fresh Python process (the finder changes the process's import
state). Tests that compare with DeepSpeed's own code import real DeepSpeed in a process
*without* the compat line, next to zero_torch's public modules, and compare answer by
answer; they skip, saying so, where DeepSpeed is not installed. ``deepspeed.comm`` and a
small training script run as 2-rank jobs over gloo.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

import conftest

HERE = Path(__file__).resolve().parent
from conftest import LAUNCH_VARS  # noqa: E402

needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="real DeepSpeed is not installed: nothing to compare with",
)


def _env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE)] + [p for p in sys.path if p])
    env.setdefault("DS_ACCELERATOR", "cpu")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def run_python(code: str, extra_env: Optional[Dict[str, str]] = None, timeout: float = 180.0) -> Any:
    """Runs ``code`` in a fresh interpreter; returns the JSON it prints after ``RESULT``."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=_env(extra_env), capture_output=True, text=True,
        timeout=timeout,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"the subprocess failed (exit {proc.returncode}):\n{output[-6000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the subprocess printed no RESULT line:\n{output[-6000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def run_ranks(task: str, world: int = 2, timeout: float = 180.0) -> List[Dict[str, Any]]:
    """Runs ``compat_workers.<task>()`` on ``world`` processes (``conftest.run_job``:
    torchrun's variables, killed after ``timeout`` seconds); returns each rank's result."""
    return conftest.run_job(world, f"compat_workers.{task}", {}, timeout=timeout, env={"DS_ACCELERATOR": "cpu"})


# ---- the one line ---------------------------------------------------------------------


@needs_deepspeed
def test_one_line_serves_zero_with_real_deepspeed_installed() -> None:
    r = run_python("""
        import importlib.machinery, importlib.metadata, importlib.util, json, sys, types
        import torch, torch.distributed, torch.cuda, torch.nn, torch.utils.checkpoint
        watched = [torch, torch.distributed, torch.cuda, torch.nn, torch.utils.checkpoint, torch.optim]
        before = {m.__name__: {k: id(v) for k, v in vars(m).items()} for m in watched}

        import zero_torch.deepspeed_compat
        import deepspeed
        from deepspeed.accelerator import get_accelerator
        import deepspeed.comm as dist
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer, is_moe_param
        from deepspeed.ops.adam import FusedAdam, DeepSpeedCPUAdam
        from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        from deepspeed.launcher.runner import DEEPSPEED_ENVIRONMENT_NAME
        from deepspeed.checkpoint.utils import clone_tensors_for_torch_save
        from deepspeed.runtime.zero import partition_parameters as pp
        import zero_torch, zero_torch.comm, zero_torch.accelerator, zero_torch.lr_schedules, zero_torch.optim
        import zero_torch.activation_checkpointing, zero_torch.checkpoint, zero_torch.zero, zero_torch._dist
        from packaging.version import Version

        after = {m.__name__: {k: id(v) for k, v in vars(m).items()} for m in watched}
        served = {k: m for k, m in sys.modules.items() if k == "deepspeed" or k.startswith("deepspeed.")}
        real = importlib.machinery.PathFinder.find_spec("deepspeed", [p for p in sys.path if p])
        version = importlib.metadata.version("deepspeed")
        print("RESULT " + json.dumps({
            "module": deepspeed.__name__,
            "file_in_zero": "zero_torch" in deepspeed.__file__,
            "every_alias_is_the_served_module": all(
                m is sys.modules["zero_torch._deepspeed" + k[len("deepspeed"):]] for k, m in served.items()),
            "served_count": len(served),
            "initialize": deepspeed.initialize is zero_torch.initialize,
            "init_distributed": deepspeed.init_distributed is zero_torch._dist.init_distributed
                and dist.init_distributed is zero_torch._dist.init_distributed,
            "add_config_arguments": deepspeed.add_config_arguments is zero_torch.add_config_arguments,
            "engine": deepspeed.DeepSpeedEngine is zero_torch.ZeroEngine
                and deepspeed.runtime.engine.DeepSpeedEngine is zero_torch.ZeroEngine,
            "get_accelerator": get_accelerator is zero_torch.accelerator.get_accelerator
                and get_accelerator() is deepspeed.get_accelerator(),
            "comm": dist is sys.modules["deepspeed.comm"] and dist.get_rank is zero_torch.comm.get_rank
                and deepspeed.comm is dist,
            "moe": split_params_into_different_moe_groups_for_optimizer.__module__,
            "fused_adam": FusedAdam is zero_torch.optim.FusedAdam and DeepSpeedCPUAdam is zero_torch.optim.DeepSpeedCPUAdam
                and deepspeed.ops.adam.FusedAdam is FusedAdam,
            "zero": deepspeed.zero.Init is zero_torch.zero.DeepSpeedInit
                and deepspeed.zero.GatheredParameters is zero_torch.zero.GatheredParameters
                and pp.GatheredParameters is zero_torch.zero.GatheredParameters,
            "hf_partition_parameters": pp._orig_torch_arange is torch.arange
                and callable(pp.zero_wrapper_for_fp_tensor_constructor),
            "checkpointing": deepspeed.checkpointing.checkpoint is zero_torch.activation_checkpointing.checkpoint,
            "lr_schedules": deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES,
            "warmup_lr": deepspeed.runtime.lr_schedules.WarmupLR is zero_torch.lr_schedules.WarmupLR,
            "zero_to_fp32": get_fp32_state_dict_from_zero_checkpoint is zero_torch.checkpoint.get_fp32_state_dict_from_zero_checkpoint,
            "logger": [deepspeed.utils.logger.name, deepspeed.utils.logger.level, deepspeed.utils.logging.logger is deepspeed.utils.logger],
            "env_file": DEEPSPEED_ENVIRONMENT_NAME,
            "offload": [OffloadDeviceEnum.cpu == "cpu", OffloadStateTypeEnum.optim_states.value],
            "git_version_info": sorted(k for k in ("version", "git_hash", "git_branch", "installed_ops", "compatible_ops", "torch_info")
                                       if hasattr(deepspeed.git_version_info, k)),
            "version": [deepspeed.__version__, deepspeed.__version_major__, deepspeed.__version_minor__, deepspeed.__version_patch__],
            "metadata_version": version,
            "metadata_name": importlib.metadata.metadata("deepspeed")["Name"],
            "distribution": importlib.metadata.distribution("deepspeed").version,
            "version_ok": Version(version) >= Version("0.9.3") and Version(version).release == (0, 19, 8),
            "find_spec_origin_in_zero": "zero_torch" in (importlib.util.find_spec("deepspeed").origin or ""),
            "real_deepspeed_on_path": real is not None and "zero_torch" not in (real.origin or ""),
            "torch_untouched": before == after,
            "is_installed": zero_torch.deepspeed_compat.is_installed(),
            "finder_first": getattr(sys.meta_path[0], "zero_torch_deepspeed_finder", False),
        }))
    """)
    for key in ("file_in_zero", "every_alias_is_the_served_module", "initialize", "init_distributed",
                "add_config_arguments", "engine", "get_accelerator", "comm", "fused_adam", "zero",
                "hf_partition_parameters", "checkpointing", "warmup_lr", "zero_to_fp32", "version_ok",
                "find_spec_origin_in_zero", "real_deepspeed_on_path", "torch_untouched", "is_installed", "finder_first"):
        assert r[key] is True, (key, r)
    assert r["module"] == "zero_torch._deepspeed"
    assert r["served_count"] > 10
    assert r["moe"] == "zero_torch._deepspeed.moe.utils"
    assert r["lr_schedules"] == ["LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"]
    assert r["logger"] == ["DeepSpeed", 30, True]
    assert r["env_file"] == ".deepspeed_env"
    assert r["offload"] == [True, "optim_states"]
    assert r["git_version_info"] == sorted(["version", "git_hash", "git_branch", "installed_ops", "compatible_ops", "torch_info"])
    assert r["metadata_version"].startswith("0.19.8+zero.")
    assert r["version"] == [r["metadata_version"], 0, 19, 8]
    assert r["distribution"] == r["metadata_version"]
    assert r["metadata_name"] == "deepspeed"


def test_transformers_sees_deepspeed_0_19_8() -> None:
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    r = run_python("""
        import json
        import zero_torch.deepspeed_compat
        from transformers.integrations.deepspeed import is_deepspeed_available
        from transformers.utils.versions import require_version
        require_version("deepspeed>=0.9.3")
        import deepspeed
        print("RESULT " + json.dumps({"available": is_deepspeed_available(), "served": deepspeed.__name__}))
    """)
    assert r == {"available": True, "served": "zero_torch._deepspeed"}


@needs_deepspeed
def test_compat_after_real_deepspeed_is_an_error() -> None:
    r = run_python("""
        import json
        import deepspeed
        from zero_torch.errors import LateCompatImportError, ZeroError
        try:
            import zero_torch.deepspeed_compat
            result = {"raised": False}
        except ImportError as e:
            result = {"raised": True, "type": type(e).__name__, "zero_error": isinstance(e, ZeroError),
                      "late": isinstance(e, LateCompatImportError), "message": str(e)}
        import deepspeed as again
        result["still_real"] = "zero_torch" not in again.__file__
        print("RESULT " + json.dumps(result))
    """)
    assert r["raised"] and r["late"] and r["zero_error"], r
    assert r["type"] == "LateCompatImportError"
    assert "came after `deepspeed` was imported" in r["message"] and "put it first" in r["message"]
    assert r["still_real"]


def test_the_line_is_idempotent() -> None:
    r = run_python("""
        import importlib, json, sys
        import zero_torch.deepspeed_compat as compat
        import deepspeed
        first = sys.modules["deepspeed"]
        import zero_torch.deepspeed_compat
        importlib.reload(compat)
        again = compat.install()
        import deepspeed as second
        finders = [f for f in sys.meta_path if getattr(f, "zero_torch_deepspeed_finder", False)]
        print("RESULT " + json.dumps({
            "finders": len(finders), "first": sys.meta_path[0] is finders[0], "returned": again is finders[0],
            "same_module": second is first,
        }))
    """)
    assert r == {"finders": 1, "first": True, "returned": True, "same_module": True}


@needs_deepspeed
def test_import_zero_torch_as_deepspeed_is_unaffected() -> None:
    r = run_python("""
        import json, sys
        import zero_torch as deepspeed
        import zero_torch
        served = "deepspeed" in sys.modules
        finder = any(getattr(f, "zero_torch_deepspeed_finder", False) for f in sys.meta_path)
        import deepspeed as real
        print("RESULT " + json.dumps({
            "alias": deepspeed.initialize is zero_torch.initialize, "served_before": served, "finder": finder,
            "plain_import_is_real": "zero_torch" not in real.__file__,
        }))
    """)
    assert r == {"alias": True, "served_before": False, "finder": False, "plain_import_is_real": True}


# ---- names zero does not provide ------------------------------------------------------


def test_names_zero_lacks_raise_errors_that_name_them() -> None:
    r = run_python("""
        import json
        import zero_torch.deepspeed_compat
        import deepspeed

        def probe(fn):
            try:
                fn()
                return {"raised": None}
            except BaseException as e:
                return {"raised": type(e).__name__, "message": str(e),
                        "classes": [c.__name__ for c in type(e).__mro__]}

        def from_pipe():
            from deepspeed.pipe import PipelineModule
        def from_deepspeed_foo():
            from deepspeed import foo
        def from_utils():
            from deepspeed.utils import set_z3_leaf_modules
        def from_layer():
            from deepspeed.moe.layer import MoE
        def import_sparse():
            import deepspeed.ops.sparse_attention
        def from_ulysses():
            from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
        def from_many_names():
            from deepspeed.comm import (get_rank, get_world_size, barrier, all_reduce, broadcast, all_gather,
                reduce, gather, scatter, send, recv, isend, irecv, new_group, is_initialized, is_available,
                destroy_process_group, get_local_rank, get_global_rank, inference_all_reduce, ReduceOp,
                configure, log_summary, no_such_function)
        class Holder:
            def method(self):
                from deepspeed.runtime import no_such_module_attr
        namespace = {}
        out = {
            "pipe_attr": probe(lambda: deepspeed.pipe.PipelineModule),
            "pipe_from": probe(from_pipe),
            "foo_attr": probe(lambda: deepspeed.foo),
            "foo_from": probe(from_deepspeed_foo),
            "utils_from": probe(from_utils),
            "moe_layer_from": probe(from_layer),
            "sparse_import": probe(import_sparse),
            "many_names": probe(from_many_names),
            "in_method": probe(Holder().method),
            "in_exec": probe(lambda: exec("from deepspeed.ops import no_such_op", namespace)),
            "init_inference": probe(lambda: deepspeed.init_inference(None)),
            "ulysses_from": probe(from_ulysses),
            "autotp_attr": probe(lambda: deepspeed.tp_model_init(None, 2, None)),
            "dunder": probe(lambda: deepspeed.__wrapped__),
            "hasattr_foo": hasattr(deepspeed, "foo"),
            "getattr_default": getattr(deepspeed, "foo", 7),
            "hasattr_pipe": hasattr(deepspeed, "pipe"),
        }
        print("RESULT " + json.dumps(out))
    """)
    prefix = "is not provided by zero"

    attr = r["pipe_attr"]
    assert attr["raised"] == "NotProvidedAttributeError", attr
    assert {"AttributeError", "UnsupportedError", "ZeroError"} <= set(attr["classes"])
    assert "`deepspeed.pipe`" in attr["message"] and prefix in attr["message"] and "pipeline" in attr["message"]

    module = r["pipe_from"]
    assert module["raised"] == "NotProvidedModuleError", module
    assert {"ModuleNotFoundError", "ImportError", "UnsupportedError"} <= set(module["classes"])
    assert "`deepspeed.pipe`" in module["message"] and "deepspeed.initialize" in module["message"]

    assert r["foo_attr"]["raised"] == "NotProvidedAttributeError"
    assert "`deepspeed.foo`" in r["foo_attr"]["message"] and prefix in r["foo_attr"]["message"]
    for key, name in (("foo_from", "deepspeed.foo"), ("utils_from", "deepspeed.utils.set_z3_leaf_modules"),
                      ("many_names", "deepspeed.comm.no_such_function"),
                      ("in_method", "deepspeed.runtime.no_such_module_attr"),
                      ("in_exec", "deepspeed.ops.no_such_op")):
        got = r[key]
        assert got["raised"] == "NotProvidedImportError", (key, got)
        assert {"ImportError", "UnsupportedError"} <= set(got["classes"]) and "AttributeError" not in got["classes"]
        assert f"`{name}`" in got["message"] and prefix in got["message"], (key, got)
    assert "leaf modules" in r["utils_from"]["message"]
    assert r["moe_layer_from"]["raised"] == "NotProvidedModuleError"
    assert "Mixture-of-Experts" in r["moe_layer_from"]["message"]
    assert r["sparse_import"]["raised"] == "NotProvidedModuleError"
    assert "removed from DeepSpeed itself" in r["sparse_import"]["message"]
    assert r["ulysses_from"]["raised"] == "NotProvidedModuleError", r["ulysses_from"]
    assert "Ulysses" in r["ulysses_from"]["message"]
    assert r["autotp_attr"]["raised"] == "NotProvidedAttributeError", r["autotp_attr"]
    assert "AutoTP" in r["autotp_attr"]["message"] and "`deepspeed.tp_model_init`" in r["autotp_attr"]["message"]
    assert r["init_inference"]["raised"] == "NotProvidedAttributeError"
    assert "inference engine" in r["init_inference"]["message"]
    assert r["dunder"]["raised"] == "AttributeError"
    assert r["hasattr_foo"] is False and r["getattr_default"] == 7 and r["hasattr_pipe"] is False


def test_zero_names_and_the_hooks_transformers_swaps() -> None:
    r = run_python("""
        import json, torch
        import zero_torch.deepspeed_compat
        import deepspeed
        import zero_torch.zero
        out = {}
        if hasattr(zero_torch.zero, "register_external_parameter"):
            from deepspeed.runtime.zero.partition_parameters import register_external_parameter
            out["register_external_parameter"] = (
                deepspeed.zero.register_external_parameter is zero_torch.zero.register_external_parameter
                and register_external_parameter is zero_torch.zero.register_external_parameter)
        else:
            try:
                deepspeed.zero.register_external_parameter
                out["register_external_parameter"] = "returned"
            except AttributeError as e:
                out["register_external_parameter"] = type(e).__name__ == "NotProvidedAttributeError"
        with deepspeed.zero.Init(config_dict_or_path={"train_batch_size": 2}):
            model = torch.nn.Linear(3, 2)
        out["init_builds"] = list(model.weight.shape)
        # DeepSpeed 0.18's MiCS_Init (0.19.8 removed it), by both of its names: it needs the
        # config and the config's mics_shard_size, and builds as zero.Init does.
        from deepspeed.runtime.zero.mics import MiCS_Init
        mics = {"train_batch_size": 2, "zero_optimization": {"stage": 3, "mics_shard_size": 2}}
        out["mics_names"] = MiCS_Init is deepspeed.zero.MiCS_Init is zero_torch.zero.MiCSInit
        torch.manual_seed(0)
        with deepspeed.zero.MiCS_Init(config_dict_or_path=mics) as init:
            built = torch.nn.Linear(3, 2)
        torch.manual_seed(0)
        out["mics_builds"] = [init.shard_size, built.weight.equal(torch.nn.Linear(3, 2).weight)]
        for name, kwargs in (("no_config", {}), ("no_size", {"config_dict_or_path": {"train_batch_size": 2}}),
                             ("bad_size", {"config": {"zero_optimization": {"mics_shard_size": -1}}})):
            try:
                deepspeed.zero.MiCS_Init(**kwargs)
                out[name] = "returned"
            except Exception as e:
                out[name] = [type(e).__name__, str(e)]
        try:
            from transformers.integrations.deepspeed import prevent_arange_dtype_change
        except ImportError:
            out["prevent_arange"] = "no transformers"
        else:
            import deepspeed.runtime.zero.partition_parameters as pp
            original = pp.zero_wrapper_for_fp_tensor_constructor
            with prevent_arange_dtype_change():
                swapped = pp.zero_wrapper_for_fp_tensor_constructor is not original
                made = pp.zero_wrapper_for_fp_tensor_constructor(torch.arange, torch.bfloat16, target_device=torch.device("cpu"))(4)
            out["prevent_arange"] = [swapped, pp.zero_wrapper_for_fp_tensor_constructor is original, str(made.dtype)]
        print("RESULT " + json.dumps(out))
    """)
    assert r["register_external_parameter"] is True
    assert r["init_builds"] == [2, 3]
    assert r["mics_names"] is True
    assert r["mics_builds"] == [2, True]
    assert r["no_config"][0] == "ConfigError" and "config_dict_or_path" in r["no_config"][1], r["no_config"]
    for key in ("no_size", "bad_size"):
        assert r[key][0] == "ConfigError" and "mics_shard_size" in r[key][1], r[key]
    assert "-1" in r["bad_size"][1], r["bad_size"]
    assert r["prevent_arange"] in ("no transformers", [True, True, "torch.int64"])


def test_logger_and_log_dist_as_deepspeed() -> None:
    r = run_python("""
        import json, logging, sys
        import zero_torch.deepspeed_compat
        import deepspeed
        from deepspeed.utils import logger, log_dist
        from deepspeed.utils.logging import logger as same

        seen = []
        class Collect(logging.Handler):
            def emit(self, record):
                seen.append([record.levelname, record.getMessage()])
        logger.addHandler(Collect())
        log_dist("shown", ranks=[0], level=logging.WARNING)
        log_dist("below the level", ranks=[0])
        logger.setLevel(logging.INFO)
        log_dist("now shown")
        print("RESULT " + json.dumps({
            "same": same is logger is deepspeed.logger, "name": logger.name, "propagate": logger.propagate,
            "stdout": [getattr(h, "stream", None) is sys.stdout for h in logger.handlers][:1],
            "seen": seen, "warning_once": callable(logger.warning_once),
        }))
    """)
    assert r == {
        "same": True, "name": "DeepSpeed", "propagate": False, "stdout": [True],
        "seen": [["WARNING", "[Rank -1] shown"], ["INFO", "[Rank -1] now shown"]], "warning_once": True,
    }


# ---- the accelerator against DeepSpeed's CPU accelerator ---------------------------------


@needs_deepspeed
def test_cpu_accelerator_matches_deepspeed_method_by_method() -> None:
    r = run_python("""
        import inspect, json, os, torch
        import deepspeed.accelerator as real_module
        from deepspeed.accelerator import get_accelerator as real_get
        from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator as RealCPU
        import zero_torch.accelerator as zmod
        from zero_torch.errors import UnsupportedError

        ds, z = real_get(), zmod.get_accelerator()
        out = {"names": [type(ds).__name__, type(z).__name__], "missing": [], "signature": [], "different": []}
        public = sorted(n for n in dir(RealCPU) if not n.startswith("_"))
        out["missing"] = [n for n in public if not hasattr(z, n)]
        for n in public:
            a = getattr(RealCPU, n)
            if callable(a) and not isinstance(a, property):
                sd = [(p.name, repr(p.default)) for p in inspect.signature(getattr(ds, n)).parameters.values()]
                sz = [(p.name, repr(p.default)) for p in inspect.signature(getattr(z, n)).parameters.values()]
                if sd != sz:
                    out["signature"].append([n, sd, sz])

        def same(label, a, b):
            if a != b:
                out["different"].append([label, repr(a), repr(b)])

        t = torch.ones(3)
        calls = {
            "_name": lambda x: x._name,
            "_communication_backend_name": lambda x: x._communication_backend_name,
            "device_name()": lambda x: x.device_name(), "device_name(1)": lambda x: x.device_name(1),
            "device()": lambda x: x.device(), "current_device_name()": lambda x: x.current_device_name(),
            "is_available()": lambda x: x.is_available(), "is_synchronized_device()": lambda x: x.is_synchronized_device(),
            "use_host_timers()": lambda x: x.use_host_timers(), "resolves_data_dependency()": lambda x: x.resolves_data_dependency(),
            "handles_memory_backpressure()": lambda x: x.handles_memory_backpressure(),
            "communication_backend_name()": lambda x: x.communication_backend_name(),
            "is_bf16_supported()": lambda x: x.is_bf16_supported(), "is_fp16_supported()": lambda x: bool(x.is_fp16_supported()),
            "is_fp64_supported()": lambda x: x.is_fp64_supported(), "is_triton_supported()": lambda x: x.is_triton_supported(),
            "supported_dtypes()": lambda x: x.supported_dtypes(), "random()": lambda x: x.random() is torch.random,
            "initial_seed()": lambda x: x.initial_seed(), "default_generator(0)": lambda x: x.default_generator(0) is torch.default_generator,
            "Stream": lambda x: x.Stream, "Event": lambda x: x.Event, "current_stream()": lambda x: x.current_stream(),
            "default_stream()": lambda x: x.default_stream(), "set_device(0)": lambda x: x.set_device(0),
            "synchronize()": lambda x: x.synchronize(), "empty_cache()": lambda x: x.empty_cache(),
            "range_push()": lambda x: x.range_push("m"), "range_pop()": lambda x: x.range_pop(),
            "lazy_call()": lambda x: x.lazy_call(lambda: 3), "create_graph()": lambda x: x.create_graph(),
            "replay_graph()": lambda x: x.replay_graph(None), "is_current_stream_capturing()": lambda x: x.is_current_stream_capturing(),
            "prefer_triton_grouped_mm()": lambda x: x.prefer_triton_grouped_mm(),
            "stream(None)": lambda x: x.stream(None).__enter__(), "capture_to_graph()": lambda x: x.capture_to_graph(None).__enter__(),
            "on_accelerator(cpu)": lambda x: x.on_accelerator(t), "on_accelerator(meta)": lambda x: x.on_accelerator(torch.empty(1, device="meta")),
            "pin_memory(t) is t": lambda x: x.pin_memory(t) is t, "pin_memory(t, make_copy=False) is t": lambda x: x.pin_memory(t, make_copy=False) is t,
            "is_pinned(t)": lambda x: x.is_pinned(t), "pin_memory_alignment()": lambda x: x.pin_memory_alignment(),
            "register_host_memory()": lambda x: x.register_host_memory(0, 8), "unpin_memory()": lambda x: x.unpin_memory(t),
            "pin_empty(2, 3)": lambda x: [list(x.pin_empty(2, 3, dtype=torch.float16).shape), str(x.pin_empty(2, 3, dtype=torch.float16).dtype)],
            "pin_empty_like": lambda x: list(x.pin_empty_like(torch.ones(4, 2)).shape),
            "export_envs()": lambda x: x.export_envs(), "visible_devices_envs()": lambda x: x.visible_devices_envs(),
            "get_compile_backend()": lambda x: x.get_compile_backend(),
            "BFloat16Tensor": lambda x: x.BFloat16Tensor, "ByteTensor": lambda x: x.ByteTensor, "DoubleTensor": lambda x: x.DoubleTensor,
            "FloatTensor": lambda x: x.FloatTensor, "HalfTensor": lambda x: x.HalfTensor, "IntTensor": lambda x: x.IntTensor,
            "LongTensor": lambda x: x.LongTensor, "supports_nvtx_domain": lambda x: x.supports_nvtx_domain,
            "total_memory()": lambda x: x.total_memory(),
            "memory_stats keys": lambda x: sorted(x.memory_stats()),
        }
        for label, call in calls.items():
            same(label, call(ds), call(z))
        for env in ({}, {"LOCAL_RANK": "3"}, {"LOCAL_SIZE": "5"}):
            saved = {k: os.environ.pop(k, None) for k in ("LOCAL_RANK", "LOCAL_SIZE")}
            os.environ.update(env)
            same(f"current_device() {env}", ds.current_device(), z.current_device())
            same(f"device_count() {env}", ds.device_count(), z.device_count())
            for k, v in saved.items():
                os.environ.pop(k, None)
                if v is not None:
                    os.environ[k] = v
        ds.manual_seed(11); a = torch.rand(3)
        z.manual_seed(11); b = torch.rand(3)
        same("manual_seed", a.tolist(), b.tolist())
        ds.manual_seed_all(12); a = torch.rand(3)
        z.manual_seed_all(12); b = torch.rand(3)
        same("manual_seed_all", a.tolist(), b.tolist())
        state = ds.get_rng_state(); same("get_rng_state", state.tolist(), z.get_rng_state().tolist())
        z.set_rng_state(state); b = torch.rand(2); ds.set_rng_state(state); a = torch.rand(2)
        same("set_rng_state", a.tolist(), b.tolist())
        gib = 1 << 30
        for name in ("memory_allocated", "max_memory_allocated", "memory_cached", "max_memory_cached",
                     "memory_reserved", "max_memory_reserved"):
            a, b = getattr(ds, name)(), getattr(z, name)()
            if not (isinstance(b, int) and abs(a - b) < gib // 4):
                out["different"].append([name, a, b])
        a, b = ds.available_memory(), z.available_memory()
        if not abs(a - b) < gib:
            out["different"].append(["available_memory", a, b])
        for name in ("reset_peak_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached"):
            same(name, getattr(ds, name)(), getattr(z, name)())
        refused = []
        for name, args in (("create_op_builder", ("CPUAdamBuilder",)), ("get_op_builder", ("CPUAdamBuilder",)),
                           ("op_builder_dir", ()), ("build_extension", ())):
            try:
                getattr(z, name)(*args)
                refused.append([name, "returned"])
            except UnsupportedError as e:
                refused.append([name, "zero compiles no DeepSpeed ops" in str(e)])
        out["refused"] = refused
        out["supported"] = [real_module.is_current_accelerator_supported(), zmod.is_current_accelerator_supported()]
        print("RESULT " + json.dumps(out))
    """, extra_env={"DS_ACCELERATOR": "cpu"})
    assert r["names"] == ["CPU_Accelerator", "CPU_Accelerator"]
    assert r["missing"] == [], r["missing"]
    assert r["signature"] == [], r["signature"]
    assert r["different"] == [], r["different"]
    assert r["refused"] == [[n, True] for n in ("create_op_builder", "get_op_builder", "op_builder_dir", "build_extension")]
    assert r["supported"] == [True, True]


def _sees_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@needs_deepspeed
@pytest.mark.skipif(not _sees_cuda(), reason="no CUDA GPU: the CUDA accelerator is compared on a GPU only")
def test_cuda_accelerator_matches_deepspeed() -> None:
    r = run_python("""
        import inspect, json, torch
        from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator as RealCUDA
        from zero_torch.accelerator import CUDA_Accelerator, get_accelerator
        ds, z = RealCUDA(), CUDA_Accelerator()
        # class_dict: DeepSpeed's cache of op-builder classes (zero has none).
        public = sorted(n for n in dir(RealCUDA) if not n.startswith("_") and n != "class_dict")
        out = {"chosen": get_accelerator()._name, "missing": [n for n in public if not hasattr(z, n)],
               "signature": [], "different": []}
        for n in public:
            a = getattr(RealCUDA, n)
            if callable(a) and not isinstance(a, property) and hasattr(z, n):
                sd = [(p.name, repr(p.default)) for p in inspect.signature(getattr(ds, n)).parameters.values()]
                sz = [(p.name, repr(p.default)) for p in inspect.signature(getattr(z, n)).parameters.values()]
                if sd != sz:
                    out["signature"].append([n, sd, sz])
        t = torch.ones(2, device="cuda")
        calls = {
            "device_name()": lambda x: x.device_name(), "device_name(0)": lambda x: x.device_name(0),
            "device(0)": lambda x: str(x.device(0)), "current_device()": lambda x: x.current_device(),
            "current_device_name()": lambda x: x.current_device_name(), "device_count()": lambda x: x.device_count(),
            "is_available()": lambda x: x.is_available(), "communication_backend_name()": lambda x: x.communication_backend_name(),
            "is_bf16_supported()": lambda x: x.is_bf16_supported(), "is_fp16_supported()": lambda x: x.is_fp16_supported(),
            "supported_dtypes()": lambda x: [str(d) for d in x.supported_dtypes()], "is_triton_supported()": lambda x: x.is_triton_supported(),
            "Stream": lambda x: x.Stream is torch.cuda.Stream, "Event": lambda x: x.Event is torch.cuda.Event,
            "memory_allocated()": lambda x: x.memory_allocated(), "total_memory()": lambda x: x.total_memory(),
            "on_accelerator(cuda)": lambda x: x.on_accelerator(t), "on_accelerator(cpu)": lambda x: x.on_accelerator(t.cpu()),
            "FloatTensor": lambda x: str(x.FloatTensor([1.0]).device), "export_envs()": lambda x: x.export_envs(),
            "is_synchronized_device()": lambda x: x.is_synchronized_device(), "initial_seed()": lambda x: x.initial_seed(),
        }
        for label, call in calls.items():
            a, b = call(ds), call(z)
            if a != b:
                out["different"].append([label, repr(a), repr(b)])
        print("RESULT " + json.dumps(out))
    """, extra_env={"DS_ACCELERATOR": "cuda"})
    assert r["chosen"] == "cuda"
    assert r["missing"] == [], r["missing"]
    assert r["signature"] == [], r["signature"]
    assert r["different"] == [], r["different"]


def test_accelerator_choice_follows_ds_accelerator() -> None:
    r = run_python("""
        import json, torch
        from zero_torch.accelerator import get_accelerator, set_accelerator, CPU_Accelerator
        from zero_torch.errors import UnsupportedError
        import zero_torch.accelerator as acc
        out = {"default": get_accelerator()._name, "cached": get_accelerator() is get_accelerator()}
        import os
        for value in ("xpu", "nonsense"):
            os.environ["DS_ACCELERATOR"] = value
            acc._Current.accelerator = None
            try:
                get_accelerator(); out[value] = "accepted"
            except UnsupportedError as e:
                out[value] = ["UnsupportedError", "CPU and on CUDA" in str(e)]
            except ValueError as e:
                out[value] = ["ValueError", "DS_ACCELERATOR must be one of" in str(e)]
        mine = CPU_Accelerator(); set_accelerator(mine)
        out["set"] = get_accelerator() is mine
        try:
            set_accelerator(object()); out["bad_set"] = "accepted"
        except AssertionError as e:
            out["bad_set"] = "not subclass of DeepSpeedAccelerator" in str(e)
        print("RESULT " + json.dumps(out))
    """, extra_env={"DS_ACCELERATOR": "cpu"})
    assert r == {"default": "cpu", "cached": True, "xpu": ["UnsupportedError", True],
                 "nonsense": ["ValueError", True], "set": True, "bad_set": True}


# ---- lr schedules, MoE helpers, activation checkpointing, small utilities ---------------


@needs_deepspeed
def test_lr_schedules_match_deepspeed_over_50_steps() -> None:
    r = run_python("""
        import inspect, json, torch
        import deepspeed.runtime.lr_schedules as D
        import zero_torch.lr_schedules as Z

        def optimizer(kind):
            torch.manual_seed(0)
            a, b = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(2))
            groups = [{"params": [a], "lr": 0.01}, {"params": [b], "lr": 0.003}]
            if kind == "sgd":
                return torch.optim.SGD(groups, lr=0.01, momentum=0.9)
            if kind == "tensor_lr":
                return torch.optim.Adam([{"params": [a], "lr": torch.tensor(0.01)}, {"params": [b], "lr": torch.tensor(0.003)}])
            return torch.optim.Adam(groups)

        cases = [
            ("WarmupLR", "adam", {}),
            ("WarmupLR", "adam", dict(warmup_min_lr=1e-5, warmup_max_lr=0.02, warmup_num_steps=20)),
            ("WarmupLR", "adam", dict(warmup_min_lr=[0.0, 1e-4], warmup_num_steps=17, warmup_type="linear")),
            ("WarmupLR", "tensor_lr", dict(warmup_min_lr=0.0, warmup_max_lr=0.01, warmup_num_steps=10)),
            ("WarmupDecayLR", "adam", dict(total_num_steps=40, warmup_min_lr=1e-5, warmup_max_lr=0.02, warmup_num_steps=10)),
            ("WarmupDecayLR", "adam", dict(total_num_steps=30, warmup_num_steps=1, warmup_type="linear")),
            ("WarmupCosineLR", "adam", dict(total_num_steps=40, warmup_min_ratio=0.1, warmup_num_steps=10, cos_min_ratio=0.01)),
            ("WarmupCosineLR", "adam", dict(total_num_steps=30, warmup_num_steps=5, warmup_type="linear")),
            ("OneCycle", "adam", dict(cycle_min_lr=1e-4, cycle_max_lr=1e-2, decay_lr_rate=0.1, cycle_first_step_size=10,
                                      cycle_second_step_size=15, cycle_first_stair_count=3, decay_step_size=4, decay_mom_rate=0.05)),
            ("OneCycle", "adam", dict(cycle_min_lr=[1e-4, 2e-4], cycle_max_lr=[1e-2, 3e-2], cycle_first_step_size=7,
                                      cycle_min_mom=[0.85, 0.8], cycle_max_mom=0.95)),
            ("OneCycle", "sgd", dict(cycle_min_lr=1e-3, cycle_max_lr=1e-2, cycle_first_step_size=5)),
            ("OneCycle", "adam", dict(cycle_min_lr=1e-3, cycle_max_lr=1e-2, cycle_first_step_size=6, cycle_momentum=False)),
            ("LRRangeTest", "adam", dict(lr_range_test_min_lr=1e-4, lr_range_test_step_size=5, lr_range_test_step_rate=2.0,
                                         lr_range_test_staircase=True)),
            ("LRRangeTest", "adam", dict(lr_range_test_min_lr=[1e-4, 1e-3], lr_range_test_step_size=3)),
        ]
        def groups(opt):
            return [[float(g["lr"]), list(g["betas"]) if "betas" in g else None, g.get("momentum")] for g in opt.param_groups]
        out = {"valid": [D.VALID_LR_SCHEDULES, Z.VALID_LR_SCHEDULES], "cases": [], "signatures": []}
        for name in D.VALID_LR_SCHEDULES:
            sd = [(p.name, repr(p.default)) for p in inspect.signature(getattr(D, name)).parameters.values()]
            sz = [(p.name, repr(p.default)) for p in inspect.signature(getattr(Z, name)).parameters.values()]
            if sd != sz:
                out["signatures"].append([name, sd, sz])
        for name, kind, kwargs in cases:
            od, oz = optimizer(kind), optimizer(kind)
            sd, sz = getattr(D, name)(od, **kwargs), getattr(Z, name)(oz, **kwargs)
            first = None
            for step in range(51):
                if groups(od) != groups(oz):
                    first = [step, groups(od), groups(oz)]
                    break
                for opt in (od, oz):
                    for g in opt.param_groups:
                        for p in g["params"]:
                            p.grad = torch.ones_like(p)
                    opt.step()
                sd.step(); sz.step()
                if sd.get_last_lr() != sz.get_last_lr() or sd.state_dict() != sz.state_dict():
                    first = [step, "get_last_lr/state_dict", sd.state_dict(), sz.state_dict()]
                    break
            jump = None
            if first is None:
                sd.load_state_dict({"last_batch_iteration": 7}); sz.load_state_dict({"last_batch_iteration": 7})
                sd.step(); sz.step()
                sd.step(33); sz.step(33)
                jump = groups(od) == groups(oz) and sd.state_dict() == sz.state_dict() == {"last_batch_iteration": 33}
            out["cases"].append([name, kind, first, jump])
        print("RESULT " + json.dumps(out))
    """)
    assert r["valid"][0] == r["valid"][1]
    assert r["signatures"] == [], r["signatures"]
    for name, kind, first, jump in r["cases"]:
        assert first is None, f"{name} on {kind}: first difference {first}"
        assert jump is True, (name, kind)


def test_lr_schedules_drive_zero_engine() -> None:
    r = run_python("""
        import json, torch
        import zero_torch.deepspeed_compat
        import deepspeed
        from deepspeed.runtime.lr_schedules import WarmupDecayLR, WarmupLR

        def model():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

        x, y = torch.randn(2, 4), torch.randn(2, 1)
        config = {"train_batch_size": 2, "zero_optimization": {"stage": 1}}
        out = {}
        # A client scheduler given to initialize (engine.step() steps it).
        m = model()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        sched = WarmupDecayLR(opt, total_num_steps=10, warmup_num_steps=3, warmup_max_lr=1e-2)
        engine, _, _, returned = deepspeed.initialize(model=m, optimizer=opt, lr_scheduler=sched, config=config)
        lrs = []
        for _ in range(5):
            engine.backward(torch.nn.functional.mse_loss(engine(x), y)); engine.step()
            lrs.append(engine.get_lr()[0])
        reference = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-2)
        ref = WarmupDecayLR(reference, total_num_steps=10, warmup_num_steps=3, warmup_max_lr=1e-2)
        expected = []
        for _ in range(5):
            ref.step(); expected.append(reference.param_groups[0]["lr"])
        out["client"] = [returned is sched, lrs == expected, sched.state_dict()]
        # A schedule built over the optimizer initialize returned (DeepSpeed unwraps .optimizer).
        m = model()
        engine, optimizer, _, _ = deepspeed.initialize(
            model=m, model_parameters=m.parameters(),
            config=dict(config, optimizer={"type": "AdamW", "params": {"lr": 1e-2}}))
        warm = WarmupLR(optimizer, warmup_max_lr=1e-2, warmup_num_steps=4, warmup_type="linear")
        seen = []
        for _ in range(3):
            engine.backward(torch.nn.functional.mse_loss(engine(x), y)); engine.step(); warm.step()
            seen.append([engine.get_lr()[0], warm.get_last_lr()[0]])
        out["over_engine_optimizer"] = [a == b for a, b in seen]
        print("RESULT " + json.dumps(out))
    """)
    assert r["client"] == [True, True, {"last_batch_iteration": 4}], r
    assert r["over_engine_optimizer"] == [True, True, True], r


@needs_deepspeed
def test_moe_utils_match_deepspeed_without_moe_parameters() -> None:
    r = run_python("""
        import json, torch
        import deepspeed.moe.utils as D
        import zero_torch._deepspeed.moe.utils as Z
        from zero_torch.errors import UnsupportedError

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
        params = list(model.parameters())

        def shape(result, inputs):
            index = {id(p): i for i, p in enumerate(params)}
            return {
                "same_list": result is inputs,
                "groups": [{k: ([index[id(p)] for p in v] if k == "params" else v) for k, v in g.items()} for g in result],
                "new_params_lists": [g["params"] is not p for g, p in zip(result, originals)],
            }

        out = {}
        cases = {
            "list": lambda: [{"params": params[:2], "name": "a", "lr": 0.1}, {"params": params[2:], "name": "b", "weight_decay": 0.0}],
            "dict": lambda: {"params": params, "name": "dense"},
            "tuple": lambda: ({"params": params[:1], "name": "x"}, {"params": params[1:], "name": "y"}),
            "small_max_group_size": lambda: [{"params": params, "name": "z"}],
        }
        for label, make in cases.items():
            answers = []
            for module in (D, Z):
                inputs = make()
                seq = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
                originals = [g["params"] for g in seq]
                kwargs = {"max_group_size": 5} if label == "small_max_group_size" else {}
                result = module.split_params_into_different_moe_groups_for_optimizer(inputs, **kwargs)
                answers.append(shape(result, inputs))
            out[label] = answers
        out["is_moe_param"] = []
        for flag in (None, True, False):
            p = torch.nn.Parameter(torch.ones(2))
            if flag is not None:
                p.allreduce = flag
            out["is_moe_param"].append([D.is_moe_param(p), Z.is_moe_param(p)])
        out["configure"] = [
            shape(D.configure_moe_param_groups(list(params)), None)["groups"],
            shape(Z.configure_moe_param_groups(list(params)), None)["groups"],
        ]
        expert = torch.nn.Parameter(torch.ones(2)); expert.allreduce = False; expert.group_name = "ep"
        try:
            Z.split_params_into_different_moe_groups_for_optimizer([{"params": [expert], "name": "e"}])
            out["moe_refused"] = "accepted"
        except UnsupportedError as e:
            out["moe_refused"] = str(e)
        try:
            Z.split_params_into_different_moe_groups_for_optimizer("nope")
        except ValueError as e:
            out["bad_type"] = str(e)
        print("RESULT " + json.dumps(out, default=str))
    """)
    for label in ("list", "dict", "tuple", "small_max_group_size"):
        ds, zero = r[label]
        assert ds == zero, (label, ds, zero)
    assert r["is_moe_param"] == [[False, False], [False, False], [True, True]]
    assert r["configure"][0] == r["configure"][1]
    assert "`deepspeed.moe.layer`" in r["moe_refused"] and "expert parameter" in r["moe_refused"]
    assert "Unknown param group type" in r["bad_type"]


@needs_deepspeed
def test_activation_checkpointing_matches_deepspeed() -> None:
    r = run_python("""
        import json, torch
        import deepspeed
        from deepspeed.runtime.activation_checkpointing import checkpointing as D
        import zero_torch.activation_checkpointing as Z
        from zero_torch.errors import UnsupportedError

        def block(x, w, scale=None):
            y = torch.nn.functional.dropout(torch.tanh(x @ w), p=0.3, training=True)
            return (y * scale if scale is not None else y), y.sum()

        def run(fn, with_kwarg):
            torch.manual_seed(1)
            x = torch.randn(4, 5, requires_grad=True)
            w = torch.randn(5, 5, requires_grad=True)
            s = torch.tensor(2.0, requires_grad=True)
            torch.manual_seed(7)
            out = fn(block, x, w, scale=s) if with_kwarg else fn(block, x, w)
            (out[0].sum() + out[1]).backward()
            return [out[0].detach().tolist(), x.grad.tolist(), w.grad.tolist(), s.grad.tolist() if with_kwarg else None]

        plain = lambda f, *a, **k: f(*a, **k)
        out = {}
        for with_kwarg in (False, True):
            ours, theirs, reference = run(Z.checkpoint, with_kwarg), run(D.checkpoint, with_kwarg), run(plain, with_kwarg)
            out[f"kwarg={with_kwarg}"] = [ours == theirs, ours == reference]
        x = torch.randn(3, requires_grad=True)
        single = lambda t: (t * 2,)
        pair = lambda t: (t * 2, t * 3)
        out["returns"] = [
            [type(D.checkpoint(single, x)).__name__, type(Z.checkpoint(single, x)).__name__],
            [type(D.checkpoint(pair, x)).__name__, type(Z.checkpoint(pair, x)).__name__],
            [type(D.non_reentrant_checkpoint(single, x)).__name__, type(Z.non_reentrant_checkpoint(single, x)).__name__],
        ]
        y = Z.non_reentrant_checkpoint(lambda t: t.sin(), x)
        y.sum().backward()
        out["non_reentrant_grad"] = torch.allclose(x.grad, x.detach().cos())
        out["configured_before"] = [D.is_configured(), Z.is_configured()]
        Z.configure(None, deepspeed_config={"activation_checkpointing": {"number_checkpoints": 4}})
        out["configured_after"] = Z.is_configured()
        Z.reset()
        refused = []
        for kwargs in ({"partition_activations": True}, {"checkpoint_in_cpu": True}, {"contiguous_checkpointing": True},
                       {"synchronize": True}, {"profile": True},
                       {"deepspeed_config": {"activation_checkpointing": {"cpu_checkpointing": True}}}):
            try:
                Z.configure(None, **kwargs); refused.append("accepted")
            except UnsupportedError as e:
                refused.append("is not provided by zero" in str(e))
        for call in (lambda: Z.configure(object()), Z.get_cuda_rng_tracker, lambda: Z.model_parallel_cuda_manual_seed(1)):
            try:
                call(); refused.append("accepted")
            except UnsupportedError as e:
                refused.append("is not provided by zero" in str(e))
        out["refused"] = refused
        out["deepspeed_checkpointing_is_public"] = deepspeed.checkpointing is D
        print("RESULT " + json.dumps(out))
    """)
    assert r["kwarg=False"] == [True, True] and r["kwarg=True"] == [True, True], r
    assert r["returns"] == [["Tensor", "Tensor"], ["tuple", "tuple"], ["Tensor", "Tensor"]]
    assert r["non_reentrant_grad"] is True
    assert r["configured_before"] == [False, False] and r["configured_after"] is True
    assert r["refused"] == [True] * 9


@needs_deepspeed
def test_small_utilities_match_deepspeed() -> None:
    r = run_python("""
        import inspect, json, os, random, numpy, torch
        import deepspeed
        from deepspeed.checkpoint.utils import clone_tensors_for_torch_save as ds_clone
        from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum as DDev, OffloadStateTypeEnum as DState
        from deepspeed.runtime.utils import set_random_seed as ds_seed
        from deepspeed.launcher.runner import DEEPSPEED_ENVIRONMENT_NAME as ds_env
        from deepspeed.utils.torch import required_torch_version as ds_required
        from deepspeed.runtime.config import DeepSpeedConfig as DC
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad as DAdagrad
        from deepspeed.runtime.zero.partition_parameters import zero_wrapper_for_fp_tensor_constructor as ds_wrap

        from zero_torch._deepspeed.checkpoint.utils import clone_tensors_for_torch_save as z_clone
        from zero_torch._deepspeed.runtime.zero.offload_config import OffloadDeviceEnum as ZDev, OffloadStateTypeEnum as ZState
        from zero_torch._deepspeed.runtime.utils import set_random_seed as z_seed
        from zero_torch._deepspeed.launcher.runner import DEEPSPEED_ENVIRONMENT_NAME as z_env
        from zero_torch._deepspeed.utils.torch import required_torch_version as z_required
        from zero_torch._deepspeed.runtime.config import DeepSpeedConfig as ZC
        from zero_torch._deepspeed.ops.adagrad import DeepSpeedCPUAdagrad as ZAdagrad
        from zero_torch._deepspeed.runtime.zero.partition_parameters import zero_wrapper_for_fp_tensor_constructor as z_wrap

        out = {}
        base = torch.arange(12.0).reshape(3, 4)
        item = {"a": base[1], "b": [base[:, 0], (torch.ones(2, dtype=torch.bfloat16), 3)], "c": "text"}
        def describe(x):
            if torch.is_tensor(x):
                return [x.tolist() if x.dtype != torch.bfloat16 else x.float().tolist(), str(x.dtype), x.is_contiguous(),
                        x.untyped_storage().nbytes(), x.requires_grad]
            if isinstance(x, dict):
                return {k: describe(v) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return [type(x).__name__] + [describe(v) for v in x]
            return x
        out["clone"] = [describe(ds_clone(item)), describe(z_clone(item))]
        out["enums"] = [[(e.name, e.value) for e in DDev], [(e.name, e.value) for e in ZDev],
                        [(e.name, e.value) for e in DState], [(e.name, e.value) for e in ZState]]
        def seeded(fn):
            fn(2**40 + 5)
            return [random.random(), float(numpy.random.rand()), torch.rand(1).item()]
        out["seed"] = [seeded(ds_seed), seeded(z_seed)]
        out["env"] = [ds_env, z_env]
        out["required"] = [[ds_required(min_version=v), z_required(min_version=v), ds_required(max_version=v), z_required(max_version=v)]
                           for v in ("1.13", 2.1, "2.11", "99.0")]
        attrs = ["train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                 "zero_optimization_stage", "zero_enabled", "gradient_clipping", "world_size", "global_rank"]
        configs = [{"train_batch_size": 8},
                   {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3, "bf16": {"enabled": True},
                    "zero_optimization": {"stage": 3}},
                   {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "fp16": {"enabled": True},
                    "zero_optimization": {"stage": 1}, "gradient_clipping": 0.5}]
        out["config"] = []
        for cfg in configs:
            d, z = DC(dict(cfg)), ZC(dict(cfg))
            out["config"].append([[getattr(d, a) for a in attrs] + [d.float16_config.enabled, d.bfloat16_config.enabled],
                                  [getattr(z, a) for a in attrs] + [z.float16_config.enabled, z.bfloat16_config.enabled],
                                  [z.fp16_enabled, z.bfloat16_enabled]])
        try:
            z.zero_config; out["config_missing"] = "returned"
        except AttributeError as e:
            out["config_missing"] = [type(e).__name__, "`deepspeed.DeepSpeedConfig.zero_config`" in str(e)]
        sig = lambda c: [(p.name, repr(p.default)) for p in inspect.signature(c).parameters.values()]
        out["adagrad_signature"] = [sig(DAdagrad.__init__), sig(ZAdagrad.__init__)]
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(4)); expected = w.detach().clone(); acc = torch.zeros(4)
        opt = ZAdagrad([w], lr=0.1, weight_decay=0.01)
        for _ in range(3):
            g = torch.randn(4); w.grad = g.clone(); opt.step()
            g = g + 0.01 * expected; acc += g * g; expected -= 0.1 * g / (acc.sqrt() + 1e-10)
        out["adagrad_step"] = torch.allclose(w.detach(), expected, atol=1e-6)
        plain = ZAdagrad([torch.nn.Parameter(torch.ones(1))]).defaults
        out["adagrad_defaults"] = [plain["lr"], plain["eps"], plain["weight_decay"], plain["amsgrad"], plain["lr_decay"]]
        made = [ds_wrap(torch.ones, torch.bfloat16, torch.device("cpu"))(2), z_wrap(torch.ones, torch.bfloat16, torch.device("cpu"))(2)]
        out["wrap"] = [str(m.dtype) for m in made]
        print("RESULT " + json.dumps(out, default=str))
    """)
    assert r["clone"][0] == r["clone"][1]
    assert r["enums"][0] == r["enums"][1] and r["enums"][2] == r["enums"][3]
    assert r["seed"][0] == r["seed"][1]
    assert r["env"][0] == r["env"][1]
    assert all(row[0] == row[1] and row[2] == row[3] for row in r["required"]), r["required"]
    for ds, zero, old_names in r["config"]:
        assert ds == zero, (ds, zero)
        assert old_names == zero[-2:]
    assert r["config_missing"] == ["NotProvidedAttributeError", True]
    assert r["adagrad_signature"][0] == r["adagrad_signature"][1]
    assert r["adagrad_step"] is True
    assert r["adagrad_defaults"] == [0.01, 1e-10, 0, False, 0]
    assert r["wrap"] == ["torch.bfloat16", "torch.bfloat16"]


@needs_deepspeed
def test_comm_signatures_match_deepspeed() -> None:
    r = run_python("""
        import inspect, json
        import deepspeed.comm.comm as D
        import zero_torch.comm as Z
        out = {"missing": [], "different": []}

        def unwrap(fn):
            # DeepSpeed's @timed_op wrapper hides the signature; the function is in its closure.
            inner = [c.cell_contents for c in (fn.__closure__ or ()) if inspect.isfunction(c.cell_contents)]
            return inner[0] if inner else fn

        def params(fn):
            return [(p.name, repr(p.default)) for p in inspect.signature(fn).parameters.values() if p.name != "debug"]

        names = [n for n in Z.__all__ if n not in ("ReduceOp", "P2POp")]
        for name in names:
            if not hasattr(D, name):
                out["missing"].append(name)
                continue
            if params(unwrap(getattr(D, name))) != params(getattr(Z, name)):
                out["different"].append([name, params(unwrap(getattr(D, name))), params(getattr(Z, name))])
        wanted = ["get_rank", "get_world_size", "get_local_rank", "barrier", "all_reduce", "broadcast", "all_gather",
                  "all_gather_into_tensor", "reduce_scatter_tensor", "reduce", "gather", "scatter", "send", "recv", "isend",
                  "irecv", "new_group", "get_world_group", "is_initialized", "is_available", "destroy_process_group",
                  "init_distributed", "get_all_ranks_from_group", "get_global_rank", "inference_all_reduce", "configure",
                  "log_summary", "ReduceOp"]
        out["not_served"] = [n for n in wanted if n not in Z.__all__]
        out["reduce_ops"] = [[e.name, e.value] for e in D.ReduceOp] == [[e.name, e.value] for e in Z.ReduceOp]
        print("RESULT " + json.dumps(out))
    """)
    assert r["missing"] == [], r["missing"]
    # The one difference: zero_torch._dist.init_distributed's timeout=None means DeepSpeed's
    # default (DEEPSPEED_TIMEOUT minutes, 10), read when called rather than at import.
    assert [d[0] for d in r["different"]] in ([], ["init_distributed"]), r["different"]
    for name, ds, zero in r["different"]:
        assert [p for p in ds if p[0] != "timeout"] == [p for p in zero if p[0] != "timeout"], (name, ds, zero)
        assert ["timeout", "None"] in zero and ["timeout", "datetime.timedelta(seconds=600)"] in ds
    assert r["not_served"] == []
    assert r["reduce_ops"] is True


# ---- 2-rank jobs ------------------------------------------------------------------------


def test_comm_on_two_ranks() -> None:
    results = run_ranks("comm", world=2)
    for rank, r in enumerate(results):
        assert r["initialized_before"] is False
        assert r["get_rank_before"]["assertion"] is True
        assert "deepspeed.init_distributed()" in r["get_rank_before"]["message"]
        assert r["all_reduce_before"] == "DistNotInitializedError"
        assert (r["initialized"], r["available"], r["rank"], r["world"], r["local_rank"]) == (True, True, rank, 2, rank)
        assert r["backend"] == "gloo" and r["world_group_is_torch"] is True
        assert r["all_ranks"] == [0, 1] and r["global_rank_of_1"] == 1
        assert r["all_reduce_sum"] == [3.0] and r["all_reduce_max_ds_op"] == [2.0] and r["all_reduce_min_torch_op"] == [1.0]
        assert r["inference_all_reduce"] == [3.0] and r["all_reduce_async_handle"] is True
        assert r["broadcast_from_1"] == [10.0]
        assert r["all_gather"] == [[5.0], [6.0]]
        assert r["all_gather_into_tensor"] == [7.0, 8.0] and r["allgather_fn"] == [8.0, 9.0]
        assert r["reduce_scatter_tensor"] == [[12.0], [14.0]][rank]
        assert r["reduce_to_0"] == ([3.0] if rank == 0 else None)
        assert r["gather_to_0"] == ([[3.0], [4.0]] if rank == 0 else None)
        assert r["scatter_from_0"] == [[10.0], [20.0]][rank]
        assert r["all_to_all_single"] == [[1.0, 11.0], [2.0, 12.0]][rank]
        assert r["send_recv"] == [[43.0], [42.0]][rank]
        assert r["batch_isend_irecv"] == [[101.0], [100.0]][rank]
        assert r["all_gather_object"] == [{"rank": 0}, {"rank": 1}]
        assert r["broadcast_object_list"] == [{"from": 1}]
        assert r["new_group_ranks"] == [0, 1] and r["new_group_global_rank_of_1"] == 1
        assert r["all_reduce_in_group"] == [3.0]
        assert all("comms_logger" in m and "not provided" in m for m in r["comms_logger_refused"]), r["comms_logger_refused"]
        assert r["log_summary"] == {"summary": {}, "world": 2} and r["has_comm_data"] is False
        assert r["initialized_after_destroy"] is False


def test_deepspeed_script_trains_on_two_ranks_through_the_one_line() -> None:
    results = run_ranks("train", world=2)
    for rank, r in enumerate(results):
        assert r["engine_is_deepspeed_engine"] is True and r["rank"] == rank
        assert r["global_steps"] == 3
        assert r["weights_equal_across_ranks"] is True
        # WarmupLR from warmup_min_lr 0: DeepSpeed's first two steps run at lr 0.
        assert r["lrs"][0] == [0.0] and r["lrs"][1][0] > 0.0
    assert results[0]["lrs"] == results[1]["lrs"]
