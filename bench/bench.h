/*
 * bench.h — what several benchmarks share: the synthetic pseudo-gradient
 * the codec benchmarks encode, so bench/codec (CPU) and bench/gpu (CUDA)
 * measure the same values; the process's peak memory.
 */
#ifndef STRAIT_BENCH_H
#define STRAIT_BENCH_H

#include <math.h>
#include <stdint.h>
#include <sys/resource.h>

/* this process's peak resident memory so far, in MB (its maxrss) */
static inline double bench_peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

/* x[0..n) ~ N(0, 0.01²) from a fixed xorshift stream (Box-Muller pairs):
 * the same floats on every run. */
static inline void bench_pseudo_gradient(float *x, uint64_t n) {
    uint64_t s = 0x243f6a8885a308d3ull;
    for (uint64_t i = 0; i < n; i += 2) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        double u1 = ((s >> 11) + 0.5) / 9007199254740992.0;
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        double u2 = ((s >> 11) + 0.5) / 9007199254740992.0, r = sqrt(-2 * log(u1)) * 0.01;
        x[i] = (float)(r * cos(6.283185307179586 * u2));
        if (i + 1 < n) x[i + 1] = (float)(r * sin(6.283185307179586 * u2));
    }
}

#endif /* STRAIT_BENCH_H */
