/*
 * tokenizer.c — GPT-2's byte-level BPE (API and behaviour: tokenizer.h).
 *
 * vocab.json keys are written in GPT-2's byte-to-unicode alphabet (printable
 * bytes stand for themselves, the other 68 are shifted to U+0100..U+0143);
 * they are turned back into bytes on load, so encoding works on bytes and
 * ids throughout: a piece starts as its byte tokens and pairs are merged
 * from a heap ordered by (rank, position), the way `tokenizers` does it.
 * A key outside that alphabet is a special token: decodable, never merged.
 *
 * tokenizer.json (Hugging Face `tokenizers`' one file) gives the same
 * model — model.vocab, model.merges (strings or pairs), Llama 3's
 * ignore_merges — with its pre-tokenization pattern (GPT-2's ByteLevel, or
 * the Split regex of Llama 3 and Qwen2) and added_tokens: special tokens,
 * decodable as their text, never matched inside a document.
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

#define MAX_IDS         (1 << 22) /* a model's largest vocabulary (model.h) */
#define MAX_MERGE_LINES (1 << 20) /* Llama 3 has 280 147, Qwen2 151 387 */

typedef struct Str {
    uint32_t off, len; /* in Tokenizer.arena */
    int id;            /* -1: empty slot */
} Str;

typedef struct Pair {
    uint64_t key; /* (a << 32 | b) + 1; 0: empty slot */
    int32_t rank;
    int32_t merged;
} Pair;

struct Tokenizer {
    uint8_t *arena; /* every token's bytes */
    size_t arena_len;
    uint32_t *tok_off, *tok_len; /* per id; tok_len UINT32_MAX: no such id */
    int n_ids, eot, bot, n_merges;
    int ignore_merges; /* a piece that is a token is that token (Llama 3's tokenizer.json) */
    int nfc;           /* text is put in Unicode NFC first (Qwen2's tokenizer.json) */
    int byte_id[256];
    Str *strs; /* bytes -> id, open addressing */
    size_t strs_cap;
    Pair *pairs; /* (a, b) -> rank and merged id */
    size_t pairs_cap;
    pcre2_code *re;
    pcre2_match_data *md;
    /* scratch for one piece */
    int *sym, *next, *prev;
    struct HeapItem {
        int32_t rank, pos;
    } * heap;
    size_t scratch_cap;
    size_t ids_cap; /* entries of tok_off and tok_len */
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
 * code point is in the alphabet, 0 for a special token (its UTF-8 kept),
 * -1 for malformed UTF-8 or no memory. */
static int key_to_bytes(Tokenizer *t, const char *key, size_t n, uint32_t *off, uint32_t *len) {
    uint8_t *grown = realloc(t->arena, t->arena_len + n + 1);
    if (grown == NULL) return -1;
    t->arena = grown;
    *off = (uint32_t)t->arena_len;
    size_t out = 0, i = 0;
    int mapped = 1;
    while (i < n) {
        int64_t cp = utf8_next((const uint8_t *)key, n, &i);
        if (cp < 0) return -1;
        int b = cp_to_byte((uint32_t)cp);
        if (b < 0) {
            mapped = 0;
            break;
        }
        t->arena[t->arena_len + out++] = (uint8_t)b;
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

/* the vocabulary, an object of token: id (vocab.json, tokenizer.json's
 * model.vocab); `extra` more ids' room for added tokens */
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
    t->ids_cap = ids;
    t->tok_off = calloc(ids, sizeof *t->tok_off);
    t->tok_len = malloc(ids * sizeof *t->tok_len);
    for (size_t c = 4; c < 2 * n; c <<= 1) t->strs_cap = c << 1;
    if (t->strs_cap < 8) t->strs_cap = 8;
    t->strs = malloc(t->strs_cap * sizeof *t->strs);
    if (!t->tok_off || !t->tok_len || !t->strs)
        return err_set(err, "out of memory for the vocabulary");
    memset(t->tok_len, 0xff, ids * sizeof *t->tok_len);
    for (size_t i = 0; i < t->strs_cap; i++) t->strs[i].id = -1;
    int rc = 0;
    json_object_foreach(root, key, val) {
        json_int_t id = json_integer_value(val);
        if (t->tok_len[id] != UINT32_MAX) {
            rc = err_set(err, "%s: id %d is given to two tokens", what, (int)id);
            break;
        }
        uint32_t off, blen;
        int mapped = key_to_bytes(t, key, strlen(key), &off, &blen);
        if (mapped < 0) {
            rc = err_set(err, "%s: token \"%.40s\" is not UTF-8 (or out of memory)", what, key);
            break;
        }
        t->tok_off[id] = off, t->tok_len[id] = blen;
        if (id + 1 > t->n_ids) t->n_ids = (int)id + 1;
        if (strcmp(key, "<|endoftext|>") == 0) t->eot = (int)id;
        if (strcmp(key, "<|begin_of_text|>") == 0) t->bot = (int)id;
        if (!mapped) continue; /* special: decodable, never merged */
        Str *s = str_slot(t, t->arena + off, blen);
        if (s->id >= 0) {
            rc = err_set(err, "%s: token \"%.40s\" is written twice", what, key);
            break;
        }
        s->off = off, s->len = blen, s->id = (int)id;
        if (blen == 1) t->byte_id[t->arena[off]] = (int)id;
    }
    for (int b = 0; rc == 0 && b < 256; b++)
        if (t->byte_id[b] < 0)
            rc = err_set(err,
                         "%s has no token for byte 0x%02x: not a byte-level BPE vocabulary "
                         "(GPT-2's, Llama 3's and Qwen2's have all 256)",
                         what, b);
    return rc;
}

static int parse_vocab(Tokenizer *t, const char *text, size_t len, char *err) {
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (root == NULL) return err_set(err, "vocab.json: not JSON (line %d: %s)", je.line, je.text);
    int rc = parse_vocab_object(t, root, "vocab.json", 0, err);
    json_decref(root);
    return rc;
}

/* One line "A B" of merges.txt, numbered for errors. */
static int add_merge(Tokenizer *t, const char *line, size_t n, int lineno, char *err) {
    const char *sp = memchr(line, ' ', n);
    if (sp == NULL || sp == line || sp + 1 == line + n ||
        memchr(sp + 1, ' ', (size_t)(line + n - sp - 1)))
        return err_set(err, "merges.txt line %d: expected two tokens separated by one space",
                       lineno);
    uint32_t oa, la, ob, lb;
    size_t mark = t->arena_len;
    if (key_to_bytes(t, line, (size_t)(sp - line), &oa, &la) != 1 ||
        key_to_bytes(t, sp + 1, (size_t)(line + n - sp - 1), &ob, &lb) != 1) {
        t->arena_len = mark;
        return err_set(err, "merges.txt line %d: a token outside GPT-2's byte alphabet", lineno);
    }
    int a = str_find(t, t->arena + oa, la), b = str_find(t, t->arena + ob, lb);
    /* the two halves sit side by side in the arena: their concatenation */
    int m = oa + la == ob ? str_find(t, t->arena + oa, (size_t)la + lb) : -1;
    t->arena_len = mark;
    if (a < 0 || b < 0 || m < 0)
        return err_set(err, "merges.txt line %d: \"%.*s\" %s", lineno, (int)(n > 60 ? 60 : n), line,
                       a < 0 || b < 0 ? "names a token vocab.json does not have"
                                      : "merges into a token vocab.json does not have");
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
        if (!skip && add_merge(t, text + i, m, lineno, err) != 0) return -1;
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
    t->eot = t->bot = -1;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    return t;
}

/* the pre-tokenization pattern compiled (PCRE2, Unicode properties) */
static int compile_pattern(Tokenizer *t, const char *pattern, char *err) {
    int code;
    PCRE2_SIZE at;
    t->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &at, NULL);
    if (t->re == NULL) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        return err_set(err, "the pre-tokenization pattern does not compile at offset %zu: %s",
                       (size_t)at, (char *)msg);
    }
    pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* faster when the JIT is there */
    t->md = pcre2_match_data_create_from_pattern(t->re, NULL);
    return t->md ? 0 : err_set(err, "out of memory");
}

Tokenizer *tokenizer_parse(const char *vocab, size_t vocab_len, const char *merges,
                           size_t merges_len, char *err) {
    Tokenizer *t = tokenizer_new(err);
    if (t == NULL) return NULL;
    if (parse_vocab(t, vocab, vocab_len, err) != 0 ||
        parse_merges(t, merges, merges_len, err) != 0 || compile_pattern(t, PATTERN, err) != 0) {
        tokenizer_free(t);
        return NULL;
    }
    return t;
}

/* ---- tokenizer.json --------------------------------------------------------------- */

/* ByteLevel's settings that Strait computes: no prefix space */
static int byte_level_ok(json_t *p, char *err) {
    if (json_is_true(json_object_get(p, "add_prefix_space")))
        return err_set(err, "tokenizer.json: ByteLevel with add_prefix_space; Strait encodes text "
                            "as it is, with no space added");
    return 0;
}

/* pre_tokenizer: GPT-2's (ByteLevel with its regex), or a Split on a regex
 * (Isolated) then ByteLevel without one (Llama 3's, Qwen2's); the pattern
 * into *pattern (owned by j) */
static int read_pre_tokenizer(json_t *pre, const char **pattern, char *err) {
    const char *type = json_string_value(json_object_get(pre, "type"));
    if (type && strcmp(type, "ByteLevel") == 0) {
        json_t *ur = json_object_get(pre, "use_regex");
        if (ur && !json_is_true(ur))
            return err_set(err, "tokenizer.json: ByteLevel without a regex splits nothing; "
                                "Strait needs a pre-tokenization pattern");
        *pattern = PATTERN;
        return byte_level_ok(pre, err);
    }
    json_t *list = json_object_get(pre, "pretokenizers");
    if (type && strcmp(type, "Sequence") == 0 && json_array_size(list) == 2) {
        json_t *split = json_array_get(list, 0), *bl = json_array_get(list, 1);
        const char *st = json_string_value(json_object_get(split, "type"));
        const char *bt = json_string_value(json_object_get(bl, "type"));
        const char *re =
            json_string_value(json_object_get(json_object_get(split, "pattern"), "Regex"));
        const char *behavior = json_string_value(json_object_get(split, "behavior"));
        if (st && bt && re && behavior && strcmp(st, "Split") == 0 &&
            strcmp(bt, "ByteLevel") == 0 && strcmp(behavior, "Isolated") == 0 &&
            !json_is_true(json_object_get(split, "invert")) &&
            !json_is_true(json_object_get(bl, "use_regex"))) {
            *pattern = re;
            return byte_level_ok(bl, err);
        }
    }
    return err_set(err,
                   "tokenizer.json: pre_tokenizer %s is not one Strait computes (GPT-2's "
                   "ByteLevel, or a Split on a Regex, Isolated, then ByteLevel: Llama 3's and "
                   "Qwen2's)",
                   type ? type : "(none)");
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
        if (add_merge(t, line, (size_t)len, (int)i + 1, err) != 0) return -1;
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
            continue;
        }
        uint8_t *grown = realloc(t->arena, t->arena_len + n + 1);
        if (grown == NULL) return err_set(err, "out of memory");
        t->arena = grown;
        memcpy(t->arena + t->arena_len, content, n);
        t->tok_off[id] = (uint32_t)t->arena_len, t->tok_len[id] = (uint32_t)n;
        t->arena_len += n;
        if (id + 1 > t->n_ids) t->n_ids = (int)id + 1;
        if (strcmp(content, "<|endoftext|>") == 0) t->eot = (int)id;
        if (strcmp(content, "<|begin_of_text|>") == 0) t->bot = (int)id;
    }
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
                            "2's) is not byte-level; Strait reads GPT-2's, Llama 3's and Qwen2's");
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
    const char *pattern = NULL;
    if (read_pre_tokenizer(json_object_get(root, "pre_tokenizer"), &pattern, err) != 0) return -1;
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
    return compile_pattern(t, pattern, err);
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

Tokenizer *tokenizer_load_dir(const char *dir, char *err) {
    char path[1200], v[1200], m[1200], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (access(path, F_OK) == 0) {
        if (file_read_all(path, (size_t)1 << 28, &text, &len, err) != 0) return NULL;
        Tokenizer *t = tokenizer_parse_json(text, len, err);
        free(text);
        return t;
    }
    snprintf(v, sizeof v, "%s/vocab.json", dir);
    snprintf(m, sizeof m, "%s/merges.txt", dir);
    if (access(v, F_OK) != 0) {
        err_set(err, "%s has neither tokenizer.json nor vocab.json and merges.txt", dir);
        return NULL;
    }
    return tokenizer_load(v, m, err);
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
    pcre2_match_data_free(t->md);
    pcre2_code_free(t->re);
    free(t->arena), free(t->tok_off), free(t->tok_len), free(t->strs), free(t->pairs);
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
    for (size_t i = 0; i < n; i++) {
        t->sym[i] = t->byte_id[p[i]];
        t->next[i] = i + 1 < n ? (int)i + 1 : -1;
        t->prev[i] = (int)i - 1;
    }
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) push_pair(t, &hn, (int)i);
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

int tokenizer_encode_some(Tokenizer *t, const char *text, size_t len, size_t *pos, size_t budget,
                          TokenBuf *out, char *err) {
    size_t start = *pos;
    while (*pos < len && (budget == 0 || *pos - start < budget)) {
        size_t s = len, e = len;
        int rc = pcre2_match(t->re, (PCRE2_SPTR)text, len, *pos, 0, t->md, NULL);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) { /* a pattern from a file may backtrack */
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return err_set(err, "the pre-tokenization pattern failed at byte %zu: %s", *pos,
                           (char *)msg);
        }
        if (rc > 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
            s = ov[0], e = ov[1] > ov[0] ? ov[1] : ov[0] + 1;
        }
        /* bytes the pattern does not cover (invalid UTF-8) form a piece of their own */
        if (s > *pos && encode_piece(t, (const uint8_t *)text + *pos, s - *pos, out) != 0)
            return err_set(err, "out of memory while encoding");
        if (s < len && encode_piece(t, (const uint8_t *)text + s, e - s, out) != 0)
            return err_set(err, "out of memory while encoding");
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
