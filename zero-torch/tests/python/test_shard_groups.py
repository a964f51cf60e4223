"""Shard groups and hpZ through the compat line, on 4 CPU processes launched as 2 nodes of
2 by two ``torchrun`` agents on one machine (``--nnodes 2 --node-rank K``), the usual way
to try a multi-node launch on one box (issue 50).

- zero's shard groups (``mics_shard_size: 2``: one node each) at stages 1-3, and hpZ
  (``zero_hpz_partition_size: 2``) at stage 3: losses within 1e-6 relative of zero's flat
  engine over 20 steps, parameters within 2e-5 of the largest (see the test for why not
  1e-6 here, where the Rust MLP of tests/tests/host/shard_groups.rs holds 1e-6); hpZ changes no
  arithmetic: the same bits as without it.
- DeepSpeed 0.19.8 on the same launch: flat and hpZ give the same bits (hpZ changes no
  arithmetic there either), and zero follows DeepSpeed's flat run within
  ``test_deepspeed.py``'s bound (1e-5 relative on the losses: the two round the reduction
  and the update in different orders). DeepSpeed 0.19.8 refuses ``mics_shard_size``, so
  zero's shard groups are held against its flat run.
- The same with accumulation and clipping (stage 2, shard sizes 2 and 1) and the
  optimizer's partitions in host memory (stage 3): each within those bounds of its own
  flat run; fp16 with loss scaling (stage 1) within fp16's (see the test).
- ``mics_hierarchical_params_gather`` on the flat layout (one shard group over both nodes):
  the flat run's bits, with part of each gather inside the node.
- The comm report's intra-node and inter-node elements equal the formulas to the element
  at stages 1-2 and across nodes with one-node shard groups (see the test for stage 3's
  gathers).

The inter-node tier of those runs is the shared-memory group too (the two "nodes" are one
machine). A third launch runs every zero configuration again with
``ZERO_CPU_INTER_NODE=gloo``, which takes each launcher node as a machine of its own: each
node's ranks over their own shared-memory group and torch's gloo group between the nodes
(docs/GLOO_TIER.md), as on two real machines. Its losses, parameters and comm report are
the shared-memory runs' bit for bit.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import torch

from conftest import HERE, LAUNCH_VARS, free_port

STEPS = 20
BATCH = 8
# No persistent parameters and no reuse of a released bucket: every bucket is gathered in
# the forward and again in the backward, the count the formulas assume.
EXACT = {"stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0}
ZERO_RUNS = [
    {"stage": 3, "zero": EXACT},
    {"stage": 3, "zero": {**EXACT, "mics_shard_size": 2}},
    {"stage": 3, "zero": {**EXACT, "mics_shard_size": 2, "zero_hpz_partition_size": 2}},
    {"stage": 3, "zero": {**EXACT, "zero_hpz_partition_size": 2}},
    {"stage": 1, "zero": EXACT},
    {"stage": 1, "zero": {**EXACT, "mics_shard_size": 2}},
    {"stage": 2, "zero": EXACT},
    {"stage": 2, "zero": {**EXACT, "mics_shard_size": 2}},
    # The world's one shard group spans both nodes: gathered across the nodes, then inside
    # each (its ranks holding their partitions place-major, so its sums run in that order).
    {"stage": 3, "zero": {**EXACT, "mics_hierarchical_params_gather": True}},
    # Accumulation (2 micro-batches per step) with clipping, at shard sizes 4 (flat), 2, 1.
    {"stage": 2, "gas": 2, "clip": 0.5, "zero": EXACT},
    {"stage": 2, "gas": 2, "clip": 0.5, "zero": {**EXACT, "mics_shard_size": 2}},
    {"stage": 2, "gas": 2, "clip": 0.5, "zero": {**EXACT, "mics_shard_size": 1}},
    # The optimizer's partitions in host memory.
    {"stage": 3, "zero": {**EXACT, "offload_optimizer": {"device": "cpu"}}},
    {"stage": 3, "zero": {**EXACT, "offload_optimizer": {"device": "cpu"}, "mics_shard_size": 2}},
    # Accumulation at stage 3, and with the optimizer's partitions in host memory, whose
    # window sum crosses back to the device for the replicas' all-reduce once per step:
    # the device run's arithmetic, so its bits.
    {"stage": 3, "gas": 2, "zero": EXACT},
    {"stage": 3, "gas": 2, "zero": {**EXACT, "mics_shard_size": 2}},
    {"stage": 3, "gas": 2, "zero": {**EXACT, "mics_shard_size": 2, "offload_optimizer": {"device": "cpu"}}},
    # fp16 with dynamic loss scaling.
    {"stage": 1, "dtype": "fp16", "zero": EXACT},
    {"stage": 1, "dtype": "fp16", "zero": {**EXACT, "mics_shard_size": 2}},
    # A script written for DeepSpeed's MiCS builds its model inside deepspeed.zero.MiCS_Init
    # (0.18 and before): the same run as the shard groups' second.
    {"stage": 3, "mics_init": True, "zero": {**EXACT, "mics_shard_size": 2}},
]
HIERARCHICAL = 8
MICS_INIT = len(ZERO_RUNS) - 1
OFFLOAD_ACCUM = next(i for i, r in enumerate(ZERO_RUNS) if r.get("gas") == 2 and "offload_optimizer" in r["zero"])
SHARD_KEYS = {"mics_shard_size", "zero_hpz_partition_size", "mics_hierarchical_params_gather"}


def is_flat(run: Dict[str, Any]) -> bool:
    return not SHARD_KEYS & set(run["zero"])


def flat_of(run: Dict[str, Any]) -> int:
    """The index of the flat run ``run`` is held against: the same run without shard groups,
    hpZ or hierarchical gathers."""
    want = {k: v for k, v in run.items() if k != "mics_init"}
    want["zero"] = {k: v for k, v in run["zero"].items() if k not in SHARD_KEYS}
    return ZERO_RUNS.index(want)


DS_RUNS = [{"stage": 3}, {"stage": 3, "zero": {"zero_hpz_partition_size": 2}}]


def two_nodes(engine: str, runs: List[Dict[str, Any]], extra: Optional[Dict[str, str]] = None) -> List[List[Dict[str, Any]]]:
    """Runs ``shard_group_workers.py`` under two torchrun agents of 2 processes each
    (``extra``: more variables); returns every rank's results."""
    out = Path(tempfile.mkdtemp(prefix="zt-nodes-"))
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and k != "ZERO_CPU_INTER_NODE"}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(HERE)] + sys.path),
                "DS_ACCELERATOR": "cpu", **(extra or {})})
    args = json.dumps({"engine": engine, "runs": runs, "steps": STEPS, "batch": BATCH, "out": str(out)})
    agents = []
    for node in range(2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", port,
               str(HERE / "shard_group_workers.py"), args]
        agents.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    logs = []
    for a in agents:
        try:
            log, _ = a.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            for b in agents:
                b.kill()
            raise AssertionError("a torchrun agent did not finish in 900 s")
        logs.append(log.decode(errors="replace"))
        assert a.returncode == 0, logs[-1][-4000:]
    results = []
    for r in range(4):
        with open(out / f"rank{r}.pkl", "rb") as f:
            results.append(pickle.load(f))
    return results


@pytest.fixture(scope="module")
def runs() -> Dict[str, List[Dict[str, Any]]]:
    return {
        "zero": two_nodes("zero", ZERO_RUNS)[0],
        "deepspeed": two_nodes("deepspeed", DS_RUNS)[0],
        "gloo": two_nodes("zero", ZERO_RUNS, {"ZERO_CPU_INTER_NODE": "gloo"})[0],
    }


def max_rel(a: Dict[str, Any], b: Dict[str, Any]) -> float:
    """The largest parameter difference over the largest parameter."""
    scale = max(t.abs().max().item() for t in b.values())
    return max((a[n] - t).abs().max().item() for n, t in b.items()) / scale


def same_bits(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    """Whether every parameter of ``a`` has ``b``'s bits."""
    return all(a[n].view(torch.int32).equal(t.view(torch.int32)) for n, t in b.items())


def test_shard_groups_and_hpz_follow_the_flat_engine(runs: Dict[str, List[Dict[str, Any]]]) -> None:
    z = runs["zero"]
    worst = []
    for i, run in enumerate(ZERO_RUNS):
        if is_flat(run) or i == OFFLOAD_ACCUM:
            continue
        ref = z[flat_of(run)]
        rel = max_rel(z[i]["params"], ref["params"])
        loss_rel = max(abs(a - b) / abs(b) for a, b in zip(z[i]["losses"], ref["losses"]))
        print(f"stage {run['stage']} {run['zero']}: parameters {rel:.2g}, losses {loss_rel:.2g} from flat")
        worst.append((i, run, rel, loss_rel))
    for i, run, rel, loss_rel in worst:
        # Two rounds of averaging (inside the shard group, then across the replicas) round
        # differently from one; Adam's first steps (g / (|g| + eps)) turn that rounding,
        # where the ranks' gradients nearly cancel, into up to ~1e-5 of the parameters
        # after 20 steps, as test_deepspeed.py measured between DeepSpeed's own stages.
        if run.get("dtype") == "fp16":
            # In fp16 each of the two rounds rounds the averaged gradient to 10 bits
            # (about 1e-3), and Adam's sign-like first steps carry that into the
            # parameters: measured 4e-3 on the losses and 4.4e-2 of the largest parameter
            # after 20 steps (the Rust MLP, 4 steps, holds 5e-3). The runs over gloo
            # below hold the fp16 runs to the bit.
            assert loss_rel <= 1e-2, (run, loss_rel)
            assert rel <= 0.1, (run, rel)
            continue
        if i == HIERARCHICAL:
            # Gathered across the nodes first, the shard group's ranks hold their
            # partitions place-major (rank 1 holds partition 2 here), so its reduce-scatter
            # sums the four ranks in another order than the flat run's; Adam's first steps
            # carry that rounding: measured 1.1e-6 on the losses, 2.5e-5 of the largest
            # parameter (the Rust MLP holds 1e-6). The gloo runs hold it to the bit.
            assert loss_rel <= 1e-5, (run, loss_rel)
            assert rel <= 1e-4, (run, rel)
            continue
        if run["stage"] == 3 and run.get("gas", 1) > 1:
            # Stage 3 at accumulation 2: the window is summed inside the shard group and
            # averaged across the replicas once, where the flat run averages each
            # micro-batch over the world; Adam's first steps carry that rounding further
            # in 40 micro-batches: measured 3.7e-6 on the losses, 3.7e-5 of the largest
            # parameter. Its offloaded twin below is held to its bits.
            assert loss_rel <= 1e-5, (run, loss_rel)
            assert rel <= 1e-4, (run, rel)
            continue
        assert loss_rel <= 1e-6, (run, loss_rel)
        assert rel <= 2e-5, (run, rel)
    # The partitions in host memory sum the same window in the same order.
    off, dev = ZERO_RUNS[OFFLOAD_ACCUM], ZERO_RUNS[OFFLOAD_ACCUM - 1]
    assert {**off, "zero": {k: v for k, v in off["zero"].items() if k != "offload_optimizer"}} == dev
    assert same_bits(z[OFFLOAD_ACCUM]["params"], z[OFFLOAD_ACCUM - 1]["params"]), "offload changed the bits"
    assert z[OFFLOAD_ACCUM]["losses"] == z[OFFLOAD_ACCUM - 1]["losses"]
    assert same_bits(z[2]["params"], z[1]["params"]), "hpZ on shard groups changed bits"
    assert same_bits(z[3]["params"], z[0]["params"]), "hpZ on the flat layout changed bits"
    assert ZERO_RUNS[1] == {k: v for k, v in ZERO_RUNS[MICS_INIT].items() if k != "mics_init"}
    assert same_bits(z[MICS_INIT]["params"], z[1]["params"]), "a model built in MiCS_Init trained differently"
    assert z[MICS_INIT]["losses"] == z[1]["losses"]


def test_deepspeed_hpz_changes_no_bits_and_zero_follows_deepspeed(runs: Dict[str, List[Dict[str, Any]]]) -> None:
    ds, z = runs["deepspeed"], runs["zero"]
    assert same_bits(ds[1]["params"], ds[0]["params"]), "DeepSpeed's hpZ changed its bits"
    assert ds[1]["losses"] == ds[0]["losses"]
    for i in range(4):
        rel = max(abs(a - b) / abs(b) for a, b in zip(z[i]["losses"], ds[0]["losses"]))
        print(f"zero {ZERO_RUNS[i]}: losses within {rel:.2g} of DeepSpeed's flat stage 3")
        assert rel <= 1e-5, (ZERO_RUNS[i], rel)


def test_comm_report_per_tier_is_the_formula(runs: Dict[str, List[Dict[str, Any]]]) -> None:
    """Stages 1-2: both tiers equal the formulas to the element. Stage 3: the formulas
    count two gathers of each bucket per micro-step (the engine's own tests hold them
    exactly, tests/tests/host/shard_groups.rs), but with ``stage3_max_reuse_distance: 0`` a bucket that
    spans several of the Llama's modules is gathered again for each, so the gathers' tier
    counts more; what crosses nodes with one-node shard groups, the replicas' all-reduce,
    is exact still."""
    for i, run in enumerate(ZERO_RUNS):
        c = runs["zero"][i]["comm"]
        shard = run["zero"].get("mics_shard_size")
        hpz = run["zero"].get("zero_hpz_partition_size")
        print(run, {k: c[k] for k in ("intra_node", "theory_intra_node", "inter_node", "theory_inter_node")})
        assert c["intra_node"] + c["inter_node"] == c["grad_reduce"] + c["param_gather"], (run, c)
        if run["stage"] < 3:
            assert c["intra_node"] == c["theory_intra_node"], (run, c)
            assert c["inter_node"] == c["theory_inter_node"], (run, c)
            assert c["grad_reduce"] + c["param_gather"] == c["theory"], (run, c)
        else:
            assert c["intra_node"] >= c["theory_intra_node"], (run, c)
            assert c["inter_node"] >= c["theory_inter_node"], (run, c)
        if shard == 2:
            # One node per shard group: only the replica all-reduce leaves the node.
            assert c["inter_node"] == c["theory_inter_node"], (run, c)
            assert 0 < c["inter_node"] < c["intra_node"], (run, c)
        elif i == HIERARCHICAL:
            # Across the nodes first: of each gather only a block of n/G crosses the nodes.
            flat = runs["zero"][0]["comm"]
            assert 0 < c["intra_node"] and c["inter_node"] < flat["inter_node"], (run, c, flat)
            assert c["intra_node"] + c["inter_node"] == flat["intra_node"] + flat["inter_node"], (run, c, flat)
        elif not hpz:
            # Flat over two nodes: everything counts as inter-node.
            assert c["intra_node"] == 0 and c["inter_node"] > 0, (run, c)


def test_the_gloo_tier_between_machines_gives_the_shared_memory_runs_bits(runs: Dict[str, List[Dict[str, Any]]]) -> None:
    """Every configuration with the nodes as two machines (shared memory inside each, gloo
    between them): zero reduces in its own order whatever carries the bytes, so the
    losses, the parameters and the comm report are the one-machine runs' exactly."""
    for i, run in enumerate(ZERO_RUNS):
        g, z = runs["gloo"][i], runs["zero"][i]
        assert g["machines"] == [0, 0, 1, 1] and z["machines"] is None, (run, g["machines"], z["machines"])
        assert g["losses"] == z["losses"], run
        assert same_bits(g["params"], z["params"]), run
        assert g["comm"] == z["comm"], (run, g["comm"], z["comm"])
