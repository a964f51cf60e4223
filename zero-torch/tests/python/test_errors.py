"""Bad input gets an exception that names the problem, and leaves the process usable:
configs, calls out of order, models zero_torch cannot take, arguments it does not support,
an fp16 overflow (the step is skipped, nothing changes), and, across processes, a rank that
dies or builds another model (every other rank raises within seconds instead of hanging).
"""

from __future__ import annotations

from typing import Any, Dict

import pytest
import torch

import models
import workers
import zero_torch


def toy_engine(pattern: str = "plain", **overrides: Any) -> zero_torch.ZeroEngine:
    cfg = workers.toy_config(1, 1, 4)
    cfg.update(overrides)
    engine, _, _, _ = zero_torch.initialize(model=models.Toy(pattern), config=cfg)
    return engine


def one_step(engine: zero_torch.ZeroEngine, scale: float = 1.0) -> torch.Tensor:
    x, y = models.regression(1, 4)[0]
    dtype = next(engine.module.parameters()).dtype  # inputs in the model's dtype, as in DeepSpeed
    loss = engine(x.to(dtype), y.to(dtype)) * scale
    engine.backward(loss)
    engine.step()
    return loss


def test_misspelt_key_is_named_with_a_suggestion() -> None:
    cfg = workers.toy_config(2, 1, 4)
    cfg["zero_optimization"]["reduce_bucket_sise"] = 100
    with pytest.raises(zero_torch.ConfigError, match=r"reduce_bucket_sise.*reduce_bucket_size"):
        zero_torch.initialize(model=models.Toy(), config=cfg)
    # The process is still usable: the next engine trains.
    assert torch.isfinite(one_step(toy_engine()))


def test_inconsistent_batch_sizes_are_named() -> None:
    cfg = workers.toy_config(2, 1, 4)
    cfg["train_micro_batch_size_per_gpu"] = 3
    with pytest.raises(zero_torch.ConfigError, match="train_batch_size"):
        zero_torch.initialize(model=models.Toy(), config=cfg)


def test_config_given_twice_or_not_at_all() -> None:
    with pytest.raises(zero_torch.ConfigError, match="no DeepSpeed config"):
        zero_torch.initialize(model=models.Toy())
    cfg = workers.toy_config(1, 1, 4)
    with pytest.raises(zero_torch.ConfigError, match="more than once"):
        zero_torch.initialize(model=models.Toy(), config=cfg, config_params=cfg)


def test_config_file_that_is_not_json(tmp_path: Any) -> None:
    bad = tmp_path / "ds_config.json"
    bad.write_text("{ not json")
    with pytest.raises(zero_torch.ConfigError, match="not valid JSON"):
        zero_torch.initialize(model=models.Toy(), config=str(bad))


def test_step_before_backward() -> None:
    engine = toy_engine()
    with pytest.raises(zero_torch.OrderError, match="before backward"):
        engine.step()


def test_parameter_added_after_initialize() -> None:
    engine = toy_engine()
    one_step(engine)
    engine.module.extra = torch.nn.Linear(2, 2)
    with pytest.raises(zero_torch.UnsupportedError, match="extra.weight"):
        one_step(engine)


def test_parameter_registered_on_an_inner_module_after_initialize() -> None:
    """A parameter registered on a module the model already had (torch's registration
    hook tells zero, so forwards need not walk the model to count parameters)."""
    engine = toy_engine()
    one_step(engine)
    name, inner = next((n, m) for n, m in engine.module.named_modules() if n)
    inner.register_parameter("late", torch.nn.Parameter(torch.ones(3)))
    with pytest.raises(zero_torch.UnsupportedError, match=f"{name}.late"):
        one_step(engine)


def test_model_without_parameters() -> None:
    with pytest.raises(ValueError, match="no parameters"):
        zero_torch.initialize(model=torch.nn.ReLU(), config=workers.toy_config(1, 1, 4))


@pytest.mark.parametrize(
    "kwargs,named",
    [
        ({"mpu": object()}, "mpu="),
        ({"optimizer": "sgd"}, "optimizer="),
        ({"lr_scheduler": object()}, "lr_scheduler="),
        ({"mesh_param": (2, 1)}, "mesh_param="),
    ],
)
def test_unsupported_arguments_are_named(kwargs: Dict[str, Any], named: str) -> None:
    with pytest.raises(zero_torch.UnsupportedError, match=named):
        zero_torch.initialize(model=models.Toy(), config=workers.toy_config(1, 1, 4), **kwargs)


def test_engine_compile_is_refused_by_name() -> None:
    """DeepSpeed's ``engine.compile()`` is not ``torch.nn.Module.compile`` run over zero's
    hooks: it is refused, naming it."""
    engine, _, _, _ = zero_torch.initialize(model=models.Toy(), config=workers.toy_config(1, 1, 4))
    with pytest.raises(zero_torch.UnsupportedError, match=r"engine\.compile\(\)"):
        engine.compile()
    engine.destroy()


def test_untested_optimizer_needs_deepspeeds_flag_and_non_elementwise_ones_are_refused() -> None:
    model = models.Toy()
    cfg = workers.toy_config(1, 1, 4)
    del cfg["optimizer"]
    # As in DeepSpeed: ZeRO stages 1-3 take an untested optimizer only with the flag.
    with pytest.raises(zero_torch.UnsupportedError, match=r"RMSprop.*zero_allow_untested_optimizer"):
        zero_torch.initialize(model=model, optimizer=torch.optim.RMSprop(model.parameters(), lr=0.1), config=cfg)
    for name in ("LBFGS", "Adafactor"):
        opt = getattr(torch.optim, name)(model.parameters(), lr=0.1)
        with pytest.raises(zero_torch.UnsupportedError, match=name):
            zero_torch.initialize(model=model, optimizer=opt, config={**cfg, "zero_allow_untested_optimizer": True})
    # Stage 0 steps tensors shaped like the parameters: Adafactor works there (as in
    # DeepSpeed); LBFGS needs a closure no engine.step() gives.
    stage0 = {**cfg, "zero_optimization": {"stage": 0}}
    with pytest.raises(zero_torch.UnsupportedError, match="LBFGS.*closure"):
        zero_torch.initialize(model=model, optimizer=torch.optim.LBFGS(model.parameters()), config=stage0)
    engine, _, _, _ = zero_torch.initialize(model=model, optimizer=torch.optim.Adafactor(model.parameters(), lr=0.1), config=stage0)
    assert isinstance(engine.basic_optimizer, torch.optim.Adafactor)
    cfg["optimizer"] = {"type": "Lamb"}
    with pytest.raises(zero_torch.ConfigError, match="Lamb"):
        zero_torch.initialize(model=model, config=cfg)
    cfg["optimizer"] = {"type": "NoSuchOptimizer"}
    with pytest.raises(zero_torch.UnsupportedError, match="NoSuchOptimizer"):
        zero_torch.initialize(model=model, config=cfg)


def test_a_passed_optimizer_wins_over_the_configs_with_a_warning() -> None:
    model = models.Toy()
    cfg = workers.toy_config(1, 1, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    with pytest.warns(UserWarning, match="passed in code is used"):
        engine, optimizer, _, _ = zero_torch.initialize(model=model, optimizer=opt, config=cfg)
    assert engine.get_lr() == [pytest.approx(3e-3)]
    assert optimizer.param_groups is opt.param_groups
    assert optimizer.param_groups[0]["weight_decay"] == 0.05


def test_without_an_optimizer_forward_runs_and_backward_is_refused() -> None:
    cfg = workers.toy_config(3, 1, 4)
    del cfg["optimizer"]
    engine, optimizer, _, scheduler = zero_torch.initialize(model=models.Toy(), config=cfg)
    assert optimizer is None and scheduler is None
    x, y = models.regression(1, 4)[0]
    loss = engine(x, y)
    assert torch.isfinite(loss)
    with pytest.raises(zero_torch.ConfigError, match="must provide optimizer"):
        engine.backward(loss)


def test_fp16_overflow_skips_the_step_and_changes_nothing() -> None:
    cfg = workers.toy_config(3, 1, 4, dtype="fp16")
    engine, _, _, _ = zero_torch.initialize(model=models.Toy(), config=cfg)
    one_step(engine)
    assert engine.was_step_applied()
    before = workers.gathered(engine)
    scale = engine._native.loss_scale()
    for overflow in (1, 2):
        one_step(engine, scale=float("inf"))
        assert not engine.was_step_applied()
        after = workers.gathered(engine)
        for n in before:
            assert torch.equal(before[n], after[n]), f"{n} changed in a skipped step"
    # DeepSpeed's default hysteresis (2): the scale halves at the second overflow in a row.
    assert engine._native.loss_scale() == scale / 2
    one_step(engine)
    assert engine.was_step_applied()


def test_a_killed_rank_raises_on_the_others_within_seconds(job: Any) -> None:
    results = job(2, "killed_mid_collective", {"stage": 3}, timeout=300, kill_rank=1, kill_after=0.5)
    r = results[0]
    assert r.get("raised") == "CommError", r
    assert "rank 1" in r["message"], r["message"]
    print(f"rank 0 raised {r['raised']} {r['after']:.2f} s after rank 1 was killed: {r['message'][:200]}")
    assert r["after"] < 30


def test_a_killed_rank_on_another_machine_raises_on_the_others_within_seconds(job: Any) -> None:
    """The same over the CPU inter-node tier: each rank a machine of its own
    (``ZERO_CPU_INTER_NODE=gloo`` with one rank per launcher node), so every collective
    crosses torch's gloo group, whose connection to the killed rank closes."""
    env = {"LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "0", "ZERO_CPU_INTER_NODE": "gloo"}
    results = job(2, "killed_mid_collective", {"stage": 3}, timeout=300, kill_rank=1, kill_after=0.5, env=env)
    r = results[0]
    assert r.get("raised") == "CommError", r
    assert "failed in the backend" in r["message"], r["message"]
    print(f"rank 0 raised {r['raised']} {r['after']:.2f} s after rank 1 was killed: {r['message'][:300]}")
    assert r["after"] < 30


def test_a_rank_with_another_model_fails_every_rank(job: Any) -> None:
    results = job(2, "mismatched_model", {}, timeout=300)
    for rank, r in enumerate(results):
        assert r.get("raised") is not None, f"rank {rank} did not raise: {r}"
        assert r["after"] < 30, r
    print("; ".join(f"rank {k}: {r['raised']}: {r['message'][:160]}" for k, r in enumerate(results)))


class _FailingNative:
    """The native engine with its ``fail``-named method raising once, as a tensor
    crossing that fails half way (a bad tensor, a device error) does."""

    def __init__(self, native: Any, fail: str) -> None:
        self._native, self._fail = native, fail

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._native, name)
        if name != self._fail:
            return attr

        def failing(*args: Any, **kwargs: Any) -> Any:
            self._fail = ""
            raise zero_torch.DeviceError("copying the tensor failed half way (injected)")

        return failing


def test_a_failed_gradient_crossing_refuses_the_step() -> None:
    """A gradient half added into the engine is never stepped on (issue 30, L4): the step
    names the unit and the cause, the parameters stay bit-identical, and the next forward
    raises the backward's error again (a failed backward leaves the engine unusable)."""
    engine = toy_engine()
    one_step(engine)
    before = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    rt = engine._runtime
    rt.native = _FailingNative(rt.native, "put_grad")
    x, y = models.regression(1, 4)[0]
    with pytest.raises(zero_torch.DeviceError, match="injected"):
        engine.backward(engine(x, y))
    with pytest.raises(zero_torch.ZeroError, match=r"gradients of head.*injected.*incomplete.*stay as they are"):
        engine.step()
    for n, p in engine.module.named_parameters():
        assert torch.equal(p, before[n]), f"{n} changed"
    with pytest.raises(zero_torch.DeviceError, match="injected"):
        engine(x, y)


class _Recording:
    """The native engine, counting ``wait_collectives`` calls."""

    def __init__(self, native: Any) -> None:
        self._native, self.waits = native, 0

    def __getattr__(self, name: str) -> Any:
        if name == "wait_collectives":
            def wait() -> None:
                self.waits += 1
                self._native.wait_collectives()
            return wait
        return getattr(self._native, name)


@pytest.mark.parametrize("backend,waits", [("gloo", 0), ("nccl", 2)])
def test_zero_settles_its_collectives_when_torch_uses_nccl_too(monkeypatch: pytest.MonkeyPatch, backend: str, waits: int) -> None:
    """Issue 30, M3: where torch's default group is NCCL, a script's collectives share the
    GPU with zero's own NCCL communicator, so zero waits for its collectives in flight at
    the end of each forward and backward (two per micro-step); with gloo it does not."""
    engine = toy_engine(zero_optimization={"stage": 3, "overlap_comm": True})
    one_step(engine)
    rt = engine._runtime
    rec = _Recording(rt.native)
    rt.native = rec
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: backend)
    one_step(engine)
    rt.native = rec._native
    assert rec.waits == waits, rec.waits


def test_a_crossing_keeps_cuda_memory_for_the_current_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30, M1, the part a CPU can check: a CUDA tensor a crossing touches is
    ``record_stream``ed on torch's current stream (which waits for the engine's copies), so
    the caching allocator cannot give its memory to another tensor before they ran, even
    when another stream allocated it; a CPU tensor is left alone."""
    from zero_torch import _hooks

    current = object()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)

    class FakeCuda:
        is_cuda = True
        device = "cuda:0"

        def __init__(self) -> None:
            self.recorded: list = []

        def record_stream(self, stream: Any) -> None:
            self.recorded.append(stream)

    t = FakeCuda()
    _hooks._used_on_current_stream(t)  # type: ignore[arg-type]
    assert t.recorded == [current]
    cpu = torch.ones(3)
    _hooks._used_on_current_stream(cpu)  # a CPU tensor has no stream: nothing happens
