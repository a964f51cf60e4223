"""Builds the model DeepSpeed-Chat fine-tunes here, offline, into the folder given
(``python make_tiny_model.py FOLDER``): a tiny OPT (``OPTForCausalLM``, width 64, 2 layers,
4 heads, dropout 0.1, so torch's random stream shows in every loss) from a fixed seed, and
a GPT-2 byte-level BPE tokenizer (OPT's kind: ``vocab.json`` and ``merges.txt``) of 300
tokens learned from ``data/``. The model's vocabulary (296) is smaller than the tokenizer's
and not a multiple of 8, so DeepSpeed-Chat's ``resize_token_embeddings(8 *
ceil(len(tokenizer) / 8))`` grows the embeddings to 304, as it does for a real model."""

import json
import os
import sys
import tempfile

import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import GPT2Tokenizer, OPTConfig, OPTForCausalLM

TOKENS = 300
"""The tokenizer's size (its end-of-text token included)."""
VOCAB = 296
"""The model's vocabulary before DeepSpeed-Chat resizes it."""
EOT = "<|endoftext|>"


def texts() -> list:
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
    out = []
    for name in ("train.json", "eval.json"):
        with open(os.path.join(here, name), encoding="utf-8") as f:
            out += [v for line in f for v in json.loads(line).values()]
    return out


def main(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts(), vocab_size=TOKENS, min_frequency=1, special_tokens=[EOT], show_progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        bpe.save_model(tmp)
        tok = GPT2Tokenizer(vocab_file=os.path.join(tmp, "vocab.json"), merges_file=os.path.join(tmp, "merges.txt"),
                            eos_token=EOT, bos_token=EOT, unk_token=EOT)
        tok.save_pretrained(folder)
        # The tokenizer files themselves, as OPT's repository has them (transformers 5's
        # save_vocabulary, which DeepSpeed-Chat's save_hf_format calls, needs them), in place
        # of the tokenizer.json transformers 5.23 writes for this slow tokenizer, which maps
        # every text to token 0.
        os.remove(os.path.join(folder, "tokenizer.json"))
        for name in ("vocab.json", "merges.txt"):
            with open(os.path.join(tmp, name), "rb") as src, open(os.path.join(folder, name), "wb") as dst:
                dst.write(src.read())
    eot = bpe.token_to_id(EOT)
    torch.manual_seed(0)
    config = OPTConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
                       max_position_embeddings=64, word_embed_proj_dim=64, dropout=0.1, attention_dropout=0.1,
                       pad_token_id=eot, bos_token_id=eot, eos_token_id=eot)
    OPTForCausalLM(config).save_pretrained(folder)


if __name__ == "__main__":
    main(sys.argv[1])
