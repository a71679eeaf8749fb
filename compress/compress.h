/*
 * compress.h — the API of compress/: codecs for model updates and
 * checkpoints, the update blob (schema/FORMATS.md), error feedback, and
 * decode-and-accumulate into an fp32 sum.
 *
 * An update is a flat fp32 vector over the model's parameter table. The
 * encoder cuts it into sections at tensor boundaries (and at most
 * CODEC_SECTION_MAX elements each); each section is encoded on its own,
 * optionally zstd-compressed when that makes it smaller, and checksummed
 * (XXH64). Sections are the unit of streaming: a receiver can check and
 * decode one while the next arrives.
 *
 * Untrusted blobs: codec_blob_inspect validates everything — header,
 * section table, checksums, decompressed sizes, indices, that every decoded
 * value is finite — and measures the update's norm without touching any sum.
 * Only a blob that passed inspection is given to codec_decode_accumulate, so
 * a bad update is never half-applied. Both check every length and count
 * against the header and the hard limits below before they allocate or
 * index, and return -1 with a reason instead of crashing.
 *
 * Determinism: encoding the same input with the same parameters gives the
 * same bytes on every machine and thread count, and the CUDA kernels give
 * the same bytes as this CPU code (FORMATS.md states the one exception).
 */
#ifndef STRAIT_COMPRESS_H
#define STRAIT_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

typedef enum CodecId {
    CODEC_FP32 = 1,
    CODEC_FP16 = 2,
    CODEC_BF16 = 3,
    CODEC_INT8 = 4,
    CODEC_TOPK = 5,
} CodecId;

/* Hard limits a decoder enforces before allocating. */
#define CODEC_MAX_ELEMENTS       (1ull << 36) /* 64 Gi parameters */
#define CODEC_SECTION_MAX        (1u << 20)   /* elements per section */
#define CODEC_MAX_SECTIONS       (1u << 24)
#define CODEC_INT8_BLOCK_DEFAULT 65536
#define CODEC_TOPK_CHUNK_DEFAULT 4096
#define CODEC_TOPK_CHUNK_MAX     65536 /* indices are uint16 */

typedef struct CodecParams {
    CodecId id;
    uint32_t block;      /* int8: values per scale and table (1..CODEC_SECTION_MAX) */
    uint32_t chunk;      /* topk: values per selection (1..CODEC_TOPK_CHUNK_MAX) */
    double density;      /* topk: kept fraction, (0, 0.5]; k = ceil(density * chunk) */
    uint32_t value_bits; /* topk: 8 (int8 bin means) or 2 (four bin means) */
    int zstd_level;      /* 0: no lossless stage; else zstd level 1..19 */
} CodecParams;

/* Defaults of docs/design.md §3: int8 blocks of 64 Ki, top-k 1% of chunks of 4 Ki
 * with int8 values, zstd level 1 (on float data it shrinks as much as level 3
 * at twice the speed). */
CodecParams codec_params_default(CodecId id);
/* "fp32", "fp16", "bf16", "int8", "topk"; NULL for an unknown id. */
const char *codec_name(CodecId id);
/* Every name codec_params_parse takes, for messages: "fp32, …, topk or topk2". */
const char *codec_names(void);
/* The name codec_params_parse takes back for these parameters' family:
 * "topk2" for top-k with 2-bit values, else codec_name. */
const char *codec_params_name(const CodecParams *p);
/* The instruction set the codecs' inner loops run with on this machine:
 * "avx512", "avx2" or "scalar" (STRAIT_CODEC_ISA may force one); every one
 * makes the same bytes. */
const char *codec_isa(void);
/* out[i] = s·x[i] over n values, on every core, out written around the
 * caches (non-temporal stores): for a buffer nothing reads soon, a round's
 * mean. */
void codec_scale(const float *x, uint64_t n, float s, float *out);
/* Parses a name (and "topk2" for 2-bit values) into defaults; -1 if unknown. */
int codec_params_parse(const char *name, CodecParams *out, char *err);
int codec_params_check(const CodecParams *p, char *err);

/* The parameter table, as far as codecs care: its hash and the tensor sizes
 * in order (sections never straddle two tensors). sizes may be NULL: one
 * tensor of n elements. */
typedef struct CodecLayout {
    uint64_t table_hash;
    uint64_t n;
    const uint64_t *sizes;
    size_t n_tensors;
} CodecLayout;

/* A growable byte buffer; owns data. */
typedef struct Blob {
    uint8_t *data;
    size_t len, cap;
} Blob;
void blob_free(Blob *b);

/* Encodes x (layout->n floats) into out (replacing its content).
 * Returns 0, or -1 with a reason (bad parameters, non-finite input). */
int codec_encode(const CodecParams *p, const CodecLayout *layout, const float *x, Blob *out,
                 char *err);

/* The largest blob codec_encode can make with these parameters for this
 * layout (0 for bad parameters): what a receiver may accept. */
uint64_t codec_blob_max_len(const CodecParams *p, const CodecLayout *layout);

typedef struct BlobInfo {
    CodecParams params;
    uint64_t table_hash;
    uint64_t n;
    uint32_t n_sections;
    uint64_t raw_bytes;  /* fp32 bytes of the update: 4 n */
    uint64_t wire_bytes; /* bytes of the blob */
    double norm2;        /* squared L2 norm of the decoded update */
    uint64_t nonzeros;   /* values a sparse codec carries, n for dense ones */
} BlobInfo;

/* What a buffer holds, by its magic: an update blob, a checkpoint blob
 * (ckpt_encode), or neither (0). Says nothing of its validity. */
typedef enum BlobKind { BLOB_KIND_NONE = 0, BLOB_KIND_UPDATE, BLOB_KIND_CHECKPOINT } BlobKind;
BlobKind compress_blob_kind(const uint8_t *data, size_t len);

/* The codec and parameters a blob's header names, the header checked (a
 * receiver enforces its codec before it inspects the whole blob). */
int codec_blob_params(const uint8_t *blob, size_t len, CodecParams *out, char *err);

/* What codec_blob_inspect returns for a blob whose only fault is a value
 * that is not finite (a site's training diverged), as against -1 for one
 * that is malformed. */
#define CODEC_NON_FINITE (-2)
/* What codec_blob_check_add returns for a well-formed header of another
 * model: another parameter table, or another count of values. */
#define CODEC_WRONG_MODEL (-3)

/* Validates a whole blob from an untrusted peer (see above). expect_hash and
 * expect_n are what the receiver's model has; 0 skips that check. 0, -1 or
 * CODEC_NON_FINITE, with the reason in err. */
int codec_blob_inspect(const uint8_t *blob, size_t len, uint64_t expect_hash, uint64_t expect_n,
                       BlobInfo *info, char *err);
/* An inspected blob, ready to apply without decompressing or checksumming
 * it again: what codec_blob_check keeps of it (the decompressed payloads of
 * its zstd sections; the rest it reads in the blob, which must outlive it).
 * A receiver inspects once and accumulates from this, and refills the same
 * one for the next blob: its buffers stay, so no new pages are paid. */
typedef struct CodecChecked CodecChecked;
CodecChecked *codec_checked_new(void); /* empty; NULL: out of memory */
/* codec_blob_inspect, keeping what it checked in c (what c held before is
 * gone; on failure c is empty). */
int codec_blob_check(const uint8_t *blob, size_t len, uint64_t expect_hash, uint64_t expect_n,
                     BlobInfo *info, CodecChecked *c, char *err);
/* sum[i] += weight * decoded[i], as codec_decode_accumulate, in parallel
 * over sections; c must hold a blob that passed. fresh: sum is zeros never
 * touched (calloc's pages); each section zeroes its span before adding, so
 * every page is first touched by a write. Read first, a page maps the
 * shared zero page, and the write after it costs a copy-on-write fault
 * and a TLB shootdown across all the process's threads. */
void codec_checked_accumulate(const CodecChecked *c, float weight, float *sum, int fresh);
void codec_checked_free(CodecChecked *c); /* NULL is fine */
/* codec_blob_check (expect_hash 0: any) and, in the same pass, out = sum + weight * decoded
 * (sum NULL: out = 0 + weight * decoded, the floats of a fresh
 * codec_checked_accumulate), each section checked and added while it is
 * in cache: the update is read once from memory. out's floats are those of
 * copying sum and then codec_checked_accumulate. On failure out holds
 * anything and c is empty; sum is only read, so a receiver that keeps its
 * sum in sum and adds into a second buffer (swapped in when the update
 * passes its gates) loses nothing to a refused update. n values; a blob
 * of another table or count: CODEC_WRONG_MODEL. */
int codec_blob_check_add(const uint8_t *blob, size_t len, uint64_t expect_hash, uint64_t n,
                         float weight, const float *sum, float *out, BlobInfo *info,
                         CodecChecked *c, char *err);

/* codec_blob_inspect and codec_decode in one pass, each section checked
 * before it is decoded: for a receiver that gives up on a bad blob, since
 * after a failure x holds some of its sections (unspecified which). 0, -1
 * or CODEC_NON_FINITE, as codec_blob_inspect. */
int codec_inspect_decode(const uint8_t *blob, size_t len, uint64_t expect_hash, uint64_t n,
                         float *x, BlobInfo *info, char *err);
/* sum[i] += weight * decoded[i], section by section, with no dense
 * temporary. Gives exactly the floats of codec_decode followed by
 * sum[i] = sum[i] + weight * x[i]. */
int codec_decode_accumulate(const uint8_t *blob, size_t len, float weight, float *sum, uint64_t n,
                            char *err);
/* x = decoded (n floats). */
int codec_decode(const uint8_t *blob, size_t len, float *x, uint64_t n, char *err);
/* Sequential reads of a blob's values, each section decoded (and checked)
 * once, holding one section (at most CODEC_SECTION_MAX floats): robust
 * aggregation reads every update block by block through one each, so it
 * reads each update once. Ranges must not go backwards. */
typedef struct CodecCursor CodecCursor;
CodecCursor *codec_cursor_open(const uint8_t *blob, size_t len, uint64_t n, char *err);
/* out[0 .. hi-lo) = decoded values lo .. hi-1 */
int codec_cursor_read(CodecCursor *c, uint64_t lo, uint64_t hi, float *out, char *err);
/* How many of the blob's bytes the cursor has read past (the sections
 * before the one it holds decoded): it never reads them again. */
size_t codec_cursor_done(const CodecCursor *c);
void codec_cursor_close(CodecCursor *c);

/* ---- GPU paths ------------------------------------------------------------ */

/* The same blob as codec_encode, from an update in GPU memory (d_x): the
 * codec's kernels run on the device, zstd and checksums on the CPU. Returns
 * -1 with a reason in a build without CUDA. */
int codec_encode_cuda(const CodecParams *p, const CodecLayout *layout, const float *d_x, Blob *out,
                      char *err);
/* codec_decode_accumulate into a sum in GPU memory, every codec, the same
 * floats. The blob must have passed codec_blob_inspect (or be one this
 * process encoded). */
int codec_decode_accumulate_cuda(const uint8_t *blob, size_t len, float weight, float *d_sum,
                                 uint64_t n, char *err);

/* ---- error feedback (at the site) -------------------------------------- */

/* e ← β·e + Δ; blob = C(e); e ← e − decode(blob). The residual is the
 * sender's memory of what compression dropped, and is checkpointed with it.
 * Ownership: the state owns e. */
typedef struct ErrorFeedback {
    uint64_t n;
    uint64_t table_hash;
    float beta;
    float *e;
    float *d_e;     /* the residual on the GPU, once ef_encode_cuda ran; NULL before */
    int host_stale; /* e is behind d_e until ef_to_host */
} ErrorFeedback;

int ef_init(ErrorFeedback *ef, uint64_t n, uint64_t table_hash, float beta, char *err);
void ef_free(ErrorFeedback *ef);
/* The step with Δ = a − b (b NULL: Δ = a), made as it is added: a site's
 * θ and θ_local, the coordinator's θ' and θ, without a Δ of the model's
 * size; the same floats as Δ made first. decoded (n floats, may be NULL)
 * takes decode(blob), which a sender applying its own update needs. The
 * whole step runs section by section, in parallel, each section's e still
 * in cache for the next stage. After a failure e is unspecified. */
int ef_encode(ErrorFeedback *ef, const CodecParams *p, const CodecLayout *layout, const float *a,
              const float *b, float *decoded, Blob *out, char *err);
/* The same step on a GPU, with Δ = base − local of two device arrays: the
 * residual moves to the GPU at the first call (ef->d_e) and stays; only
 * the payloads cross to the host. The same blob and residual as
 * ef_encode(base, local). A residual lives on one side: after this call,
 * only this one (and ef_to_host before ef_serialize). -1 in a build
 * without CUDA. */
int ef_encode_cuda(ErrorFeedback *ef, const CodecParams *p, const CodecLayout *layout,
                   const float *d_base, const float *d_local, Blob *out, char *err);
/* e takes the GPU's residual (nothing when it has none) */
void ef_to_host(ErrorFeedback *ef);
/* Serialised form (FORMATS.md "error feedback state"), checksummed. */
int ef_serialize(const ErrorFeedback *ef, Blob *out, char *err);
/* The same bytes written durably to path (util's atomic replace) straight
 * from e, without a copy of the residual's size. */
int ef_save(const ErrorFeedback *ef, const char *path, int mode, char *err);
int ef_deserialize(ErrorFeedback *ef, const uint8_t *data, size_t len, char *err);

/* ---- checkpoints (lossless) -------------------------------------------- */

/* Byte-grouping of `word`-byte words (4 for fp32, 2 for bf16/fp16) into
 * planes, each plane zstd-compressed; with prev (same length), the words
 * are XORed with the previous checkpoint's first. Exact round trip. */
int ckpt_encode(const void *words, size_t len, int word, const void *prev, int zstd_level,
                Blob *out, char *err);
/* Decodes into out (len bytes, as recorded in the blob; *len_out set). prev
 * must be given iff the blob was encoded against one. */
int ckpt_decode(const uint8_t *blob, size_t blob_len, const void *prev, size_t prev_len, void **out,
                size_t *len_out, char *err);
/* The same into dst, which must hold exactly the blob's bytes and is not
 * prev; after a failure its bytes are unspecified. */
int ckpt_decode_into(const uint8_t *blob, size_t blob_len, const void *prev, size_t prev_len,
                     void *dst, size_t dst_len, char *err);

#endif /* STRAIT_COMPRESS_H */
