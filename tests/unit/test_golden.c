/*
 * test_golden.c — GPT-2 before and after the model became data: the losses
 * of 12 AdamW steps of `tiny` and 3 of `small` from a seed, and the SHA-256
 * of the checkpoint each writes, recorded from the code before the
 * architecture table (commit 405a192), then once more when the classifier
 * came to sum a row's exponentials in double (two of the 15 losses moved
 * by one ulp, and both checkpoints' bytes with them). On the machine they were recorded
 * on (the same OpenBLAS core and thread count) every bit must match;
 * elsewhere BLAS's kernels round differently and 12 steps carry it, so the
 * losses are held to 1e-3 of themselves (a mis-wired graph is off by far
 * more) and the checkpoint hashes are reported, not asserted.
 *
 * STRAIT_GOLDEN_PRINT=1 prints the values to record.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "kernels/device.h"
#include "kernels/formats.h"
#include "kernels/model.h"
#include "kernels/train.h"
#include "security/security.h"
#include "tests/harness.h"
#include "util/util.h"

char *openblas_get_corename(void); /* OpenBLAS's own, not in cblas.h */

typedef struct Golden {
    const char *preset;
    int steps, B, T;
    uint32_t loss_bits[12];
    const char *ckpt_sha;
} Golden;

/* recorded on an AMD Zen 5 with 2 threads, where OpenBLAS picks its SkylakeX kernels */
#define RECORDED_CORE    "SkylakeX"
#define RECORDED_THREADS 2

static const Golden GOLDEN[] = {
    {"tiny",
     12,
     4,
     32,
     {0x40b1ee50, 0x40a0e989, 0x4098c12e, 0x4092ac01, 0x408ccaa8, 0x40870a52, 0x40816b56,
      0x4077fc92, 0x406d6f65, 0x40632282, 0x4058c107, 0x404e3d4a},
     "0fe8a544a86f80a1461aea0c2aa7dfac52ed2df0e8fdc8ba472bd49e8efe5338"},
    {"small",
     3,
     2,
     64,
     {0x40b1c0d7, 0x4093626b, 0x408a8d00},
     "3374986d42e992b5d3762205a6565d8a6ff82522db921092fc8c17a20c462a59"},
};

static void run(const Golden *g, float *losses, char sha[SHA256_HEX_LEN]) {
    ModelConfig cfg;
    cr_assert_eq(model_config_preset(g->preset, &cfg), 0);
    Model m;
    char err[ERR_LEN];
    cr_assert_eq(model_build(&m, &cfg, 42, err), 0, "%s", err);
    int n = g->B * g->T, *in = malloc(sizeof(int) * n), *tg = malloc(sizeof(int) * n);
    for (int i = 0; i < n; i++) in[i] = (i * 13 + 7) % 251, tg[i] = (i * 17 + 3) % 251;
    AdamWConfig o = {0.9f, 0.95f, 1e-8f, 0.1f};
    for (int s = 0; s < g->steps; s++) {
        losses[s] = model_forward(&m, in, tg, g->B, g->T);
        model_zero_grad(&m);
        model_backward(&m);
        model_clip_grad_norm(&m, 1.0f);
        model_adamw_step(&m, &o, 3e-3f);
    }
    char *dir = harness_tmpdir("golden"), path[700];
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    cr_assert_eq(model_save(&m, path, g->steps, err), 0, "%s", err);
    int64_t bytes;
    cr_assert_eq(security_sha256_file(path, sha, &bytes, err), 0, "%s", err);
    free(dir), free(in), free(tg);
    model_free(&m);
}

Test(golden, gpt2_losses_and_checkpoints_are_those_recorded_before_the_redesign, .timeout = 120) {
    kernels_set_threads(RECORDED_THREADS);
    const char *core = openblas_get_corename();
    int exact = strcmp(core, RECORDED_CORE) == 0;
    int print = getenv("STRAIT_GOLDEN_PRINT") != NULL;
    if (print) printf("core %s\n", core);
    for (size_t k = 0; k < sizeof GOLDEN / sizeof GOLDEN[0]; k++) {
        const Golden *g = &GOLDEN[k];
        float losses[12];
        char sha[SHA256_HEX_LEN];
        run(g, losses, sha);
        if (print) {
            printf("%s:", g->preset);
            for (int s = 0; s < g->steps; s++) {
                uint32_t b;
                memcpy(&b, &losses[s], 4);
                printf(" 0x%08x,", b);
            }
            printf("\n%s sha %s\n", g->preset, sha);
            continue;
        }
        for (int s = 0; s < g->steps; s++) {
            float want;
            memcpy(&want, &g->loss_bits[s], 4);
            if (exact)
                cr_assert_eq(memcmp(&want, &losses[s], 4), 0,
                             "%s step %d: loss %.9g, recorded %.9g (same BLAS core, same threads: "
                             "every bit must match)",
                             g->preset, s, losses[s], want);
            else
                cr_assert_float_eq(losses[s], want, 1e-3f * want, "%s step %d: %.9g, recorded %.9g",
                                   g->preset, s, losses[s], want);
        }
        if (exact)
            cr_assert_str_eq(sha, g->ckpt_sha, "%s's checkpoint after %d steps", g->preset,
                             g->steps);
        else
            cr_log_info("%s: OpenBLAS core %s, recorded on %s: checkpoint %s not compared",
                        g->preset, core, RECORDED_CORE, sha);
    }
}
