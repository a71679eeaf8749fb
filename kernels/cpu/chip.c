/*
 * chip.c — which CPU kernels this process runs (API: device.h). OpenBLAS
 * picks its kernels once, as it loads, from its own table of CPU model
 * names; on a chip it does not know it falls back to its oldest (SSE3)
 * ones, several times below the chip. Here the chip is judged by the
 * instructions CPUID reports instead, the kernel OpenBLAS took is ranked
 * against that, and OpenBLAS's products are checked against a reference
 * before they are trusted. A program that links this file and finds
 * OpenBLAS below the chip starts itself once more, before main, with
 * OPENBLAS_CORETYPE set to the chip's kernel (unless the user set it):
 * the strait program, the tests and the benchmarks alike, so they all
 * compute with one kernel. oneDNN (the bf16 matmuls) dispatches on CPUID
 * itself; its instruction set is named here too.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <sys/auxv.h>
#endif

#ifdef STRAIT_HAVE_OPENBLAS
#include <cblas.h>
char *openblas_get_corename(void); /* OpenBLAS's own, not in cblas.h */
#endif
#ifdef STRAIT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

#include "kernels/device.h"
#include "kernels/ops.h"
#include "util/util.h"

/* OpenBLAS's single-precision kernels by their widest vectors: 1 SSE, 2
 * AVX, 3 AVX2 and FMA, 4 AVX-512; 0 for a name not in this table */
static const struct {
    const char *core;
    int rank;
} CORES[] = {
    {"Prescott", 1},       {"Core2", 1},      {"Penryn", 1},      {"Dunnington", 1},
    {"Nehalem", 1},        {"Atom", 1},       {"Barcelona", 1},   {"Sandybridge", 2},
    {"Bulldozer", 2},      {"Piledriver", 2}, {"Steamroller", 2}, {"Excavator", 2},
    {"Haswell", 3},        {"Zen", 3},        {"SkylakeX", 4},    {"Cooperlake", 4},
    {"SapphireRapids", 4},
};

int kernels_blas_rank(const char *core) {
    for (size_t i = 0; core && i < sizeof CORES / sizeof CORES[0]; i++)
        if (strcasecmp(core, CORES[i].core) == 0) return CORES[i].rank;
    return 0;
}

const char *kernels_blas_core(void) {
#ifdef STRAIT_HAVE_OPENBLAS
    return openblas_get_corename();
#else
    return "none";
#endif
}

const char *kernels_blas_core_for_chip(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
    if (__builtin_cpu_supports("avx")) return "Sandybridge";
    return "Prescott";
#else
    return "none"; /* not judged: the table above is x86's */
#endif
}

int kernels_blas_below_chip(char *why, size_t len) {
    const char *have = kernels_blas_core(), *want = kernels_blas_core_for_chip();
    int h = kernels_blas_rank(have), w = kernels_blas_rank(want);
    if (h == 0 || h >= w) return 0; /* a kernel this table does not know is not judged */
    if (why)
        snprintf(why, len,
                 "OpenBLAS runs its %s kernels on a chip with %s's instructions, several times "
                 "below it; unset OPENBLAS_CORETYPE or set it to %s",
                 have, want, want);
    return 1;
}

/* one product of (M,K) by (K,N), ragged against every kernel's blocks and
 * large enough for OpenBLAS's blocked path (not its small-matrix one),
 * against fp64 sums; 0, or -1 with err */
static int check_product(int M, int K, int N, char *err) {
    int rc = 0;
#ifdef STRAIT_HAVE_OPENBLAS
    float *a = mallocCheck(sizeof(float) * M * K), *b = mallocCheck(sizeof(float) * K * N);
    float *c = mallocCheck(sizeof(float) * M * N);
    uint64_t s = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < M * K; i++)
        a[i] = (float)((s = s * 6364136223846793005ull + 1) >> 41) / 4194304.0f - 1; /* [-1, 1) */
    for (int i = 0; i < K * N; i++)
        b[i] = (float)((s = s * 6364136223846793005ull + 1) >> 41) / 4194304.0f - 1;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N);
    for (int i = 0; i < M && rc == 0; i++)
        for (int j = 0; j < N && rc == 0; j++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++)
                ref += (double)a[i * K + k] * b[k * N + j],
                    mag += fabs(a[i * K + k] * b[k * N + j]);
            if (!(fabs(c[i * N + j] - ref) <= 1e-5 * mag + 1e-30))
                rc = err_set(err,
                             "OpenBLAS's %s kernels compute wrong products here (%g where %g is "
                             "right); set OPENBLAS_CORETYPE to an older kernel, e.g. Haswell",
                             kernels_blas_core(), c[i * N + j], ref);
        }
    free(a), free(b), free(c);
#else
    (void)M, (void)K, (void)N, (void)err;
#endif
    return rc;
}

int kernels_blas_check(char *err) {
    return check_product(37, 61, 29, err) || check_product(131, 97, 89, err) ? -1 : 0;
}

#ifdef __GLIBC__
/* Before main (glibc hands a constructor main's arguments), after
 * OpenBLAS has chosen: once, again with the chip's kernel, when this
 * program was started as itself (not through ld.so, whose path
 * /proc/self/exe would name). If exec fails it goes on as it is, and
 * kernels_blas_below_chip says so. */
__attribute__((constructor)) static void blas_for_this_chip(int argc, char **argv) {
    (void)argc;
    if (argv == NULL || getenv("OPENBLAS_CORETYPE") != NULL || !kernels_blas_below_chip(NULL, 0))
        return;
    const char *fn = (const char *)getauxval(AT_EXECFN);
    char self[4096], started[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (fn == NULL || n <= 0 || realpath(fn, started) == NULL) return;
    self[n] = '\0';
    if (strcmp(self, started) != 0) return;
    setenv("OPENBLAS_CORETYPE", kernels_blas_core_for_chip(), 1);
    execv(self, argv);
    unsetenv("OPENBLAS_CORETYPE");
}
#endif

const char *kernels_bf16_isa(void) {
#ifdef STRAIT_HAVE_DNNL
    if (bf16_units())
        return dnnl_get_effective_cpu_isa() == dnnl_cpu_isa_avx512_core_amx
                   ? "oneDNN on AMX"
                   : "oneDNN on AVX-512 BF16";
    return "OpenBLAS on the bf16 values widened (no bf16 instructions here)";
#else
    return "OpenBLAS on the bf16 values widened (built without oneDNN)";
#endif
}
