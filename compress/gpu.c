/*
 * gpu.c — the GPU paths of compress/: the same container code as the CPU
 * (codec_encode_sections), with each section's raw payload made by the
 * kernels in kernels/cuda/compress.cu. Top-k selection runs on the GPU and
 * the few kept values are quantized by the CPU code, so a GPU site and a CPU
 * site send byte-identical blobs. Decode-accumulate into GPU memory walks
 * the blob on the CPU (checksums, zstd) and adds each section on the GPU;
 * error feedback keeps its residual there, so a GPU site's round moves only
 * the payloads between host and device.
 */
#include <stdlib.h>

#include "compress_internal.h"
#include "kernels/cuda.h"
#include "util/util.h"

#ifdef STRAIT_HAVE_CUDA
/* A section's payload from x + offset (device memory). take_off: x is
 * error feedback's residual, which the kernels then leave as x − the
 * payload's decoded values, for the dense codecs (top-k's few values are
 * quantized here on the CPU: the caller scatters them back). */
static int encode_section(float *x, const CodecParams *p, uint64_t offset, uint32_t count,
                          uint8_t *out, int take_off, char *err) {
    x += offset;
    int rc = 0;
    switch (p->id) {
    case CODEC_FP32:
        rc = kernels_cuda_copy_checked(x, count, (float *)(void *)out, take_off, NULL);
        break;
    case CODEC_FP16:
    case CODEC_BF16:
        rc = kernels_cuda_cast_half(x, count, p->id == CODEC_BF16, out, take_off, NULL);
        break;
    case CODEC_INT8:
        rc = kernels_cuda_int8_encode(x, count, p->block, out, take_off, NULL);
        break;
    case CODEC_TOPK: {
        uint64_t K = topk_total_k(p, count);
        uint16_t *sel = malloc(2 * (K ? K : 1));
        float *vals = malloc(4 * (K ? K : 1));
        if (sel == NULL || vals == NULL) {
            free(sel), free(vals);
            return err_set(err, "out of memory");
        }
        rc = kernels_cuda_topk_select(x, count, p->chunk, codec_density_ppm(p), K, sel, vals, NULL);
        if (rc == 0)
            rc = topk_encode_selected(p, count, sel, vals, out, err);
        else
            err_set(err, "update holds a value that is not finite");
        free(sel), free(vals);
        return rc;
    }
    }
    if (rc != 0)
        return err_set(err,
                       "update section at %llu holds a non-finite value or one beyond "
                       "%s range",
                       (unsigned long long)offset, codec_name(p->id));
    return 0;
}

static int gpu_section(void *ctx, const CodecParams *p, uint64_t offset, uint32_t count,
                       uint8_t *out, char *err) {
    return encode_section(ctx, p, offset, count, out, 0, err);
}

typedef struct GpuAccumulate {
    float weight;
    float *sum; /* device memory, not owned */
} GpuAccumulate;

/* sum += weight * a section's decoded values, each codec through its
 * kernel: the floats of its apply() on the CPU */
static int gpu_accumulate(void *ctx, const CodecParams *p, const uint8_t *raw, uint64_t offset,
                          uint32_t count, char *err) {
    GpuAccumulate *a = ctx;
    float *sum = a->sum + offset;
    switch (p->id) {
    case CODEC_FP32:
        kernels_cuda_fp32_accumulate(raw, count, a->weight, sum, NULL);
        return 0;
    case CODEC_FP16:
    case CODEC_BF16:
        kernels_cuda_half_accumulate(raw, count, p->id == CODEC_BF16, a->weight, sum, NULL);
        return 0;
    case CODEC_INT8:
        kernels_cuda_int8_accumulate(raw, count, p->block, a->weight, sum, NULL);
        return 0;
    case CODEC_TOPK: {
        uint64_t K = topk_total_k(p, count);
        uint32_t *idx = malloc(4 * (K ? K : 1));
        float *vals = malloc(4 * (K ? K : 1));
        if (idx == NULL || vals == NULL) {
            free(idx), free(vals);
            return err_set(err, "out of memory");
        }
        K = topk_entries(p, raw, count, idx, vals);
        kernels_cuda_scatter_accumulate(idx, vals, K, a->weight, sum, NULL);
        free(idx), free(vals);
        return 0;
    }
    }
    return err_set(err, "codec %d has no GPU decode-accumulate", (int)p->id);
}

/* A section of C(e) for error feedback, and e ← e − decoded for it from
 * the payload just made, as ef.c does on the CPU: no decompression of the
 * blob to decode it */
static int gpu_ef_section(void *ctx, const CodecParams *p, uint64_t offset, uint32_t count,
                          uint8_t *raw, char *err) {
    if (encode_section(ctx, p, offset, count, raw, 1, err) != 0) return -1;
    if (p->id != CODEC_TOPK) return 0; /* the kernels took the payload off already */
    GpuAccumulate a = {-1.0f, ctx};
    return gpu_accumulate(&a, p, raw, offset, count, err);
}
#endif

int codec_encode_cuda(const CodecParams *p, const CodecLayout *layout, const float *d_x, Blob *out,
                      char *err) {
#ifdef STRAIT_HAVE_CUDA
    return codec_encode_sections(p, layout, gpu_section, (void *)d_x, 0, out, err);
#else
    (void)p, (void)layout, (void)d_x, (void)out;
    return err_set(err, "this strait was built without CUDA; encode on the CPU");
#endif
}

int codec_decode_accumulate_cuda(const uint8_t *blob, size_t len, float weight, float *d_sum,
                                 uint64_t n, char *err) {
#ifdef STRAIT_HAVE_CUDA
    GpuAccumulate ctx = {weight, d_sum};
    return codec_for_each_section(blob, len, n, gpu_accumulate, &ctx, err);
#else
    (void)blob, (void)len, (void)weight, (void)d_sum, (void)n;
    return err_set(err, "this strait was built without CUDA; decode on the CPU");
#endif
}

/* ---- error feedback with the residual on the GPU --------------------------- */

int ef_encode_cuda(ErrorFeedback *ef, const CodecParams *p, const CodecLayout *layout,
                   const float *d_base, const float *d_local, Blob *out, char *err) {
#ifdef STRAIT_HAVE_CUDA
    if (layout->n != ef->n || layout->table_hash != ef->table_hash)
        return err_set(err, "error feedback state is for another parameter table");
    if (ef->d_e == NULL) { /* the residual moves to the GPU and stays there */
        ef->d_e = kernels_cuda_alloc(4 * (size_t)ef->n);
        kernels_cuda_to_device(ef->d_e, ef->e, 4 * (size_t)ef->n);
    }
    ef->host_stale = 1;
    kernels_cuda_ef_step(ef->d_e, d_base, d_local, ef->beta, ef->n, NULL);
    return codec_encode_sections(p, layout, gpu_ef_section, ef->d_e, 0, out, err);
#else
    (void)ef, (void)p, (void)layout, (void)d_base, (void)d_local, (void)out;
    return err_set(err, "this strait was built without CUDA; encode on the CPU");
#endif
}

void ef_to_host(ErrorFeedback *ef) {
#ifdef STRAIT_HAVE_CUDA
    if (ef->d_e && ef->host_stale) kernels_cuda_to_host(ef->e, ef->d_e, 4 * (size_t)ef->n);
#endif
    ef->host_stale = 0;
}

void ef_release_device(ErrorFeedback *ef) {
#ifdef STRAIT_HAVE_CUDA
    if (ef->d_e) kernels_cuda_free(ef->d_e);
#endif
    ef->d_e = NULL;
    ef->host_stale = 0;
}
