"""transformers_logits.py — Hugging Face transformers 5 with PyTorch (CPU)
as the reference for Strait's Hugging Face folders (make test-hf).

  transformers_logits.py logits DIR IDS OUT
      load DIR with AutoModelForCausalLM (float32: a BF16 or F16 file is
      widened exactly), run IDS (int32, one sequence) through it, write the
      logits (float32, T x vocab) to OUT
  transformers_logits.py make-gpt2|make-llama|make-llama3|make-qwen2 DIR VOCAB IDS OUT
      a random model of that family made and saved by transformers 5
      itself (save_pretrained: its safetensors and its config in the new
      form, rope_parameters and layer_types), and its logits on IDS to OUT;
      the Llama's folder gets a byte-level BPE tokenizer of VOCAB tokens
      trained by `tokenizers` and saved by transformers
  transformers_logits.py rounded F32DIR DIR DTYPE
      every tensor of DIR (bf16 or f16, sharded or not) is F32DIR's rounded
      by torch (to nearest, ties to even), bit for bit
  transformers_logits.py tokenizer DIR SRC
      AutoTokenizer loads DIR and encodes text as SRC's tokenizer does;
      DIR's generation_config.json has SRC's eos_token_id

Prints "ok ...".
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import (AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel,
                          LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config,
                          Qwen2ForCausalLM)

TEXT = ("The quick brown fox jumps over the lazy dog. Federated training keeps the data "
        "where it is: each site trains, the coordinator averages. 0123456789 ;:!? éà")


def logits_of(model, ids_path, out):
    ids = torch.tensor(list(memoryview(open(ids_path, "rb").read()).cast("i")))[None, :]
    with torch.no_grad():
        logits = model(ids).logits[0].to(torch.float32).numpy()
    logits.tofile(out)
    print("ok %d %d" % logits.shape)


def tokenizer_for(d, vocab):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                   eos_token="<|im_end|>")
    fast.save_pretrained(d)
    return fast


def make(kind, d, vocab, ids_path, out):
    torch.manual_seed(7)
    small = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab,
                 max_position_embeddings=64, rms_norm_eps=1e-5)
    if kind == "make-gpt2":
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=64,
                                           vocab_size=vocab))
    elif kind == "make-llama":  # SmolLM2's form: theta 100000, tied
        tok = tokenizer_for(d, vocab)
        model = LlamaForCausalLM(LlamaConfig(**small, tie_word_embeddings=True,
                                             bos_token_id=tok.bos_token_id,
                                             eos_token_id=tok.eos_token_id,
                                             rope_parameters={"rope_type": "default",
                                                              "rope_theta": 100000.0}))
    elif kind == "make-llama3":
        model = LlamaForCausalLM(LlamaConfig(**small, tie_word_embeddings=False, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16}))
    elif kind == "make-qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**small, tie_word_embeddings=False, rope_parameters={
            "rope_type": "default", "rope_theta": 1000000.0}))
    else:
        sys.exit("unknown kind %s" % kind)
    with torch.no_grad():  # larger than the 0.02 init, so the logits say something
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.eval().save_pretrained(d)
    cfg = json.load(open(os.path.join(d, "config.json")))
    if kind != "make-gpt2":
        assert "rope_parameters" in cfg and "rope_theta" not in cfg, cfg
    logits_of(model, ids_path, out)


def tensors(d):
    ix = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(ix))["weight_map"].values())) if os.path.exists(ix) \
        else ["model.safetensors"]
    out = {}
    for f in files:
        out.update(load_file(os.path.join(d, f)))
    return out


def rounded(f32dir, d, dtype):
    want = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    a, b = tensors(f32dir), tensors(d)
    assert a.keys() == b.keys(), (a.keys() ^ b.keys())
    for k in a:
        assert b[k].dtype == want, (k, b[k].dtype)
        assert torch.equal(a[k].to(want).view(torch.int16), b[k].view(torch.int16)), k
    cfg = json.load(open(os.path.join(d, "config.json")))
    assert cfg["torch_dtype"] == {"bf16": "bfloat16", "f16": "float16"}[dtype], cfg
    print("ok %d tensors" % len(a))


def tokenizer(d, src):
    ours, theirs = AutoTokenizer.from_pretrained(d), AutoTokenizer.from_pretrained(src)
    a, b = ours(TEXT)["input_ids"], theirs(TEXT)["input_ids"]
    assert a == b and len(a) > 10, (a, b)
    gen = json.load(open(os.path.join(d, "generation_config.json")))
    assert gen["eos_token_id"] == theirs.eos_token_id, (gen, theirs.eos_token_id)
    cfg = json.load(open(os.path.join(d, "config.json")))
    assert cfg["eos_token_id"] == theirs.eos_token_id, cfg
    print("ok %d ids, eos %d" % (len(a), gen["eos_token_id"]))


def main():
    cmd = sys.argv[1]
    if cmd == "logits":
        d, ids_path, out = sys.argv[2:5]
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        logits_of(model, ids_path, out)
    elif cmd.startswith("make-"):
        make(cmd, sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
    elif cmd == "rounded":
        rounded(*sys.argv[2:5])
    elif cmd == "tokenizer":
        tokenizer(*sys.argv[2:4])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
