/*
 * tokenizer.c — GPT-2's byte-level BPE (API and behaviour: tokenizer.h).
 *
 * vocab.json keys are written in GPT-2's byte-to-unicode alphabet (printable
 * bytes stand for themselves, the other 68 are shifted to U+0100..U+0143);
 * they are turned back into bytes on load, so encoding works on bytes and
 * ids throughout: a piece starts as its byte tokens and pairs are merged
 * from a heap ordered by (rank, position), the way `tokenizers` does it.
 * A key outside that alphabet is a special token: decodable, never merged.
 * A byte the vocabulary has no token for is dropped from its piece (its
 * neighbours may then merge), or becomes model.unk_token's id when the
 * tokenizer.json names one (consecutive ones fused into one with fuse_unk):
 * what `tokenizers` does.
 *
 * Pre-tokenization is a sequence of stages, each an Isolated split on a
 * regex (PCRE2, Unicode properties): a stage's pieces are split again by
 * the next, which sees only the piece, and the last stage's pieces are
 * merged. GPT-2's ByteLevel is one stage; SmolLM2's Digits then ByteLevel
 * two; Llama 3's and Qwen2's Split one.
 *
 * tokenizer.json (Hugging Face `tokenizers`' one file) gives the same
 * model — model.vocab, model.merges (strings or pairs), Llama 3's
 * ignore_merges — with its pre-tokenizer and added_tokens: special tokens,
 * decodable as their text, never matched inside a document. GGUF's lists
 * (TokenizerLists) give it too, and the tokenizer is written back as either.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <stdio.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#include <unistd.h>

#include "tokenizer.h"
#include "data.h"
#include "util/util.h"

/* GPT-2's pre-tokenization pattern (encoder.py, and `tokenizers`' ByteLevel) */
static const char PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Llama 3's and Qwen2's tokenizer.json Split regexes (llama.cpp: "llama-bpe", "qwen2") */
static const char LLAMA3_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* `tokenizers`' Digits: char::is_numeric is Unicode's N (Nd, Nl, No) */
static const char DIGIT_PATTERN[] = "\\p{N}";
static const char DIGITS_PATTERN[] = "\\p{N}+";

#define MAX_IDS         (1 << 22) /* a model's largest vocabulary (model.h) */
#define MAX_MERGE_LINES (1 << 20) /* Llama 3 has 280 147, Qwen2 151 387 */
#define MAX_STAGES      4

/* GGUF's token types (TokenizerLists.types) */
enum { TOKEN_NORMAL = 1, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER, TOKEN_UNUSED, TOKEN_BYTE };

typedef struct Str {
    uint32_t off, len; /* in Tokenizer.arena */
    int id;            /* -1: empty slot */
} Str;

typedef struct Pair {
    uint64_t key; /* (a << 32 | b) + 1; 0: empty slot */
    int32_t rank;
    int32_t merged;
} Pair;

/* One pre-tokenization stage: an Isolated split on pattern. What it came
 * from is kept so the tokenizer can be written back as it was read. */
typedef enum StageKind {
    STAGE_BYTE_LEVEL, /* ByteLevel with use_regex: GPT-2's pattern */
    STAGE_SPLIT,      /* Split on a Regex, Isolated */
    STAGE_DIGIT,      /* Digits, individual_digits */
    STAGE_DIGITS,     /* Digits, runs */
} StageKind;

typedef struct Stage {
    StageKind kind;
    char *pattern; /* owned */
    pcre2_code *re;
    pcre2_match_data *md;
} Stage;

struct Tokenizer {
    uint8_t *arena; /* every token's bytes */
    size_t arena_len;
    uint32_t *tok_off, *tok_len; /* per id; tok_len UINT32_MAX: no such id */
    uint8_t *type;               /* per id: GGUF's token type; TOKEN_NORMAL ones are merged */
    int n_ids, eot, bot, n_merges;
    int ignore_merges; /* a piece that is a token is that token (Llama 3's tokenizer.json) */
    int nfc;           /* text is put in Unicode NFC first (Qwen2's tokenizer.json) */
    int byte_id[256];  /* -1: the vocabulary has no token for the byte */
    int unk_byte;      /* model.unk_token's id: what a byte without a token becomes; -1: dropped */
    int fuse_unk;      /* consecutive such bytes become one unk_byte */
    int bos, eos, unk, pad; /* tokenizer_config.json's (or GGUF's) special tokens; -1: none */
    char *chat_template;    /* owned; NULL: none */
    Str *strs;              /* bytes -> id, open addressing */
    size_t strs_cap;
    Pair *pairs; /* (a, b) -> rank and merged id */
    size_t pairs_cap;
    Stage stage[MAX_STAGES];
    int n_stages;
    /* scratch for one piece */
    int *sym, *next, *prev;
    struct HeapItem {
        int32_t rank, pos;
    } * heap;
    size_t scratch_cap;
    size_t ids_cap; /* entries of tok_off, tok_len and type */
};

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33;
    return x;
}

/* GPT-2's bytes_to_unicode, inverted: code point -> byte, or -1. */
static int cp_to_byte(uint32_t cp) {
    static int table[324];
    static int ready;
    if (!ready) {
        for (int i = 0; i < 324; i++) table[i] = -1;
        int n = 0;
        for (int b = 0; b < 256; b++) {
            int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
            table[printable ? b : 256 + n++] = b;
        }
        ready = 1;
    }
    return cp < 324 ? table[cp] : -1;
}

/* One UTF-8 code point from s[*i..n); -1 on a malformed sequence. */
static int64_t utf8_next(const uint8_t *s, size_t n, size_t *i) {
    uint8_t c = s[*i];
    int extra = c < 0x80             ? 0
                : (c & 0xe0) == 0xc0 ? 1
                : (c & 0xf0) == 0xe0 ? 2
                : (c & 0xf8) == 0xf0 ? 3
                                     : -1;
    if (extra < 0 || *i + (size_t)extra >= n) return -1;
    uint32_t cp = extra == 0 ? c : (uint32_t)(c & (0x3f >> extra));
    for (int k = 1; k <= extra; k++) {
        uint8_t d = s[*i + (size_t)k];
        if ((d & 0xc0) != 0x80) return -1;
        cp = cp << 6 | (d & 0x3f);
    }
    static const uint32_t least[4] = {0, 0x80, 0x800, 0x10000}; /* no overlong forms */
    if (cp < least[extra] || cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000)) return -1;
    *i += (size_t)extra + 1;
    return cp;
}

/* Key text in GPT-2's alphabet -> bytes appended to the arena; 1 when every
 * code point is in the alphabet, 0 for a special token (its UTF-8 kept; so
 * too when raw), -1 for malformed UTF-8 or no memory. */
static int key_to_bytes(Tokenizer *t, const char *key, size_t n, int raw, uint32_t *off,
                        uint32_t *len) {
    uint8_t *grown = realloc(t->arena, t->arena_len + n + 1);
    if (grown == NULL) return -1;
    t->arena = grown;
    *off = (uint32_t)t->arena_len;
    size_t out = 0, i = 0;
    int mapped = !raw;
    while (i < n) {
        int64_t cp = utf8_next((const uint8_t *)key, n, &i);
        if (cp < 0) return -1;
        int b = cp_to_byte((uint32_t)cp);
        mapped &= b >= 0;
        if (mapped) t->arena[t->arena_len + out++] = (uint8_t)b;
    }
    if (!mapped) { /* keep the key as it is written */
        memcpy(t->arena + t->arena_len, key, n);
        out = n;
    }
    *len = (uint32_t)out;
    t->arena_len += out;
    return mapped;
}

static Str *str_slot(Tokenizer *t, const uint8_t *p, size_t n) {
    size_t mask = t->strs_cap - 1;
    for (size_t i = hash_bytes(p, n) & mask;; i = (i + 1) & mask) {
        Str *s = &t->strs[i];
        if (s->id < 0 || (s->len == n && memcmp(t->arena + s->off, p, n) == 0)) return s;
    }
}

static int str_find(Tokenizer *t, const uint8_t *p, size_t n) {
    return str_slot(t, p, n)->id;
}

static Pair *pair_slot(const Tokenizer *t, int a, int b) {
    uint64_t key = ((uint64_t)a << 32 | (uint64_t)b) + 1;
    size_t mask = t->pairs_cap - 1;
    for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask)
        if (t->pairs[i].key == key || t->pairs[i].key == 0) return &t->pairs[i];
}

/* The id tables for ids 0..ids-1 and the string table for n_keys tokens. */
static int vocab_alloc(Tokenizer *t, size_t ids, size_t n_keys, char *err) {
    t->ids_cap = ids;
    t->tok_off = calloc(ids, sizeof *t->tok_off);
    t->tok_len = malloc(ids * sizeof *t->tok_len);
    t->type = calloc(ids, 1);
    for (size_t c = 4; c < 2 * n_keys; c <<= 1) t->strs_cap = c << 1;
    if (t->strs_cap < 8) t->strs_cap = 8;
    t->strs = malloc(t->strs_cap * sizeof *t->strs);
    if (!t->tok_off || !t->tok_len || !t->type || !t->strs)
        return err_set(err, "out of memory for the vocabulary");
    memset(t->tok_len, 0xff, ids * sizeof *t->tok_len);
    for (size_t i = 0; i < t->strs_cap; i++) t->strs[i].id = -1;
    return 0;
}

/* Token id, its key as vocab.json writes it. type TOKEN_NORMAL: a key in
 * GPT-2's alphabet, merged and produced from text; any other type is
 * decodable as its text and never produced; 0: decided by the key (outside
 * the alphabet: TOKEN_CONTROL). */
static int vocab_add(Tokenizer *t, const char *key, int id, int type, const char *what, char *err) {
    if (id < 0 || (size_t)id >= t->ids_cap || t->tok_len[id] != UINT32_MAX)
        return err_set(err, "%s: id %d is given to two tokens", what, id);
    uint32_t off, blen;
    /* a special token of GGUF's lists is its text as it is */
    int mapped = key_to_bytes(t, key, strlen(key), type > TOKEN_NORMAL, &off, &blen);
    if (mapped < 0)
        return err_set(err, "%s: token \"%.40s\" is not UTF-8 (or out of memory)", what, key);
    if (type == TOKEN_NORMAL && !mapped)
        return err_set(err, "%s: token %d \"%.40s\" is normal but not in GPT-2's byte alphabet",
                       what, id, key);
    if (type == 0) type = mapped ? TOKEN_NORMAL : TOKEN_CONTROL;
    t->tok_off[id] = off, t->tok_len[id] = blen, t->type[id] = (uint8_t)type;
    if (id + 1 > t->n_ids) t->n_ids = id + 1;
    if (strcmp(key, "<|endoftext|>") == 0) t->eot = id;
    if (strcmp(key, "<|begin_of_text|>") == 0) t->bot = id;
    if (type != TOKEN_NORMAL) return 0; /* special: decodable, never merged */
    Str *s = str_slot(t, t->arena + off, blen);
    if (s->id >= 0) return err_set(err, "%s: token \"%.40s\" is written twice", what, key);
    s->off = off, s->len = blen, s->id = id;
    if (blen == 1) t->byte_id[t->arena[off]] = id;
    return 0;
}

/* A byte-level vocabulary may lack bytes that never occur in its training
 * text (SmolLM2's has no 0x04, nor 0xf5..0xff), but not tab, newline or
 * printable ASCII: without them it is not byte-level (SentencePiece's has
 * no token for the space byte). */
static int vocab_check_bytes(const Tokenizer *t, const char *what, char *err) {
    for (int b = 0; b < 256; b++)
        if (t->byte_id[b] < 0 && (b == '\t' || b == '\n' || (b >= 0x20 && b < 0x7f)))
            return err_set(err,
                           "%s has no token for byte 0x%02x: not a byte-level BPE vocabulary "
                           "(GPT-2's, Llama 3's, Qwen2's and SmolLM2's have one for every "
                           "printable ASCII byte)",
                           what, b);
    return 0;
}

/* the vocabulary, an object of token: id (vocab.json, tokenizer.json's
 * model.vocab); room for min_ids ids at least (added tokens) */
static int parse_vocab_object(Tokenizer *t, json_t *root, const char *what, size_t min_ids,
                              char *err) {
    if (!json_is_object(root)) return err_set(err, "%s: expected an object of token: id", what);
    size_t n = json_object_size(root);
    if (n == 0 || n > MAX_IDS || min_ids > MAX_IDS)
        return err_set(err, "%s: %zu tokens; a vocabulary has 256 to %d", what, n, MAX_IDS);
    /* the id table is sized by the largest id, bounded first */
    const char *key;
    json_t *val;
    json_int_t top = 0;
    json_object_foreach(root, key, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id >= MAX_IDS)
            return err_set(err, "%s: token \"%.40s\" has id %s; ids are 0..%d", what, key,
                           json_is_integer(val) ? "out of range" : "that is not an integer",
                           MAX_IDS - 1);
        top = id > top ? id : top;
    }
    size_t ids = (size_t)top + 1 > min_ids ? (size_t)top + 1 : min_ids;
    if (vocab_alloc(t, ids, n, err) != 0) return -1;
    json_object_foreach(root, key, val) {
        if (vocab_add(t, key, (int)json_integer_value(val), 0, what, err) != 0) return -1;
    }
    return vocab_check_bytes(t, what, err);
}

static int parse_vocab(Tokenizer *t, const char *text, size_t len, char *err) {
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (root == NULL) return err_set(err, "vocab.json: not JSON (line %d: %s)", je.line, je.text);
    int rc = parse_vocab_object(t, root, "vocab.json", 0, err);
    json_decref(root);
    return rc;
}

/* One merge "A B" of rank lineno; errors name it as "what lineno". */
static int add_merge(Tokenizer *t, const char *line, size_t n, int lineno, const char *what,
                     char *err) {
    const char *sp = memchr(line, ' ', n);
    if (sp == NULL || sp == line || sp + 1 == line + n ||
        memchr(sp + 1, ' ', (size_t)(line + n - sp - 1)))
        return err_set(err, "%s %d: expected two tokens separated by one space", what, lineno);
    uint32_t oa, la, ob, lb;
    size_t mark = t->arena_len;
    if (key_to_bytes(t, line, (size_t)(sp - line), 0, &oa, &la) != 1 ||
        key_to_bytes(t, sp + 1, (size_t)(line + n - sp - 1), 0, &ob, &lb) != 1) {
        t->arena_len = mark;
        return err_set(err, "%s %d: a token outside GPT-2's byte alphabet", what, lineno);
    }
    int a = str_find(t, t->arena + oa, la), b = str_find(t, t->arena + ob, lb);
    /* the two halves sit side by side in the arena: their concatenation */
    int m = oa + la == ob ? str_find(t, t->arena + oa, (size_t)la + lb) : -1;
    t->arena_len = mark;
    if (a < 0 || b < 0 || m < 0)
        return err_set(err, "%s %d: \"%.*s\" %s", what, lineno, (int)(n > 60 ? 60 : n), line,
                       a < 0 || b < 0 ? "names a token the vocabulary does not have"
                                      : "merges into a token the vocabulary does not have");
    Pair *p = pair_slot(t, a, b);
    if (p->key == 0) t->n_merges++;
    p->key = ((uint64_t)a << 32 | (uint64_t)b) + 1; /* a later line wins, as in GPT-2's dict */
    p->rank = lineno;
    p->merged = m;
    return 0;
}

/* the merge table for `lines` merges: the file's claim, bounded first
 * (GPT-2 has 50 000 merges, Llama 3 280 147; every merge makes a token) */
static int alloc_merges(Tokenizer *t, size_t lines, const char *what, char *err) {
    if (lines > MAX_MERGE_LINES)
        return err_set(err, "%s: %zu lines of merges; a byte-level BPE has at most %d", what, lines,
                       MAX_MERGE_LINES);
    for (t->pairs_cap = 8; t->pairs_cap < 2 * lines; t->pairs_cap <<= 1) {
    }
    t->pairs = calloc(t->pairs_cap, sizeof *t->pairs);
    if (t->pairs == NULL) return err_set(err, "out of memory for %zu merges", lines);
    return 0;
}

static int parse_merges(Tokenizer *t, const char *text, size_t len, char *err) {
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    if (alloc_merges(t, lines, "merges.txt", err) != 0) return -1;
    int lineno = 0;
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t n = nl ? (size_t)(nl - (text + i)) : len - i;
        lineno++;
        size_t m = n;
        if (m > 0 && text[i + m - 1] == '\r') m--;
        int skip = m == 0 || (lineno == 1 && m >= 9 && memcmp(text + i, "#version:", 9) == 0);
        if (!skip && add_merge(t, text + i, m, lineno, "merges.txt line", err) != 0) return -1;
        i += n + 1;
    }
    return 0;
}

static Tokenizer *tokenizer_new(char *err) {
    Tokenizer *t = calloc(1, sizeof *t);
    if (t == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    t->eot = t->bot = t->unk_byte = -1;
    t->bos = t->eos = t->unk = t->pad = -1;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    return t;
}

/* One more pre-tokenization stage, its pattern compiled (PCRE2, Unicode
 * properties) */
static int add_stage(Tokenizer *t, StageKind kind, const char *pattern, char *err) {
    if (t->n_stages == MAX_STAGES)
        return err_set(err, "a pre-tokenizer of more than %d splits", MAX_STAGES);
    Stage *s = &t->stage[t->n_stages];
    int code;
    PCRE2_SIZE at;
    s->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &at, NULL);
    if (s->re == NULL) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        return err_set(err, "the pre-tokenization pattern does not compile at offset %zu: %s",
                       (size_t)at, (char *)msg);
    }
    t->n_stages++;
    s->kind = kind;
    pcre2_jit_compile(s->re, PCRE2_JIT_COMPLETE); /* faster when the JIT is there */
    s->md = pcre2_match_data_create_from_pattern(s->re, NULL);
    s->pattern = strdup(pattern);
    return s->md && s->pattern ? 0 : err_set(err, "out of memory");
}

Tokenizer *tokenizer_parse(const char *vocab, size_t vocab_len, const char *merges,
                           size_t merges_len, char *err) {
    Tokenizer *t = tokenizer_new(err);
    if (t == NULL) return NULL;
    if (parse_vocab(t, vocab, vocab_len, err) != 0 ||
        parse_merges(t, merges, merges_len, err) != 0 ||
        add_stage(t, STAGE_BYTE_LEVEL, PATTERN, err) != 0) {
        tokenizer_free(t);
        return NULL;
    }
    return t;
}

/* ---- tokenizer.json --------------------------------------------------------------- */

/* One pre-tokenizer of tokenizer.json into a stage; *byte_level set when it
 * is the ByteLevel, which must come last (it maps bytes to its alphabet). */
static int read_pre_one(Tokenizer *t, json_t *p, int *byte_level, char *err) {
    const char *type = json_string_value(json_object_get(p, "type"));
    if (type && strcmp(type, "ByteLevel") == 0) {
        if (json_is_true(json_object_get(p, "add_prefix_space")))
            return err_set(err, "tokenizer.json: ByteLevel with add_prefix_space; Strait encodes "
                                "text as it is, with no space added");
        *byte_level = 1;
        json_t *ur = json_object_get(p, "use_regex");
        return ur && !json_is_true(ur) ? 0 : add_stage(t, STAGE_BYTE_LEVEL, PATTERN, err);
    }
    if (type && strcmp(type, "Digits") == 0) {
        int one = json_is_true(json_object_get(p, "individual_digits"));
        return add_stage(t, one ? STAGE_DIGIT : STAGE_DIGITS, one ? DIGIT_PATTERN : DIGITS_PATTERN,
                         err);
    }
    if (type && strcmp(type, "Split") == 0) {
        const char *re = json_string_value(json_object_get(json_object_get(p, "pattern"), "Regex"));
        const char *behavior = json_string_value(json_object_get(p, "behavior"));
        if (re && behavior && strcmp(behavior, "Isolated") == 0 &&
            !json_is_true(json_object_get(p, "invert")))
            return add_stage(t, STAGE_SPLIT, re, err);
        return err_set(err, "tokenizer.json: a Split that is not on a Regex, Isolated, not "
                            "inverted; Strait computes only that one");
    }
    return err_set(err,
                   "tokenizer.json: pre_tokenizer %s is not one Strait computes (ByteLevel, "
                   "Split on a Regex, Digits, in a Sequence ending with ByteLevel: GPT-2's, "
                   "Llama 3's, Qwen2's, SmolLM2's)",
                   type ? type : "(none)");
}

/* pre_tokenizer: ByteLevel alone (GPT-2's), or a Sequence of Splits on a
 * regex and Digits ending with ByteLevel (Llama 3's and Qwen2's Split,
 * SmolLM2's Digits then ByteLevel with its regex) */
static int read_pre_tokenizer(Tokenizer *t, json_t *pre, char *err) {
    const char *type = json_string_value(json_object_get(pre, "type"));
    json_t *list = json_object_get(pre, "pretokenizers");
    int byte_level = 0;
    if (type && strcmp(type, "Sequence") == 0 && json_is_array(list)) {
        size_t i;
        json_t *p;
        json_array_foreach(list, i, p) {
            if (byte_level)
                return err_set(err, "tokenizer.json: a pre-tokenizer after ByteLevel; Strait "
                                    "computes ByteLevel last");
            if (read_pre_one(t, p, &byte_level, err) != 0) return -1;
        }
    } else if (read_pre_one(t, pre, &byte_level, err) != 0) {
        return -1;
    }
    if (!byte_level)
        return err_set(err, "tokenizer.json: a pre-tokenizer without ByteLevel is not byte-level");
    if (t->n_stages == 0)
        return err_set(err, "tokenizer.json: ByteLevel without a regex splits nothing; Strait "
                            "needs a pre-tokenization pattern");
    return 0;
}

/* model.merges: "a b" strings or [a, b] pairs, ranked in order */
static int read_merges(Tokenizer *t, json_t *merges, char *err) {
    if (!json_is_array(merges)) return err_set(err, "tokenizer.json: model.merges is not a list");
    size_t n = json_array_size(merges);
    if (alloc_merges(t, n, "tokenizer.json", err) != 0) return -1;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(merges, i);
        char line[1024];
        int len = -1;
        if (json_is_string(m)) {
            len = snprintf(line, sizeof line, "%s", json_string_value(m));
        } else if (json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            const char *a = json_string_value(json_array_get(m, 0));
            const char *b = json_string_value(json_array_get(m, 1));
            if (!strchr(a, ' ') && !strchr(b, ' '))
                len = snprintf(line, sizeof line, "%s %s", a, b);
        }
        if (len < 0 || len >= (int)sizeof line)
            return err_set(err, "tokenizer.json: merge %zu is not two tokens", i + 1);
        if (add_merge(t, line, (size_t)len, (int)i + 1, "tokenizer.json merge", err) != 0)
            return -1;
    }
    return 0;
}

/* added_tokens: special tokens, decodable as their text, never matched in
 * text (a document cannot forge one) and never merged */
static int read_added(Tokenizer *t, json_t *added, char *err) {
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        const char *content = json_string_value(json_object_get(a, "content"));
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        if (content == NULL || id < 0 || (size_t)id >= t->ids_cap)
            return err_set(err, "tokenizer.json: added token %zu has no content or a bad id", i);
        if (!json_is_true(json_object_get(a, "special")))
            return err_set(err,
                           "tokenizer.json: added token \"%.40s\" is not special; tokenizers "
                           "matches such tokens inside text, Strait encodes text as text",
                           content);
        size_t n = strlen(content);
        if (t->tok_len[id] != UINT32_MAX) { /* also in the vocabulary: the same text only */
            if (t->tok_len[id] != n || memcmp(t->arena + t->tok_off[id], content, n) != 0)
                return err_set(err, "tokenizer.json: id %d is given to two tokens", (int)id);
            t->type[id] = TOKEN_CONTROL;
            continue;
        }
        uint8_t *grown = realloc(t->arena, t->arena_len + n + 1);
        if (grown == NULL) return err_set(err, "out of memory");
        t->arena = grown;
        memcpy(t->arena + t->arena_len, content, n);
        t->tok_off[id] = (uint32_t)t->arena_len, t->tok_len[id] = (uint32_t)n;
        t->type[id] = TOKEN_CONTROL;
        t->arena_len += n;
        if (id + 1 > t->n_ids) t->n_ids = (int)id + 1;
        if (strcmp(content, "<|endoftext|>") == 0) t->eot = (int)id;
        if (strcmp(content, "<|begin_of_text|>") == 0) t->bot = (int)id;
    }
    return 0;
}

/* The id of the token whose bytes are p[0..n): a mergeable one first, else
 * a special one; -1 when none is. */
static int find_bytes(Tokenizer *t, const uint8_t *p, size_t n) {
    int id = str_find(t, p, n);
    for (int i = 0; id < 0 && i < t->n_ids; i++)
        if (t->tok_len[i] == n && memcmp(t->arena + t->tok_off[i], p, n) == 0) id = i;
    return id;
}

/* model.unk_token (a key of model.vocab): what a byte without a token
 * becomes, instead of being dropped */
static int read_unk(Tokenizer *t, json_t *model, char *err) {
    json_t *unk = json_object_get(model, "unk_token");
    t->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
    if (unk == NULL || json_is_null(unk)) return 0;
    const char *key = json_string_value(unk);
    if (key == NULL) return err_set(err, "tokenizer.json: model.unk_token is not a string");
    uint32_t off, len;
    size_t mark = t->arena_len;
    if (key_to_bytes(t, key, strlen(key), 0, &off, &len) < 0)
        return err_set(err, "tokenizer.json: model.unk_token is not UTF-8");
    t->unk_byte = find_bytes(t, t->arena + off, len);
    t->arena_len = mark;
    if (t->unk_byte < 0)
        return err_set(err, "tokenizer.json: model.unk_token \"%.40s\" is not in model.vocab", key);
    return 0;
}

static int parse_json(Tokenizer *t, json_t *root, char *err) {
    json_t *model = json_object_get(root, "model"), *added = json_object_get(root, "added_tokens");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!json_is_object(model) || (type && strcmp(type, "BPE") != 0))
        return err_set(err, "tokenizer.json: model %s; Strait reads byte-level BPE",
                       type ? type : "(none)");
    if (json_is_true(json_object_get(model, "byte_fallback")))
        return err_set(err, "tokenizer.json: a BPE with byte_fallback (SentencePiece's, as Llama "
                            "2's) is not byte-level; Strait reads GPT-2's, Llama 3's, Qwen2's and "
                            "SmolLM2's");
    const char *cont = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    const char *suffix = json_string_value(json_object_get(model, "end_of_word_suffix"));
    json_t *dropout = json_object_get(model, "dropout");
    if ((cont && cont[0]) || (suffix && suffix[0]) ||
        (json_is_number(dropout) && json_number_value(dropout) > 0))
        return err_set(err, "tokenizer.json: a BPE with a subword prefix, a word suffix or "
                            "dropout; Strait reads byte-level BPE without them");
    json_t *norm = json_object_get(root, "normalizer");
    const char *ntype = json_string_value(json_object_get(norm, "type"));
    if (norm && !json_is_null(norm) && !(ntype && strcmp(ntype, "NFC") == 0))
        return err_set(err, "tokenizer.json: normalizer %s; Strait computes NFC (Qwen2's) or none",
                       ntype ? ntype : "(unknown)");
    t->nfc = ntype != NULL;
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    if (read_pre_tokenizer(t, json_object_get(root, "pre_tokenizer"), err) != 0) return -1;
    if (added && !json_is_array(added))
        return err_set(err, "tokenizer.json: added_tokens is not a list");
    size_t min_ids = 0, i;
    json_t *a;
    json_array_foreach(added, i, a) {
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        if (id < 0 || id >= MAX_IDS)
            return err_set(err, "tokenizer.json: added token %zu has id outside 0..%d", i,
                           MAX_IDS - 1);
        if ((size_t)id + 1 > min_ids) min_ids = (size_t)id + 1;
    }
    if (parse_vocab_object(t, json_object_get(model, "vocab"), "tokenizer.json's model.vocab",
                           min_ids, err) != 0 ||
        read_merges(t, json_object_get(model, "merges"), err) != 0 ||
        (added && read_added(t, added, err) != 0))
        return -1;
    return read_unk(t, model, err);
}

Tokenizer *tokenizer_parse_json(const char *text, size_t len, char *err) {
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!json_is_object(root)) {
        json_decref(root);
        err_set(err, "tokenizer.json: not a JSON object (line %d: %s)", je.line, je.text);
        return NULL;
    }
    Tokenizer *t = tokenizer_new(err);
    if (t && parse_json(t, root, err) != 0) {
        tokenizer_free(t);
        t = NULL;
    }
    json_decref(root);
    return t;
}

/* ---- tokenizer_config.json: the special tokens and the chat template ------------- */

/* bos_token and friends: a string, {"content": ...} (transformers'
 * AddedToken), or null; *id -1 when absent or null */
static int config_token(Tokenizer *t, json_t *root, const char *name, int *id, char *err) {
    json_t *v = json_object_get(root, name);
    *id = -1;
    if (v == NULL || json_is_null(v)) return 0;
    if (json_is_object(v)) v = json_object_get(v, "content");
    const char *text = json_string_value(v);
    if (text == NULL)
        return err_set(err, "tokenizer_config.json: %s is neither a string nor {\"content\": ...}",
                       name);
    /* one this vocabulary lacks (a legacy folder's pad "[PAD]" from
     * added_tokens.json, which is not read) is left unknown: these ids name
     * tokens for the tools a model is exported to, never change encoding */
    *id = find_bytes(t, (const uint8_t *)text, strlen(text));
    return 0;
}

int tokenizer_parse_config(Tokenizer *t, const char *text, size_t len, char *err) {
    json_error_t je;
    /* integers as reals: transformers writes model_max_length 1e30 as an integer */
    json_t *root = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, &je);
    if (!json_is_object(root)) {
        json_decref(root);
        return err_set(err, "tokenizer_config.json: not a JSON object (line %d: %s)", je.line,
                       je.text);
    }
    int bos, eos, unk, pad, rc = 0;
    json_t *tpl = json_object_get(root, "chat_template");
    if (json_is_array(tpl)) { /* [{"name": ..., "template": ...}]: the default one */
        size_t i;
        json_t *e, *found = NULL;
        json_array_foreach(tpl, i, e) {
            const char *name = json_string_value(json_object_get(e, "name"));
            if (name && strcmp(name, "default") == 0) found = json_object_get(e, "template");
        }
        tpl = found;
    }
    if (config_token(t, root, "bos_token", &bos, err) != 0 ||
        config_token(t, root, "eos_token", &eos, err) != 0 ||
        config_token(t, root, "unk_token", &unk, err) != 0 ||
        config_token(t, root, "pad_token", &pad, err) != 0) {
        rc = -1;
    } else if (tpl && !json_is_null(tpl) && !json_is_string(tpl)) {
        rc = err_set(err, "tokenizer_config.json: chat_template is not a string");
    } else {
        t->bos = bos, t->eos = eos, t->unk = unk, t->pad = pad;
        if (json_is_string(tpl)) {
            free(t->chat_template);
            if ((t->chat_template = strdup(json_string_value(tpl))) == NULL)
                rc = err_set(err, "out of memory");
        }
    }
    json_decref(root);
    return rc;
}

/* DIR/tokenizer_config.json and DIR/chat_template.jinja, when there */
static int load_config(Tokenizer *t, const char *dir, char *err) {
    char path[1200], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (access(path, F_OK) == 0) {
        if (file_read_all(path, (size_t)1 << 26, &text, &len, err) != 0) return -1;
        int rc = tokenizer_parse_config(t, text, len, err);
        free(text);
        if (rc != 0) return -1;
    }
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (access(path, F_OK) == 0) { /* transformers takes the file over the config's */
        if (file_read_all(path, (size_t)1 << 26, &text, &len, err) != 0) return -1;
        free(t->chat_template);
        t->chat_template = text;
    }
    return 0;
}

Tokenizer *tokenizer_load_dir(const char *dir, char *err) {
    char path[1200], v[1200], m[1200], *text;
    size_t len;
    Tokenizer *t;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    snprintf(v, sizeof v, "%s/vocab.json", dir);
    snprintf(m, sizeof m, "%s/merges.txt", dir);
    if (access(path, F_OK) == 0) {
        if (file_read_all(path, (size_t)1 << 28, &text, &len, err) != 0) return NULL;
        t = tokenizer_parse_json(text, len, err);
        free(text);
    } else if (access(v, F_OK) == 0) {
        t = tokenizer_load(v, m, err);
    } else {
        err_set(err, "%s has neither tokenizer.json nor vocab.json and merges.txt", dir);
        return NULL;
    }
    if (t && load_config(t, dir, err) != 0) {
        char why[ERR_LEN];
        snprintf(why, sizeof why, "%s", err);
        err_set(err, "%s: %s", dir, why);
        tokenizer_free(t);
        t = NULL;
    }
    return t;
}

Tokenizer *tokenizer_load(const char *vocab_path, const char *merges_path, char *err) {
    char *v = NULL, *m = NULL;
    size_t vl, ml;
    if (file_read_all(vocab_path, (size_t)1 << 28, &v, &vl, err) != 0) return NULL;
    if (file_read_all(merges_path, (size_t)1 << 28, &m, &ml, err) != 0) {
        free(v);
        return NULL;
    }
    Tokenizer *t = tokenizer_parse(v, vl, m, ml, err);
    free(v), free(m);
    return t;
}

void tokenizer_free(Tokenizer *t) {
    if (t == NULL) return;
    for (int k = 0; k < t->n_stages; k++) {
        pcre2_match_data_free(t->stage[k].md);
        pcre2_code_free(t->stage[k].re);
        free(t->stage[k].pattern);
    }
    free(t->arena), free(t->tok_off), free(t->tok_len), free(t->type), free(t->strs);
    free(t->pairs), free(t->chat_template);
    free(t->sym), free(t->next), free(t->prev), free(t->heap);
    free(t);
}

int tokenizer_vocab_size(const Tokenizer *t) {
    return t->n_ids;
}
int tokenizer_eot(const Tokenizer *t) {
    return t->eot;
}
int tokenizer_doc_start(const Tokenizer *t) {
    return t->bot >= 0 ? t->bot : t->eot;
}
int tokenizer_merges(const Tokenizer *t) {
    return t->n_merges;
}
int tokenizer_byte_token(const Tokenizer *t, int byte) {
    return byte >= 0 && byte < 256 ? t->byte_id[byte] : -1;
}
int tokenizer_special(const Tokenizer *t, int *bos, int *eos, int *unk, int *pad,
                      const char **chat_template) {
    if (bos) *bos = t->bos;
    if (eos) *eos = t->eos;
    if (unk) *unk = t->unk;
    if (pad) *pad = t->pad;
    if (chat_template) *chat_template = t->chat_template;
    return 0;
}

const uint8_t *tokenizer_decode(const Tokenizer *t, int id, size_t *len) {
    if (id < 0 || id >= t->n_ids || t->tok_len[id] == UINT32_MAX) {
        *len = 0;
        return NULL;
    }
    *len = t->tok_len[id];
    return t->arena + t->tok_off[id];
}

void token_buf_free(TokenBuf *b) {
    free(b->ids);
    memset(b, 0, sizeof *b);
}

int token_buf_push(TokenBuf *b, int id) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        uint32_t *g = realloc(b->ids, cap * sizeof *g);
        if (g == NULL) return -1;
        b->ids = g, b->cap = cap;
    }
    b->ids[b->n++] = (uint32_t)id;
    return 0;
}

/* ---- merging one piece: a min-heap of (rank, position) ---- */

static int heap_less(struct HeapItem a, struct HeapItem b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(struct HeapItem *h, size_t *n, struct HeapItem x) {
    size_t i = (*n)++;
    while (i > 0 && heap_less(x, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = x;
}

static struct HeapItem heap_pop(struct HeapItem *h, size_t *n) {
    struct HeapItem top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c])) c++;
        if (!heap_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static void push_pair(Tokenizer *t, size_t *hn, int pos) {
    if (pos < 0 || t->next[pos] < 0) return;
    const Pair *p = pair_slot(t, t->sym[pos], t->sym[t->next[pos]]);
    if (p->key != 0) heap_push(t->heap, hn, (struct HeapItem){p->rank, pos});
}

static int encode_piece(Tokenizer *t, const uint8_t *p, size_t n, TokenBuf *out) {
    if (n > t->scratch_cap) {
        size_t cap = n * 2;
        int *s = realloc(t->sym, cap * sizeof *s);
        if (s) t->sym = s;
        int *nx = realloc(t->next, cap * sizeof *nx);
        if (nx) t->next = nx;
        int *pv = realloc(t->prev, cap * sizeof *pv);
        if (pv) t->prev = pv;
        /* each merge pushes at most two pairs: n - 1 + 2 (n - 1) entries */
        struct HeapItem *h = realloc(t->heap, 3 * cap * sizeof *h);
        if (h) t->heap = h;
        if (!s || !nx || !pv || !h) return -1;
        t->scratch_cap = cap;
    }
    if (t->ignore_merges) { /* a piece that is a token is that token */
        int whole = str_find(t, p, n);
        if (whole >= 0) return token_buf_push(out, whole);
    }
    /* the byte tokens; a byte without one dropped, or unk_byte (fused) */
    size_t m = 0;
    int prev_unk = 0;
    for (size_t i = 0; i < n; i++) {
        int id = t->byte_id[p[i]];
        if (id < 0) {
            if (t->unk_byte < 0 || (t->fuse_unk && prev_unk)) continue;
            id = t->unk_byte, prev_unk = 1;
        } else {
            prev_unk = 0;
        }
        t->sym[m++] = id;
    }
    if (m == 0) return 0;
    for (size_t i = 0; i < m; i++) {
        t->next[i] = i + 1 < m ? (int)i + 1 : -1;
        t->prev[i] = (int)i - 1;
    }
    size_t hn = 0;
    for (size_t i = 0; i + 1 < m; i++) push_pair(t, &hn, (int)i);
    while (hn > 0) {
        struct HeapItem top = heap_pop(t->heap, &hn);
        int i = top.pos, j = t->next[i];
        if (t->sym[i] < 0 || j < 0) continue; /* merged away since */
        const Pair *pr = pair_slot(t, t->sym[i], t->sym[j]);
        if (pr->key == 0 || pr->rank != top.rank) continue; /* stale: the pair changed */
        t->sym[i] = pr->merged;
        t->sym[j] = -1;
        t->next[i] = t->next[j];
        if (t->next[i] >= 0) t->prev[t->next[i]] = i;
        push_pair(t, &hn, t->prev[i]);
        push_pair(t, &hn, i);
    }
    for (int i = 0; i >= 0; i = t->next[i])
        if (token_buf_push(out, t->sym[i]) != 0) return -1;
    return 0;
}

/* The next piece of stage st in s[0..n) from pos: the match [*ms, *me), and
 * before it the gap [pos, *ms) the pattern does not cover (invalid UTF-8),
 * a piece of its own; *ms == n when nothing more matches. */
static int stage_next(Stage *st, const char *s, size_t n, size_t pos, size_t *ms, size_t *me,
                      char *err) {
    int rc = pcre2_match(st->re, (PCRE2_SPTR)s, n, pos, 0, st->md, NULL);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) { /* a pattern from a file may backtrack */
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return err_set(err, "the pre-tokenization pattern failed at byte %zu: %s", pos,
                       (char *)msg);
    }
    *ms = *me = n;
    if (rc > 0) {
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
        *ms = ov[0], *me = ov[1] > ov[0] ? ov[1] : ov[0] + 1;
        if (*me > n) *me = n;
    }
    return 0;
}

/* Piece s[0..n) of stage k - 1 through stages k on, then merged: each
 * stage sees only its piece, as `tokenizers` runs a Sequence. */
static int encode_split(Tokenizer *t, int k, const char *s, size_t n, TokenBuf *out, char *err) {
    if (k == t->n_stages)
        return encode_piece(t, (const uint8_t *)s, n, out) == 0
                   ? 0
                   : err_set(err, "out of memory while encoding");
    for (size_t pos = 0, ms, me; pos < n; pos = me) {
        if (stage_next(&t->stage[k], s, n, pos, &ms, &me, err) != 0) return -1;
        if (ms > pos && encode_split(t, k + 1, s + pos, ms - pos, out, err) != 0) return -1;
        if (ms < n && encode_split(t, k + 1, s + ms, me - ms, out, err) != 0) return -1;
    }
    return 0;
}

int tokenizer_encode_some(Tokenizer *t, const char *text, size_t len, size_t *pos, size_t budget,
                          TokenBuf *out, char *err) {
    size_t start = *pos;
    while (*pos < len && (budget == 0 || *pos - start < budget)) {
        size_t s, e;
        if (stage_next(&t->stage[0], text, len, *pos, &s, &e, err) != 0) return -1;
        if (s > *pos && encode_split(t, 1, text + *pos, s - *pos, out, err) != 0) return -1;
        if (s < len && encode_split(t, 1, text + s, e - s, out, err) != 0) return -1;
        *pos = e;
    }
    return 0;
}

/* ---- normalization ---------------------------------------------------------------- */

/* appends the NFC of valid UTF-8 s[0..n) to *o (ICU, through UTF-16) */
static int nfc_run(const UNormalizer2 *nfc, const char *s, size_t n, char **o, size_t *ol,
                   size_t *cap, char *err) {
    if (n > (size_t)INT32_MAX / 4) return err_set(err, "a document over 512 MiB to normalize");
    UErrorCode e = U_ZERO_ERROR;
    int32_t u16n = 0, normn = 0, outn = 0;
    UChar *u16 = malloc(sizeof(UChar) * (n + 1)), *norm = NULL;
    if (u16 == NULL) return err_set(err, "out of memory");
    u_strFromUTF8(u16, (int32_t)n + 1, &u16n, s, (int32_t)n, &e);
    size_t ncap = (size_t)u16n * 3 + 16; /* NFC's composition may expand a string, by at most 3x */
    if (U_SUCCESS(e) && (norm = malloc(sizeof(UChar) * ncap)) != NULL)
        normn = unorm2_normalize(nfc, u16, u16n, norm, (int32_t)ncap, &e);
    if (U_SUCCESS(e) && norm) {
        size_t need = *ol + (size_t)normn * 3 + 1;
        if (need > *cap) {
            char *g = realloc(*o, need * 2);
            if (g == NULL)
                e = U_MEMORY_ALLOCATION_ERROR;
            else
                *o = g, *cap = need * 2;
        }
        if (U_SUCCESS(e)) u_strToUTF8(*o + *ol, (int32_t)(*cap - *ol), &outn, norm, normn, &e);
    }
    free(u16), free(norm);
    if (U_FAILURE(e) || norm == NULL)
        return err_set(err, "Unicode normalization failed: %s", u_errorName(e));
    *ol += (size_t)outn;
    return 0;
}

int tokenizer_normalize(const Tokenizer *t, const char *text, size_t len, char **out,
                        size_t *out_len, char *err) {
    *out = NULL, *out_len = 0;
    if (!t->nfc) return 0;
    UErrorCode e = U_ZERO_ERROR;
    const UNormalizer2 *nfc = unorm2_getNFCInstance(&e);
    if (U_FAILURE(e)) return err_set(err, "ICU has no NFC: %s", u_errorName(e));
    size_t cap = len + 16, ol = 0;
    char *o = malloc(cap);
    if (o == NULL) return err_set(err, "out of memory");
    /* runs of valid UTF-8 normalized; a byte that is not UTF-8 stays as it is */
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len) {
            size_t k = j;
            if (utf8_next((const uint8_t *)text, len, &k) < 0) break;
            j = k;
        }
        if (j > i && nfc_run(nfc, text + i, j - i, &o, &ol, &cap, err) != 0) {
            free(o);
            return -1;
        }
        if (j < len) {
            if (ol + 1 > cap) {
                char *g = realloc(o, cap * 2);
                if (g == NULL) {
                    free(o);
                    return err_set(err, "out of memory");
                }
                o = g, cap *= 2;
            }
            o[ol++] = text[j++];
        }
        i = j;
    }
    *out = o, *out_len = ol;
    return 0;
}

int tokenizer_encode(Tokenizer *t, const char *text, size_t len, TokenBuf *out, char *err) {
    size_t pos = 0;
    return tokenizer_encode_some(t, text, len, &pos, 0, out, err);
}

/* ---- GGUF's lists and Hugging Face's files out --------------------------------------- */

/* llama.cpp's names of the pre-tokenizers Strait computes (tokenizer.ggml.pre;
 * llama-vocab.cpp gives each its regexes), as stages and flags; the first
 * row that fits a tokenizer names it */
static const struct PreName {
    const char *name;
    StageKind kind;
    const char *pattern; /* the first stage's */
    int then_byte_level; /* a second stage, GPT-2's pattern */
    int ignore_merges, nfc;
} PRE_NAMES[] = {
    {"gpt2", STAGE_BYTE_LEVEL, PATTERN, 0, 0, 0},
    {"smollm", STAGE_DIGIT, DIGIT_PATTERN, 1, 0, 0},
    {"llama-bpe", STAGE_SPLIT, LLAMA3_PATTERN, 0, 1, 0},
    {"qwen2", STAGE_SPLIT, QWEN2_PATTERN, 0, 0, 1},
    /* older names llama.cpp reads as llama-bpe; written back as that */
    {"llama3", STAGE_SPLIT, LLAMA3_PATTERN, 0, 1, 0},
    {"llama-v3", STAGE_SPLIT, LLAMA3_PATTERN, 0, 1, 0},
};
#define N_PRE_NAMES (sizeof PRE_NAMES / sizeof PRE_NAMES[0])

/* the name of t's pre-tokenization, or NULL when llama.cpp has none for it */
static const char *pre_name(const Tokenizer *t) {
    for (size_t i = 0; i < N_PRE_NAMES; i++) {
        const struct PreName *p = &PRE_NAMES[i];
        if (t->n_stages == 1 + p->then_byte_level && strcmp(t->stage[0].pattern, p->pattern) == 0 &&
            (!p->then_byte_level || strcmp(t->stage[1].pattern, PATTERN) == 0) &&
            t->ignore_merges == p->ignore_merges && t->nfc == p->nfc)
            return p->name;
    }
    return NULL;
}

/* GPT-2's bytes_to_unicode: byte -> code point */
static uint32_t byte_to_cp(int b) {
    static uint32_t table[256];
    static int ready;
    if (!ready) {
        uint32_t n = 0;
        for (int c = 0; c < 256; c++) {
            int printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174);
            table[c] = printable ? (uint32_t)c : 256 + n++;
        }
        ready = 1;
    }
    return table[b];
}

/* token id's key as vocab.json writes it (malloc'd): a mergeable token's
 * bytes in GPT-2's alphabet, a special one's text as it is */
static char *token_key(const Tokenizer *t, int id) {
    const uint8_t *p = t->arena + t->tok_off[id];
    size_t n = t->tok_len[id];
    char *s = malloc(2 * n + 1), *o = s;
    if (s == NULL) return NULL;
    if (t->type[id] != TOKEN_NORMAL) {
        memcpy(s, p, n);
        s[n] = '\0';
        return s;
    }
    for (size_t i = 0; i < n; i++) { /* code points below U+0144: one or two UTF-8 bytes */
        uint32_t cp = byte_to_cp(p[i]);
        if (cp < 0x80) {
            *o++ = (char)cp;
        } else {
            *o++ = (char)(0xc0 | (cp >> 6));
            *o++ = (char)(0x80 | (cp & 0x3f));
        }
    }
    *o = '\0';
    return s;
}

static int pair_rank_cmp(const void *a, const void *b) {
    int32_t x = (*(const Pair *const *)a)->rank, y = (*(const Pair *const *)b)->rank;
    return (x > y) - (x < y);
}

/* the merges in rank order (malloc'd; *n of them), NULL when out of memory */
static const Pair **merges_ranked(const Tokenizer *t, size_t *n) {
    const Pair **m = malloc(((size_t)t->n_merges + 1) * sizeof *m);
    *n = 0;
    if (m == NULL) return NULL;
    for (size_t i = 0; i < t->pairs_cap; i++)
        if (t->pairs[i].key != 0) m[(*n)++] = &t->pairs[i];
    qsort(m, *n, sizeof *m, pair_rank_cmp);
    return m;
}

/* merge p as "A B" in GPT-2's alphabet (malloc'd) */
static char *merge_text(const Tokenizer *t, const Pair *p) {
    char *a = token_key(t, (int)((p->key - 1) >> 32)),
         *b = token_key(t, (int)((p->key - 1) & 0xffffffffu));
    char *s = a && b ? malloc(strlen(a) + strlen(b) + 2) : NULL;
    if (s) sprintf(s, "%s %s", a, b);
    free(a), free(b);
    return s;
}

/* A special id of the lists: -1 (none) or a token's */
static int list_id(int id, int n_tokens, const char *name, char *err) {
    if (id < -1 || id >= n_tokens)
        return err_set(err, "tokenizer.ggml.%s %d is not a token id (0..%d)", name, id,
                       n_tokens - 1);
    return 0;
}

static int lists_build(Tokenizer *t, const TokenizerLists *l, char *err) {
    if (l->n_tokens <= 0 || l->n_tokens > MAX_IDS || l->tokens == NULL)
        return err_set(err, "tokenizer.ggml.tokens: %d tokens; a vocabulary has 256 to %d",
                       l->n_tokens, MAX_IDS);
    if (l->n_merges < 0 || (l->n_merges > 0 && l->merges == NULL))
        return err_set(err, "tokenizer.ggml.merges: %d merges", l->n_merges);
    const struct PreName *pre = NULL;
    for (size_t i = 0; l->pre && i < N_PRE_NAMES; i++)
        if (strcmp(l->pre, PRE_NAMES[i].name) == 0) pre = &PRE_NAMES[i];
    if (pre == NULL)
        return err_set(err,
                       "tokenizer.ggml.pre \"%.40s\" is not a pre-tokenizer Strait computes "
                       "(gpt2, llama-bpe, smollm, qwen2)",
                       l->pre ? l->pre : "(missing)");
    if (list_id(l->bos, l->n_tokens, "bos_token_id", err) != 0 ||
        list_id(l->eos, l->n_tokens, "eos_token_id", err) != 0 ||
        list_id(l->unk, l->n_tokens, "unknown_token_id", err) != 0 ||
        list_id(l->pad, l->n_tokens, "padding_token_id", err) != 0)
        return -1;
    if (vocab_alloc(t, (size_t)l->n_tokens, (size_t)l->n_tokens, err) != 0) return -1;
    for (int i = 0; i < l->n_tokens; i++) {
        int type = l->types ? l->types[i] : 0;
        if (l->tokens[i] == NULL)
            return err_set(err, "tokenizer.ggml.tokens: token %d is missing", i);
        if (type == TOKEN_BYTE)
            return err_set(err,
                           "tokenizer.ggml.token_type: token %d \"%.40s\" is a byte token "
                           "(SentencePiece's byte fallback); Strait reads byte-level BPE",
                           i, l->tokens[i]);
        if (l->types && (type < TOKEN_NORMAL || type > TOKEN_BYTE))
            return err_set(err, "tokenizer.ggml.token_type: token %d has type %d; GGUF's are 1..6",
                           i, type);
        if (vocab_add(t, l->tokens[i], i, type, "tokenizer.ggml.tokens", err) != 0) return -1;
    }
    if (vocab_check_bytes(t, "tokenizer.ggml.tokens", err) != 0 ||
        alloc_merges(t, (size_t)l->n_merges, "tokenizer.ggml.merges", err) != 0)
        return -1;
    for (int i = 0; i < l->n_merges; i++) {
        if (l->merges[i] == NULL)
            return err_set(err, "tokenizer.ggml.merges: merge %d is missing", i + 1);
        if (add_merge(t, l->merges[i], strlen(l->merges[i]), i + 1, "tokenizer.ggml.merges entry",
                      err) != 0)
            return -1;
    }
    if (add_stage(t, pre->kind, pre->pattern, err) != 0 ||
        (pre->then_byte_level && add_stage(t, STAGE_BYTE_LEVEL, PATTERN, err) != 0))
        return -1;
    t->ignore_merges = pre->ignore_merges, t->nfc = pre->nfc;
    t->bos = l->bos, t->eos = l->eos, t->unk = l->unk, t->pad = l->pad;
    if (l->chat_template && (t->chat_template = strdup(l->chat_template)) == NULL)
        return err_set(err, "out of memory");
    return 0;
}

Tokenizer *tokenizer_from_lists(const TokenizerLists *l, char *err) {
    Tokenizer *t = tokenizer_new(err);
    if (t && lists_build(t, l, err) != 0) {
        tokenizer_free(t);
        t = NULL;
    }
    return t;
}

void tokenizer_lists_free(TokenizerLists *l) {
    for (int i = 0; l->tokens && i < l->n_tokens; i++) free(l->tokens[i]);
    for (int i = 0; l->merges && i < l->n_merges; i++) free(l->merges[i]);
    free(l->tokens), free(l->types), free(l->merges), free(l->pre), free(l->chat_template);
    memset(l, 0, sizeof *l);
    l->bos = l->eos = l->unk = l->pad = -1;
}

/* some byte has no token and becomes model.unk_token: GGUF cannot say so */
static int unk_bytes(const Tokenizer *t) {
    for (int b = 0; t->unk_byte >= 0 && b < 256; b++)
        if (t->byte_id[b] < 0) return 1;
    return 0;
}

static int lists_fill(const Tokenizer *t, TokenizerLists *out, char *err) {
    const char *pre = pre_name(t);
    if (pre == NULL)
        return err_set(err,
                       "the tokenizer's pre-tokenization (\"%.60s\"%s%s) has no llama.cpp name; "
                       "GGUF holds gpt2's, llama-bpe's, smollm's and qwen2's",
                       t->stage[0].pattern, t->n_stages > 1 ? " and more" : "",
                       t->nfc ? ", NFC" : "");
    if (unk_bytes(t))
        return err_set(err, "the tokenizer turns bytes it has no token for into model.unk_token; "
                            "GGUF's lists cannot say so");
    size_t n_merges;
    const Pair **ranked = merges_ranked(t, &n_merges);
    out->n_tokens = t->n_ids;
    out->tokens = calloc((size_t)t->n_ids, sizeof *out->tokens);
    out->types = calloc((size_t)t->n_ids, sizeof *out->types);
    out->merges = calloc(n_merges + 1, sizeof *out->merges);
    out->pre = strdup(pre);
    int oom = !ranked || !out->tokens || !out->types || !out->merges || !out->pre;
    for (int i = 0; !oom && i < t->n_ids; i++) {
        if (t->tok_len[i] == UINT32_MAX) { /* a hole: convert_hf_to_gguf's filler */
            char pad[32];
            snprintf(pad, sizeof pad, "[PAD%d]", i);
            out->tokens[i] = strdup(pad);
            out->types[i] = TOKEN_UNUSED;
        } else {
            out->tokens[i] = token_key(t, i);
            out->types[i] = t->type[i];
        }
        oom = out->tokens[i] == NULL;
    }
    for (size_t i = 0; !oom && i < n_merges; i++) {
        out->merges[i] = merge_text(t, ranked[i]);
        out->n_merges = (int)i + 1;
        oom = out->merges[i] == NULL;
    }
    free(ranked);
    out->bos = t->bos, out->eos = t->eos, out->unk = t->unk, out->pad = t->pad;
    if (!oom && t->chat_template) oom = (out->chat_template = strdup(t->chat_template)) == NULL;
    return oom ? err_set(err, "out of memory for the tokenizer's lists") : 0;
}

int tokenizer_to_lists(const Tokenizer *t, TokenizerLists *out, char *err) {
    memset(out, 0, sizeof *out);
    out->bos = out->eos = out->unk = out->pad = -1;
    if (lists_fill(t, out, err) == 0) return 0;
    tokenizer_lists_free(out);
    return -1;
}

/* ---- tokenizer.json, tokenizer_config.json, special_tokens_map.json out ---- */

static json_t *byte_level_json(int use_regex) {
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                     "trim_offsets", 1, "use_regex", use_regex);
}

/* the stages as tokenizers' pre_tokenizer: one, or a Sequence */
static json_t *pre_tokenizer_json(const Tokenizer *t) {
    json_t *list = json_array();
    int last_byte_level = t->stage[t->n_stages - 1].kind == STAGE_BYTE_LEVEL;
    for (int k = 0; k < t->n_stages; k++) {
        const Stage *s = &t->stage[k];
        json_t *p;
        if (s->kind == STAGE_BYTE_LEVEL && k == t->n_stages - 1)
            p = byte_level_json(1);
        else if (s->kind == STAGE_DIGIT || s->kind == STAGE_DIGITS)
            p = json_pack("{s:s, s:b}", "type", "Digits", "individual_digits",
                          s->kind == STAGE_DIGIT);
        else
            p = json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex",
                          s->pattern, "behavior", "Isolated", "invert", 0);
        json_array_append_new(list, p);
    }
    if (!last_byte_level) json_array_append_new(list, byte_level_json(0));
    if (json_array_size(list) == 1) {
        json_t *one = json_incref(json_array_get(list, 0));
        json_decref(list);
        return one;
    }
    return json_pack("{s:s, s:o}", "type", "Sequence", "pretokenizers", list);
}

/* tokenizer.json's model: BPE with its vocab and merges */
static json_t *model_json(const Tokenizer *t, char *err) {
    json_t *vocab = json_object(), *merges = json_array(), *model = NULL;
    size_t n_merges;
    const Pair **ranked = merges_ranked(t, &n_merges);
    char *unk = t->unk_byte >= 0 ? token_key(t, t->unk_byte) : NULL;
    int rc = vocab && merges && ranked && (unk || t->unk_byte < 0)
                 ? 0
                 : err_set(err, "out of memory for tokenizer.json");
    for (int i = 0; rc == 0 && i < t->n_ids; i++) {
        if (t->tok_len[i] == UINT32_MAX || t->type[i] == TOKEN_UNUSED) continue;
        char *key = token_key(t, i);
        if (key == NULL)
            rc = err_set(err, "out of memory for tokenizer.json");
        else if (json_object_get(vocab, key))
            rc = err_set(err,
                         "token %d \"%.40s\" is written as another token is; tokenizer.json "
                         "cannot hold both",
                         i, key);
        else if (json_object_set_new(vocab, key, json_integer(i)) != 0)
            rc = err_set(err, "token %d is not UTF-8; tokenizer.json cannot hold it", i);
        free(key);
    }
    for (size_t i = 0; rc == 0 && i < n_merges; i++) {
        char *m = merge_text(t, ranked[i]);
        if (m == NULL || json_array_append_new(merges, json_string(m)) != 0)
            rc = err_set(err, "out of memory for tokenizer.json");
        free(m);
    }
    if (rc == 0)
        model = json_pack("{s:s, s:n, s:s?, s:n, s:n, s:b, s:b, s:b, s:O, s:O}", "type", "BPE",
                          "dropout", "unk_token", unk, "continuing_subword_prefix",
                          "end_of_word_suffix", "fuse_unk", t->fuse_unk, "byte_fallback", 0,
                          "ignore_merges", t->ignore_merges, "vocab", vocab, "merges", merges);
    if (rc == 0 && model == NULL) err_set(err, "out of memory for tokenizer.json");
    json_decref(vocab), json_decref(merges);
    free(ranked), free(unk);
    return model;
}

/* the tokenizer as tokenizers' tokenizer.json */
static json_t *tokenizer_json(const Tokenizer *t, char *err) {
    json_t *model = model_json(t, err);
    if (model == NULL) return NULL;
    json_t *added = json_array();
    for (int i = 0; i < t->n_ids; i++) {
        if (t->tok_len[i] == UINT32_MAX || t->type[i] == TOKEN_NORMAL || t->type[i] == TOKEN_UNUSED)
            continue;
        char *key = token_key(t, i);
        json_array_append_new(added, json_pack("{s:i, s:s?, s:b, s:b, s:b, s:b, s:b}", "id", i,
                                               "content", key, "single_word", 0, "lstrip", 0,
                                               "rstrip", 0, "normalized", 0, "special", 1));
        free(key);
    }
    json_t *root = json_pack("{s:s, s:n, s:n, s:o, s:o, s:o, s:n, s:o, s:o}", "version", "1.0",
                             "truncation", "padding", "added_tokens", added, "normalizer",
                             t->nfc ? json_pack("{s:s}", "type", "NFC") : json_null(),
                             "pre_tokenizer", pre_tokenizer_json(t), "post_processor", "decoder",
                             byte_level_json(1), "model", model);
    if (root == NULL) err_set(err, "out of memory for tokenizer.json");
    return root;
}

/* bos_token and friends as text into obj (none: not set) */
static int special_tokens_json(const Tokenizer *t, json_t *obj, char *err) {
    const char *names[4] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    int ids[4] = {t->bos, t->eos, t->unk, t->pad};
    for (int k = 0; k < 4; k++) {
        if (ids[k] < 0 || ids[k] >= t->n_ids || t->tok_len[ids[k]] == UINT32_MAX) continue;
        json_t *s = json_stringn((const char *)t->arena + t->tok_off[ids[k]], t->tok_len[ids[k]]);
        if (s == NULL || json_object_set_new(obj, names[k], s) != 0)
            return err_set(err, "%s (token %d) is not UTF-8 text", names[k], ids[k]);
    }
    return 0;
}

/* DIR/<name> of the text (atomically) */
static int text_write(const char *dir, const char *name, const char *text, char *err) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return file_write_atomic(path, text, strlen(text), 0644, err);
}

int tokenizer_save_hf(const Tokenizer *t, const char *dir, char *err) {
    json_t *tok = tokenizer_json(t, err), *config = json_object(), *map = json_object();
    char *text[3] = {NULL, NULL, NULL};
    int rc = tok ? 0 : -1;
    if (rc == 0 && (!config || !map)) rc = err_set(err, "out of memory");
    if (rc == 0) rc = special_tokens_json(t, map, err);
    if (rc == 0) {
        json_object_set_new(config, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
        json_object_set_new(config, "clean_up_tokenization_spaces", json_false());
        json_object_update(config, map);
        if (t->chat_template &&
            json_object_set_new(config, "chat_template", json_string(t->chat_template)) != 0)
            rc = err_set(err, "the chat template is not UTF-8 text");
    }
    /* all three in memory before the first file is written */
    if (rc == 0) {
        text[0] = json_dumps(tok, JSON_INDENT(2));
        text[1] = json_dumps(config, JSON_INDENT(2));
        text[2] = json_dumps(map, JSON_INDENT(2));
        if (!text[0] || !text[1] || !text[2]) rc = err_set(err, "out of memory for %s", dir);
    }
    if (rc == 0) rc = file_mkdir_p(dir, 0755, err);
    if (rc == 0) rc = text_write(dir, "tokenizer.json", text[0], err);
    if (rc == 0) rc = text_write(dir, "tokenizer_config.json", text[1], err);
    if (rc == 0) rc = text_write(dir, "special_tokens_map.json", text[2], err);
    json_decref(tok), json_decref(config), json_decref(map);
    free(text[0]), free(text[1]), free(text[2]);
    return rc;
}

/* ---- shards ---------------------------------------------------------------------- */

void shard_writer_init(ShardWriter *w, const char *dir, size_t shard_tokens) {
    memset(w, 0, sizeof *w);
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    w->shard_tokens = shard_tokens;
}

static int shard_write(ShardWriter *w, size_t from, size_t n, char *err) {
    char path[1200];
    snprintf(path, sizeof path, "%s/tokens_%06d.bin", w->dir, w->shards);
    if (tokens_write_bin(path, w->b.ids + from, n, err) != 0) return -1;
    w->shards++, w->written += n;
    return 0;
}

int shard_writer_flush(ShardWriter *w, int last, char *err) {
    size_t from = 0;
    int rc = 0;
    while (rc == 0 && w->b.n - from >= w->shard_tokens) {
        rc = shard_write(w, from, w->shard_tokens, err);
        from += w->shard_tokens;
    }
    if (rc == 0 && last && w->b.n > from) {
        rc = shard_write(w, from, w->b.n - from, err);
        from = w->b.n;
    }
    if (from > 0) { /* keep only what is not in a shard yet */
        memmove(w->b.ids, w->b.ids + from, (w->b.n - from) * sizeof *w->b.ids);
        w->b.n -= from;
    }
    return rc;
}

void shard_writer_free(ShardWriter *w) {
    token_buf_free(&w->b);
}

/* ---- files to shards ----------------------------------------------------------------- */

static int dir_is_empty_or_absent(const char *path) {
    DIR *d = opendir(path);
    if (d == NULL) return errno == ENOENT;
    struct dirent *e;
    int empty = 1;
    while (empty && (e = readdir(d)) != NULL)
        empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    closedir(d);
    return empty;
}

int tokenize_dir_check(const char *dir, char *err) {
    if (dir_is_empty_or_absent(dir)) return 0;
    return err_set(err, "%s is not empty: give a new folder, so no old shard is mixed in", dir);
}

/* One file's ids into w, its text normalized first where the tokenizer
 * says (Qwen2's NFC); done counts the bytes encoded, for the progress. */
static int tokenize_file(Tokenizer *t, const char *path, ShardWriter *w, ProgressBar *pb,
                         uint64_t *done, char *err) {
    char *text, *norm;
    size_t len, pos = 0, nlen;
    if (file_read_all(path, (size_t)1 << 34, &text, &len, err) != 0) return -1;
    if (tokenizer_normalize(t, text, len, &norm, &nlen, err) != 0) {
        free(text);
        return -1;
    }
    if (norm) free(text), text = norm, len = nlen;
    int rc = 0, eot = tokenizer_doc_start(t);
    if (eot >= 0 && token_buf_push(&w->b, eot) != 0) rc = err_set(err, "out of memory");
    while (rc == 0 && pos < len) {
        size_t before = pos;
        rc = tokenizer_encode_some(t, text, len, &pos, (size_t)1 << 20, &w->b, err);
        *done += pos - before;
        if (pb) {
            char suffix[64];
            snprintf(suffix, sizeof suffix, "%zu tokens", w->written + w->b.n);
            progress_update(pb, *done, suffix);
        }
        if (rc == 0) rc = shard_writer_flush(w, 0, err);
    }
    free(text);
    return rc;
}

int tokenize_files(Tokenizer *t, char *const *paths, int n, const char *dir, size_t shard_tokens,
                   FILE *progress, TokenizeStats *out, char *err) {
    memset(out, 0, sizeof *out);
    if (tokenize_dir_check(dir, err) != 0) return -1;
    for (int i = 0; i < n; i++) {
        struct stat st;
        if (stat(paths[i], &st) != 0 || !S_ISREG(st.st_mode))
            return err_set(err, "%s: not a readable file", paths[i]);
        out->bytes += (uint64_t)st.st_size;
    }
    if (file_mkdir_p(dir, 0755, err) != 0) return -1;
    ProgressBar pb;
    if (progress) progress_init(&pb, progress, "tokenize", out->bytes);
    ShardWriter w;
    shard_writer_init(&w, dir, shard_tokens);
    uint64_t done = 0;
    int rc = 0;
    for (int i = 0; rc == 0 && i < n; i++)
        rc = tokenize_file(t, paths[i], &w, progress ? &pb : NULL, &done, err);
    if (rc == 0) rc = shard_writer_flush(&w, 1, err);
    if (progress) progress_finish(&pb, done, rc == 0 ? "done" : "failed");
    out->tokens = w.written;
    out->shards = w.shards;
    shard_writer_free(&w);
    return rc;
}
