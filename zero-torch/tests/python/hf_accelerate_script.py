"""A plain ``accelerate`` loop (``Accelerator(deepspeed_plugin=...)``, ``prepare``,
``accumulate``, ``backward``, ``step``) as its users write it, run by
``test_hf_trainer.py`` under ``torchrun --nproc-per-node 2`` on CPU: on zero
(``ZT_COMPAT=1``, the one added import line) or on DeepSpeed 0.19.8 (``ZT_COMPAT=0``).
Rank 0 writes every micro-step's loss, and the module of the engine ``prepare`` made, as
JSON to ``ZT_RESULT``.

Variables: ``ZT_STAGE``, ``ZT_MODEL_DIR``, ``ZT_RESULT``."""

import os

if os.environ.get("ZT_COMPAT") == "1":
    import zero_torch.deepspeed_compat  # noqa: F401  (the one added line)

import json

import torch
from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin
from transformers import AutoModelForCausalLM

config = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 0.5,
    "zero_optimization": {"stage": int(os.environ["ZT_STAGE"])},
}
# Not cpu=True: accelerate then ignores the DeepSpeed plugin and wraps the model in DDP
# (its state chooses DeepSpeed only without it); the device is the CPU all the same on a
# machine without a GPU.
accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config), gradient_accumulation_steps=2)
model = AutoModelForCausalLM.from_pretrained(os.environ["ZT_MODEL_DIR"])
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
data = [torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i)) for i in range(24)]
loader = torch.utils.data.DataLoader(data, batch_size=2)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
losses = []
for ids in loader:
    with accelerator.accumulate(model):
        loss = model(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    losses.append(loss.item())
if accelerator.is_main_process:
    with open(os.environ["ZT_RESULT"], "w") as f:
        json.dump({"losses": losses, "engine": type(model).__module__}, f)

import teardown  # noqa: E402  (the end of a launched script, as the client scripts end)

teardown.exit_before_teardown()
