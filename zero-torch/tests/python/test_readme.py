"""The README's example runs as written (one rank), and the GPT-2 example script trains
under 2 processes with the loss falling."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import conftest

CRATE = Path(__file__).resolve().parents[2]


def test_readme_example_runs(tmp_path: Path) -> None:
    text = (CRATE / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    code = code.replace("/tmp/zero-torch-readme", str(tmp_path / "ckpt"))
    env = {k: v for k, v in os.environ.items() if k not in conftest.LAUNCH_VARS}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"loss \d+\.\d+, global steps 20", out.stdout), out.stdout
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "global_step20"


def test_gpt2_example_trains_on_two_processes(tmp_path: Path) -> None:
    port = conftest.free_port()
    procs = []
    for r in range(2):
        env = {k: v for k, v in os.environ.items() if k not in conftest.LAUNCH_VARS}
        env.update({"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
        procs.append(subprocess.Popen(
            [sys.executable, str(CRATE / "examples" / "train_gpt2.py"), "--steps", "40", "--width", "32",
             "--layers", "2", "--seq", "16", "--save", str(tmp_path / "run")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=300)[0])
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    losses = [float(x) for x in re.findall(r"^step +\d+ +loss (\d+\.\d+)", logs[0], re.M)]
    assert len(losses) == 3 and losses[-1] < losses[0] - 0.5, logs[0]
    from transformers import GPT2LMHeadModel

    GPT2LMHeadModel.from_pretrained(tmp_path / "run" / "hf")
