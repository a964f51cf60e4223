#!/usr/bin/env python
"""Consolidates the weights of the checkpoints zero_torch saved into this folder: DeepSpeed's
``zero_to_fp32.py``, for zero's format (saved at any ZeRO stage and world size), written
here by ``engine.save_checkpoint`` as DeepSpeed writes its own:

    python zero_to_fp32.py CHECKPOINT_DIR OUTPUT_DIR [--safe_serialization]
        [--max_shard_size 5GB] [-t TAG] [--exclude_frozen_parameters]

writes ``OUTPUT_DIR/pytorch_model.bin`` (or ``model.safetensors``; sharded with an index
above ``--max_shard_size``): every parameter whole, in fp32. It needs torch and zero_torch
(which reads zero's format), not DeepSpeed.
"""

import sys

try:
    from zero_torch.checkpoint import zero_to_fp32_main
except ImportError as e:
    sys.exit(f"zero_to_fp32.py: this checkpoint was saved by zero_torch, which is needed to read it ({e})")

if __name__ == "__main__":
    zero_to_fp32_main()
