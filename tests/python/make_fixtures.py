"""make_fixtures.py — how tests/fixtures/ was made, by the libraries
themselves (run once by hand; the files are committed, a few KB):

  PY4 make_fixtures.py configs 4 OUT    transformers 4.46.3's config.json
  PY5 make_fixtures.py configs 5 OUT    transformers 5.25's
      of a tiny Llama (SmolLM2's rope_theta 100000, tied), a Llama 3
      (rope_scaling llama3), a Qwen2 and a GPT-2, each model saved by
      save_pretrained: OUT/{llama,llama3,qwen2,gpt2}-transformers{4,5}.json
  PY4 make_fixtures.py model OUT
      a random tiny Llama saved by transformers 4 (BF16 tensors, its config
      in transformers 4's form) and reference.json: token ids and the
      logits transformers 4 computed for them in fp32 from the same
      (bf16-exact) weights.
"""
import json
import os
import shutil
import sys
import tempfile

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

LLAMA = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1, vocab_size=64, max_position_embeddings=32, rms_norm_eps=1e-5)


def saved_config(model, out):
    d = tempfile.mkdtemp()
    model.save_pretrained(d)
    shutil.copy(os.path.join(d, "config.json"), out)
    shutil.rmtree(d)


def rope(major, theta, scaling=None):
    if major == 5:
        p = {"rope_type": "default", "rope_theta": theta}
        if scaling:
            p.update(scaling)
        return {"rope_parameters": p}
    return {"rope_theta": theta, "rope_scaling": scaling}


def configs(major, out):
    torch.manual_seed(0)
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    made = {
        "llama": LlamaForCausalLM(LlamaConfig(**LLAMA, tie_word_embeddings=True,
                                              **rope(major, 100000.0))),
        "llama3": LlamaForCausalLM(LlamaConfig(**LLAMA, **rope(major, 500000.0, llama3))),
        "qwen2": Qwen2ForCausalLM(Qwen2Config(**LLAMA, **rope(major, 1000000.0))),
        "gpt2": GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=32,
                                           vocab_size=64)),
    }
    for name, model in made.items():
        saved_config(model, os.path.join(out, "%s-transformers%d.json" % (name, major)))


def model(out):
    torch.manual_seed(3)
    cfg = LlamaConfig(**LLAMA, tie_word_embeddings=True, rope_theta=100000.0)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # weights bf16 can hold exactly, so the file holds them
        for p in m.parameters():
            p.copy_(p.normal_(0, 0.3).to(torch.bfloat16).to(torch.float32))
    ids = [(i * 37 + 5) % LLAMA["vocab_size"] for i in range(12)]
    with torch.no_grad():
        logits = m(torch.tensor([ids])).logits[0].to(torch.float32)
    m.to(torch.bfloat16).save_pretrained(out)
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump({"made_by": "transformers %s, torch %s, fp32" % (
            __import__("transformers").__version__, torch.__version__),
            "ids": ids, "logits": [[float("%.8g" % v) for v in row] for row in logits.tolist()]},
            f, indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "configs":
        configs(int(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "model":
        model(sys.argv[2])
    else:
        sys.exit(__doc__)
