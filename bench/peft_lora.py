# PEFT's LoRA on PyTorch (CPU), the baseline of docs/benchmarks.md's LoRA
# figures: a Hugging Face folder (argv[1]; SmolLM2-135M as `strait export
# FILE.gguf --format hf` writes it, f32), r 8, alpha 16, q and v, batch 4 x
# 128 of random ids, AdamW, argv[2] threads, the base in argv[3]'s dtype
# (f32, the default, or bf16: PEFT keeps the adapters in fp32 over it);
# tokens/s over all 10 steps
# (strait train's window) and over steps 3..10 (warm), and peak RSS. Run
# with build/venv-hf's python (make test-hf makes it: transformers, torch,
# peft).
import sys, time, resource, torch
from transformers import AutoModelForCausalLM
from peft import LoraConfig, get_peft_model
torch.set_num_threads(int(sys.argv[2]))
dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[sys.argv[3] if len(sys.argv) > 3 else "f32"]
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=dtype)
m = get_peft_model(m, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
g = torch.Generator().manual_seed(1)
ids = torch.randint(0, 49152, (4, 129), generator=g)
times = []
for s in range(10):
    t = time.perf_counter()
    logits = m(input_ids=ids[:, :128]).logits
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward(); opt.step(); opt.zero_grad()
    times.append(time.perf_counter() - t)
warm = times[2:]
# all 10 steps: the window strait train's tokens_per_s counts; and warm
print("peft tok/s %.0f (steps 1-10, as strait train counts), %.0f (steps 3-10), peak RSS %.0f MB, trainable %d" % (4 * 128 * len(times) / sum(times), 4 * 128 * len(warm) / sum(warm), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, sum(p.numel() for p in m.parameters() if p.requires_grad)))
