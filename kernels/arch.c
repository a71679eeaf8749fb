/*
 * arch.c — the registry of architectures (API: arch.h, and model.h's
 * names): one row per architecture, in ARCHES' order, and what follows
 * from an architecture's tensor table alone: the walk over a
 * configuration's tensors, its parameter count and its training memory.
 * Nothing here knows one architecture from another.
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/arch.h"
#include "kernels/model.h"
#include "util/util.h"

#define ARCH_ROW(up, low) [ARCH_##up] = &arch_##low,
static const Arch *const ALL[ARCH_COUNT] = {ARCHES(ARCH_ROW)};
#undef ARCH_ROW

const Arch *arch_of(int arch) {
    return arch >= 0 && arch < ARCH_COUNT ? ALL[arch] : NULL;
}

const Arch *arch_named(const char *name) {
    int i = model_arch_of(name);
    return i < 0 ? NULL : ALL[i];
}

const char *model_arch_name(int arch) {
    const Arch *a = arch_of(arch);
    return a ? a->name : "?";
}

const char *model_hf_class(int arch) {
    const Arch *a = arch_of(arch);
    return a ? a->hf_class : "?";
}

int model_arch_of(const char *name) {
    for (int i = 0; name && i < ARCH_COUNT; i++)
        if (strcmp(ALL[i]->name, name) == 0) return i;
    return -1;
}

const char *model_arch_names(void) {
    static char names[128];
    if (names[0] == '\0')
        for (int i = 0; i < ARCH_COUNT; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                     ALL[i]->name);
    return names;
}

/* ---- adapters' targets, by name ------------------------------------------------- */

static const struct {
    unsigned bit;
    const char *name;
} LORA_NAMES[] = {{LORA_Q, "q"},       {LORA_K, "k"},   {LORA_V, "v"},      {LORA_O, "o"},
                  {LORA_GATE, "gate"}, {LORA_UP, "up"}, {LORA_DOWN, "down"}};
#define N_LORA_NAMES (int)(sizeof LORA_NAMES / sizeof LORA_NAMES[0])

int model_lora_targets_parse(const char *list, unsigned *targets, char *err) {
    if (strcmp(list, "all") == 0) {
        *targets = LORA_ALL;
        return 0;
    }
    unsigned t = 0;
    const char *s = list;
    while (*s) {
        size_t n = strcspn(s, ",");
        int found = 0;
        for (int i = 0; i < N_LORA_NAMES && !found; i++)
            if (strlen(LORA_NAMES[i].name) == n && strncmp(s, LORA_NAMES[i].name, n) == 0)
                t |= LORA_NAMES[i].bit, found = 1;
        if (!found)
            return err_set(err,
                           "adapter target '%.*s' is not one of q, k, v, o, gate, up, down (or "
                           "all)",
                           (int)n, s);
        s += n + (s[n] == ',');
    }
    if (t == 0) return err_set(err, "no adapter target; name some of q, k, v, o, gate, up, down");
    *targets = t;
    return 0;
}

void model_lora_targets_names(unsigned targets, char *out, size_t cap) {
    out[0] = '\0';
    for (int i = 0; i < N_LORA_NAMES; i++)
        if (targets & LORA_NAMES[i].bit)
            snprintf(out + strlen(out), cap - strlen(out), "%s%s", out[0] ? "," : "",
                     LORA_NAMES[i].name);
}

/* ---- adapters' rules, by name ------------------------------------------------------ */

#define LORA_RULE_NAME(up, low) #low,
static const char *const LORA_RULE_NAMES[] = {LORA_RULES(LORA_RULE_NAME)};
#undef LORA_RULE_NAME

const char *model_lora_rule_name(int rule) {
    return rule >= 0 && rule < LORA_RULE_COUNT ? LORA_RULE_NAMES[rule] : NULL;
}

int model_lora_rule_of(const char *name) {
    for (int k = 0; k < LORA_RULE_COUNT; k++)
        if (strcmp(LORA_RULE_NAMES[k], name) == 0) return k;
    return -1;
}

const char *model_lora_rule_names(void) {
    static char names[64];
    if (names[0] == '\0')
        for (int k = 0; k < LORA_RULE_COUNT; k++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "",
                     LORA_RULE_NAMES[k]);
    return names;
}

/* ---- the table walk --------------------------------------------------------------- */

void arch_each_tensor(const ModelConfig *c, TensorFn f, void *ctx) {
    const Arch *a = arch_of(c->arch);
    for (int r = 0; r < a->n_tensors; r++) {
        const ArchTensor *t = &a->tensors[r];
        if (!t->layer) {
            if (arch_has(c, t))
                f(ctx, r, 0, t->name, t->d1 == DIM_NONE ? 1 : 2, arch_dim(c, t->d0),
                  arch_dim(c, t->d1));
            continue;
        }
        int end = r; /* the block of layer rows, layer by layer */
        while (end < a->n_tensors && a->tensors[end].layer) end++;
        for (int l = 0; l < c->L; l++)
            for (int k = r; k < end; k++) {
                const ArchTensor *lt = &a->tensors[k];
                if (!arch_has(c, lt)) continue;
                char name[64];
                snprintf(name, sizeof name, "h.%d.%s", l, lt->name);
                f(ctx, k, l, name, lt->d1 == DIM_NONE ? 1 : 2, arch_dim(c, lt->d0),
                  arch_dim(c, lt->d1));
            }
        r = end - 1;
    }
}

static void count_tensor(void *ctx, int row, int layer, const char *name, int ndim, int d0,
                         int d1) {
    (void)row, (void)layer, (void)name;
    *(double *)ctx += (double)d0 * (ndim > 1 ? d1 : 1);
}

double model_config_params(const ModelConfig *c) {
    double n = 0;
    arch_each_tensor(c, count_tensor, &n);
    return n;
}

/* the adapters' values: every one held (A, B and R, frozen or not), or
 * those that train */
static double adapter_values(const ModelConfig *c, int trained) {
    if (c->lora.rank == 0) return 0;
    const Arch *a = arch_of(c->arch);
    double n = 0, R = c->lora.rank;
    int rule = c->lora.rule;
    for (int r = 0; r < a->n_tensors; r++) {
        if (!(a->tensors[r].lora & c->lora.targets) || !arch_has(c, &a->tensors[r])) continue;
        double in = arch_dim(c, a->tensors[r].d1), out = arch_dim(c, a->tensors[r].d0);
        if (!trained)
            n += R * (in + out) + (rule == LORA_RULE_FEDSB ? R * R : 0);
        else
            n += rule == LORA_RULE_FEDSB ? R * R : rule == LORA_RULE_FFA ? R * out : R * (in + out);
    }
    return n * c->L;
}

double model_adapter_params(const ModelConfig *c) {
    return adapter_values(c, 0);
}

double model_adapter_trained(const ModelConfig *c) {
    return adapter_values(c, 1);
}

double model_train_bytes(const ModelConfig *c, int B, int T, int moments_bf16, int recompute) {
    assert(recompute >= 0 && recompute <= MODEL_RECOMPUTE_MAX);
    ActLayout lay = {.recompute = recompute};
    arch_of(c->arch)->layout(c, B, T, &lay);
    /* what trains: parameters, gradients, AdamW's two moments; a frozen
     * base and frozen adapters their values alone; a step's activations
     * and their gradients */
    double per = moments_bf16 ? 12.0 : 16.0, adapters = model_adapter_params(c),
           trained = model_adapter_trained(c);
    double acts = 4.0 * (double)(lay.len + lay.dlen), n = model_config_params(c);
    /* a base is loaded in fp32; a bf16 one is then held in bf16 (graph.c)
     * before the first step touches the activations: the larger of the
     * two moments */
    double base_acts = c->lora.base_bf16 ? fmax(4.0 * n, 2.0 * n + acts) : 4.0 * n + acts;
    if (adapters > 0) return base_acts + 4.0 * (adapters - trained) + per * trained;
    return per * n + acts;
}
