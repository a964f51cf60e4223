"""Sums up a ``ZT_CPU_LOG`` file (``sitecustomize.py`` beside this one): CPU by kind of
process, by imported package, and by test file.

    python3 .ci/python_cpu/report.py cpu.jsonl
"""

import collections
import json
import sys


def kind(r: dict) -> str:
    a = r["argv"]
    if "cpuinfo" in a:
        return "py-cpuinfo (DeepSpeed's op builder)"
    if r["forked"]:
        return "forked from a zygote"
    if "pytest" in a:
        return "pytest"
    if "torch/distributed/run.py" in a or "torch.distributed.run" in a:
        return "torchrun's agent"
    if "deepspeed/launcher" in a or "/bin/deepspeed" in a:
        return "deepspeed launcher"
    if "accelerate" in a and "launch" in a:
        return "accelerate launch"
    if "/tests/clients/" in a or "zt-client" in a:
        return "client script rank"
    if "hf_" in a:
        return "Trainer/accelerate script rank"
    if a.startswith("-c"):
        return "python -c"
    return "other"


def main(path: str) -> None:
    records = [json.loads(line) for line in open(path)]
    cpu, count, imp, imp_by_kind, by_file = (collections.Counter() for _ in range(5))
    for r in records:
        k = kind(r)
        cpu[k] += r["cpu"]
        count[k] += 1
        by_file[r["test"].split("::")[0].split("/")[-1] or "?"] += r["cpu"]
        for m, v in r["imports"].items():
            imp[m] += v
            imp_by_kind[k] += v
    total = sum(cpu.values())
    print(f"{len(records)} processes, {total:.0f} CPU s, of which {sum(imp.values()):.0f} in top-level imports")
    for k, v in cpu.most_common():
        print(f"  {k:36s} {count[k]:5d} processes {v:7.0f} s (imports {imp_by_kind[k]:6.0f})")
    print("imports by package: " + ", ".join(f"{m} {v:.0f} s" for m, v in imp.most_common(10)))
    print("by test file:")
    for f, v in by_file.most_common(25):
        print(f"  {f:40s} {v:7.0f} s")


if __name__ == "__main__":
    main(sys.argv[1])
