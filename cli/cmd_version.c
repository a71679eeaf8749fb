/*
 * cmd_version.c — `strait version`: what this binary is and what it can use
 * here: version, commit, the build's capabilities, and the GPUs the CUDA
 * runtime sees (or why none).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "compress/compress.h"
#include "kernels/device.h"
#include "kernels/ranks.h"
#include "net/net.h"
#include "util/util.h"

int cmd_version(const Command *cmd, int argc, char **argv) {
    int as_json = cli_json_flag(cmd, argc, argv);
    if (as_json < 0) return EXIT_USAGE;
    if (optind < argc) return cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);

    KernelsBuildCaps caps = kernels_build_caps();
    char gpu_name[256], why[256];
    int gpus = kernels_gpu_count(gpu_name, sizeof gpu_name, why, sizeof why);
    const char *nccl = kernels_nccl_version();

    if (as_json) {
        json_t *o = json_object();
        json_object_set_new(o, "version", json_string(strait_version));
        json_object_set_new(o, "commit", json_string(strait_git_commit));
        json_object_set_new(o, "cuda", json_boolean(caps.cuda));
        json_object_set_new(o, "nccl", json_boolean(caps.nccl));
        json_object_set_new(o, "nccl_version", json_string(nccl));
        json_object_set_new(o, "openblas", json_boolean(caps.openblas));
        json_object_set_new(o, "openmp", json_boolean(caps.openmp));
        json_object_set_new(o, "mpi", json_boolean(caps.mpi));
        json_object_set_new(o, "mpi_library", json_string(ranks_library()));
        json_object_set_new(o, "tls13_only", json_boolean(net_tls13_only()));
        json_object_set_new(o, "codec_isa", json_string(codec_isa()));
        json_object_set_new(o, "blas_core", json_string(kernels_blas_core()));
        json_object_set_new(o, "blas_core_for_chip", json_string(kernels_blas_core_for_chip()));
        json_object_set_new(o, "bf16_matmuls", json_string(kernels_bf16_isa()));
        json_object_set_new(o, "gpus", json_integer(gpus));
        json_object_set_new(o, "gpu_name", json_string(gpus > 0 ? gpu_name : ""));
        json_object_set_new(o, "no_gpu_reason", json_string(gpus > 0 ? "" : why));
        return json_emit_line(stdout, o) == 0 ? EXIT_OK : EXIT_FAILED;
    }
    printf("strait %s (commit %s)\n", strait_version, strait_git_commit);
    const char *mpi = ranks_library();
    printf("build: CUDA %s, NCCL %s%s%s%s, OpenBLAS %s, OpenMP %s, MPI %s%s%s%s\n",
           caps.cuda ? "yes" : "no", caps.nccl ? "yes" : "no", *nccl ? " (" : "", nccl,
           *nccl ? ")" : "", caps.openblas ? "yes" : "no", caps.openmp ? "yes" : "no",
           caps.mpi ? "yes" : "no (sites run as one process)", *mpi ? " (" : "", mpi,
           *mpi ? ")" : "");
    printf("codecs: %s inner loops\n", codec_isa());
    char below[300];
    printf("kernels: OpenBLAS %s (the chip's instructions allow %s)%s%s; bf16 matmuls: %s\n",
           kernels_blas_core(), kernels_blas_core_for_chip(),
           kernels_blas_below_chip(below, sizeof below) ? ": " : "",
           kernels_blas_below_chip(NULL, 0) ? below : "", kernels_bf16_isa());
    printf("tls: %s\n",
           net_tls13_only() ? "1.3 only" : "1.2 and 1.3 (this libgrpc cannot refuse 1.2)");
    if (gpus > 0)
        printf("devices: %d CUDA GPU%s, first: %s\n", gpus, gpus == 1 ? "" : "s", gpu_name);
    else
        printf("devices: no GPU (%s)\n", why);
    return EXIT_OK;
}
