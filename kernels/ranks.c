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

void ranks_mean(float *x, size_t n) {
    if (n_ranks == 1) return;
#ifdef STRAIT_HAVE_MPI
    for (size_t at = 0; at < n; at += PIECE) {
        size_t k = n - at < PIECE ? n - at : PIECE;
        MPI_Allreduce(MPI_IN_PLACE, x + at, (int)k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    float inv = 1.0f / (float)n_ranks;
    for (size_t i = 0; i < n; i++) x[i] *= inv;
#else
    (void)x, (void)n;
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
