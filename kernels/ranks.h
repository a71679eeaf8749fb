/*
 * ranks.h — the processes of one site started by mpirun (Open MPI) or
 * Slurm's srun: which one this is, and the collectives a site's training
 * needs between them (broadcast from rank 0, the mean of a buffer, and
 * for ZeRO-1 the table cut into shares: a share's mean at its owner, the
 * shares to all, scattered from rank 0; bytes from one rank to another). MPI
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
/* The ranks' shares of a table of n values (ZeRO-1): rank r's is
 * [bounds[r], bounds[r + 1]), bounds[0] = 0, bounds[size] = n, every inner
 * boundary a multiple of RANKS_ALIGN, the shares as even as that allows. */
#define RANKS_ALIGN 4096
void ranks_shards(size_t n, size_t *bounds);
/* x[i] = the mean over the ranks of x[i] (the sum, times 1/size): each
 * share summed at its owner, then sent to all, so every rank holds the same
 * bits and a sharded step (ranks_mean_owned) sums in the same order */
void ranks_mean(float *x, size_t n);
/* the mean of x's share r at rank r alone, for every r (the rest of x as
 * it was); bounds from ranks_shards */
void ranks_mean_owned(float *x, const size_t *bounds);
/* every rank's share of x (values of el bytes) from its owner to all */
void ranks_share(void *x, size_t el, const size_t *bounds);
/* each rank's own (its share alone) from rank 0's all (every share): a
 * saved optimizer state to its owners */
void ranks_scatter(const void *all, void *own, size_t el, const size_t *bounds);
/* bytes from this rank to rank `to`, and from rank `from` into buf */
void ranks_send(const void *buf, size_t bytes, int to);
void ranks_recv(void *buf, size_t bytes, int from);
/* Ends every rank of the job with code (after this rank said why). */
void ranks_abort(int code);
/* The MPI library's version ("Open MPI v4.1.4, …"), or "" without MPI. */
const char *ranks_library(void);

#endif /* STRAIT_KERNELS_RANKS_H */
