/*
 * device.c — the build's capabilities, fixed at compile time by the
 * Makefile's compile-and-link probes (-DSTRAIT_HAVE_*), and the device query
 * of a CPU-only build (CUDA=0 or no nvcc). A CUDA build gets its device
 * query from kernels/cuda/device.cu instead.
 */
#include <stdio.h>

#include "kernels/device.h"
#include "util/util.h"

double kernels_mem_available(void) {
    return mem_available();
}

KernelsBuildCaps kernels_build_caps(void) {
    KernelsBuildCaps caps = {0, 0, 0, 0, 0};
#ifdef STRAIT_HAVE_CUDA
    caps.cuda = 1;
#endif
#ifdef STRAIT_HAVE_NCCL
    caps.nccl = 1;
#endif
#ifdef STRAIT_HAVE_OPENBLAS
    caps.openblas = 1;
#endif
#ifdef STRAIT_HAVE_OPENMP
    caps.openmp = 1;
#endif
#ifdef STRAIT_HAVE_MPI
    caps.mpi = 1;
#endif
    return caps;
}

#ifndef STRAIT_HAVE_CUDA
int kernels_gpu_count(char *name, size_t name_len, char *why, size_t why_len) {
    if (name && name_len) name[0] = '\0';
    if (why && why_len) snprintf(why, why_len, "built without CUDA");
    return 0;
}

const char *kernels_nccl_version(void) {
    return "";
}
#endif
