/*
 * tokenizer.h — the API of kernels/tokenizer.c: byte-level BPE (GPT-2's,
 * Llama 3's, Qwen2's, SmolLM2's), read from a Hugging Face tokenizer.json
 * (with tokenizer_config.json's special tokens), from vocab.json and
 * merges.txt (what GPT-2's own files and PyPI's `tokenizers` save), or from
 * GGUF's lists; text to token ids and ids back to bytes; written back as
 * Hugging Face's files or GGUF's lists.
 *
 * Encoding splits the text with the tokenizer's pre-tokenization stages
 * (PCRE2, Unicode properties: GPT-2's pattern, tokenizer.json's Split
 * regex, Digits; each stage splits the pieces of the one before), maps each
 * piece's bytes to their byte tokens and applies the merges lowest rank
 * first, leftmost first on a tie — the order `tokenizers` applies them in.
 * Text is plain text: "<|endoftext|>" written in a document is encoded as
 * its characters, never as the special token, so no document can forge a
 * boundary. A byte the vocabulary has no token for is dropped (or becomes
 * model.unk_token), as `tokenizers` does; every other byte round-trips:
 * decode(encode(x)) == x, invalid UTF-8 included (it becomes byte tokens).
 */
#ifndef STRAIT_TOKENIZER_H
#define STRAIT_TOKENIZER_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

typedef struct Tokenizer Tokenizer;

/* A growing array of token ids. */
typedef struct TokenBuf {
    uint32_t *ids;
    size_t n, cap;
} TokenBuf;

/* A vocabulary as lists, the way GGUF's tokenizer.ggml.* keys hold one
 * (and what converts between GGUF and Hugging Face's files). Token i's
 * text is in GPT-2's byte-to-unicode alphabet, as vocab.json writes it;
 * types are GGUF's (1 normal, 2 unknown, 3 control, 4 user-defined, 5
 * unused, 6 byte), NULL when not known; merges are "a b" in rank order;
 * pre is llama.cpp's name of the pre-tokenizer (tokenizer.ggml.pre:
 * "gpt2", "llama-bpe", "smollm", "qwen2", ...); ids are -1 when absent. */
typedef struct TokenizerLists {
    char **tokens;
    int n_tokens;
    int32_t *types;
    char **merges;
    int n_merges;
    char *pre;
    int bos, eos, unk, pad;
    char *chat_template; /* NULL: none */
} TokenizerLists;

/* Reads vocab.json and merges.txt. Refuses, naming the entry: an id outside
 * 0..2^22 - 1 or given twice, a vocabulary without a token for tab, newline
 * and each printable ASCII byte (so not byte-level; other bytes may lack
 * one: SmolLM2's has none for 21 bytes that UTF-8 text never holds), a merge
 * line that is not two known tokens whose concatenation is a token. */
Tokenizer *tokenizer_load(const char *vocab_path, const char *merges_path, char *err);
/* The same from bytes in memory (what the fuzz target drives). */
Tokenizer *tokenizer_parse(const char *vocab, size_t vocab_len, const char *merges,
                           size_t merges_len, char *err);
/* tokenizer.json, from bytes; refused, naming the setting, unless it is a
 * byte-level BPE as GPT-2's, Llama 3's, Qwen2's and SmolLM2's (no
 * normalizer but NFC, no byte_fallback, no prefix space, only special added
 * tokens; pre_tokenizer ByteLevel, or a Sequence of Splits on a Regex
 * (Isolated) and Digits ending with ByteLevel). model.unk_token, when set,
 * is what a byte without a token becomes (fuse_unk: a run of them). */
Tokenizer *tokenizer_parse_json(const char *text, size_t len, char *err);
/* tokenizer_config.json, from bytes: bos_token, eos_token, unk_token and
 * pad_token (strings or {"content": ...}; each must be in the vocabulary)
 * and chat_template (a string, or the "default" of a list) into t. */
int tokenizer_parse_config(Tokenizer *t, const char *text, size_t len, char *err);
/* DIR/tokenizer.json if it is there, else DIR/vocab.json and merges.txt;
 * then DIR/tokenizer_config.json and DIR/chat_template.jinja (which wins
 * over the config's template) when they are there. */
Tokenizer *tokenizer_load_dir(const char *dir, char *err);
/* GGUF's lists (what kernels/gguf.c reads from tokenizer.ggml.*): tokens
 * of types 3 (control), 4 (user-defined), 2 and 5 are special: decodable,
 * never merged, never produced from text; type 6 (byte) is refused, as is
 * a pre name other than "gpt2" (GPT-2's pattern), "llama-bpe" (Llama 3's
 * with ignore_merges; also "llama3", "llama-v3"), "smollm" (each Unicode
 * digit alone, then GPT-2's) and
 * "qwen2" (Qwen2's, NFC first). A byte without a token is dropped before
 * merging, as `tokenizers` does with the tokenizer.json these lists came
 * from (llama.cpp drops it after merging, so its neighbours never merge
 * across it). l->unk is the special unk token only. */
Tokenizer *tokenizer_from_lists(const TokenizerLists *l, char *err);
/* The reverse, into *out (every array and string owned: free with
 * tokenizer_lists_free). Refused: a pre-tokenization llama.cpp has no name
 * for, or bytes turned into model.unk_token. An id with no token becomes
 * "[PAD<id>]" of type 5, as convert_hf_to_gguf.py writes it. */
int tokenizer_to_lists(const Tokenizer *t, TokenizerLists *out, char *err);
void tokenizer_lists_free(TokenizerLists *l);
/* DIR/tokenizer.json (BPE with its vocab and merges, the pre_tokenizer,
 * ByteLevel decoder, NFC when it has it, special tokens as added_tokens),
 * tokenizer_config.json (PreTrainedTokenizerFast, bos/eos/unk/pad, the chat
 * template) and special_tokens_map.json, each written atomically after all
 * three are built; DIR is made when absent. transformers'
 * AutoTokenizer.from_pretrained(DIR) loads them. */
int tokenizer_save_hf(const Tokenizer *t, const char *dir, char *err);
void tokenizer_free(Tokenizer *t);

/* One more than the largest id: the model's vocabulary must be at least this. */
int tokenizer_vocab_size(const Tokenizer *t);
/* The id of "<|endoftext|>", or -1 when the vocabulary has none. */
int tokenizer_eot(const Tokenizer *t);
/* What opens a document: "<|begin_of_text|>" (Llama 3), else
 * "<|endoftext|>" (GPT-2, Qwen2, as llm.c's scripts), else -1. */
int tokenizer_doc_start(const Tokenizer *t);
int tokenizer_merges(const Tokenizer *t);
/* The id of byte's one-byte token, -1 when the vocabulary has none. */
int tokenizer_byte_token(const Tokenizer *t, int byte);
/* The special tokens of tokenizer_config.json (or GGUF's lists): each id
 * -1 when not named; *chat_template NULL when there is none (owned by t).
 * Any pointer may be NULL. Returns 0. */
int tokenizer_special(const Tokenizer *t, int *bos, int *eos, int *unk, int *pad,
                      const char **chat_template);

/* Appends the ids of text[*pos..len) to out, piece by piece, stopping once
 * budget bytes have been consumed (0: to the end); *pos moves past what was
 * encoded. The pieces do not depend on where a call stops, so encoding in
 * steps gives the ids of encoding at once. -1 only when out of memory. */
int tokenizer_encode_some(Tokenizer *t, const char *text, size_t len, size_t *pos, size_t budget,
                          TokenBuf *out, char *err);
int tokenizer_encode(Tokenizer *t, const char *text, size_t len, TokenBuf *out, char *err);

/* The text as the tokenizer's normalizer leaves it (Unicode NFC, ICU), in
 * *out (owned; NULL when the tokenizer has none: encode the text as it is).
 * Bytes that are not UTF-8 stay as they are. A whole document at once,
 * before encoding it. */
int tokenizer_normalize(const Tokenizer *t, const char *text, size_t len, char **out,
                        size_t *out_len, char *err);

/* The bytes of one token; NULL (and *len 0) for an id not in the vocabulary. */
const uint8_t *tokenizer_decode(const Tokenizer *t, int id, size_t *len);

/* Appends one id; -1 when out of memory. */
int token_buf_push(TokenBuf *b, int id);
void token_buf_free(TokenBuf *b);

/* Token shards in a folder, as `strait tokenize` writes them (llm.c's .bin
 * shards: data.h reads them): DIR/tokens_000000.bin on, shard_tokens ids
 * each, the last fewer. Ids go into w->b (tokenizer_encode_some appends
 * there); shard_writer_flush writes every full shard it holds, and with
 * last the rest. */
typedef struct ShardWriter {
    char dir[1024];
    size_t shard_tokens;
    TokenBuf b;     /* ids not yet in a shard */
    int shards;     /* written so far */
    size_t written; /* ids in them */
} ShardWriter;
void shard_writer_init(ShardWriter *w, const char *dir, size_t shard_tokens);
int shard_writer_flush(ShardWriter *w, int last, char *err);
void shard_writer_free(ShardWriter *w);

/* What `strait tokenize` does: each file one document (opened by the
 * tokenizer's document-start token, as llm.c's data scripts do), encoded
 * in pieces of 1 MiB into shards of shard_tokens ids in dir, which must be
 * new or empty so no old shard is mixed in; the progress drawn on progress
 * (NULL: none). *out: the bytes read, the ids and shards written. */
typedef struct TokenizeStats {
    uint64_t bytes;
    size_t tokens;
    int shards;
} TokenizeStats;
int tokenize_files(Tokenizer *t, char *const *paths, int n, const char *dir, size_t shard_tokens,
                   FILE *progress, TokenizeStats *out, char *err);
/* tokenize_files' check of dir alone, for a caller that would say so
 * before it loads a tokenizer: 0, or -1 with err. */
int tokenize_dir_check(const char *dir, char *err);

#endif /* STRAIT_TOKENIZER_H */
