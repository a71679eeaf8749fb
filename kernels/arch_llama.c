/*
 * arch_llama.c — the Llama family (API: arch.h): Llama 2 and 3, SmolLM2,
 * and Qwen2 (the same graph with biases on q, k and v). Pre-RMSNorm blocks
 * of grouped-query attention with rotary embeddings and a SwiGLU MLP, no
 * biases elsewhere, the output layer tied to the token embedding or not.
 * Names follow Hugging Face's LlamaForCausalLM / Qwen2ForCausalLM, whose
 * layouts ([out, in]) are Strait's. Initialisation: N(0, 0.02), the two
 * projections into the residual stream scaled by 1/sqrt(2L) as in GPT-2
 * (transformers draws them unscaled; a preset's start is Strait's choice).
 */
#include <assert.h>
#include <string.h>

#include "kernels/arch.h"
#include "util/util.h"

enum { WTE, LN1, QW, QB, KW, KB, VW, VB, OW, LN2, GATE_W, UP_W, DOWN_W, LNF, HEAD };
static const ArchTensor TENSORS[] = {
    [WTE] = {"wte", 0, DIM_VP, DIM_C, INIT_NORMAL, IF_ALWAYS, "model.embed_tokens.weight", 0, 0},
    [LN1] = {"ln_1.weight", 1, DIM_C, DIM_NONE, INIT_ONE, IF_ALWAYS,
             "model.layers.%d.input_layernorm.weight", 0, 0},
    [QW] = {"attn.q.weight", 1, DIM_Q, DIM_C, INIT_NORMAL, IF_ALWAYS,
            "model.layers.%d.self_attn.q_proj.weight", 0, LORA_Q},
    [QB] = {"attn.q.bias", 1, DIM_Q, DIM_NONE, INIT_ZERO, IF_QKV_BIAS,
            "model.layers.%d.self_attn.q_proj.bias", 0, 0},
    [KW] = {"attn.k.weight", 1, DIM_KV, DIM_C, INIT_NORMAL, IF_ALWAYS,
            "model.layers.%d.self_attn.k_proj.weight", 0, LORA_K},
    [KB] = {"attn.k.bias", 1, DIM_KV, DIM_NONE, INIT_ZERO, IF_QKV_BIAS,
            "model.layers.%d.self_attn.k_proj.bias", 0, 0},
    [VW] = {"attn.v.weight", 1, DIM_KV, DIM_C, INIT_NORMAL, IF_ALWAYS,
            "model.layers.%d.self_attn.v_proj.weight", 0, LORA_V},
    [VB] = {"attn.v.bias", 1, DIM_KV, DIM_NONE, INIT_ZERO, IF_QKV_BIAS,
            "model.layers.%d.self_attn.v_proj.bias", 0, 0},
    [OW] = {"attn.o.weight", 1, DIM_C, DIM_Q, INIT_RESID, IF_ALWAYS,
            "model.layers.%d.self_attn.o_proj.weight", 0, LORA_O},
    [LN2] = {"ln_2.weight", 1, DIM_C, DIM_NONE, INIT_ONE, IF_ALWAYS,
             "model.layers.%d.post_attention_layernorm.weight", 0, 0},
    [GATE_W] = {"mlp.gate.weight", 1, DIM_F, DIM_C, INIT_NORMAL, IF_ALWAYS,
                "model.layers.%d.mlp.gate_proj.weight", 0, LORA_GATE},
    [UP_W] = {"mlp.up.weight", 1, DIM_F, DIM_C, INIT_NORMAL, IF_ALWAYS,
              "model.layers.%d.mlp.up_proj.weight", 0, LORA_UP},
    [DOWN_W] = {"mlp.down.weight", 1, DIM_C, DIM_F, INIT_RESID, IF_ALWAYS,
                "model.layers.%d.mlp.down_proj.weight", 0, LORA_DOWN},
    [LNF] = {"ln_f.weight", 0, DIM_C, DIM_NONE, INIT_ONE, IF_ALWAYS, "model.norm.weight", 0, 0},
    [HEAD] = {"lm_head.weight", 0, DIM_VP, DIM_C, INIT_NORMAL, IF_UNTIED, "lm_head.weight", 0, 0},
};

enum {
    ENCODED = ACT_LSE + 1,
    XN1,
    RSTD1,
    Q,
    K,
    V,
    ATTY,
    ATT,
    ATTPROJ,
    RES2,
    XN2,
    RSTD2,
    GATE,
    UP,
    SWI,
    DOWN,
    RES3,
    RSTDF,
    LORA_A0 /* lora.c's: LORA_ACTS of them */
};

static void layout(const ModelConfig *c, int B, int T, ActLayout *lay) {
    size_t BT = (size_t)B * T, C = (size_t)c->C, NH = (size_t)c->NH, F = (size_t)c->F;
    size_t Qd = NH * (size_t)c->HD, KVd = (size_t)c->NKV * (size_t)c->HD;
    int L = c->L;
    assert(B >= 1 && T >= 1);
    lay->len = 0, lay->B = B, lay->T = T;
    act_add(lay, ENCODED, BT * C, 0);
    act_add_recomputed(lay, XN1, BT * C, L, MODEL_RECOMPUTE_NORM);
    act_add(lay, RSTD1, BT, L);
    act_add(lay, Q, BT * Qd, L);
    act_add(lay, K, BT * KVd, L);
    act_add(lay, V, BT * KVd, L);
    act_add(lay, ATTY, BT * Qd, L);
    act_add(lay, ATT, B * NH * T, L); /* each query row's log-sum-exp */
    act_add(lay, ATTPROJ, BT * C, L);
    act_add(lay, RES2, BT * C, L);
    act_add_recomputed(lay, XN2, BT * C, L, MODEL_RECOMPUTE_NORM);
    act_add(lay, RSTD2, BT, L);
    act_add(lay, GATE, BT * F, L);
    act_add(lay, UP, BT * F, L);
    act_add_recomputed(lay, SWI, BT * F, L, MODEL_RECOMPUTE_ACT);
    act_add(lay, DOWN, BT * C, L);
    act_add(lay, RES3, BT * C, L);
    act_add(lay, ACT_OUT, BT * C, 0);
    act_add(lay, RSTDF, BT, 0);
    act_add(lay, ACT_LOSSES, BT, 0);
    act_add(lay, ACT_LSE, BT, 0);
    lora_layout(c, B, T, lay, LORA_A0);
    act_carry(lay, RES3);
    act_finish(lay);
}

static void forward(const Model *m, const Pass *p) {
    const Ops *o = p->ops;
    void *st = p->stream;
    const ModelConfig *c = &m->cfg;
    int C = c->C, L = c->L, F = c->F, B = p->B, T = p->T, BT = B * T;
    int Qd = c->NH * c->HD, KVd = c->NKV * c->HD;
    assert(c->NKV >= 1 && c->NH % c->NKV == 0 && c->HD % 2 == 0 && p->lay->B == B);
    float *a = p->acts, *w = p->params, eps = c->eps;
    AttnShape as = {B, T, c->NH, c->NKV, c->HD, Qd, KVd};
#define A(x, l) act_at(p, a, x, l)
#define W(r, l) arch_w(m, w, r, l)
    o->encoder_forward(A(ENCODED, 0), p->inputs, W(WTE, 0), NULL, B, T, C, st);
    for (int l = 0; l < L; l++) {
        float *x = l == 0 ? A(ENCODED, 0) : A(RES3, l - 1);
        o->rmsnorm_forward(A(XN1, l), A(RSTD1, l), x, W(LN1, l), BT, C, eps, st);
        o->matmul_forward(A(Q, l), A(XN1, l), W(QW, l), W(QB, l), BT, C, Qd, st);
        lora_forward(m, p, LORA_A0, QW, l, A(XN1, l), A(Q, l));
        o->matmul_forward(A(K, l), A(XN1, l), W(KW, l), W(KB, l), BT, C, KVd, st);
        lora_forward(m, p, LORA_A0, KW, l, A(XN1, l), A(K, l));
        o->matmul_forward(A(V, l), A(XN1, l), W(VW, l), W(VB, l), BT, C, KVd, st);
        lora_forward(m, p, LORA_A0, VW, l, A(XN1, l), A(V, l));
        o->rope_forward(A(Q, l), B, T, c->NH, c->HD, Qd, &c->rope, st);
        o->rope_forward(A(K, l), B, T, c->NKV, c->HD, KVd, &c->rope, st);
        o->attention_forward(A(ATTY, l), A(ATT, l), A(Q, l), A(K, l), A(V, l), &as, st);
        o->matmul_forward(A(ATTPROJ, l), A(ATTY, l), W(OW, l), NULL, BT, Qd, C, st);
        lora_forward(m, p, LORA_A0, OW, l, A(ATTY, l), A(ATTPROJ, l));
        o->residual_forward(A(RES2, l), x, A(ATTPROJ, l), (size_t)BT * C, st);
        o->rmsnorm_forward(A(XN2, l), A(RSTD2, l), A(RES2, l), W(LN2, l), BT, C, eps, st);
        o->matmul_forward(A(GATE, l), A(XN2, l), W(GATE_W, l), NULL, BT, C, F, st);
        lora_forward(m, p, LORA_A0, GATE_W, l, A(XN2, l), A(GATE, l));
        o->matmul_forward(A(UP, l), A(XN2, l), W(UP_W, l), NULL, BT, C, F, st);
        lora_forward(m, p, LORA_A0, UP_W, l, A(XN2, l), A(UP, l));
        o->swiglu_forward(A(SWI, l), A(GATE, l), A(UP, l), (size_t)BT * F, st);
        o->matmul_forward(A(DOWN, l), A(SWI, l), W(DOWN_W, l), NULL, BT, F, C, st);
        lora_forward(m, p, LORA_A0, DOWN_W, l, A(SWI, l), A(DOWN, l));
        o->residual_forward(A(RES3, l), A(RES2, l), A(DOWN, l), (size_t)BT * C, st);
    }
    o->rmsnorm_forward(A(ACT_OUT, 0), A(RSTDF, 0), A(RES3, L - 1), W(LNF, 0), BT, C, eps, st);
}

static void backward(const Model *m, const Pass *p) {
    const Ops *o = p->ops;
    void *st = p->stream;
    const ModelConfig *c = &m->cfg;
    int C = c->C, L = c->L, F = c->F, B = p->B, T = p->T, BT = B * T;
    int Qd = c->NH * c->HD, KVd = c->NKV * c->HD;
    assert(c->NKV >= 1 && c->NH % c->NKV == 0 && c->HD % 2 == 0 && p->lay->B == B);
    float *a = p->acts, *w = p->params, *g = p->grads, eps = c->eps;
    AttnShape as = {B, T, c->NH, c->NKV, c->HD, Qd, KVd};
#define D(x, l) dact_at(p, x, l)
#define G(r, l) arch_wg(m, g, r, l) /* NULL: the base is frozen */
    o->rmsnorm_backward(D(RES3, L - 1), G(LNF, 0), D(ACT_OUT, 0), A(RES3, L - 1), W(LNF, 0),
                        A(RSTDF, 0), BT, C, st);
    for (int l = L - 1; l >= 0; l--) {
        act_layer_start(p, RES3, l);
        float *x = l == 0 ? A(ENCODED, 0) : A(RES3, l - 1);
        float *dx = l == 0 ? D(ENCODED, 0) : D(RES3, l - 1);
        if (act_recomputes(p, MODEL_RECOMPUTE_NORM)) /* what the forward wrote, again */
            o->rmsnorm_forward(A(XN2, l), A(RSTD2, l), A(RES2, l), W(LN2, l), BT, C, eps, st);
        if (act_recomputes(p, MODEL_RECOMPUTE_ACT))
            o->swiglu_forward(A(SWI, l), A(GATE, l), A(UP, l), (size_t)BT * F, st);
        o->residual_backward(D(RES2, l), D(DOWN, l), D(RES3, l), (size_t)BT * C, st);
        o->matmul_backward(D(SWI, l), G(DOWN_W, l), NULL, D(DOWN, l), A(SWI, l), W(DOWN_W, l), BT,
                           F, C, st);
        lora_backward(m, p, LORA_A0, DOWN_W, l, A(SWI, l), D(SWI, l), D(DOWN, l));
        o->swiglu_backward(D(GATE, l), D(UP, l), D(SWI, l), A(GATE, l), A(UP, l), (size_t)BT * F,
                           st);
        o->matmul_backward(D(XN2, l), G(GATE_W, l), NULL, D(GATE, l), A(XN2, l), W(GATE_W, l), BT,
                           C, F, st);
        lora_backward(m, p, LORA_A0, GATE_W, l, A(XN2, l), D(XN2, l), D(GATE, l));
        o->matmul_backward(D(XN2, l), G(UP_W, l), NULL, D(UP, l), A(XN2, l), W(UP_W, l), BT, C, F,
                           st);
        lora_backward(m, p, LORA_A0, UP_W, l, A(XN2, l), D(XN2, l), D(UP, l));
        o->rmsnorm_backward(D(RES2, l), G(LN2, l), D(XN2, l), A(RES2, l), W(LN2, l), A(RSTD2, l),
                            BT, C, st);
        o->residual_backward(dx, D(ATTPROJ, l), D(RES2, l), (size_t)BT * C, st);
        o->matmul_backward(D(ATTY, l), G(OW, l), NULL, D(ATTPROJ, l), A(ATTY, l), W(OW, l), BT, Qd,
                           C, st);
        lora_backward(m, p, LORA_A0, OW, l, A(ATTY, l), D(ATTY, l), D(ATTPROJ, l));
        if (act_recomputes(p, MODEL_RECOMPUTE_NORM)) /* what the forward wrote, again */
            o->rmsnorm_forward(A(XN1, l), A(RSTD1, l), x, W(LN1, l), BT, C, eps, st);
        o->attention_backward(D(Q, l), D(K, l), D(V, l), D(ATT, l), D(ATTY, l), A(Q, l), A(K, l),
                              A(V, l), A(ATTY, l), A(ATT, l), &as, st);
        o->rope_backward(D(Q, l), B, T, c->NH, c->HD, Qd, &c->rope, st);
        o->rope_backward(D(K, l), B, T, c->NKV, c->HD, KVd, &c->rope, st);
        o->matmul_backward(D(XN1, l), G(QW, l), G(QB, l), D(Q, l), A(XN1, l), W(QW, l), BT, C, Qd,
                           st);
        lora_backward(m, p, LORA_A0, QW, l, A(XN1, l), D(XN1, l), D(Q, l));
        o->matmul_backward(D(XN1, l), G(KW, l), G(KB, l), D(K, l), A(XN1, l), W(KW, l), BT, C, KVd,
                           st);
        lora_backward(m, p, LORA_A0, KW, l, A(XN1, l), D(XN1, l), D(K, l));
        o->matmul_backward(D(XN1, l), G(VW, l), G(VB, l), D(V, l), A(XN1, l), W(VW, l), BT, C, KVd,
                           st);
        lora_backward(m, p, LORA_A0, VW, l, A(XN1, l), D(XN1, l), D(V, l));
        o->rmsnorm_backward(dx, G(LN1, l), D(XN1, l), x, W(LN1, l), A(RSTD1, l), BT, C, st);
    }
    if (g != NULL) o->encoder_backward(G(WTE, 0), NULL, D(ENCODED, 0), p->inputs, B, T, C, st);
#undef A
#undef W
#undef D
#undef G
}

/* ---- config.json ------------------------------------------------------------------- */

/* The fields of a Llama's and a Qwen2's config.json beside every config's
 * own (hf_config.c): what Strait reads, and what it knows not to change
 * the model at a neutral value. SmolLM2's carry rope_interleaved and two
 * of transformers.js's. */
static const HfField FAMILY_FIELDS[] = {
    {"num_hidden_layers", HF_USED},
    {"hidden_size", HF_USED},
    {"num_attention_heads", HF_USED},
    {"intermediate_size", HF_USED},
    {"max_position_embeddings", HF_USED},
    {"vocab_size", HF_USED},
    {"num_key_value_heads", HF_USED},
    {"head_dim", HF_USED},
    {"rms_norm_eps", HF_USED},
    {"hidden_act", HF_USED},
    {"rope_theta", HF_USED},
    {"rope_scaling", HF_USED},
    {"rope_parameters", HF_USED},
    {"tie_word_embeddings", HF_USED},
    {"attention_dropout", HF_ZERO},
};
static const HfField LLAMA_FIELDS[] = {
    {"attention_bias", HF_FALSE},     {"mlp_bias", HF_FALSE},
    {"pretraining_tp", HF_ONE},       {"rope_interleaved", HF_FALSE},
    {"is_llama_config", HF_HARMLESS}, {"transformers.js_config", HF_HARMLESS},
};
static const HfField QWEN2_FIELDS[] = {
    {"layer_types", HF_USED},
    {"use_sliding_window", HF_FALSE}, /* and with none, the window's size is moot: */
    {"sliding_window", HF_HARMLESS},
    {"max_window_layers", HF_HARMLESS},
};
#define N_OF(a) (int)(sizeof(a) / sizeof((a)[0]))

/* A rope description: transformers 4's rope_scaling or transformers 5's
 * rope_parameters (`field`, which may hold rope_theta too). default and
 * llama3 are computed; any other type is refused by name. */
static int rope_read(json_t *o, const char *field, RopeConfig *r, char *err) {
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        static const char *const known[] = {"rope_type",
                                            "type",
                                            "rope_theta",
                                            "factor",
                                            "low_freq_factor",
                                            "high_freq_factor",
                                            "original_max_position_embeddings"};
        int ok = 0;
        for (int i = 0; i < N_OF(known) && !ok; i++)
            ok = strcmp(key, known[i]) == 0 && (i != 2 || strcmp(field, "rope_parameters") == 0);
        if (!ok)
            return err_set(err,
                           "config.json's %s has %.80s, which Strait does not know; remove it "
                           "if it does not change the model",
                           field, key);
    }
    const char *type = json_string_value(json_object_get(o, "rope_type"));
    if (type == NULL) type = json_string_value(json_object_get(o, "type"));
    if (type == NULL) type = "(none)";
    if (hf_num(o, "rope_theta", r->theta, &r->theta, err)) return -1;
    if (strcmp(type, "default") == 0) {
        r->factor = 0, r->low_freq = 0, r->high_freq = 0, r->original_ctx = 0;
        return 0;
    }
    if (strcmp(type, "llama3") != 0)
        return err_set(err,
                       "%s of type %s; Strait computes rotary embeddings of type default or "
                       "llama3 (Llama 3's) only",
                       field, type);
    /* every one of Llama 3's four: a missing factor would silently mean none */
    static const char *const need[] = {"factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings"};
    for (int i = 0; i < 4; i++)
        if (!json_is_number(json_object_get(o, need[i])))
            return err_set(err,
                           "%s of type llama3 has no %s (a number); Llama 3's scaling needs "
                           "factor, low_freq_factor, high_freq_factor and "
                           "original_max_position_embeddings",
                           field, need[i]);
    if (hf_num(o, "factor", 0, &r->factor, err) ||
        hf_num(o, "low_freq_factor", 0, &r->low_freq, err) ||
        hf_num(o, "high_freq_factor", 0, &r->high_freq, err) ||
        hf_int(o, "original_max_position_embeddings", -1, 1, 1 << 24, &r->original_ctx, err))
        return -1;
    return 0;
}

/* Rotary embeddings as transformers 4 writes them (rope_theta, rope_scaling)
 * or 5 (rope_parameters); a config with both is taken when they agree. */
static int rope_config(json_t *j, RopeConfig *r, char *err) {
    RopeConfig old = {10000.0f, 0, 0, 0, 0}, new = old;
    json_t *rs = json_object_get(j, "rope_scaling"), *rp = json_object_get(j, "rope_parameters");
    int has_old =
        (json_object_get(j, "rope_theta") && !json_is_null(json_object_get(j, "rope_theta"))) ||
        (rs && !json_is_null(rs));
    if (hf_num(j, "rope_theta", 10000.0, &old.theta, err)) return -1;
    if (rs && !json_is_null(rs) &&
        (!json_is_object(rs) ? err_set(err, "config.json's rope_scaling should be an object")
                             : rope_read(rs, "rope_scaling", &old, err)))
        return -1;
    if (rp == NULL || json_is_null(rp)) {
        *r = old;
        return 0;
    }
    if (!json_is_object(rp))
        return err_set(err, "config.json's rope_parameters should be an object");
    if (rope_read(rp, "rope_parameters", &new, err)) return -1;
    if (has_old && memcmp(&old, &new, sizeof old) != 0)
        return err_set(err,
                       "config.json's rope_theta/rope_scaling (theta %g, factor %g) and "
                       "rope_parameters (theta %g, factor %g) disagree; keep one of them",
                       old.theta, old.factor, new.theta, new.factor);
    *r = new;
    return 0;
}

/* Qwen2's layer_types (transformers 5): every layer full_attention */
static int layer_types_check(json_t *j, int L, char *err) {
    json_t *lt = json_object_get(j, "layer_types");
    if (lt == NULL || json_is_null(lt)) return 0;
    if (!json_is_array(lt) || (int)json_array_size(lt) != L)
        return err_set(err, "config.json's layer_types should list the %d layers", L);
    for (int l = 0; l < L; l++) {
        const char *t = json_string_value(json_array_get(lt, (size_t)l));
        if (t && strcmp(t, "full_attention") == 0) continue;
        return err_set(err,
                       "config.json's layer_types[%d] is %.40s; Strait attends to the whole "
                       "context (full_attention) in every layer",
                       l, t ? t : "not a string");
    }
    return 0;
}

static int hf_config_read(json_t *j, ModelConfig *c, char *err) {
    const char *type = json_string_value(json_object_get(j, "model_type"));
    int qwen = type && strcmp(type, "qwen2") == 0;
    if (qwen ? hf_fields_check(j, FAMILY_FIELDS, N_OF(FAMILY_FIELDS), QWEN2_FIELDS,
                               N_OF(QWEN2_FIELDS), err)
             : hf_fields_check(j, FAMILY_FIELDS, N_OF(FAMILY_FIELDS), LLAMA_FIELDS,
                               N_OF(LLAMA_FIELDS), err))
        return -1;
    const char *act = json_string_value(json_object_get(j, "hidden_act"));
    if (act && strcmp(act, "silu") != 0)
        return err_set(err, "hidden_act %s; the Llama family's SwiGLU is silu", act);
    if (hf_int(j, "num_hidden_layers", -1, 1, 256, &c->L, err) ||
        hf_int(j, "hidden_size", -1, 1, 65536, &c->C, err) ||
        hf_int(j, "num_attention_heads", -1, 1, 65536, &c->NH, err) ||
        hf_int(j, "intermediate_size", -1, 1, 1 << 20, &c->F, err) ||
        hf_int(j, "max_position_embeddings", -1, 1, 1 << 20, &c->T, err) ||
        hf_int(j, "vocab_size", -1, 2, 1 << 22, &c->V, err) ||
        hf_int(j, "num_key_value_heads", c->NH, 1, 65536, &c->NKV, err) ||
        hf_int(j, "head_dim", c->C / c->NH, 2, 1024, &c->HD, err) ||
        hf_num(j, "rms_norm_eps", 1e-6, &c->eps, err) || rope_config(j, &c->rope, err) ||
        layer_types_check(j, c->L, err))
        return -1;
    if (qwen && c->HD * c->NH != c->C)
        return err_set(err, "head_dim %d; Qwen2's heads split hidden_size evenly", c->HD);
    json_t *tie = json_object_get(j, "tie_word_embeddings");
    if (tie && !json_is_null(tie) && !json_is_boolean(tie))
        return err_set(err, "config.json's tie_word_embeddings should be true or false");
    c->tied = json_is_true(tie); /* transformers' default for both: untied */
    c->qkv_bias = qwen;
    return 0;
}

static json_t *hf_config_write(const ModelConfig *c) {
    int qwen = c->arch == ARCH_QWEN2;
    json_t *j =
        json_pack("{s:[s],s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:f,s:b,s:s,s:s}", "architectures",
                  qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM", "model_type",
                  qwen ? "qwen2" : "llama", "vocab_size", c->V, "hidden_size", c->C,
                  "intermediate_size", c->F, "num_hidden_layers", c->L, "num_attention_heads",
                  c->NH, "num_key_value_heads", c->NKV, "max_position_embeddings", c->T,
                  "rms_norm_eps", (double)c->eps, "rope_theta", (double)c->rope.theta,
                  "tie_word_embeddings", c->tied, "hidden_act", "silu", "torch_dtype", "float32");
    if (qwen) {
        json_object_set_new(j, "use_sliding_window", json_false());
    } else {
        json_object_set_new(j, "head_dim", json_integer(c->HD));
        json_object_set_new(j, "attention_bias", json_false());
        json_object_set_new(j, "mlp_bias", json_false());
    }
    json_object_set_new(j, "rope_scaling",
                        c->rope.factor > 0
                            ? json_pack("{s:s,s:f,s:f,s:f,s:i}", "rope_type", "llama3", "factor",
                                        (double)c->rope.factor, "low_freq_factor",
                                        (double)c->rope.low_freq, "high_freq_factor",
                                        (double)c->rope.high_freq,
                                        "original_max_position_embeddings", c->rope.original_ctx)
                            : json_null());
    return j;
}

/* what the shape leaves open: grouped heads, rotary embeddings, the norms */
static int check(ModelConfig *c, char *err) {
    const RopeConfig *r = &c->rope;
    if (c->NKV < 1 || c->NH % c->NKV != 0)
        return err_set(err, "%d attention heads do not share %d key/value heads evenly", c->NH,
                       c->NKV);
    if (c->HD < 2 || c->HD % 2 != 0 || c->HD > 1024 || (long long)c->HD * c->NH > 65536)
        return err_set(err,
                       "head size %d; rotary embeddings need an even one, at most 1024 "
                       "(and heads x head size at most 65536)",
                       c->HD);
    if (c->F < 1 || c->F > (1 << 20)) return err_set(err, "MLP width %d; use 1 to 2^20", c->F);
    if (!(c->eps > 0 && c->eps < 1))
        return err_set(err, "norm epsilon %g; use more than 0, less than 1", c->eps);
    if (!(r->theta > 1 && r->theta < 1e12f))
        return err_set(err, "rope_theta %g; use more than 1", r->theta);
    if (r->factor != 0 &&
        !(r->factor >= 1 && r->factor < 1e6f && r->low_freq > 0 && r->high_freq > r->low_freq &&
          r->high_freq < 1e6f && r->original_ctx >= 1))
        return err_set(err,
                       "rope_scaling factor %g, low_freq_factor %g, high_freq_factor %g, "
                       "original_max_position_embeddings %d; use a factor of at least 1 and "
                       "0 < low < high",
                       r->factor, r->low_freq, r->high_freq, r->original_ctx);
    c->tied = c->tied != 0;
    c->qkv_bias = c->qkv_bias != 0;
    return 0;
}

/* The published models' config.json (their weights come from --init-from;
 * a preset draws random ones): name, L, C, NH, NKV, F, T, V, tied,
 * qkv_bias, theta, eps, scaling */
static const ArchPreset LLAMA_PRESETS[] = {
    {"llama-tiny", 2, 64, 4, 2, 176, 64, 256, 0, 0, 10000.0f, 1e-5f, {.factor = 0}},
    {"llama-small", 4, 128, 4, 2, 352, 128, 256, 0, 0, 10000.0f, 1e-5f, {.factor = 0}},
    {"smollm2-135m", 30, 576, 9, 3, 1536, 8192, 49152, 1, 0, 100000.0f, 1e-5f, {.factor = 0}},
    {"smollm2-360m", 32, 960, 15, 5, 2560, 8192, 49152, 1, 0, 100000.0f, 1e-5f, {.factor = 0}},
    {"llama-3.2-1b",
     16,
     2048,
     32,
     8,
     8192,
     131072,
     128256,
     1,
     0,
     500000.0f,
     1e-5f,
     {.factor = 32.0f, .low_freq = 1.0f, .high_freq = 4.0f, .original_ctx = 8192}},
};
static const ArchPreset QWEN2_PRESETS[] = {
    {"qwen2-tiny", 2, 64, 4, 2, 176, 64, 256, 1, 1, 1000000.0f, 1e-6f, {.factor = 0}},
    {"qwen2.5-0.5b", 24, 896, 14, 2, 4864, 32768, 151936, 1, 1, 1000000.0f, 1e-6f, {.factor = 0}},
};

/* Llama and Qwen2: one table, one graph and one check, their Hugging Face
 * names and presets apart */
#define LLAMA_FAMILY(id, class, rows)                                                              \
    {                                                                                              \
        .name = id, .hf_class = class, .hf_type = id, .hf_prefix = "", .tensors = TENSORS,         \
        .n_tensors = sizeof TENSORS / sizeof TENSORS[0], .embed_row = WTE, .head_row = HEAD,       \
        .layout = layout, .forward = forward, .backward = backward,                                \
        .hf_config_read = hf_config_read, .hf_config_write = hf_config_write, .check = check,      \
        .shape_only = 0, .presets = rows, .n_presets = sizeof rows / sizeof rows[0],               \
        .gguf_arch = id                                                                            \
    }
const Arch arch_llama = LLAMA_FAMILY("llama", "LlamaForCausalLM", LLAMA_PRESETS);
const Arch arch_qwen2 = LLAMA_FAMILY("qwen2", "Qwen2ForCausalLM", QWEN2_PRESETS);
