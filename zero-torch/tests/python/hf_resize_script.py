"""``resize_token_embeddings`` at ZeRO-3 under ``accelerate launch``, as accelerate's own
example (``examples/by_feature/deepspeed_with_config_support.py``) and DeepSpeed-Chat
call it: the model loaded with ``from_pretrained`` under ``zero.Init`` (accelerate's
``--zero3_init_flag``), its vocabulary grown (transformers gathers ``[old.weight, old.bias,
new.weight, new.bias]`` with ``None`` biases, and draws the new rows from torch's
generator), then trained with dropout, so torch's random stream shows in every loss.

Run by ``test_hf_trainer.py`` under ``accelerate launch --use_deepspeed --zero_stage 3
--zero3_init_flag true`` on 2 processes, on zero (``ZERO_AS_DEEPSPEED=1`` and the wheel's
``.pth``: no added line) or on DeepSpeed 0.19.8. Rank 0 writes each micro-step's loss and a
hash of torch's generator state then, the vocabulary size after the resize and the engine's
module as JSON to ``ZT_RESULT``.

Variables: ``ZT_MODEL_DIR``, ``ZT_RESULT``."""

import hashlib
import json
import os

import torch
from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin
from transformers import AutoModelForCausalLM

NEW_VOCAB = 70
"""The resized vocabulary (the saved model has 64 tokens)."""

# The batch keys set here (accelerate derives a train_batch_size from the launch otherwise
# that neither engine accepts on 2 processes); the stage from the launch, as the example's.
config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
          "zero_optimization": {"stage": 3}}
accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config, zero3_init_flag=True))
torch.manual_seed(1234)
model = AutoModelForCausalLM.from_pretrained(os.environ["ZT_MODEL_DIR"])
model.resize_token_embeddings(NEW_VOCAB)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
data = [torch.randint(0, NEW_VOCAB, (16,), generator=torch.Generator().manual_seed(i)) for i in range(12)]
loader = torch.utils.data.DataLoader(data, batch_size=2)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
model.train()
losses, rng = [], []
for ids in loader:
    loss = model(input_ids=ids, labels=ids).loss
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())
    rng.append(hashlib.sha1(torch.random.get_rng_state().numpy().tobytes()).hexdigest()[:16])
vocab = model.module.config.vocab_size if hasattr(model, "module") else model.config.vocab_size
if accelerator.is_main_process:
    with open(os.environ["ZT_RESULT"], "w") as f:
        json.dump({"losses": losses, "rng": rng, "vocab": vocab, "engine": type(model).__module__}, f)

import teardown  # noqa: E402  (the end of a launched script, as the client scripts end)

teardown.exit_before_teardown()
