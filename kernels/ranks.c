/*
 * ranks.c — kernels/ranks.h over MPI. Only the main thread calls MPI
 * (MPI_THREAD_FUNNELED): the site's other threads (gRPC's, OpenMP's, the
 * signal watcher) never do. Buffers go in pieces of at most 2^30 elements,
 * as MPI counts are ints.
 */
#include <stdlib.h>
#include <string.h>

#ifdef STRAIT_HAVE_MPI
#include <mpi.h>
#endif

#include "kernels/ranks.h"
#include "util/util.h"

#define PIECE ((size_t)1 << 30)

static int initialized, n_ranks = 1;

int ranks_launched(int *size) {
    /* Open MPI's mpirun, then PMIx and PMI launchers, then a Slurm job step
     * (srun sets SLURM_STEP_NUM_TASKS; a batch script's SLURM_NTASKS alone
     * does not make this process one of several) */
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 1) {
            if (size) *size = atoi(v);
            return 1;
        }
    }
    if (size) *size = 1;
    return 0;
}

int ranks_init(Ranks *r, char *err) {
    r->rank = 0, r->size = 1;
    int size;
    if (!ranks_launched(&size)) return 0;
#ifndef STRAIT_HAVE_MPI
    (void)r;
    return err_set(err,
                   "started as one of %d ranks (mpirun or srun), but this strait was built "
                   "without MPI: install libopenmpi-dev and rebuild, or run one process",
                   size);
#else
    (void)err;
    int provided;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    initialized = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &r->size);
    n_ranks = r->size;
    return 0;
#endif
}

void ranks_finalize(void) {
#ifdef STRAIT_HAVE_MPI
    if (initialized) MPI_Finalize();
#endif
    initialized = 0;
}

void ranks_bcast(void *buf, size_t bytes) {
    if (n_ranks == 1) return;
#ifdef STRAIT_HAVE_MPI
    for (size_t at = 0; at < bytes; at += PIECE) {
        size_t n = bytes - at < PIECE ? bytes - at : PIECE;
        MPI_Bcast((char *)buf + at, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD);
    }
#else
    (void)buf, (void)bytes;
#endif
}

void ranks_shards(size_t n, size_t *bounds) {
    size_t units = (n + RANKS_ALIGN - 1) / RANKS_ALIGN;
    for (int r = 0; r <= n_ranks; r++) {
        size_t at = units * (size_t)r / (size_t)n_ranks * RANKS_ALIGN;
        bounds[r] = at < n ? at : n;
    }
}

/* share r, values [lo, hi) of buf (el bytes each): op 0 sums floats at
 * rank r, 1 sends them from rank r to all, 2 sends rank 0's to rank r's
 * own; in pieces whose counts fit an int */
#ifdef STRAIT_HAVE_MPI
static void move_share(int r, char *buf, char *own, size_t lo, size_t hi, size_t el, int op) {
    int me;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    size_t piece = PIECE / el;
    for (size_t at = lo; at < hi; at += piece) {
        size_t k = hi - at < piece ? hi - at : piece;
        char *p = buf ? buf + at * el : NULL, *o = own ? own + (at - lo) * el : NULL;
        if (op == 0)
            MPI_Reduce(me == r ? MPI_IN_PLACE : p, me == r ? p : NULL, (int)k, MPI_FLOAT, MPI_SUM,
                       r, MPI_COMM_WORLD);
        else if (op == 1)
            MPI_Bcast(p, (int)(k * el), MPI_BYTE, r, MPI_COMM_WORLD);
        else if (r == 0 && me == 0)
            memcpy(o, p, k * el);
        else if (me == 0)
            MPI_Send(p, (int)(k * el), MPI_BYTE, r, r, MPI_COMM_WORLD);
        else if (me == r)
            MPI_Recv(o, (int)(k * el), MPI_BYTE, 0, r, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
}
#endif

static void each_share(void *buf, void *own, size_t el, const size_t *bounds, int op) {
#ifdef STRAIT_HAVE_MPI
    for (int r = 0; r < n_ranks; r++) move_share(r, buf, own, bounds[r], bounds[r + 1], el, op);
#else
    (void)buf, (void)own, (void)el, (void)bounds, (void)op;
#endif
}

void ranks_mean_owned(float *x, const size_t *bounds) {
    if (n_ranks == 1) return;
    each_share(x, NULL, sizeof(float), bounds, 0);
#ifdef STRAIT_HAVE_MPI
    int me;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    float inv = 1.0f / (float)n_ranks;
    for (size_t i = bounds[me]; i < bounds[me + 1]; i++) x[i] *= inv;
#endif
}

void ranks_share(void *x, size_t el, const size_t *bounds) {
    if (n_ranks > 1) each_share(x, NULL, el, bounds, 1);
}

void ranks_mean(float *x, size_t n) {
    if (n_ranks == 1) return;
    size_t *bounds = mallocCheck(sizeof(size_t) * (size_t)(n_ranks + 1));
    ranks_shards(n, bounds);
    ranks_mean_owned(x, bounds);
    ranks_share(x, sizeof(float), bounds);
    free(bounds);
}

void ranks_scatter(const void *all, void *own, size_t el, const size_t *bounds) {
    if (n_ranks > 1) each_share((void *)all, own, el, bounds, 2);
}

void ranks_send(const void *buf, size_t bytes, int to) {
#ifdef STRAIT_HAVE_MPI
    for (size_t at = 0; at < bytes; at += PIECE) {
        size_t k = bytes - at < PIECE ? bytes - at : PIECE;
        MPI_Send((const char *)buf + at, (int)k, MPI_BYTE, to, 1, MPI_COMM_WORLD);
    }
#else
    (void)buf, (void)bytes, (void)to;
#endif
}

void ranks_recv(void *buf, size_t bytes, int from) {
#ifdef STRAIT_HAVE_MPI
    for (size_t at = 0; at < bytes; at += PIECE) {
        size_t k = bytes - at < PIECE ? bytes - at : PIECE;
        MPI_Recv((char *)buf + at, (int)k, MPI_BYTE, from, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
#else
    (void)buf, (void)bytes, (void)from;
#endif
}

void ranks_abort(int code) {
#ifdef STRAIT_HAVE_MPI
    if (initialized) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    exit(code);
}

const char *ranks_library(void) {
#ifdef STRAIT_HAVE_MPI
    static char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (version[0] == '\0') {
        MPI_Get_library_version(version, &len);
        version[strcspn(version, ",\n")] = '\0'; /* "Open MPI v4.1.4" */
    }
    return version;
#else
    return "";
#endif
}
