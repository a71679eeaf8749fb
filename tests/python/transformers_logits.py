"""transformers_logits.py — Hugging Face transformers as the reference for
Strait's GPT-2 and Llama files, with transformers' Flax models on JAX's CPU
backend (they read PyTorch-layout safetensors without torch).

  transformers_logits.py logits DIR IDS OUT
      load DIR (config.json, model.safetensors in PyTorch's layout: what
      `strait export --format hf` writes), run IDS (int32, one sequence)
      through it, write the logits (float32, T x vocab) to OUT
  transformers_logits.py make-llama DIR VOCAB IDS OUT
      the same for a random Llama (2 layers, width 64, 4 heads sharing 2
      key/value heads, an untied lm_head), saved in Flax's layout
  transformers_logits.py make DIR VOCAB IDS OUT
      a random GPT-2 (2 layers, width 64, 2 heads, context 64, VOCAB tokens)
      made and saved by transformers itself (safetensors, its own layout),
      and its logits on IDS to OUT

Prints "ok T V".
"""
import sys

import numpy as np
from transformers import (FlaxAutoModelForCausalLM, FlaxGPT2LMHeadModel,
                          FlaxLlamaForCausalLM, GPT2Config, LlamaConfig)


def logits_of(model, ids_path, out):
    ids = np.fromfile(ids_path, dtype=np.int32)[None, :]
    logits = np.asarray(model(ids).logits, dtype=np.float32)[0]
    logits.tofile(out)
    print("ok %d %d" % logits.shape)


def main():
    if sys.argv[1] == "logits":
        d, ids_path, out = sys.argv[2:5]
        logits_of(FlaxAutoModelForCausalLM.from_pretrained(d, from_pt=True), ids_path, out)
    elif sys.argv[1] == "make":
        d, vocab, ids_path, out = sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=64, vocab_size=vocab)
        model = FlaxGPT2LMHeadModel(cfg, seed=7)
        model.save_pretrained(d, safe_serialization=True)
        logits_of(model, ids_path, out)
    elif sys.argv[1] == "make-llama":
        # transformers' Flax Llama computes rope with theta 10000 and no
        # rope_scaling (modeling_flax_llama.py): those are checked against
        # llama_hf_numpy.py in make test
        d, vocab, ids_path, out = sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
        cfg = LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab,
                          max_position_embeddings=64, tie_word_embeddings=False,
                          rms_norm_eps=1e-5)
        model = FlaxLlamaForCausalLM(cfg, seed=7)
        model.save_pretrained(d, safe_serialization=True)
        logits_of(model, ids_path, out)
    else:
        sys.exit("usage: transformers_logits.py logits|make|make-llama ...")


if __name__ == "__main__":
    main()
