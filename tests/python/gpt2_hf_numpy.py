"""gpt2_hf_numpy.py — an independent GPT-2 forward pass in numpy over a
Hugging Face GPT-2 folder (config.json + model.safetensors, as `strait
export --format hf` writes it and transformers' GPT2LMHeadModel reads it):
names with the "transformer." prefix, Conv1D weights [in, out], fused
c_attn, lm_head tied to wte, gelu_new, LayerNorm epsilon from the config.

    python gpt2_hf_numpy.py DIR B T INPUTS TARGETS

INPUTS and TARGETS are comma-separated token ids (B*T each); prints the
mean cross-entropy loss over them.
"""
import json
import sys

import numpy as np
from safetensors.numpy import load_file


def main():
    d, B, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    inputs = np.array([int(x) for x in sys.argv[4].split(",")]).reshape(B, T)
    targets = np.array([int(x) for x in sys.argv[5].split(",")]).reshape(B, T)
    cfg = json.load(open(d + "/config.json"))
    w = {k.removeprefix("transformer."): v.astype(np.float64)
         for k, v in load_file(d + "/model.safetensors").items()}
    C, H, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    assert cfg["activation_function"] == "gelu_new" and cfg["tie_word_embeddings"]

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[p + ".weight"] + w[p + ".bias"]

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

    x = w["wte.weight"][inputs] + w["wpe.weight"][:T]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(cfg["n_layer"]):
        p = "h.%d." % l
        h = ln(x, p + "ln_1") @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = np.split(h, 3, axis=-1)
        split = lambda t: t.reshape(B, T, H, C // H).transpose(0, 2, 1, 3)
        q, k, v = split(q), split(k), split(v)
        att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(C // H) + mask
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = gelu(ln(x, p + "ln_2") @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    logits = ln(x, "ln_f") @ w["wte.weight"].T
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    loss = -np.take_along_axis(logp, targets[..., None], -1).mean()
    print("loss %.8f" % loss)


if __name__ == "__main__":
    main()
