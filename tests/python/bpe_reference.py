"""bpe_reference.py — PyPI's `tokenizers` as the reference for Strait's BPE.

  train DIR MERGES FILE...   train a byte-level BPE (GPT-2's pre-tokenizer, no
                             normalizer) on FILEs, with MERGES merges and the
                             special token <|endoftext|>; save DIR/vocab.json and
                             DIR/merges.txt
  encode DIR OUT FILE...     encode each FILE (UTF-8) with DIR's files, written
                             to OUT/<i>.ids as little-endian uint16; print
                             "ok N files T tokens"
  train-json OUT STYLE MERGES FILE...
                             a tokenizer.json as Hugging Face's models carry
                             it: STYLE gpt2 (ByteLevel's regex, <|endoftext|>),
                             llama3 (Llama 3's Split regex, ignore_merges,
                             <|begin_of_text|> and <|end_of_text|>), qwen2
                             (Qwen2's Split regex and NFC normalizer, <|endoftext|>,
                             <|im_start|>, <|im_end|>, every id moved up by 70000
                             so they pass 65535 as Qwen2's 151 646 do)
  encode-json JSON OUT FILE...
                             encode each FILE with tokenizer.json JSON, special
                             tokens in the text encoded as text (Strait's rule),
                             written to OUT/<i>.ids as little-endian uint32
"""
import json
import os
import sys

import unicodedata

from tokenizers import ByteLevelBPETokenizer, Regex, Tokenizer, decoders, models, \
    normalizers, pre_tokenizers, trainers

# the pre-tokenization patterns of Llama 3's and Qwen2's tokenizer.json
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = {"gpt2": ["<|endoftext|>"], "llama3": ["<|begin_of_text|>", "<|end_of_text|>"],
            "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]}


def train_json(out, style, merges, files):
    tok = Tokenizer(models.BPE(ignore_merges=style == "llama3"))
    if style == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3 if style == "llama3" else QWEN2),
                                 behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    if style == "qwen2":
        tok.normalizer = normalizers.NFC()
    specials = SPECIALS[style]
    trainer = trainers.BpeTrainer(vocab_size=256 + merges + len(specials), min_frequency=2,
                                  special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(files, trainer)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "tokenizer.json")
    tok.save(path)
    if style == "qwen2":
        j = json.load(open(path))
        j["model"]["vocab"] = {k: v + 70000 for k, v in j["model"]["vocab"].items()}
        for a in j["added_tokens"]:
            a["id"] += 70000
        json.dump(j, open(path, "w"), ensure_ascii=False)
    print("ok vocab %d" % Tokenizer.from_file(path).get_vocab_size())


def encode_json(path, out, files):
    tok = Tokenizer.from_file(path)
    tok.encode_special_tokens = True
    os.makedirs(out, exist_ok=True)
    total = 0
    for i, f in enumerate(files):
        with open(f, encoding="utf-8") as fh:
            text = fh.read()
        ids = tok.encode(text).ids
        want = unicodedata.normalize("NFC", text) if tok.normalizer else text
        if tok.decode(ids, skip_special_tokens=False) != want:
            sys.exit("tokenizers does not round-trip %s" % f)
        with open(os.path.join(out, "%d.ids" % i), "wb") as fh:
            fh.write(b"".join(x.to_bytes(4, "little") for x in ids))
        total += len(ids)
    print("ok %d files %d tokens" % (len(files), total))


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
    elif cmd == "train-json":
        train_json(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:])
    elif cmd == "encode-json":
        encode_json(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        sys.exit("usage: bpe_reference.py train|encode|train-json|encode-json ...")


if __name__ == "__main__":
    main()
