#!/usr/bin/env python
"""Consolidates the weights of the checkpoints zero_torch saved into this folder in the
dtype you choose: DeepSpeed's ``zero_to_torch.py``, for zero's format, written here by
``engine.save_checkpoint`` as DeepSpeed writes its own:

    python zero_to_torch.py CHECKPOINT_DIR OUTPUT_DIR --dtype {bf16,bfloat16,float16,float32,fp16,fp32}
        [--safe_serialization] [--max_shard_size 5GB] [-t TAG] [--exclude_frozen_parameters]

It needs torch and zero_torch (which reads zero's format), not DeepSpeed.
"""

import sys

try:
    from zero_torch.checkpoint import zero_to_torch_main
except ImportError as e:
    sys.exit(f"zero_to_torch.py: this checkpoint was saved by zero_torch, which is needed to read it ({e})")

if __name__ == "__main__":
    zero_to_torch_main()
