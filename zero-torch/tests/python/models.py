"""Tiny models and data for zero_torch's tests: Hugging Face ``LlamaForCausalLM`` and
``GPT2LMHeadModel`` (tied weights) built from configs, no download."""

from __future__ import annotations

from typing import Iterator, List, Tuple

import torch

VOCAB = 64
SEQ = 12


def build_config(name: str) -> object:
    """The transformers config of test model ``name``."""
    from transformers import GPT2Config, LlamaConfig

    if name == "llama":
        return LlamaConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            tie_word_embeddings=False,
        )
    return GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1,
    )


def llama(seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(build_config("llama")).float()


def gpt2(seed: int = 0) -> torch.nn.Module:
    from transformers import GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(build_config("gpt2")).float()


def wide_llama(seed: int = 0) -> torch.nn.Module:
    """A Llama of 126M parameters (the test vocabulary): large enough that the engine's
    device memory stands out from NCCL's and the kernels' fixed costs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=1024, intermediate_size=4096, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=64, tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg).float()


def build(name: str, seed: int = 0) -> torch.nn.Module:
    return {"llama": llama, "gpt2": gpt2, "wide_llama": wide_llama}[name](seed)


def freeze_base(model: torch.nn.Module) -> torch.nn.Module:
    """A LoRA-style frozen base: the projections and the embedding stop training
    (``requires_grad=False``); the norms and the head train on."""
    for name, p in model.named_parameters():
        if "_proj" in name or "embed_tokens" in name or name.startswith("transformer.h."):
            p.requires_grad_(False)
    return model


def batches(steps: int, batch: int, seed: int = 1) -> List[torch.Tensor]:
    """``steps`` global batches of token ids, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (batch, SEQ), generator=g) for _ in range(steps)]


def loss_of(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def shard(ids: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    per = ids.shape[0] // world
    return ids[rank * per:(rank + 1) * per]


def micro(ids: torch.Tensor, k: int, gas: int) -> torch.Tensor:
    per = ids.shape[0] // gas
    return ids[k * per:(k + 1) * per]


def named(model: torch.nn.Module) -> Iterator[Tuple[str, torch.nn.Parameter]]:
    return model.named_parameters()


class Block(torch.nn.Module):
    """A residual MLP block with a LayerNorm."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 2 * d)
        self.fc2 = torch.nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.tanh(self.fc1(self.norm(x))))


PATTERNS = ["plain", "twice", "ckpt", "ckpt_reentrant", "unused", "frozen", "buffers"]
"""The ways ``Toy`` can use its modules:

- ``twice``: one block applied twice per forward;
- ``ckpt`` / ``ckpt_reentrant``: every block under ``torch.utils.checkpoint``
  (non-reentrant, reentrant);
- ``unused``: a layer used only on even micro-steps (no gradient on the others);
- ``frozen``: the input layer has ``requires_grad=False``;
- ``buffers``: a BatchNorm (running statistics) before the head.
"""


class Toy(torch.nn.Module):
    """A small regression model whose forward follows one of ``PATTERNS``."""

    def __init__(self, pattern: str = "plain", d: int = 16, n: int = 3, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.pattern = pattern
        self.inp = torch.nn.Linear(8, d)
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(n))
        self.shared = Block(d)
        self.side = torch.nn.Linear(d, d)
        self.bn = torch.nn.BatchNorm1d(d) if pattern == "buffers" else None
        self.head = torch.nn.Linear(d, 1)
        if pattern == "frozen":
            self.inp.requires_grad_(False)
        self.calls = 0

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        h = self.inp(x)
        for b in self.blocks:
            if self.pattern.startswith("ckpt") and torch.is_grad_enabled():
                h = checkpoint(b, h, use_reentrant=self.pattern == "ckpt_reentrant")
            else:
                h = b(h)
        h = self.shared(h)
        if self.pattern == "twice":
            h = self.shared(h)
        if self.pattern != "unused" or self.calls % 2 == 0:
            h = h + self.side(h)
        if self.bn is not None:
            h = self.bn(h)
        self.calls += 1
        return ((self.head(h).squeeze(-1) - y) ** 2).mean()


def regression(steps: int, batch: int, seed: int = 1) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` global batches of ``(x, y)`` for ``Toy``, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 8, generator=g), torch.randn(batch, generator=g)) for _ in range(steps)]
