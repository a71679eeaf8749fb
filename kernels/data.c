/*
 * data.c — training data: plain text as byte tokens (vocabulary 256), and
 * token shards (.bin: a 256-int32 header with magic 20240520, a version
 * and the token count, then the ids: version 1, llm.c's, uint16; version
 * 2, Strait's for vocabularies past 65,536 as Llama 3's and Qwen2's,
 * uint32), validated on open, with the largest id seen, so no model reads
 * past its vocabulary; a train/validation split; and a loader of (B, T)
 * batches.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/data.h"
#include "util/util.h"

#define BIN_MAGIC       20240520
#define BIN_VERSION     1 /* llm.c's: uint16 ids */
#define BIN_VERSION_U32 2 /* Strait's: uint32 ids */
#define BIN_HEADER_INTS 256

/* room for n more tokens at ts->tokens + ts->n */
static uint32_t *grow(TokenSet *ts, size_t n, char *err) {
    uint32_t *grown = realloc(ts->tokens, (ts->n + n + 1) * sizeof *grown);
    if (grown == NULL) {
        err_set(err, "out of memory for %zu tokens", ts->n + n);
        return NULL;
    }
    ts->tokens = grown;
    return grown + ts->n;
}

static int load_bin(TokenSet *ts, const char *path, const char *data, size_t len, char *err) {
    if (len < BIN_HEADER_INTS * 4) return err_set(err, "%s: shorter than a .bin header", path);
    int32_t h[3];
    memcpy(h, data, sizeof h);
    if (h[0] != BIN_MAGIC)
        return err_set(err, "%s: not a token shard (magic %d, expected %d)", path, h[0], BIN_MAGIC);
    if (h[1] != BIN_VERSION && h[1] != BIN_VERSION_U32)
        return err_set(err, "%s: shard version %d, this strait reads %d (uint16) and %d (uint32)",
                       path, h[1], BIN_VERSION, BIN_VERSION_U32);
    size_t w = h[1] == BIN_VERSION ? 2 : 4, body = len - BIN_HEADER_INTS * 4;
    if (h[2] < 0 || (size_t)h[2] != body / w || body % w)
        return err_set(err, "%s: header says %d tokens, the file holds %zu bytes of them", path,
                       h[2], body);
    size_t n = (size_t)h[2];
    uint32_t *t = grow(ts, n, err), top = 0;
    if (t == NULL) return -1;
    const uint8_t *src = (const uint8_t *)data + BIN_HEADER_INTS * 4;
    for (size_t i = 0; i < n; i++) {
        uint16_t v16;
        if (w == 2)
            memcpy(&v16, src + 2 * i, 2), t[i] = v16;
        else
            memcpy(&t[i], src + 4 * i, 4);
        top = t[i] > top ? t[i] : top;
    }
    if (top >= (1u << 22))
        return err_set(err, "%s holds token id %u; a vocabulary has at most 2^22", path, top);
    ts->n += n;
    if ((int)top + 1 > ts->vocab) ts->vocab = (int)top + 1;
    ts->shards = 1;
    return 0;
}

int tokens_load(TokenSet *ts, const char *const *paths, int n_paths, char *err) {
    memset(ts, 0, sizeof *ts);
    int kinds = 0; /* 1 text, 2 bin: one vocabulary per set */
    for (int i = 0; i < n_paths; i++) {
        char *data;
        size_t len;
        if (file_read_all(paths[i], (size_t)1 << 34, &data, &len, err) != 0) {
            tokens_free(ts);
            return -1;
        }
        size_t n = strlen(paths[i]);
        int is_bin = n > 4 && strcmp(paths[i] + n - 4, ".bin") == 0;
        int rc;
        if (is_bin) {
            rc = load_bin(ts, paths[i], data, len, err);
        } else {
            uint32_t *t = grow(ts, len, err);
            for (size_t k = 0; t && k < len; k++) t[k] = (uint8_t)data[k];
            if (t) ts->n += len;
            rc = t ? 0 : -1;
            if (ts->vocab == 0) ts->vocab = 256;
        }
        free(data);
        kinds |= is_bin ? 2 : 1;
        if (rc != 0 || kinds == 3) {
            if (kinds == 3)
                err_set(err, "mixing text files and .bin shards: they have different vocabularies");
            tokens_free(ts);
            return -1;
        }
    }
    if (ts->n < 2) {
        tokens_free(ts);
        return err_set(err, "no tokens in the data given");
    }
    return 0;
}

void tokens_free(TokenSet *ts) {
    free(ts->tokens);
    memset(ts, 0, sizeof *ts);
}

int tokens_write_bin(const char *path, const uint32_t *tokens, size_t n, char *err) {
    if (n > 0x7fffffff) return err_set(err, "too many tokens for one shard");
    uint32_t top = 0;
    for (size_t i = 0; i < n; i++) top = tokens[i] > top ? tokens[i] : top;
    int wide = top > 0xffff; /* llm.c's uint16 when the ids fit, as they do for GPT-2 */
    AtomicFile *af = file_atomic_open(path, 0644, err);
    if (af == NULL) return -1;
    int32_t h[BIN_HEADER_INTS] = {BIN_MAGIC, wide ? BIN_VERSION_U32 : BIN_VERSION, (int32_t)n};
    int rc = file_atomic_write(af, h, sizeof h, err);
    if (wide && rc == 0) rc = file_atomic_write(af, tokens, n * 4, err);
    uint16_t chunk[4096];
    for (size_t i = 0; !wide && rc == 0 && i < n; i += 4096) {
        size_t k = n - i < 4096 ? n - i : 4096;
        for (size_t j = 0; j < k; j++) chunk[j] = (uint16_t)tokens[i + j];
        rc = file_atomic_write(af, chunk, k * 2, err);
    }
    if (rc != 0) {
        file_atomic_abort(af);
        return -1;
    }
    return file_atomic_commit(af, err);
}

void tokens_split(const TokenSet *all, double val_frac, TokenView *train, TokenView *val) {
    size_t n_val = (size_t)((double)all->n * val_frac);
    if (n_val < 2 && val_frac > 0) n_val = all->n > 4 ? 2 : 0;
    train->tokens = all->tokens;
    train->n = all->n - n_val;
    val->tokens = all->tokens + train->n;
    val->n = n_val;
}

int loader_init(Loader *ld, TokenView data, int B, int T, int shard, int n_shards, uint64_t seed,
                char *err) {
    memset(ld, 0, sizeof *ld);
    if (n_shards < 1 || shard < 0 || shard >= n_shards)
        return err_set(err, "shard %d of %d is not a shard", shard, n_shards);
    size_t per = data.n / (size_t)n_shards;
    ld->data.tokens = data.tokens + per * (size_t)shard;
    ld->data.n = shard == n_shards - 1 ? data.n - per * (size_t)shard : per;
    if (ld->data.n < (size_t)B * T + 1)
        return err_set(err, "shard of %zu tokens is too small for batches of %d x %d", ld->data.n,
                       B, T);
    ld->B = B, ld->T = T;
    /* a seeded random start, so sites sharing a corpus do not read in lockstep */
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    z ^= z >> 31;
    ld->pos = (size_t)(z % (ld->data.n - (size_t)B * T));
    return 0;
}

void loader_next(Loader *ld, int *inputs, int *targets) {
    size_t need = (size_t)ld->B * ld->T + 1;
    if (ld->pos + need > ld->data.n) ld->pos = 0; /* wrap to the start */
    const uint32_t *t = ld->data.tokens + ld->pos;
    for (size_t i = 0; i + 1 < need; i++) {
        inputs[i] = t[i];
        targets[i] = t[i + 1];
    }
    ld->pos += need - 1;
}
