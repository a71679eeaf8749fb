/*
 * formats.c — a Strait GPT-2 out to llm.c (Hugging Face's formats, for
 * every architecture, are kernels/hf.c):
 *
 * - llm.c: the checkpoint train_gpt2.c loads — a header of 256 int32
 *   (magic 20240326, version 3, maxT, V, L, NH, C, Vp) and the parameters
 *   in fp32, grouped by tensor across layers: wte (Vp, C), wpe (T, C),
 *   ln1w, ln1b, qkvw (L, 3C, C), qkvb, attprojw, attprojb, ln2w, ln2b, fcw,
 *   fcb, fcprojw, fcprojb, lnfw, lnfb.
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/arch.h"
#include "kernels/model.h"
#include "kernels/formats.h"
#include "util/util.h"

#define LLMC_MAGIC   20240326
#define LLMC_VERSION 3

int model_export_llmc(const Model *m, const char *path, char *err) {
    const ModelConfig *c = &m->cfg;
    if (c->arch != ARCH_GPT2)
        return err_set(err, "llm.c trains GPT-2; this model is a %s: export it with --format hf",
                       model_arch_name(c->arch));
    int32_t header[256] = {LLMC_MAGIC, LLMC_VERSION, c->T, c->V, c->L, c->NH, c->C, c->Vp};
    assert(!m->base_rounded); /* the base as loaded, never after a bf16 pass */
    AtomicFile *af = file_atomic_open(path, 0644, err);
    if (af == NULL) return -1;
    int rc = file_atomic_write(af, header, sizeof header, err);
    /* llm.c's order is GPT-2's table order with each layer row's tensors
     * grouped across the layers */
    const Arch *a = m->arch;
    for (int r = 0; r < a->n_tensors && rc == 0; r++)
        for (int l = 0; l < (a->tensors[r].layer ? c->L : 1) && rc == 0; l++) {
            const ParamView *v = &model_base_views(m)[m->row_view[r * c->L + l]];
            rc = file_atomic_write(af, model_base(m) + v->offset, v->numel * 4, err);
        }
    if (rc != 0) {
        file_atomic_abort(af);
        return -1;
    }
    return file_atomic_commit(af, err);
}
