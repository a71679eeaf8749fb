"""transformers_logits.py — Hugging Face transformers as the reference for
Strait's GPT-2 files, with transformers' Flax GPT-2 on JAX's CPU backend
(it reads PyTorch-layout safetensors without torch).

  transformers_logits.py logits DIR IDS OUT
      load DIR (config.json, model.safetensors in PyTorch's layout: what
      `strait export --format hf` writes), run IDS (int32, one sequence)
      through it, write the logits (float32, T x vocab) to OUT
  transformers_logits.py make DIR VOCAB IDS OUT
      a random GPT-2 (2 layers, width 64, 2 heads, context 64, VOCAB tokens)
      made and saved by transformers itself (safetensors, its own layout),
      and its logits on IDS to OUT

Prints "ok T V".
"""
import sys

import numpy as np
from transformers import FlaxGPT2LMHeadModel, GPT2Config


def logits_of(model, ids_path, out):
    ids = np.fromfile(ids_path, dtype=np.int32)[None, :]
    logits = np.asarray(model(ids).logits, dtype=np.float32)[0]
    logits.tofile(out)
    print("ok %d %d" % logits.shape)


def main():
    if sys.argv[1] == "logits":
        d, ids_path, out = sys.argv[2:5]
        logits_of(FlaxGPT2LMHeadModel.from_pretrained(d, from_pt=True), ids_path, out)
    elif sys.argv[1] == "make":
        d, vocab, ids_path, out = sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=64, vocab_size=vocab)
        model = FlaxGPT2LMHeadModel(cfg, seed=7)
        model.save_pretrained(d, safe_serialization=True)
        logits_of(model, ids_path, out)
    else:
        sys.exit("usage: transformers_logits.py logits|make ...")


if __name__ == "__main__":
    main()
