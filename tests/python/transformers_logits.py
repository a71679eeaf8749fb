"""transformers_logits.py — Hugging Face transformers as the reference for
Strait's exported GPT-2: loads DIR (config.json, model.safetensors in
PyTorch's layout) with transformers' GPT-2 (its Flax implementation on JAX's
CPU backend, which reads the PyTorch-layout safetensors without torch),
runs IDS (int32, one sequence) through it, and writes the logits (float32,
T x vocab) to OUT; prints "ok T V".

  transformers_logits.py DIR IDS OUT
"""
import sys

import numpy as np
from transformers import FlaxGPT2LMHeadModel


def main():
    d, ids_path, out = sys.argv[1:4]
    ids = np.fromfile(ids_path, dtype=np.int32)[None, :]
    model = FlaxGPT2LMHeadModel.from_pretrained(d, from_pt=True)
    logits = np.asarray(model(ids).logits, dtype=np.float32)[0]
    logits.tofile(out)
    print("ok %d %d" % logits.shape)


if __name__ == "__main__":
    main()
