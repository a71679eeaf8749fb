/*
 * ef.c — error feedback at the site: e ← β·e + Δ; send C(e); e ← e − Ĉ(e).
 * What a lossy codec drops this round is carried into the next, so sparse
 * and quantized updates converge to the dense ones over rounds (DGC,
 * SparseLoCo). The residual is saved with the site's state in the
 * checksummed form below (FORMATS.md).
 */
#include <math.h>
#include <stdlib.h>

#include <xxhash.h>

#include "compress_internal.h"
#include "util/util.h"

#define EF_MAGIC      0x46455453u /* "STEF" */
#define EF_VERSION    1
#define EF_HEADER_LEN 32

int ef_init(ErrorFeedback *ef, uint64_t n, uint64_t table_hash, float beta, char *err) {
    memset(ef, 0, sizeof *ef);
    if (n == 0 || n > CODEC_MAX_ELEMENTS)
        return err_set(err, "error feedback for %llu values is out of range",
                       (unsigned long long)n);
    if (!(beta >= 0.0f && beta <= 1.0f))
        return err_set(err, "error feedback beta %g out of range; use 0 to 1", (double)beta);
    ef->e = calloc(n, sizeof(float));
    if (ef->e == NULL) return err_set(err, "out of memory for the error feedback residual");
    ef->n = n;
    ef->table_hash = table_hash;
    ef->beta = beta;
    return 0;
}

void ef_free(ErrorFeedback *ef) {
    ef_release_device(ef);
    free(ef->e);
    memset(ef, 0, sizeof *ef);
}

/* One section of the whole step, on its own span of e (sections are
 * disjoint, so they run in parallel): e ← βe + Δ, its payload C(e), and
 * e ← e − decoded from that payload while it and e are still in cache (the
 * blob's own bytes before their lossless stage: the floats decoding the
 * blob would give, without decompressing what was just compressed). */
typedef struct EfStep {
    float *e;
    const float *a, *b; /* Δ = a − b; b NULL: Δ = a */
    float beta;
    float *decoded; /* NULL: not asked for */
} EfStep;

static int ef_section(void *ctx, const CodecParams *p, uint64_t offset, uint32_t count,
                      uint8_t *raw, char *err) {
    const EfStep *st = ctx;
    float *restrict e = st->e + offset, beta = st->beta;
    const float *a = st->a + offset;
    if (st->b) {
        const float *b = st->b + offset;
        for (uint32_t i = 0; i < count; i++) e[i] = beta * e[i] + (a[i] - b[i]);
    } else {
        for (uint32_t i = 0; i < count; i++) e[i] = beta * e[i] + a[i];
    }
    const CodecOps *ops = codec_ops(p->id);
    if (ops->encode(p, e, count, raw, err) != 0) return -1;
    if (st->decoded == NULL) {
        ops->apply(p, raw, count, -1.0f, e, 1);
        return 0;
    }
    float *restrict d = st->decoded + offset; /* e + (−1)·d is e − d: the same floats */
    ops->apply(p, raw, count, 0.0f, d, 0);
    for (uint32_t i = 0; i < count; i++) e[i] = e[i] - d[i];
    return 0;
}

int ef_encode(ErrorFeedback *ef, const CodecParams *p, const CodecLayout *layout, const float *a,
              const float *b, float *decoded, Blob *out, char *err) {
    assert(ef->d_e == NULL); /* the residual is on the GPU: ef_encode_cuda */
    assert(decoded == NULL || (decoded != ef->e && decoded != a && decoded != b));
    if (layout->n != ef->n || layout->table_hash != ef->table_hash)
        return err_set(err, "error feedback state is for another parameter table");
    EfStep st = {ef->e, a, b, ef->beta, decoded};
    return codec_encode_sections(p, layout, ef_section, &st, 1, out, err);
}

/* The serialised form: this header, the n residual floats (little-endian,
 * as in memory), then XXH64 of all that. */
static void ef_header(const ErrorFeedback *ef, uint8_t *b) {
    st32(b, EF_MAGIC);
    st16(b + 4, EF_VERSION);
    st16(b + 6, 0);
    st64(b + 8, ef->n);
    st64(b + 16, ef->table_hash);
    stf(b + 24, ef->beta);
    st32(b + 28, 0);
}

int ef_serialize(const ErrorFeedback *ef, Blob *out, char *err) {
    assert(!ef->host_stale); /* ef_to_host first */
    size_t len = EF_HEADER_LEN + 4 * (size_t)ef->n + 8;
    out->len = 0;
    if (blob_reserve(out, len, err) != 0) return -1;
    uint8_t *b = out->data;
    ef_header(ef, b);
    memcpy(b + EF_HEADER_LEN, ef->e, 4 * (size_t)ef->n);
    st64(b + len - 8, XXH64(b, len - 8, 0));
    out->len = len;
    return 0;
}

int ef_save(const ErrorFeedback *ef, const char *path, int mode, char *err) {
    assert(!ef->host_stale); /* ef_to_host first */
    uint8_t h[EF_HEADER_LEN], tail[8];
    ef_header(ef, h);
    XXH64_state_t *x = XXH64_createState();
    if (x == NULL) return err_set(err, "out of memory");
    XXH64_reset(x, 0);
    XXH64_update(x, h, sizeof h);
    XXH64_update(x, ef->e, 4 * (size_t)ef->n);
    st64(tail, XXH64_digest(x));
    XXH64_freeState(x);
    AtomicFile *af = file_atomic_open(path, mode, err);
    if (af == NULL) return -1;
    if (file_atomic_write(af, h, sizeof h, err) != 0 ||
        file_atomic_write(af, ef->e, 4 * (size_t)ef->n, err) != 0 ||
        file_atomic_write(af, tail, sizeof tail, err) != 0) {
        file_atomic_abort(af);
        return -1;
    }
    return file_atomic_commit(af, err);
}

int ef_deserialize(ErrorFeedback *ef, const uint8_t *b, size_t len, char *err) {
    memset(ef, 0, sizeof *ef);
    if (len < EF_HEADER_LEN + 8) return err_set(err, "error feedback state is truncated");
    if (ld32(b) != EF_MAGIC) return err_set(err, "not an error feedback state (wrong magic)");
    if (ld16(b + 4) != EF_VERSION)
        return err_set(err, "error feedback state version %u is not supported", ld16(b + 4));
    uint64_t n = ld64(b + 8);
    if (n == 0 || n > CODEC_MAX_ELEMENTS || len != EF_HEADER_LEN + 4 * n + 8)
        return err_set(err, "error feedback state length does not match its %llu values",
                       (unsigned long long)n);
    if (ld64(b + len - 8) != XXH64(b, len - 8, 0))
        return err_set(err, "error feedback state checksum mismatch; the file is damaged");
    float beta = ldf(b + 24);
    if (ef_init(ef, n, ld64(b + 16), beta, err) != 0) return -1;
    memcpy(ef->e, b + EF_HEADER_LEN, 4 * (size_t)n);
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(ef->e[i])) {
            ef_free(ef);
            return err_set(err, "error feedback state holds a non-finite value");
        }
    return 0;
}
