"""llama_hf_numpy.py — an independent Llama-family forward pass in numpy
(float64) over a Hugging Face folder in PyTorch's layout (config.json +
model.safetensors, as `strait export --format hf` writes it and
transformers' LlamaForCausalLM / Qwen2ForCausalLM read it): RMSNorm,
rotary embeddings on pairs (i, i + head_dim/2) with Llama 3's rope_scaling
(transformers' _compute_llama3_parameters), grouped-query attention,
SwiGLU, Qwen2's q/k/v biases, lm_head tied to embed_tokens or not.

    python llama_hf_numpy.py DIR IDS OUT

IDS is a file of int32 ids (one sequence); writes the logits (float32,
T x vocab) to OUT and prints "ok T V".
"""
import json
import math
import sys

import numpy as np
from safetensors.numpy import load_file


def inv_freq(cfg, hd):
    f = 1.0 / cfg.get("rope_theta", 10000.0) ** (np.arange(0, hd, 2) / hd)
    rs = cfg.get("rope_scaling")
    if rs:
        assert rs.get("rope_type", rs.get("type")) == "llama3"
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / f
        smooth = (old / wavelen - low) / (high - low)
        f = np.where(wavelen > old / low, f / factor,
                     np.where(wavelen < old / high, f, (1 - smooth) * f / factor + smooth * f))
    return f


def forward(cfg, w, ids):
    """logits (T x vocab, float32) of ids under config cfg and weights w
    (Hugging Face's names; any float type, computed in float64)"""
    T = len(ids)
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads", H)
    hd = cfg.get("head_dim", C // H)
    eps = cfg["rms_norm_eps"]
    qwen = cfg["model_type"] == "qwen2"

    def rms(x, name):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w[name]

    def lin(x, name, bias=False):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if bias else y

    ang = np.arange(T)[:, None] * inv_freq(cfg, hd)[None, :]  # (T, hd/2)
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(x):  # (heads, T, hd)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    x = w["model.embed_tokens.weight"][ids].astype(np.float64)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        h = rms(x, p + "input_layernorm.weight")
        q = lin(h, p + "self_attn.q_proj", qwen).reshape(T, H, hd).transpose(1, 0, 2)
        k = lin(h, p + "self_attn.k_proj", qwen).reshape(T, KV, hd).transpose(1, 0, 2)
        v = lin(h, p + "self_attn.v_proj", qwen).reshape(T, KV, hd).transpose(1, 0, 2)
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, H // KV, axis=0), np.repeat(v, H // KV, axis=0)
        att = q @ k.transpose(0, 2, 1) / math.sqrt(hd) + mask
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(1, 0, 2).reshape(T, H * hd)
        x = x + lin(y, p + "self_attn.o_proj")
        h = rms(x, p + "post_attention_layernorm.weight")
        g = lin(h, p + "mlp.gate_proj")
        x = x + lin(g / (1 + np.exp(-g)) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    x = rms(x, "model.norm.weight")
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return (x @ head.T).astype(np.float32)


def main():
    d, ids_path, out = sys.argv[1:4]
    ids = np.fromfile(ids_path, dtype=np.int32)
    cfg = json.load(open(d + "/config.json"))
    w = {k: v.astype(np.float64) for k, v in load_file(d + "/model.safetensors").items()}
    logits = forward(cfg, w, ids)
    logits.tofile(out)
    print("ok %d %d" % logits.shape)


if __name__ == "__main__":
    main()
