/*
 * gguf.h — GGUF, llama.cpp's model file (versions 2 and 3): a reader over
 * a mapped file (kernels/gguf.c), ggml's tensor types and their
 * dequantization to fp32 (kernels/gguf_quant.c), the model in from a GGUF
 * and out to one (kernels/gguf_model.c).
 *
 * The reader trusts nothing: the header's counts, every string's length,
 * every array's length and element type, every tensor's dimensions, type
 * and offset are checked before use (overflow-safe; a tensor's bytes whole
 * inside the data section, aligned to general.alignment, no two
 * overlapping; keys and tensor names unique, no NUL inside). A Gguf holds
 * the mapping: tensor data pointers live as long as it.
 */
#ifndef STRAIT_KERNELS_GGUF_H
#define STRAIT_KERNELS_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/model.h"
#include "kernels/tokenizer.h"

/* ggml's tensor types Strait decodes (the rest are named in errors) */
enum {
    GGML_F32 = 0,
    GGML_F16 = 1,
    GGML_Q4_0 = 2,
    GGML_Q4_1 = 3,
    GGML_Q5_0 = 6,
    GGML_Q5_1 = 7,
    GGML_Q8_0 = 8,
    GGML_Q4_K = 12,
    GGML_Q5_K = 13,
    GGML_Q6_K = 14,
    GGML_BF16 = 30,
};

/* GGUF's metadata value types */
enum {
    GGUF_U8,
    GGUF_I8,
    GGUF_U16,
    GGUF_I16,
    GGUF_U32,
    GGUF_I32,
    GGUF_F32,
    GGUF_BOOL,
    GGUF_STRING,
    GGUF_ARRAY,
    GGUF_U64,
    GGUF_I64,
    GGUF_F64,
    GGUF_NTYPES
};

#define GGUF_MAX_DIMS 4

typedef struct GgufTensor {
    char *name; /* owned by the Gguf */
    int n_dims;
    uint64_t
        ne[GGUF_MAX_DIMS]; /* ne[0] varies fastest: a matrix [in, out] is PyTorch's [out, in] */
    uint32_t type;         /* GGML_* */
    uint64_t n_elems, n_bytes;
    uint64_t offset;     /* from the start of the data section */
    const uint8_t *data; /* inside the mapping */
} GgufTensor;

typedef struct Gguf Gguf;

/* Maps and parses path; NULL with err naming the file and the problem. */
Gguf *gguf_open(const char *path, char *err);
/* The same over bytes the caller keeps alive (what the fuzz target drives);
 * name is what messages call it. */
Gguf *gguf_parse(const uint8_t *data, size_t len, const char *name, char *err);
void gguf_close(Gguf *g);
/* A mapped file's pages out of this process's memory (read again from the
 * page cache at the next touch): after a load that keeps the file open. */
void gguf_drop_pages(const Gguf *g);
const char *gguf_name(const Gguf *g);
/* A name from a file as a message shows it: bytes outside printable ASCII
 * (and the backslash) as \xNN, at most GGUF_SHOWN_MAX bytes then "...";
 * buf holds GGUF_SHOWN. Returns buf. */
#define GGUF_SHOWN_MAX 80
#define GGUF_SHOWN     (GGUF_SHOWN_MAX * 4 + 4)
const char *gguf_shown(const char *s, char *buf);

/* Metadata, by key. Each getter returns 1 when the key is there with a
 * fitting type (and, for numbers, a value in range), 0 when it is absent,
 * -1 with err naming the key otherwise. Integers are taken from any of
 * GGUF's integer types. */
int gguf_n_kv(const Gguf *g);
const char *gguf_kv_key(const Gguf *g, int i);
int gguf_kv_type(const Gguf *g, int i, int *array_type); /* GGUF_*; array_type for an array */
uint64_t gguf_kv_len(const Gguf *g, int i); /* an array's count, a string's bytes, else 1 */
/* key i's value as the file holds it (its type, u32, then its bytes; what
 * a writer copies verbatim); the count of bytes at *p */
size_t gguf_kv_value_bytes(const Gguf *g, int i, const uint8_t **p);
int gguf_find_key(const Gguf *g, const char *key); /* index, or -1 */
int gguf_get_int(const Gguf *g, const char *key, int64_t lo, int64_t hi, int64_t *out, char *err);
int gguf_get_f32(const Gguf *g, const char *key, float *out, char *err); /* F32 or F64 */
/* a string (owned copy, NUL-terminated; one holding a NUL is refused) */
int gguf_get_str(const Gguf *g, const char *key, char **out, char *err);

int gguf_n_tensors(const Gguf *g);
const GgufTensor *gguf_tensor_at(const Gguf *g, int i);
const GgufTensor *gguf_tensor(const Gguf *g, const char *name); /* NULL if absent */

/* ggml's types (gguf_quant.c): the name ("Q4_K"; NULL for a number ggml
 * does not define), the block (elements, bytes; -1 when unknown), whether
 * Strait decodes it, and the decoding of n values (whole blocks) to fp32;
 * -1 naming the type when it cannot. */
const char *gguf_type_name(uint32_t type);
int gguf_type_block(uint32_t type, uint32_t *block, uint32_t *bytes);
int gguf_type_decodes(uint32_t type);
int gguf_dequantize(uint32_t type, const void *src, size_t n, float *dst, char *err);
/* n (a multiple of 32) finite values to Q8_0 blocks (34 bytes each), as ggml
 * rounds; the quantized values clamped to +-127 */
void gguf_quantize_q8_0(const float *x, size_t n, uint8_t *out);

/* tokenizer.ggml.* as TokenizerLists (owned copies; tokenizer_lists_free
 * releases them): model "gpt2" (byte-level BPE) only, any other refused by
 * name ("llama" is SentencePiece; "none" is a file without a tokenizer),
 * add_space_prefix true refused; tokens, token_type, merges, pre, the bos,
 * eos, unknown and padding ids (-1 when absent), chat_template. */
int gguf_tokenizer_lists(const Gguf *g, TokenizerLists *out, char *err);

/* A model from a GGUF file (gguf_model.c): general.architecture "llama"
 * (Llama 2 and 3, SmolLM2) or "qwen2", its <arch>.* keys to a ModelConfig
 * (any key of the namespace Strait cannot honour refused by name), its
 * tensors dequantized into Strait's table, llama.cpp's interleaving of the
 * q and k rows undone. m is built here and freed on failure; err names the
 * file, the key or tensor, and the problem. */
int model_import_gguf(Model *m, const char *path, char *err);
/* What --init-from takes: a file is read as GGUF (model_import_gguf), a
 * folder as Hugging Face's (model_import_hf). gguf_path_is: path is a file. */
int model_import(Model *m, const char *path, char *err);
/* model_import of a base that adapters will freeze (model_add_adapters
 * next): a GGUF's quantized projections also stay in its file (model.h's
 * held), for a bf16 base to hold them as blocks. Its values must not
 * change: a full fine-tune imports with model_import. */
int model_import_frozen(Model *m, const char *path, char *err);
/* A model whose configuration has adapters (cfg.lora.rank > 0): the base
 * from base_path (model_import's file or folder), checked to be the one
 * the adapters were trained over (its shape, and cfg.lora.base, the
 * fingerprint of its values), then the adapters added (their values
 * zero: the caller loads them, model_load for Strait's checkpoints). m is
 * built here and freed on failure, which says what differs. */
int model_import_base(Model *m, const ModelConfig *cfg, const char *base_path, char *err);
/* A Strait checkpoint whose configuration is cfg (model_read_config's),
 * adapters and all: over base_path when given (model_import_base), else
 * over the base its seed draws, checked by its fingerprint; adapters over a
 * pretrained base without base_path are refused, saying so. m is built
 * here and freed on failure. */
int model_load_checkpoint(Model *m, const ModelConfig *cfg, const char *ckpt, const char *base_path,
                          char *err);
/* whether path is a file (model_import reads it as a GGUF, a folder as
 * Hugging Face's) */
int gguf_path_is(const char *path);

/* The model out to a GGUF llama.cpp loads, atomically: general.*, the
 * <arch>.* keys, general.alignment 32, llama.cpp's tensor names with the q
 * and k rows (weights and biases) interleaved as its converter does; 1-D
 * tensors in F32, matrices in dtype (GGML_F32, GGML_F16, GGML_BF16 or
 * GGML_Q8_0); Llama 3's rope scaling as rope_freqs.weight (llama only)
 * with the strait.rope.scaling.* keys its reader takes the setting from.
 * The tokenizer: every tokenizer.* key of tok_src verbatim (its type and
 * bytes; tok_src wins), else tokenizer.ggml.* from tok, else
 * tokenizer.ggml.model "none" (llama.cpp's no vocabulary; <arch>.vocab_size
 * gives its size). A value that is not finite, or beyond what its type
 * holds (f16's 65504), is refused naming the tensor before the file is
 * opened. Llama family only. */
int model_export_gguf(const Model *m, const char *path, int dtype, const TokenizerLists *tok,
                      const Gguf *tok_src, char *err);
/* "f32", "f16", "bf16", "q8_0" to GGML_*; -1 */
int gguf_dtype_of(const char *name);

#endif /* STRAIT_KERNELS_GGUF_H */
