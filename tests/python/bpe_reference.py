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
                             written to OUT/<i>.ids as little-endian uint32, and
                             tokenizers' decode of them to OUT/<i>.txt (UTF-8)
  gguf-lists GGUF OUT        the tokenizer.ggml.* lists of GGUF (read by the gguf
                             package) into OUT/lists.json, and tokenizers' own
                             tokenizer built from them into OUT/ref/tokenizer.json:
                             every token in model.vocab, the control ones also
                             special added tokens, pre_tokenizer by tokenizer.ggml.pre
                             as llama.cpp names it (smollm: Digits(individual_digits)
                             then ByteLevel with GPT-2's regex, as SmolLM2's
                             tokenizer.json has it)
  missing-json OUT UNK FUSE  a byte-level BPE without tokens for the bytes 0x04,
                             0x06, 0x13 and 0xf1, a few merges ("a b", "! ?",
                             "!? !", "<unk> !" when UNK is 1, fuse_unk FUSE)
                             into OUT/tokenizer.json
"""
import json
import os
import sys

import unicodedata

from tokenizers import AddedToken, ByteLevelBPETokenizer, Regex, Tokenizer, decoders, models, \
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
    vocab = tok.get_vocab()
    every_byte = all(c in vocab for c in byte_to_unicode().values())
    for i, f in enumerate(files):
        with open(f, encoding="utf-8") as fh:
            text = fh.read()
        ids = tok.encode(text).ids
        want = unicodedata.normalize("NFC", text) if tok.normalizer else text
        if every_byte and tok.decode(ids, skip_special_tokens=False) != want:
            sys.exit("tokenizers does not round-trip %s" % f)
        with open(os.path.join(out, "%d.ids" % i), "wb") as fh:
            fh.write(b"".join(x.to_bytes(4, "little") for x in ids))
        with open(os.path.join(out, "%d.txt" % i), "w", encoding="utf-8",
                  errors="surrogatepass") as fh:
            fh.write(tok.decode(ids, skip_special_tokens=False))
        total += len(ids)
    print("ok %d files %d tokens" % (len(files), total))


def byte_to_unicode():
    """GPT-2's bytes_to_unicode: byte -> character of its alphabet"""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) +
          list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def gguf_lists(path, out):
    import gguf  # the gguf package, only here
    r = gguf.GGUFReader(path)

    def val(key, default=None):
        f = r.fields.get(key)
        return f.contents() if f is not None else default

    tokens, types = val("tokenizer.ggml.tokens"), val("tokenizer.ggml.token_type")
    merges, pre = val("tokenizer.ggml.merges"), val("tokenizer.ggml.pre")
    lists = {"tokens": tokens, "types": types, "merges": merges, "pre": pre,
             "bos": val("tokenizer.ggml.bos_token_id", -1),
             "eos": val("tokenizer.ggml.eos_token_id", -1),
             "unk": val("tokenizer.ggml.unknown_token_id", -1),
             "pad": val("tokenizer.ggml.padding_token_id", -1),
             "chat_template": val("tokenizer.chat_template")}
    os.makedirs(os.path.join(out, "ref"), exist_ok=True)
    with open(os.path.join(out, "lists.json"), "w", encoding="utf-8") as fh:
        json.dump(lists, fh, ensure_ascii=False)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    stages = {"gpt2": byte_level,
              "smollm": pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 byte_level])}
    if pre not in stages:
        sys.exit("gguf-lists: no reference for tokenizer.ggml.pre %r" % pre)
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)},
                               [tuple(m.split(" ")) for m in merges]))
    tok.pre_tokenizer = stages[pre]
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True)
                            for i in range(len(tokens)) if types[i] == 3])
    tok.save(os.path.join(out, "ref", "tokenizer.json"))
    missing = [b for b, c in byte_to_unicode().items() if c not in tok.get_vocab()]
    print("ok %d tokens %d merges pre %s; no token for %d bytes: %s" % (
        len(tokens), len(merges), pre, len(missing), " ".join("%02x" % b for b in sorted(missing))))


def missing_json(out, unk, fuse):
    b2u = byte_to_unicode()
    vocab = {"<unk>": 0} if unk else {}
    for b in range(256):
        if b not in (0x04, 0x06, 0x13, 0xf1):
            vocab[b2u[b]] = len(vocab)
    pairs = [("a", "b"), ("!", "?"), ("!?", "!")] + ([("<unk>", "!")] if unk else [])
    for a, b in pairs:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, pairs, unk_token="<unk>" if unk else None, fuse_unk=fuse))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    print("ok vocab %d" % tok.get_vocab_size())


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
    elif cmd == "gguf-lists":
        gguf_lists(sys.argv[2], sys.argv[3])
    elif cmd == "missing-json":
        missing_json(sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1")
    else:
        sys.exit("usage: bpe_reference.py train|encode|train-json|encode-json|gguf-lists|missing-json ...")


if __name__ == "__main__":
    main()
