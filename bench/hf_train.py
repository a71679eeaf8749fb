"""hf_train.py — transformers' own GPT-2 trained on the CPU, timed for bench/train.

    python hf_train.py B T THREADS STEPS

transformers' FlaxGPT2LMHeadModel (GPT-2 124M's config: 12 layers, 12 heads,
768 wide, vocabulary 50257, context 1024; random weights, no dropout, fp32)
on JAX's CPU backend, pinned to THREADS cores, taking full training steps the
way bench/train times Strait's: forward, cross-entropy on the next token,
backward, gradients clipped to a global norm of 1, AdamW (lr 1e-3, betas 0.9
and 0.95, eps 1e-8, weight decay 0.1), one jitted function. The token ids
follow bench/train's pattern. Two warm-up steps (the first compiles), then
STEPS timed ones, each waited for.

One JSON line: tokens per second, seconds a step (the median, and the first
timed step apart), the process's peak RSS, and the versions.
"""

import json
import os
import resource
import statistics
import sys
import time


def main():
    B, T, threads, steps = (int(a) for a in sys.argv[1:5])
    # pinned before JAX starts its thread pools, which size themselves from
    # the cores this process may run on
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:threads]))
    import jax
    import jax.numpy as jnp
    import optax
    import transformers
    from transformers import FlaxGPT2LMHeadModel, GPT2Config

    cfg = GPT2Config(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024)
    model = FlaxGPT2LMHeadModel(cfg, input_shape=(B, T), seed=1, dtype=jnp.float32)
    V = cfg.vocab_size
    i = jnp.arange(B * T, dtype=jnp.int64 if jax.config.jax_enable_x64 else jnp.int32)
    inputs = ((i * 31) % V).reshape(B, T)
    targets = ((i * 17 + 1) % V).reshape(B, T)
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(1e-3, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1),
    )
    params = model.params
    opt = tx.init(params)

    def loss_fn(p):
        logits = model(inputs, params=p, train=False).logits
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    @jax.jit
    def step(p, o):
        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, o = tx.update(grads, o, p)
        return optax.apply_updates(p, updates), o, loss

    for _ in range(2):  # the first compiles
        params, opt, loss = step(params, opt)
        loss.block_until_ready()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        params, opt, loss = step(params, opt)
        loss.block_until_ready()
        times.append(time.perf_counter() - t0)
    rest = times[1:] or times
    print(
        json.dumps(
            {
                "peer": "transformers FlaxGPT2LMHeadModel",
                "tokens_per_s": B * T * len(times) / sum(times),
                "median_step_s": statistics.median(rest),
                "first_step_s": times[0],
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                "threads": len(os.sched_getaffinity(0)),
                "loss": float(loss),
                "versions": f"transformers {transformers.__version__}, jax {jax.__version__}, "
                f"optax {optax.__version__}",
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
