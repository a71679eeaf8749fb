"""gguf_transformers.py — transformers 5 (PyTorch, CPU) loads a GGUF that
`strait export --format gguf` wrote, through from_pretrained(gguf_file=):
its logits on IDS against Strait's, and its tokenizer from the same file.

    python gguf_transformers.py OUT.gguf IDS STRAIT_LOGITS

IDS: int32 ids (one sequence); STRAIT_LOGITS: float32, T x vocab (Strait's
model_next_logits for each prefix). Prints "max_diff D max_logit M" and the
ids transformers' tokenizer gives "Hello world 123" (needs accelerate).
"""
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    path, ids_path, logits_path = sys.argv[1:4]
    d, f = os.path.split(os.path.abspath(path))
    m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    ids = np.fromfile(ids_path, dtype=np.int32).astype(np.int64)
    with torch.no_grad():
        lg = m(torch.tensor(ids)[None]).logits[0].numpy()
    ours = np.fromfile(logits_path, dtype=np.float32).reshape(len(ids), -1)
    print("max_diff %.3g max_logit %.3g" % (np.abs(lg - ours).max(), np.abs(lg).max()))
    try:
        tk = AutoTokenizer.from_pretrained(d, gguf_file=f)
        print("tokenizer", tk.encode("Hello world 123"))
    except Exception as e:  # a GGUF written without --tokenizer has none
        print("tokenizer none (%s)" % type(e).__name__)


if __name__ == "__main__":
    main()
