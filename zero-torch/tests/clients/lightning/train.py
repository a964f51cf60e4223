"""Lightning's ``DeepSpeedStrategy`` training the model of Lightning's own DeepSpeed tests
(``ModelParallelClassificationModel``, copied verbatim from
``tests/tests_pytorch/strategies/test_deepspeed.py``: a ``configure_model`` built under the
strategy's ``deepspeed.zero.Init``, Adam with an ``ExponentialLR`` stepped every step by
Lightning), on 2 processes under ``torchrun``, ``accelerator="cpu"``:

    torchrun --nproc-per-node 2 train.py --stage 3 --max_steps 6 --ckpt_dir CKPT --out OUT
    torchrun --nproc-per-node 2 train.py --stage 3 --max_steps 10 --ckpt_dir CKPT --out OUT --resume

The first run saves ``CKPT/last.ckpt`` (a DeepSpeed checkpoint folder); the resume run
continues from it (``trainer.fit(ckpt_path=...)``) and then, on rank 0, converts it with
Lightning's ``convert_zero_checkpoint_to_fp32_state_dict``. Rank 0 writes the learning rate
after every step, and what the converter gave (names, shapes, values, the client state's
keys), to ``OUT/result-<phase>.pt``.

What is not Lightning's own: the data (a fixed synthetic classification set in place of its
``ClassifDataModule``, which needs scikit-learn), and two changes its CUDA-only code needs
on a CPU, for DeepSpeed as for zero: ``CPUDeepSpeedStrategy`` skips the one check that
refuses a CPU accelerator (``DeepSpeedStrategy.setup_environment``: "only supported on CUDA
GPUs") and runs the rest of the strategy, and the strategy's devices are ``cpu:0`` and
``cpu:1`` (Lightning passes a device's index to DeepSpeed as ``device_rank`` and checks it
against the local rank; a plain ``cpu`` has none).
"""

import argparse
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import Accuracy

from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DeepSpeedStrategy
from lightning.pytorch.strategies.ddp import DDPStrategy
from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

_TM_GE_0_11 = True  # torchmetrics >= 0.11 (Lightning's test reads it from its imports)


class ModelParallelClassificationModel(LightningModule):
    def __init__(self, lr: float = 0.01, num_blocks: int = 5):
        super().__init__()
        self.lr = lr
        self.num_blocks = num_blocks
        self.prepare_data_per_node = True
        self.train_acc = self.valid_acc = self.test_acc = None
        self.model = None

    def make_block(self):
        return nn.Sequential(nn.Linear(32, 32, bias=False), nn.ReLU())

    def configure_model(self) -> None:
        # As of deepspeed v0.9.3, in ZeRO stage 3 all submodules need to be created within this hook,
        # including the metrics. Otherwise, modules that aren't affected by `deepspeed.zero.Init()`
        # won't be moved to the GPU. See https://github.com/microsoft/DeepSpeed/pull/3611
        if self.model is None:
            metric = Accuracy(task="multiclass", num_classes=3) if _TM_GE_0_11 else Accuracy()
            self.train_acc = metric.clone()
            self.valid_acc = metric.clone()
            self.test_acc = metric.clone()
            self.model = nn.Sequential(*(self.make_block() for x in range(self.num_blocks)), nn.Linear(32, 3))

    def forward(self, x):
        x = self.model(x)
        # Ensure output is in float32 for softmax operation
        x = x.float()
        return F.softmax(x, dim=1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.forward(x)
        loss = F.cross_entropy(logits, y)
        self.log("train_loss", loss, prog_bar=True)
        self.log("train_acc", self.train_acc(logits, y), prog_bar=True, sync_dist=True)
        return {"loss": loss}

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.forward(x)
        self.log("val_loss", F.cross_entropy(logits, y), prog_bar=False, sync_dist=True)
        self.log("val_acc", self.valid_acc(logits, y), prog_bar=True, sync_dist=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        logits = self.forward(x)
        self.log("test_loss", F.cross_entropy(logits, y), prog_bar=False, sync_dist=True)
        self.log("test_acc", self.test_acc(logits, y), prog_bar=True, sync_dist=True)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        logits = self.forward(x)
        self.test_acc(logits, y)
        return self.test_acc.compute()

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.lr)

        lr_scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.99)
        return [optimizer], [{"scheduler": lr_scheduler, "interval": "step"}]

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if not hasattr(self, "model"):
            self.configure_model()

        # Lightning saves the lr schedulers, but DeepSpeed saves the optimizer states separately
        assert len(checkpoint["lr_schedulers"]) == 1
        assert "optimizer_states" not in checkpoint


class CPUDeepSpeedStrategy(DeepSpeedStrategy):
    """Lightning's ``DeepSpeedStrategy`` with its CUDA-only check skipped (the one change):
    ``setup_environment`` refuses any accelerator but CUDA."""

    def setup_environment(self) -> None:
        DDPStrategy.setup_environment(self)  # DeepSpeedStrategy's, less its CUDA check


class RecordLR(Callback):
    """The learning rate of the optimizer after every training step."""

    def __init__(self) -> None:
        self.lrs: list = []

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


def data() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(96, 32, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4, shuffle=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", type=int, default=3)
    ap.add_argument("--max_steps", type=int, default=6)
    ap.add_argument("--ckpt_dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    seed_everything(42)
    model = ModelParallelClassificationModel()
    lrs = RecordLR()
    checkpoint = ModelCheckpoint(dirpath=args.ckpt_dir, save_last=True, every_n_train_steps=3, save_top_k=-1)
    trainer = Trainer(
        # Each rank's device with an index (cpu:0, cpu:1), which Lightning's DeepSpeed path
        # reads as DeepSpeed's device_rank and checks against the local rank: a plain "cpu"
        # has none. The tensors are on the CPU all the same.
        strategy=CPUDeepSpeedStrategy(stage=args.stage, parallel_devices=[torch.device("cpu", i) for i in range(2)]),
        accelerator="cpu",
        devices=2,
        max_steps=args.max_steps,
        limit_val_batches=0,
        callbacks=[checkpoint, lrs],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    last = os.path.join(args.ckpt_dir, "last.ckpt")
    trainer.fit(model, train_dataloaders=data(), ckpt_path=last if args.resume else None)
    result: dict = {"lrs": lrs.lrs, "global_step": trainer.global_step}
    if args.resume and trainer.is_global_zero:
        out = os.path.join(args.out, "converted.pt")
        convert_zero_checkpoint_to_fp32_state_dict(last, out)
        converted = torch.load(out, weights_only=False)
        # The converted state_dict holds the model's parameters, whole (at stage 3 a rank
        # holds a piece of each: its full shape is DeepSpeed's ds_shape).
        expected = {n: tuple(getattr(p, "ds_shape", p.shape)) for n, p in model.named_parameters()}
        got = {n: tuple(t.shape) for n, t in converted["state_dict"].items()}
        assert got == expected, f"converted {got}, the model's parameters {expected}"
        result["converted_keys"] = sorted(k for k in converted if k != "state_dict")
        result["state_dict"] = {k: v.clone() for k, v in converted["state_dict"].items()}
        result["epoch"], result["converted_global_step"] = converted.get("epoch"), converted.get("global_step")
    if trainer.is_global_zero:
        os.makedirs(args.out, exist_ok=True)
        torch.save(result, os.path.join(args.out, f"result-{'resume' if args.resume else 'first'}.pt"))


if __name__ == "__main__":
    main()
