"""check_safetensors.py CKPT RAW INDEX

Loads a Strait checkpoint with the reference `safetensors` package (PyPI)
and compares every tensor with the raw float32 parameters the test wrote
beside it (RAW, in table order; INDEX lists name, offset in floats, shape).
Prints "ok N tensors" and exits 0, or says which tensor differs and exits 1.
"""
import json
import sys

import numpy as np
from safetensors.numpy import load_file


def main():
    ckpt, raw_path, index_path = sys.argv[1:4]
    tensors = load_file(ckpt)
    raw = np.fromfile(raw_path, dtype="<f4")
    index = json.load(open(index_path))
    for entry in index:
        name, off, shape = entry["name"], entry["offset"], tuple(entry["shape"])
        if name not in tensors:
            print(f"missing tensor {name}")
            return 1
        t = tensors[name]
        want = raw[off:off + int(np.prod(shape))].reshape(shape)
        if t.dtype != np.float32 or t.shape != shape or not np.array_equal(t, want):
            print(f"tensor {name}: dtype {t.dtype} shape {t.shape} differs from {shape}")
            return 1
    extra = set(tensors) - {e["name"] for e in index}
    if extra:
        print(f"unexpected tensors {sorted(extra)[:3]}")
        return 1
    print(f"ok {len(index)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
