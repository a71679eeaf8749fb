"""torch_train.py — a full training step on transformers 5 + PyTorch (CPU),
eager or torch.compile'd, the peer of bench/train's whole-model rows, timed
the way bench/train times Strait's.

    python torch_train.py ARCH MODE PRECISION THREADS B T STEPS V C F L NH NKV HD EPS THETA TIED \
        [checkpointing]

ARCH gpt2 (GPT2LMHeadModel) or llama (LlamaForCausalLM) of that shape, random
weights, every dropout 0 (Strait has none), fp32 parameters; MODE eager or
compile (the forward and the loss as one torch.compile'd function, inductor's
C++ backend); PRECISION fp32, or bf16 (torch.autocast on the CPU: its matmuls,
attention's among them, in bf16 with bf16 activations between them;
parameters, gradients and AdamW in fp32 — near what Strait's --precision bf16
does, which keeps attention and the activations fp32). A full step as
Strait's trainer takes it: forward, cross-entropy on the next token in fp32,
backward, the gradients clipped to a global norm of 1 (foreach), AdamW
(fused, PyTorch's fastest on a CPU and the default optimizer of transformers'
Trainer; lr 1e-3, betas 0.9 and 0.95, eps 1e-8, weight decay 0.1 on the
matrices alone, as Strait decays them). With `checkpointing`, transformers'
gradient checkpointing (each block's forward run again in its backward), the
peer of Strait's --recompute. Ids follow bench/train's pattern. Three warm-up steps (the first compiles the forward, the first
backward the backward), then STEPS timed ones.

One JSON line: tokens per second over the timed steps, the process's peak RSS,
the last loss and the versions.
"""

import json
import os
import resource
import sys
import time


def main():
    a = sys.argv[1:]
    arch, mode, precision = a[0], a[1], a[2]
    threads, B, T, steps = (int(x) for x in a[3:7])
    V, C, F, L, NH, NKV, HD = (int(x) for x in a[7:14])
    eps, theta, tied = float(a[14]), float(a[15]), a[16] == "1"
    checkpointing = len(a) > 17 and a[17] == "checkpointing"
    if arch not in ("gpt2", "llama") or mode not in ("eager", "compile") or \
            precision not in ("fp32", "bf16"):
        sys.exit("torch_train.py: ARCH is gpt2 or llama, MODE eager or compile, "
                 "PRECISION fp32 or bf16")
    # inductor compiles its kernels in worker processes; on the threads given
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(threads))
    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(1)
    if arch == "gpt2":
        cfg = GPT2Config(n_layer=L, n_head=NH, n_embd=C, vocab_size=V, n_positions=1024,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         layer_norm_epsilon=eps)
        m = GPT2LMHeadModel(cfg)
    else:
        cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L,
                          num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HD,
                          max_position_embeddings=max(T, 2048), rms_norm_eps=eps,
                          rope_theta=theta, tie_word_embeddings=tied, attention_bias=False,
                          mlp_bias=False, attention_dropout=0.0)
        m = LlamaForCausalLM(cfg)
    if checkpointing:
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    m.train()
    groups = [{"params": [p for p in m.parameters() if p.ndim >= 2], "weight_decay": 0.1},
              {"params": [p for p in m.parameters() if p.ndim < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, fused=True)
    n = B * T
    ids = torch.tensor([(i * 31) % V for i in range(n)]).reshape(B, T)
    tg = torch.tensor([(i * 17 + 1) % V for i in range(n)]).reshape(B, T)

    def loss_of(ids, tg):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = m(input_ids=ids).logits
        return torch.nn.functional.cross_entropy(logits.float().reshape(-1, V), tg.reshape(-1))

    fn = torch.compile(loss_of) if mode == "compile" else loss_of
    t0 = 0.0
    for s in range(steps + 3):
        if s == 3:
            t0 = time.perf_counter()
        loss = fn(ids, tg)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
    secs = time.perf_counter() - t0
    print(json.dumps({
        "peer": "transformers %s on PyTorch %s (CPU), %s, %s%s" % (
            transformers.__version__, torch.__version__,
            "torch.compile (inductor)" if mode == "compile" else "eager",
            "bf16 autocast" if precision == "bf16" else "fp32",
            ", gradient checkpointing" if checkpointing else ""),
        "tokens_per_s": steps * n / secs,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "loss": loss.item(),
    }))


if __name__ == "__main__":
    main()
