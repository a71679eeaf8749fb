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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/model.h"
#include "kernels/formats.h"
#include "util/util.h"

#define LLMC_MAGIC   20240326
#define LLMC_VERSION 3

/* The per-layer suffixes in llm.c's order of tensor groups. */
static const char *const LAYER_TENSORS[] = {"ln_1.weight",   "ln_1.bias",        "attn.qkv.weight",
                                            "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
                                            "ln_2.weight",   "ln_2.bias",        "mlp.fc.weight",
                                            "mlp.fc.bias",   "mlp.proj.weight",  "mlp.proj.bias"};
#define N_LAYER_TENSORS 12

static const ParamView *view_of(const GPT *m, const char *name, char *err) {
    const ParamView *v = gpt_view(m, name);
    if (v == NULL) err_set(err, "the model has no tensor %s", name);
    return v;
}

int gpt_export_llmc(const GPT *m, const char *path, char *err) {
    const GPTConfig *c = &m->cfg;
    if (c->arch != ARCH_GPT2)
        return err_set(err, "llm.c trains GPT-2; this model is a %s: export it with --format hf",
                       model_arch_name(c->arch));
    int32_t header[256] = {LLMC_MAGIC, LLMC_VERSION, c->T, c->V, c->L, c->NH, c->C, c->Vp};
    AtomicFile *af = file_atomic_open(path, 0644, err);
    if (af == NULL) return -1;
    int rc = file_atomic_write(af, header, sizeof header, err);
    const char *head[2] = {"wte", "wpe"}, *tail[2] = {"ln_f.weight", "ln_f.bias"};
    for (int i = 0; i < 2 && rc == 0; i++) {
        const ParamView *v = view_of(m, head[i], err);
        rc = v ? file_atomic_write(af, m->params + v->offset, v->numel * 4, err) : -1;
    }
    for (int t = 0; t < N_LAYER_TENSORS && rc == 0; t++)
        for (int l = 0; l < c->L && rc == 0; l++) {
            char name[64];
            snprintf(name, sizeof name, "h.%d.%s", l, LAYER_TENSORS[t]);
            const ParamView *v = view_of(m, name, err);
            rc = v ? file_atomic_write(af, m->params + v->offset, v->numel * 4, err) : -1;
        }
    for (int i = 0; i < 2 && rc == 0; i++) {
        const ParamView *v = view_of(m, tail[i], err);
        rc = v ? file_atomic_write(af, m->params + v->offset, v->numel * 4, err) : -1;
    }
    if (rc != 0) {
        file_atomic_abort(af);
        return -1;
    }
    return file_atomic_commit(af, err);
}
