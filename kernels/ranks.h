/*
 * ranks.h — the processes of one site started by mpirun (Open MPI) or
 * Slurm's srun: which one this is, and the collectives a site's training
 * needs between them (broadcast from rank 0, the mean of a buffer). MPI
 * underneath, in builds that found it (STRAIT_HAVE_MPI); a process not
 * started by a launcher is rank 0 of 1 and never initializes MPI.
 *
 * Errors: a collective that fails ends the job (MPI's default handler), so
 * a rank that dies stops the others instead of leaving them waiting; the
 * launcher says which rank it lost.
 */
#ifndef STRAIT_KERNELS_RANKS_H
#define STRAIT_KERNELS_RANKS_H

#include <stddef.h>
#include <stdint.h>

typedef struct Ranks {
    int rank, size;
} Ranks;

/* Whether a launcher started this process as one of several ranks (its
 * environment says so), and how many. */
int ranks_launched(int *size);
/* This process's place: MPI initialized when launched, else rank 0 of 1.
 * -1 with the reason when launched but built without MPI. */
int ranks_init(Ranks *r, char *err);
void ranks_finalize(void);
/* buf (bytes) from rank 0 to every rank */
void ranks_bcast(void *buf, size_t bytes);
/* x[i] = the mean over the ranks of x[i] (the sum, times 1/size) */
void ranks_mean(float *x, size_t n);
/* Ends every rank of the job with code (after this rank said why). */
void ranks_abort(int code);
/* The MPI library's version ("Open MPI v4.1.4, …"), or "" without MPI. */
const char *ranks_library(void);

#endif /* STRAIT_KERNELS_RANKS_H */
