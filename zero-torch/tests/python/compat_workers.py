"""Rank processes for test_compat.py: each runs one task with the variables torchrun sets
and writes what it saw to ``$ZC_OUT/rank<r>.json`` (or the traceback it raised)."""

from __future__ import annotations

from typing import Any, Dict


def comm() -> Dict[str, Any]:
    """``deepspeed.comm`` through the one-line compat layer: every function, on 2 ranks over
    gloo, before and after ``deepspeed.init_distributed``."""
    import zero_torch.deepspeed_compat  # noqa: F401 - the one line

    import datetime

    import torch

    import deepspeed
    import deepspeed.comm as dist
    from zero_torch.errors import DistNotInitializedError, UnsupportedError

    out: Dict[str, Any] = {}
    out["initialized_before"] = dist.is_initialized()
    try:
        dist.get_rank()
        out["get_rank_before"] = "returned"
    except DistNotInitializedError as e:
        out["get_rank_before"] = {"assertion": isinstance(e, AssertionError), "message": str(e)}

    try:
        dist.all_reduce(torch.ones(1))
        out["all_reduce_before"] = "returned"
    except DistNotInitializedError:
        out["all_reduce_before"] = "DistNotInitializedError"

    deepspeed.init_distributed(dist_backend=None, auto_mpi_discovery=False, timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    out.update(
        initialized=dist.is_initialized(), available=dist.is_available(), rank=rank, world=world,
        local_rank=dist.get_local_rank(), backend=torch.distributed.get_backend(),
        world_group_is_torch=dist.get_world_group() is torch.distributed.group.WORLD,
        all_ranks=dist.get_all_ranks_from_group(), global_rank_of_1=dist.get_global_rank(None, 1),
    )

    def f(*values: float) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32)

    t = f(rank + 1)
    dist.all_reduce(t)
    out["all_reduce_sum"] = t.tolist()
    t = f(rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["all_reduce_max_ds_op"] = t.tolist()
    t = f(rank + 1)
    dist.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
    out["all_reduce_min_torch_op"] = t.tolist()
    t = f(rank + 1)
    dist.inference_all_reduce(t)
    out["inference_all_reduce"] = t.tolist()
    handle = dist.all_reduce(f(rank + 1), async_op=True)
    handle.wait()
    out["all_reduce_async_handle"] = handle is not None

    t = f(rank * 10)
    dist.broadcast(t, src=1)
    out["broadcast_from_1"] = t.tolist()
    parts = [f(0), f(0)]
    dist.all_gather(parts, f(rank + 5))
    out["all_gather"] = [p.tolist() for p in parts]
    flat = f(0, 0)
    dist.all_gather_into_tensor(flat, f(rank + 7))
    out["all_gather_into_tensor"] = flat.tolist()
    flat = f(0, 0)
    dist.allgather_fn(flat, f(rank + 8))
    out["allgather_fn"] = flat.tolist()
    piece = f(0)
    dist.reduce_scatter_tensor(piece, f(10 * rank + 1, 10 * rank + 2))
    out["reduce_scatter_tensor"] = piece.tolist()
    t = f(rank + 1)
    dist.reduce(t, dst=0)
    out["reduce_to_0"] = t.tolist() if rank == 0 else None
    gathered = [f(0), f(0)] if rank == 0 else None
    dist.gather(f(rank + 3), gather_list=gathered, dst=0)
    out["gather_to_0"] = [g.tolist() for g in gathered] if gathered else None
    got = f(0)
    dist.scatter(got, scatter_list=[f(10), f(20)] if rank == 0 else None, src=0)
    out["scatter_from_0"] = got.tolist()
    swapped = f(0, 0)
    dist.all_to_all_single(swapped, f(rank * 10 + 1, rank * 10 + 2))
    out["all_to_all_single"] = swapped.tolist()

    if rank == 0:
        dist.send(f(42), dst=1)
        got = f(0)
        dist.irecv(got, src=1).wait()
    else:
        got = f(0)
        dist.recv(got, src=0)
        dist.isend(f(43), dst=0).wait()
    out["send_recv"] = got.tolist()
    peer = 1 - rank
    inbox = f(0)
    ops = [dist.P2POp(dist.isend, f(100 + rank), peer), dist.P2POp(dist.irecv, inbox, peer)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    out["batch_isend_irecv"] = inbox.tolist()

    objects: list = [None, None]
    dist.all_gather_object(objects, {"rank": rank})
    out["all_gather_object"] = objects
    box = [{"from": rank}]
    dist.broadcast_object_list(box, src=1)
    out["broadcast_object_list"] = box

    group = dist.new_group([0, 1])
    out["new_group_ranks"] = dist.get_all_ranks_from_group(group)
    out["new_group_global_rank_of_1"] = dist.get_global_rank(group, 1)
    t = f(rank + 1)
    dist.all_reduce(t, group=group)
    out["all_reduce_in_group"] = t.tolist()
    dist.barrier()
    dist.barrier(group=group)
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))

    dist.configure(enabled=False, prof_all=True)
    for bad in ({"enabled": True}, {"deepspeed_config": {"comms_logger": {"enabled": True}}}):
        try:
            dist.configure(**bad)
            out.setdefault("comms_logger_refused", []).append("accepted")
        except UnsupportedError as e:
            out.setdefault("comms_logger_refused", []).append(str(e))
    summary = dist.log_summary(return_dict=True)
    out["log_summary"] = {"summary": summary["summary"], "world": summary["metadata"]["world_size"]}
    out["has_comm_data"] = dist.has_comm_data()

    dist.destroy_process_group()
    out["initialized_after_destroy"] = dist.is_initialized()
    return out


def train() -> Dict[str, Any]:
    """A DeepSpeed-style script (add_config_arguments, init_distributed, get_accelerator,
    initialize with a WarmupLR config, backward/step) run through the one line."""
    import zero_torch.deepspeed_compat  # noqa: F401 - the one line

    import argparse

    import torch

    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.accelerator import get_accelerator

    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args([])
    deepspeed.init_distributed()
    device = torch.device(get_accelerator().device_name())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    config = {
        "train_batch_size": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-2, "warmup_num_steps": 4}},
        "zero_optimization": {"stage": 2},
    }
    engine, _, _, scheduler = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(), config=config)
    torch.manual_seed(1 + dist.get_rank())
    x, y = torch.randn(2, 4, device=device), torch.randn(2, 1, device=device)
    losses, lrs = [], []
    for _ in range(3):
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        lrs.append(engine.get_lr())
    weights = [p.detach().clone() for p in model.parameters()]
    total = [w.clone() for w in weights]
    for t in total:
        dist.all_reduce(t)
    same = all(torch.allclose(2 * w, t) for w, t in zip(weights, total))
    return {
        "engine_is_deepspeed_engine": isinstance(engine, deepspeed.DeepSpeedEngine),
        "rank": dist.get_rank(),
        "global_steps": engine.global_steps,
        "losses": losses,
        "lrs": lrs,
        "weights_equal_across_ranks": same,
        "scheduler_state": scheduler.state_dict() if hasattr(scheduler, "state_dict") else None,
    }
