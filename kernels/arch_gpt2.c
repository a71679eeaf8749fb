/*
 * arch_gpt2.c — GPT-2 (API: arch.h): learned position embeddings,
 * pre-LayerNorm blocks of fused-qkv multi-head attention and a GELU (tanh)
 * MLP, the output layer tied to the token embedding. Its tensor table
 * (names and order are the checkpoints' since the first release: the
 * federation's table hash depends on them), its activations and its graph,
 * after llm.c's train_gpt2.c.
 */
#include <assert.h>
#include <string.h>

#include "kernels/arch.h"
#include "util/util.h"

/* the table's rows, in order */
enum { WTE, WPE, LN1W, LN1B, QKVW, QKVB, APW, APB, LN2W, LN2B, FCW, FCB, FPW, FPB, LNFW, LNFB };
static const ArchTensor TENSORS[] = {
    [WTE] = {"wte", 0, DIM_VP, DIM_C, INIT_NORMAL, IF_ALWAYS, "wte.weight", 0, 0},
    [WPE] = {"wpe", 0, DIM_T, DIM_C, INIT_NORMAL, IF_ALWAYS, "wpe.weight", 0, 0},
    [LN1W] = {"ln_1.weight", 1, DIM_C, DIM_NONE, INIT_ONE, IF_ALWAYS, "h.%d.ln_1.weight", 0, 0},
    [LN1B] = {"ln_1.bias", 1, DIM_C, DIM_NONE, INIT_ZERO, IF_ALWAYS, "h.%d.ln_1.bias", 0, 0},
    [QKVW] = {"attn.qkv.weight", 1, DIM_3C, DIM_C, INIT_NORMAL, IF_ALWAYS,
              "h.%d.attn.c_attn.weight", 1, 0},
    [QKVB] = {"attn.qkv.bias", 1, DIM_3C, DIM_NONE, INIT_ZERO, IF_ALWAYS, "h.%d.attn.c_attn.bias",
              0, 0},
    [APW] = {"attn.proj.weight", 1, DIM_C, DIM_C, INIT_RESID, IF_ALWAYS, "h.%d.attn.c_proj.weight",
             1, 0},
    [APB] = {"attn.proj.bias", 1, DIM_C, DIM_NONE, INIT_ZERO, IF_ALWAYS, "h.%d.attn.c_proj.bias", 0,
             0},
    [LN2W] = {"ln_2.weight", 1, DIM_C, DIM_NONE, INIT_ONE, IF_ALWAYS, "h.%d.ln_2.weight", 0, 0},
    [LN2B] = {"ln_2.bias", 1, DIM_C, DIM_NONE, INIT_ZERO, IF_ALWAYS, "h.%d.ln_2.bias", 0, 0},
    [FCW] = {"mlp.fc.weight", 1, DIM_4C, DIM_C, INIT_NORMAL, IF_ALWAYS, "h.%d.mlp.c_fc.weight", 1,
             0},
    [FCB] = {"mlp.fc.bias", 1, DIM_4C, DIM_NONE, INIT_ZERO, IF_ALWAYS, "h.%d.mlp.c_fc.bias", 0, 0},
    [FPW] = {"mlp.proj.weight", 1, DIM_C, DIM_4C, INIT_RESID, IF_ALWAYS, "h.%d.mlp.c_proj.weight",
             1, 0},
    [FPB] = {"mlp.proj.bias", 1, DIM_C, DIM_NONE, INIT_ZERO, IF_ALWAYS, "h.%d.mlp.c_proj.bias", 0,
             0},
    [LNFW] = {"ln_f.weight", 0, DIM_C, DIM_NONE, INIT_ONE, IF_ALWAYS, "ln_f.weight", 0, 0},
    [LNFB] = {"ln_f.bias", 0, DIM_C, DIM_NONE, INIT_ZERO, IF_ALWAYS, "ln_f.bias", 0, 0},
};

/* the activations (after every architecture's ACT_OUT, ACT_LOSSES, ACT_LSE) */
enum {
    ENCODED = ACT_LSE + 1,
    LN1,
    LN1_MEAN,
    LN1_RSTD,
    QKV,
    ATTY,
    ATT,
    ATTPROJ,
    RES2,
    LN2,
    LN2_MEAN,
    LN2_RSTD,
    FCH,
    FCH_GELU,
    FCPROJ,
    RES3,
    LNF_MEAN,
    LNF_RSTD
};

static void layout(const ModelConfig *c, int B, int T, ActLayout *lay) {
    size_t BT = (size_t)B * T, C = (size_t)c->C, NH = (size_t)c->NH;
    int L = c->L;
    assert(B >= 1 && T >= 1);
    lay->len = 0, lay->B = B, lay->T = T;
    act_add(lay, ENCODED, BT * C, 0);
    act_add_recomputed(lay, LN1, BT * C, L, MODEL_RECOMPUTE_NORM);
    act_add(lay, LN1_MEAN, BT, L);
    act_add(lay, LN1_RSTD, BT, L);
    act_add(lay, QKV, BT * 3 * C, L);
    act_add(lay, ATTY, BT * C, L);
    act_add(lay, ATT, B * NH * T, L); /* each query row's log-sum-exp */
    act_add(lay, ATTPROJ, BT * C, L);
    act_add(lay, RES2, BT * C, L);
    act_add_recomputed(lay, LN2, BT * C, L, MODEL_RECOMPUTE_NORM);
    act_add(lay, LN2_MEAN, BT, L);
    act_add(lay, LN2_RSTD, BT, L);
    act_add(lay, FCH, BT * 4 * C, L);
    act_add_recomputed(lay, FCH_GELU, BT * 4 * C, L, MODEL_RECOMPUTE_ACT);
    act_add(lay, FCPROJ, BT * C, L);
    act_add(lay, RES3, BT * C, L);
    act_add(lay, ACT_OUT, BT * C, 0);
    act_add(lay, LNF_MEAN, BT, 0);
    act_add(lay, LNF_RSTD, BT, 0);
    act_add(lay, ACT_LOSSES, BT, 0);
    act_add(lay, ACT_LSE, BT, 0); /* each row's log-sum-exp, for the classifier's backward */
    act_carry(lay, RES3);
    act_finish(lay);
}

static void forward(const Model *m, const Pass *p) {
    const Ops *o = p->ops;
    void *st = p->stream;
    int C = m->cfg.C, L = m->cfg.L, B = p->B, T = p->T, BT = B * T;
    float *a = p->acts, *w = p->params;
    size_t sBTC = (size_t)BT * C;
    assert(C % m->cfg.NH == 0 && m->cfg.F == 4 * C && p->lay->B == B);
    AttnShape as = {B, T, m->cfg.NH, m->cfg.NH, C / m->cfg.NH, 3 * C, 3 * C};
#define A(x, l) act_at(p, a, x, l)
#define W(r, l) arch_w(m, w, r, l)
    o->encoder_forward(A(ENCODED, 0), p->inputs, W(WTE, 0), W(WPE, 0), B, T, C, st);
    for (int l = 0; l < L; l++) {
        float *residual = l == 0 ? A(ENCODED, 0) : A(RES3, l - 1), *qkv = A(QKV, l);
        o->layernorm_forward(A(LN1, l), A(LN1_MEAN, l), A(LN1_RSTD, l), residual, W(LN1W, l),
                             W(LN1B, l), BT, C, st);
        o->matmul_forward(qkv, A(LN1, l), W(QKVW, l), W(QKVB, l), BT, C, 3 * C, st);
        o->attention_forward(A(ATTY, l), A(ATT, l), qkv, qkv + C, qkv + 2 * C, &as, st);
        o->matmul_forward(A(ATTPROJ, l), A(ATTY, l), W(APW, l), W(APB, l), BT, C, C, st);
        o->residual_forward(A(RES2, l), residual, A(ATTPROJ, l), sBTC, st);
        o->layernorm_forward(A(LN2, l), A(LN2_MEAN, l), A(LN2_RSTD, l), A(RES2, l), W(LN2W, l),
                             W(LN2B, l), BT, C, st);
        o->matmul_forward(A(FCH, l), A(LN2, l), W(FCW, l), W(FCB, l), BT, C, 4 * C, st);
        o->gelu_forward(A(FCH_GELU, l), A(FCH, l), 4 * sBTC, st);
        o->matmul_forward(A(FCPROJ, l), A(FCH_GELU, l), W(FPW, l), W(FPB, l), BT, 4 * C, C, st);
        o->residual_forward(A(RES3, l), A(RES2, l), A(FCPROJ, l), sBTC, st);
    }
    o->layernorm_forward(A(ACT_OUT, 0), A(LNF_MEAN, 0), A(LNF_RSTD, 0), A(RES3, L - 1), W(LNFW, 0),
                         W(LNFB, 0), BT, C, st);
}

static void backward(const Model *m, const Pass *p) {
    const Ops *o = p->ops;
    void *st = p->stream;
    int C = m->cfg.C, L = m->cfg.L, B = p->B, T = p->T, BT = B * T;
    float *a = p->acts, *w = p->params, *g = p->grads;
    size_t sBTC = (size_t)BT * C;
    AttnShape as = {B, T, m->cfg.NH, m->cfg.NH, C / m->cfg.NH, 3 * C, 3 * C};
#define D(x, l) dact_at(p, x, l)
#define G(r, l) arch_w(m, g, r, l)
    o->layernorm_backward(D(RES3, L - 1), G(LNFW, 0), G(LNFB, 0), D(ACT_OUT, 0), A(RES3, L - 1),
                          W(LNFW, 0), A(LNF_MEAN, 0), A(LNF_RSTD, 0), BT, C, st);
    for (int l = L - 1; l >= 0; l--) {
        act_layer_start(p, RES3, l);
        float *residual = l == 0 ? A(ENCODED, 0) : A(RES3, l - 1);
        float *dresidual = l == 0 ? D(ENCODED, 0) : D(RES3, l - 1);
        float *qkv = A(QKV, l), *dqkv = D(QKV, l);
        if (act_recomputes(p, MODEL_RECOMPUTE_NORM)) /* what the forward wrote, again */
            o->layernorm_forward(A(LN2, l), A(LN2_MEAN, l), A(LN2_RSTD, l), A(RES2, l), W(LN2W, l),
                                 W(LN2B, l), BT, C, st);
        if (act_recomputes(p, MODEL_RECOMPUTE_ACT))
            o->gelu_forward(A(FCH_GELU, l), A(FCH, l), 4 * sBTC, st);
        o->residual_backward(D(RES2, l), D(FCPROJ, l), D(RES3, l), sBTC, st);
        o->matmul_backward(D(FCH_GELU, l), G(FPW, l), G(FPB, l), D(FCPROJ, l), A(FCH_GELU, l),
                           W(FPW, l), BT, 4 * C, C, st);
        o->gelu_backward(D(FCH, l), A(FCH, l), D(FCH_GELU, l), 4 * sBTC, st);
        o->matmul_backward(D(LN2, l), G(FCW, l), G(FCB, l), D(FCH, l), A(LN2, l), W(FCW, l), BT, C,
                           4 * C, st);
        o->layernorm_backward(D(RES2, l), G(LN2W, l), G(LN2B, l), D(LN2, l), A(RES2, l), W(LN2W, l),
                              A(LN2_MEAN, l), A(LN2_RSTD, l), BT, C, st);
        o->residual_backward(dresidual, D(ATTPROJ, l), D(RES2, l), sBTC, st);
        o->matmul_backward(D(ATTY, l), G(APW, l), G(APB, l), D(ATTPROJ, l), A(ATTY, l), W(APW, l),
                           BT, C, C, st);
        if (act_recomputes(p, MODEL_RECOMPUTE_NORM)) /* what the forward wrote, again */
            o->layernorm_forward(A(LN1, l), A(LN1_MEAN, l), A(LN1_RSTD, l), residual, W(LN1W, l),
                                 W(LN1B, l), BT, C, st);
        o->attention_backward(dqkv, dqkv + C, dqkv + 2 * C, D(ATT, l), D(ATTY, l), qkv, qkv + C,
                              qkv + 2 * C, A(ATTY, l), A(ATT, l), &as, st);
        o->matmul_backward(D(LN1, l), G(QKVW, l), G(QKVB, l), dqkv, A(LN1, l), W(QKVW, l), BT, C,
                           3 * C, st);
        o->layernorm_backward(dresidual, G(LN1W, l), G(LN1B, l), D(LN1, l), residual, W(LN1W, l),
                              A(LN1_MEAN, l), A(LN1_RSTD, l), BT, C, st);
    }
    o->encoder_backward(G(WTE, 0), G(WPE, 0), D(ENCODED, 0), p->inputs, B, T, C, st);
#undef A
#undef W
#undef D
#undef G
}

/* GPT2Config's fields beside every config's own (hf_config.c). Dropout is
 * a training-time regulariser, not part of the model: Strait trains without
 * it, whatever a published GPT-2 sets (0.1). summary_* configure
 * GPT2DoubleHeadsModel's classifier, which a causal LM does not have. */
static const HfField GPT2_FIELDS[] = {
    {"n_layer", HF_USED},
    {"n_head", HF_USED},
    {"n_embd", HF_USED},
    {"n_positions", HF_USED},
    {"vocab_size", HF_USED},
    {"activation_function", HF_USED},
    {"layer_norm_epsilon", HF_USED},
    {"n_inner", HF_USED},
    {"n_ctx", HF_HARMLESS}, /* an old name transformers no longer reads */
    {"resid_pdrop", HF_HARMLESS},
    {"embd_pdrop", HF_HARMLESS},
    {"attn_pdrop", HF_HARMLESS},
    {"summary_type", HF_HARMLESS},
    {"summary_use_proj", HF_HARMLESS},
    {"summary_activation", HF_HARMLESS},
    {"summary_proj_to_labels", HF_HARMLESS},
    {"summary_first_dropout", HF_HARMLESS},
    {"add_cross_attention", HF_FALSE},
    {"scale_attn_weights", HF_TRUE},
    {"scale_attn_by_inverse_layer_idx", HF_FALSE},
    {"reorder_and_upcast_attn", HF_FALSE},
    {"tie_word_embeddings", HF_TRUE},
};

/* config.json as transformers' GPT2Config names it */
static int hf_config_read(json_t *j, ModelConfig *c, char *err) {
    if (hf_fields_check(j, GPT2_FIELDS, (int)(sizeof GPT2_FIELDS / sizeof GPT2_FIELDS[0]), NULL, 0,
                        err))
        return -1;
    json_int_t L = 0, H = 0, C = 0, T = 0, V = 0;
    const char *act = "gelu_new";
    if (json_unpack(j, "{s:I,s:I,s:I,s:I,s:I}", "n_layer", &L, "n_head", &H, "n_embd", &C,
                    "n_positions", &T, "vocab_size", &V) != 0)
        return err_set(err, "not a GPT-2 config (it needs n_layer, n_head, n_embd, n_positions "
                            "and vocab_size)");
    json_unpack(j, "{s?s}", "activation_function", &act);
    if (strcmp(act, "gelu_new") != 0 && strcmp(act, "gelu_pytorch_tanh") != 0)
        return err_set(err, "activation %s; Strait computes gelu_new (tanh)", act);
    if (L < 1 || L > 256 || H < 1 || H > 65536 || C < 1 || C > 65536 || T < 1 || T > (1 << 20) ||
        V < 2 || V > (1 << 22))
        return err_set(err,
                       "not a GPT-2 shape this strait builds: %lld layers, %lld channels, %lld "
                       "heads, context %lld, vocabulary %lld",
                       (long long)L, (long long)C, (long long)H, (long long)T, (long long)V);
    float eps;
    int inner;
    if (hf_num(j, "layer_norm_epsilon", 1e-5, &eps, err) ||
        hf_int(j, "n_inner", 4 * C, 1, 1 << 20, &inner, err))
        return -1;
    if (eps != 1e-5f)
        return err_set(err, "config.json's layer_norm_epsilon is %g; Strait's GPT-2 uses 1e-5",
                       eps);
    if (inner != 4 * C)
        return err_set(err, "config.json's n_inner is %d; Strait's GPT-2 MLP is 4 x n_embd (%lld)",
                       inner, (long long)(4 * C));
    c->L = (int)L, c->NH = (int)H, c->C = (int)C, c->T = (int)T, c->V = (int)V;
    return 0;
}

static json_t *hf_config_write(const ModelConfig *c) {
    return json_pack("{s:[s],s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:s,s:f,s:b,s:i,s:i,s:f,s:f,s:f}",
                     "architectures", "GPT2LMHeadModel", "model_type", "gpt2", "vocab_size", c->V,
                     "n_positions", c->T, "n_ctx", c->T, "n_embd", c->C, "n_layer", c->L, "n_head",
                     c->NH, "activation_function", "gelu_new", "layer_norm_epsilon", 1e-5,
                     "tie_word_embeddings", 1, "bos_token_id", c->V - 1, "eos_token_id", c->V - 1,
                     "resid_pdrop", 0.0, "embd_pdrop", 0.0, "attn_pdrop", 0.0);
}

/* everything but the shape follows from it */
static int check(ModelConfig *c, char *err) {
    if (c->C % c->NH != 0)
        return err_set(err, "%d channels do not divide into %d heads", c->C, c->NH);
    c->NKV = c->NH, c->HD = c->C / c->NH, c->F = 4 * c->C;
    c->tied = 1, c->qkv_bias = 0, c->eps = 1e-5f;
    memset(&c->rope, 0, sizeof c->rope);
    return 0;
}

/* name, L, C, NH, NKV, F, T, V, tied, qkv_bias, theta, eps, scaling */
static const ArchPreset PRESETS[] = {
    {"tiny", 2, 64, 2, 2, 256, 64, 256, 1, 0, 0, 1e-5f, {.factor = 0}},
    {"small", 4, 128, 4, 4, 512, 128, 256, 1, 0, 0, 1e-5f, {.factor = 0}},
    {"base", 6, 384, 6, 6, 1536, 256, 256, 1, 0, 0, 1e-5f, {.factor = 0}},
    {"gpt2-124m", 12, 768, 12, 12, 3072, 1024, 50257, 1, 0, 0, 1e-5f, {.factor = 0}},
    {"gpt2-large", 36, 1280, 20, 20, 5120, 1024, 50257, 1, 0, 0, 1e-5f, {.factor = 0}},
};

const Arch arch_gpt2 = {.name = "gpt2",
                        .hf_class = "GPT2LMHeadModel",
                        .hf_type = "gpt2",
                        .hf_prefix = "transformer.",
                        .tensors = TENSORS,
                        .n_tensors = sizeof TENSORS / sizeof TENSORS[0],
                        .embed_row = WTE,
                        .head_row = -1,
                        .layout = layout,
                        .forward = forward,
                        .backward = backward,
                        .hf_config_read = hf_config_read,
                        .hf_config_write = hf_config_write,
                        .check = check,
                        .shape_only = 1,
                        .presets = PRESETS,
                        .n_presets = sizeof PRESETS / sizeof PRESETS[0],
                        .gguf_arch = NULL};
