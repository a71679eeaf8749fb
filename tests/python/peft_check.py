"""peft_check.py — PEFT (with transformers 5 and PyTorch on the CPU) as the
reference for Strait's LoRA adapter folders (make test-hf).

  peft_check.py load BASE ADAPTER IDS LOGITS
      transformers loads BASE (a Hugging Face folder, float32) and
      PeftModel.from_pretrained puts ADAPTER (Strait's --format peft) over
      it, checking every lora_A and lora_B of the file was loaded; runs IDS
      (int32, one sequence) and prints "ok max_diff D base_diff E": D the
      largest difference from LOGITS (float32, T x vocab: Strait's), E the
      largest between the adapted model's logits and the base's alone (the
      adapter changed something)
  peft_check.py make BASE ADAPTER IDS OUT
      PEFT makes an adapter over BASE (LoraConfig r=4, lora_alpha=8,
      q_proj and v_proj), trains it a few Adam steps on random tokens so
      that A and B are PEFT's own and B is nonzero, saves it to ADAPTER
      (save_pretrained) and writes its logits on IDS (float32) to OUT;
      prints "ok T V"
"""
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def ids_of(path):
    return torch.tensor(list(memoryview(open(path, "rb").read()).cast("i")))[None, :]


def base_of(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def load(base, adapter, ids_path, strait_path):
    ids = ids_of(ids_path)
    model = base_of(base)
    with torch.no_grad():
        plain = model(ids).logits[0]
    peft = PeftModel.from_pretrained(model, adapter).eval()
    # every tensor of the file is one the model holds, with its values
    state = peft.state_dict()
    saved = load_file(adapter + "/adapter_model.safetensors")
    assert saved, "no tensors in the adapter"
    for name, t in saved.items():
        assert name.endswith((".lora_A.weight", ".lora_B.weight")), name
        held = name.replace(".lora_A.weight", ".lora_A.default.weight").replace(
            ".lora_B.weight", ".lora_B.default.weight")
        assert held in state, "PEFT did not load %s" % name
        assert torch.equal(state[held], t), "%s differs once loaded" % name
    with torch.no_grad():
        logits = peft(ids).logits[0].to(torch.float32)
    theirs = torch.frombuffer(bytearray(open(strait_path, "rb").read()),
                              dtype=torch.float32).reshape(logits.shape)
    print("ok max_diff %.3g base_diff %.3g" % ((logits - theirs).abs().max().item(),
                                              (logits - plain).abs().max().item()))


def make(base, adapter, ids_path, out):
    torch.manual_seed(11)
    model = base_of(base)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                        lora_dropout=0.0, task_type="CAUSAL_LM")
    peft = get_peft_model(model, config)
    opt = torch.optim.Adam([p for p in peft.parameters() if p.requires_grad], lr=1e-2)
    vocab = model.config.vocab_size
    for _ in range(3):
        batch = torch.randint(0, vocab, (2, 16))
        loss = peft(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    peft.eval()
    nonzero = [n for n, p in peft.named_parameters() if "lora_B" in n and p.abs().max() > 0]
    assert nonzero, "training left every lora_B zero"
    peft.save_pretrained(adapter)
    with torch.no_grad():
        logits = peft(ids_of(ids_path)).logits[0].to(torch.float32).numpy()
    logits.tofile(out)
    print("ok %d %d" % logits.shape)


def main():
    cmd = sys.argv[1]
    if cmd == "load":
        load(*sys.argv[2:6])
    elif cmd == "make":
        make(*sys.argv[2:6])
    else:
        sys.exit("usage: peft_check.py load|make BASE ADAPTER IDS FILE")


if __name__ == "__main__":
    main()
