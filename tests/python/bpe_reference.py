"""bpe_reference.py — PyPI's `tokenizers` as the reference for Strait's BPE.

  train DIR MERGES FILE...   train a byte-level BPE (GPT-2's pre-tokenizer, no
                             normalizer) on FILEs, with MERGES merges and the
                             special token <|endoftext|>; save DIR/vocab.json and
                             DIR/merges.txt
  encode DIR OUT FILE...     encode each FILE (UTF-8) with DIR's files, written
                             to OUT/<i>.ids as little-endian uint16; print
                             "ok N files T tokens"
"""
import os
import sys

from tokenizers import ByteLevelBPETokenizer


def main():
    cmd = sys.argv[1]
    if cmd == "train":
        out, merges, files = sys.argv[2], int(sys.argv[3]), sys.argv[4:]
        tok = ByteLevelBPETokenizer()
        tok.train(files, vocab_size=256 + 1 + merges, min_frequency=2,
                  special_tokens=["<|endoftext|>"], show_progress=False)
        os.makedirs(out, exist_ok=True)
        tok.save_model(out)
        print("ok vocab %d" % tok.get_vocab_size())
    elif cmd == "encode":
        d, out, files = sys.argv[2], sys.argv[3], sys.argv[4:]
        tok = ByteLevelBPETokenizer(os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt"))
        os.makedirs(out, exist_ok=True)
        total = 0
        for i, f in enumerate(files):
            with open(f, encoding="utf-8") as fh:
                text = fh.read()
            ids = tok.encode(text).ids
            if tok.decode(ids) != text:
                sys.exit("tokenizers does not round-trip %s" % f)
            with open(os.path.join(out, "%d.ids" % i), "wb") as fh:
                fh.write(b"".join(x.to_bytes(2, "little") for x in ids))
            total += len(ids)
        print("ok %d files %d tokens" % (len(files), total))
    else:
        sys.exit("usage: bpe_reference.py train|encode ...")


if __name__ == "__main__":
    main()
