"""A Hugging Face ``Trainer`` script as its users write it, run by ``test_hf_trainer.py``
under ``torchrun --nproc-per-node 2`` on CPU: on zero (``ZT_COMPAT=1``: the one added
import line) or on DeepSpeed 0.19.8 itself (``ZT_COMPAT=0``). It trains a tiny model loaded
with ``from_pretrained`` after ``TrainingArguments`` (so stage 3 loads it through
``zero.Init``), evaluates, saves with ``save_model``, and writes what rank 0 saw as JSON and the
trained model's logits on a fixed batch (``logits.pt``).

Variables: ``ZT_STAGE``, ``ZT_CASE`` (A: optimizer and scheduler in the config; B: the
Trainer's optimizer; C: the Trainer's scheduler; D: both the Trainer's; E: as A, by epochs
with a short last accumulation window; O: as A, with ``offload_optimizer: cpu``; L: as A, the
model wrapped in ``peft``'s LoRA (rank 4 on ``q_proj`` and ``v_proj``: a frozen base, which
stage 3 partitions), saved as ``peft`` saves an adapter), ``ZT_MODEL_DIR``, ``ZT_OUT_DIR``, ``ZT_RESUME``
(a ``checkpoint-N`` folder to resume from), ``ZT_RESULT`` (the JSON file)."""

import os

if os.environ.get("ZT_COMPAT") == "1":
    import zero_torch.deepspeed_compat  # noqa: F401  (the one added line)

import json

import torch
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

stage = int(os.environ["ZT_STAGE"])
case = os.environ["ZT_CASE"]
out_dir = os.environ["ZT_OUT_DIR"]
cfg = {
    "train_micro_batch_size_per_gpu": "auto",
    "train_batch_size": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": stage, "stage3_gather_16bit_weights_on_model_save": True},
}
if case == "O":
    cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
if case in ("B", "D"):
    del cfg["optimizer"]
if case in ("C", "D"):
    del cfg["scheduler"]
steps = {"max_steps": 4} if case != "E" else {"num_train_epochs": 2}
args = TrainingArguments(
    output_dir=out_dir, use_cpu=True, deepspeed=cfg, save_steps=2, gradient_accumulation_steps=2,
    per_device_train_batch_size=2, per_device_eval_batch_size=2, report_to=[], logging_steps=1,
    learning_rate=1e-3, weight_decay=0.01, max_grad_norm=0.5, warmup_steps=1, seed=0,
    dataloader_drop_last=False, **steps,
)
model = AutoModelForCausalLM.from_pretrained(os.environ["ZT_MODEL_DIR"])
# What the loaded model holds on this rank before any engine exists: at stage 3 on zero,
# placeholders (one element each) and a shard of each parameter.
loaded = list({id(p): p for p in model.parameters()}.values())
held = {"numel": sum(p.numel() for p in loaded),
        "storage_bytes": sum(p.untyped_storage().nbytes() for p in loaded),
        "shard_numel": sum(getattr(p, "_zero_shard", torch.empty(0)).numel() for p in loaded),
        "params": len(loaded), "itemsize": loaded[0].element_size()}
if case == "L":
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)  # the adapter's initial values, the same whatever the loading drew
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]))


class Tokens(torch.utils.data.Dataset):
    """Seeded token sequences (24 for training; 10 for E: 3 micro-batches per rank, so each
    epoch ends with a window of one)."""

    def __init__(self, n: int, offset: int) -> None:
        self.n, self.offset = n, offset

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(self.offset + i))
        return {"input_ids": ids, "labels": ids}


train = Tokens(10 if case == "E" else 24, 0)
trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=Tokens(8, 1000))
trainer.train(resume_from_checkpoint=os.environ.get("ZT_RESUME") or None)
evaluated = trainer.evaluate()
trainer.save_model(os.path.join(out_dir, "final"))
# The trained model's logits on a fixed batch, through the engine (every rank: a collective
# at stage 3), for the test to compare with what plain transformers reads back.
probe = torch.stack([torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(2000 + k)) for k in range(2)])
trainer.model_wrapped.eval()
with torch.no_grad():
    logits = trainer.model_wrapped(input_ids=probe).logits
if trainer.is_world_process_zero():
    torch.save({"input_ids": probe, "logits": logits}, os.path.join(out_dir, "logits.pt"))
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    with open(os.environ["ZT_RESULT"], "w") as f:
        json.dump({"losses": [e["loss"] for e in logs], "steps": [e["step"] for e in logs],
                   "grad_norms": [e["grad_norm"] for e in logs], "eval_loss": evaluated["eval_loss"],
                   "global_step": trainer.state.global_step, "engine": type(trainer.model_wrapped).__module__,
                   "loaded": held}, f)

import teardown  # noqa: E402  (the end of a launched script, as the client scripts end)

teardown.exit_before_teardown()
