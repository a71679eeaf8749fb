"""peft_train.py — PEFT's LoRA on transformers + PyTorch (CPU), the peer of
bench/train's LoRA rows, timed the way bench/train times Strait's.

    python peft_train.py THREADS RANK B T STEPS V C F L NH NKV HD EPS THETA TIED

A LlamaForCausalLM of that shape (random weights, as bench/train's; the
rotary scaling left out: it costs nothing a step) held in bf16, PEFT
adapters of RANK and alpha 2 x RANK on q_proj and v_proj (PEFT keeps them
in fp32 over the bf16 base), no dropout; AdamW (lr 1e-4) on the adapters;
cross-entropy in fp32 on the next token; ids following bench/train's
pattern. Two warm-up steps, then STEPS timed ones.

One JSON line: tokens per second over the timed steps, the process's peak
RSS, the adapters' trainable count and the versions.
"""

import json
import resource
import sys
import time

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    a = sys.argv[1:]
    threads, rank, B, T, steps = (int(x) for x in a[0:5])
    V, C, F, L, NH, NKV, HD = (int(x) for x in a[5:12])
    eps, theta, tied = float(a[12]), float(a[13]), a[14] == "1"
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L,
                      num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HD,
                      max_position_embeddings=max(T, 2048), rms_norm_eps=eps, rope_theta=theta,
                      tie_word_embeddings=tied, attention_bias=False, mlp_bias=False)
    m = LlamaForCausalLM(cfg).to(torch.bfloat16)
    m = get_peft_model(m, LoraConfig(r=rank, lora_alpha=2 * rank,
                                     target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
    n = B * T
    ids = torch.tensor([(i * 31) % V for i in range(n)]).reshape(B, T)
    tg = torch.tensor([(i * 17 + 1) % V for i in range(n)]).reshape(B, T)
    t0 = 0.0
    for s in range(steps + 2):
        if s == 2:
            t0 = time.perf_counter()
        logits = m(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V), tg.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
    secs = time.perf_counter() - t0
    print(json.dumps({
        "peer": "PEFT %s LoRA on transformers %s, PyTorch %s (CPU)" % (
            peft.__version__, transformers.__version__, torch.__version__),
        "tokens_per_s": steps * n / secs,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "trainable": sum(p.numel() for p in m.parameters() if p.requires_grad),
        "loss": loss.item(),
    }))


if __name__ == "__main__":
    main()
