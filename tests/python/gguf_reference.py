"""gguf_reference.py — the PyPI gguf package as the reference for Strait's
GGUF reader, dequantizers and importer (tests/integration/test_gguf.c).

    python gguf_reference.py blocks OUT.gguf
        random blocks of every type Strait decodes (f16 scales drawn as
        finite values), each tensor "<TYPE>" beside "<TYPE>.ref": its values
        as gguf.quants.dequantize gives them, in F32.
    python gguf_reference.py model GGUF TEXT N T OUTDIR
        the GGUF's tokenizer rebuilt in PyPI `tokenizers` (byte-level BPE
        from tokenizer.ggml.tokens/merges, digits split one by one as
        SmolLM2's pre-tokenizer does); the first N*T+1 ids of TEXT written
        as OUTDIR/tokens.bin (llm.c's shard, version 1); the model
        dequantized by the gguf package, llama.cpp's q/k row interleaving
        undone here (numpy reshape, independently of Strait), run by
        llama_hf_numpy.forward; prints "loss L" (the mean cross-entropy of
        the N windows of T) and "greedy id id ..." (8 greedy tokens after
        the first 12 ids).
    python gguf_reference.py quantized F32.gguf OTHER.gguf
        every tensor of OTHER that is not F32 has the bytes
        gguf.quants.quantize makes of F32's tensor of the same name; prints
        "same N".
    python gguf_reference.py read GGUF
        prints every key and tensor (name, type, shape, float64 sum of its
        dequantized values) as the gguf package's GGUFReader sees them.
    python gguf_reference.py sizes
        every type the package defines: "type NAME NUMBER BLOCK BYTES".
    python gguf_reference.py tokenizer_keys SRC.gguf OUT.gguf
        every tokenizer.* key of SRC is in OUT with the same value types
        and value; prints "same N".
    python gguf_reference.py permute HFDIR OUT.gguf
        the q and k weights of the Hugging Face folder (F32) put through
        convert_hf_to_gguf.py's LlamaModel.permute (written here from its
        definition) equal OUT's blk.*.attn_q/attn_k rows; prints "same N".
"""
import sys

import numpy as np
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType as Q
from gguf.quants import dequantize

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
# bytes of a block, and where its f16 scales sit
GEOM = {"Q8_0": (34, [0]), "Q4_0": (18, [0]), "Q4_1": (20, [0, 2]), "Q5_0": (22, [0]),
        "Q5_1": (24, [0, 2]), "Q4_K": (144, [0, 2]), "Q5_K": (176, [0, 2]),
        "Q6_K": (210, [208])}


def blocks(out):
    rng = np.random.default_rng(7)
    w = GGUFWriter(out, "llama")
    w.add_tokenizer_model("llama")  # SentencePiece: Strait refuses it by name
    for name in TYPES:
        qt = Q[name]
        if name in ("F32", "F16", "BF16"):
            x = rng.standard_normal(512).astype(np.float32)
            raw = {"F32": x, "F16": x.astype(np.float16)}.get(name)
            if raw is None:
                raw = (x.view(np.uint32) >> 16).astype(np.uint16)
            data = raw.view(np.uint8).reshape(1, -1)
            shape = [512]
        else:
            size, scales = GEOM[name]
            n_blocks = 24
            data = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
            for off in scales:  # finite f16 scales of either sign
                s = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
                data[:, off:off + 2] = s.view(np.uint8).reshape(n_blocks, 2)
            block = 256 if name.endswith("_K") else 32
            shape = [n_blocks * block]
        w.add_tensor(name, data.reshape(-1), raw_shape=data.reshape(-1).shape, raw_dtype=qt)
        ref = dequantize(data.reshape(-1), qt).astype(np.float32).reshape(shape)
        w.add_tensor(name + ".ref", ref)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("ok")


def field(r, key):
    return r.fields[key].contents()


def tokenizer_of(r):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    toks = field(r, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in field(r, "tokenizer.ggml.merges")]
    bpe = models.BPE({t: i for i, t in enumerate(toks)}, merges)
    tk = Tokenizer(bpe)
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tk.decoder = decoders.ByteLevel()
    return tk


def unpermute(w, n_head):
    """llama.cpp's converter wrote rows (head, pair index, half); back to
    (head, half, pair index) as Hugging Face holds them."""
    rows = w.shape[0]
    hd = rows // n_head
    return w.reshape(n_head, hd // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def model(path, text_path, n, T, outdir):
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from llama_hf_numpy import forward
    r = GGUFReader(path)
    arch = field(r, "general.architecture")
    g = lambda k: field(r, arch + "." + k)
    H, KV = g("attention.head_count"), g("attention.head_count_kv")
    cfg = {"hidden_size": g("embedding_length"), "num_attention_heads": H,
           "num_key_value_heads": KV, "rms_norm_eps": g("attention.layer_norm_rms_epsilon"),
           "rope_theta": g("rope.freq_base"), "num_hidden_layers": g("block_count"),
           "model_type": arch}
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight":
             "model.norm.weight", "output.weight": "lm_head.weight"}
    per = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
           "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
           "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
           "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    w = {}
    for t in r.tensors:
        x = dequantize(t.data, t.tensor_type).astype(np.float32)
        x = x.reshape([int(d) for d in reversed(t.shape)])
        if t.name in names:
            w[names[t.name]] = x
            continue
        _, l, kind, end = t.name.split(".")
        if arch == "llama" and kind in ("attn_q", "attn_k"):
            x = unpermute(x, H if kind == "attn_q" else KV)
        w["model.layers.%s.%s.%s" % (l, per[kind], end)] = x
    cfg["tie_word_embeddings"] = "lm_head.weight" not in w
    tk = tokenizer_of(r)
    ids = np.array(tk.encode(open(text_path, encoding="utf-8", errors="replace").read()).ids,
                   dtype=np.int64)
    need = n * T + 1
    assert len(ids) >= need, "the text is too short"
    ids = ids[:need]
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, need]
    with open(outdir + "/tokens.bin", "wb") as f:
        f.write(header.tobytes())
        f.write(ids.astype(np.uint16).tobytes())
    losses = []
    for k in range(n):
        x = ids[k * T:(k + 1) * T]
        y = ids[k * T + 1:(k + 1) * T + 1]
        lg = forward(cfg, w, x).astype(np.float64)
        m = lg.max(-1, keepdims=True)
        lse = (m + np.log(np.exp(lg - m).sum(-1, keepdims=True)))[:, 0]
        losses.append((lse - lg[np.arange(T), y]).mean())
    print("loss %.8f" % np.mean(losses))
    ctx = list(ids[:12])
    out = []
    for _ in range(8):
        nxt = int(np.argmax(forward(cfg, w, np.array(ctx))[-1]))
        out.append(nxt)
        ctx.append(nxt)
    print("greedy " + " ".join(map(str, out)))


def quantized(f32_path, other_path):
    from gguf.quants import quantize
    ref = {t.name: t for t in GGUFReader(f32_path).tensors}
    n = 0
    for t in GGUFReader(other_path).tensors:
        if t.tensor_type == Q.F32:
            continue
        x = np.asarray(ref[t.name].data, dtype=np.float32)
        want = quantize(x, t.tensor_type).view(np.uint8).reshape(-1)
        got = np.asarray(t.data).view(np.uint8).reshape(-1)
        assert want.shape == got.shape and (want == got).all(), \
            "%s: %d of %d bytes differ" % (t.name, (want != got).sum(), want.size)
        n += 1
    print("same %d" % n)


def read(path):
    r = GGUFReader(path)
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        v = f.contents()
        if isinstance(v, list):
            v = "%d items, first %r" % (len(v), v[0] if v else None)
        print("key %s %s" % (k, v))
    for t in r.tensors:
        x = dequantize(t.data, t.tensor_type).astype(np.float64)
        print("tensor %s %s %s %.6f" % (t.name, t.tensor_type.name,
                                        "x".join(str(int(d)) for d in t.shape), x.sum()))


def sizes():
    from gguf.constants import GGML_QUANT_SIZES
    for t, (block, size) in GGML_QUANT_SIZES.items():
        print("type %s %d %d %d" % (t.name, t.value, block, size))


def tokenizer_keys(src_path, out_path):
    src, out = GGUFReader(src_path), GGUFReader(out_path)
    n = 0
    for k, f in src.fields.items():
        if not k.startswith("tokenizer."):
            continue
        assert k in out.fields, "%s is missing" % k
        g = out.fields[k]
        assert f.types == g.types, "%s: types %s, the source's %s" % (k, g.types, f.types)
        assert f.contents() == g.contents(), "%s differs" % k
        n += 1
    print("same %d" % n)


def llama_permute(weights, n_head, n_head_kv):
    """LlamaModel.permute: each head's rows as (2 halves, HD/2 pairs), the
    two axes swapped."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def permute(hf_dir, out_path):
    import json
    from safetensors.numpy import load_file
    cfg = json.load(open(hf_dir + "/config.json"))
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    assert KV < H, "the check wants grouped-query attention"
    hf = load_file(hf_dir + "/model.safetensors")
    gg = {t.name: t for t in GGUFReader(out_path).tensors}
    n = 0
    for l in range(cfg["num_hidden_layers"]):
        for proj, kind, heads in (("q_proj", "attn_q", H), ("k_proj", "attn_k", KV)):
            w = hf["model.layers.%d.self_attn.%s.weight" % (l, proj)].astype(np.float32)
            t = gg["blk.%d.%s.weight" % (l, kind)]
            assert t.tensor_type == Q.F32
            got = np.asarray(t.data, dtype=np.float32).reshape(w.shape)
            want = llama_permute(w, H, heads)
            assert (got == want).all(), "blk.%d.%s: %d rows differ" % (
                l, kind, (got != want).any(axis=1).sum())
            assert not (got == w).all(), "blk.%d.%s: not permuted at all" % (l, kind)
            n += 1
    print("same %d" % n)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "blocks":
        blocks(sys.argv[2])
    elif cmd == "model":
        model(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    elif cmd == "quantized":
        quantized(sys.argv[2], sys.argv[3])
    elif cmd == "sizes":
        sizes()
    elif cmd == "tokenizer_keys":
        tokenizer_keys(sys.argv[2], sys.argv[3])
    elif cmd == "permute":
        permute(sys.argv[2], sys.argv[3])
    else:
        read(sys.argv[2])
