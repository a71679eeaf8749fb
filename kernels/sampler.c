/*
 * sampler.c — the next token from logits, and a prompt continued by a
 * model (sampler.h).
 */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

void sampler_init(Sampler *s, uint64_t seed, float temperature) {
    s->state = seed * 0x9E3779B97F4A7C15ull + 1;
    s->temperature = temperature;
}

int sampler_next(Sampler *s, const float *logits, int usable) {
    int next = 0;
    if (s->temperature == 0) {
        for (int v = 1; v < usable; v++) next = logits[v] > logits[next] ? v : next;
        return next;
    }
    float mx = logits[0];
    for (int v = 1; v < usable; v++) mx = logits[v] > mx ? logits[v] : mx;
    double sum = 0;
    for (int v = 0; v < usable; v++) sum += exp((logits[v] - mx) / s->temperature);
    s->state ^= s->state << 13, s->state ^= s->state >> 7, s->state ^= s->state << 17;
    double u = (double)(s->state >> 11) / 9007199254740992.0 * sum, acc = 0;
    for (next = 0; next < usable - 1; next++) {
        acc += exp((logits[next] - mx) / s->temperature);
        if (acc > u) break;
    }
    return next;
}

void model_sample_text(Model *m, Tokenizer *tok, const char *prompt, int n, float temperature,
                       uint64_t seed, FILE *out) {
    const ModelConfig cfg = m->cfg;
    size_t plen = strlen(prompt);
    TokenBuf ctx = {0};
    char err[ERR_LEN];
    if (tok != NULL) {
        if (plen == 0 && tokenizer_eot(tok) >= 0) token_buf_push(&ctx, tokenizer_eot(tok));
        tokenizer_encode(tok, prompt, plen, &ctx, err);
    } else {
        for (size_t i = 0; i < plen; i++) token_buf_push(&ctx, (uint8_t)prompt[i]);
    }
    if (ctx.n == 0)
        token_buf_push(&ctx, tok ? tokenizer_eot(tok) < 0 ? 0 : tokenizer_eot(tok) : '\n');
    int *ids = mallocCheck(sizeof(int) * (ctx.n + (size_t)n));
    int len = 0;
    for (size_t i = 0; i < ctx.n; i++) ids[len++] = ctx.ids[i];
    token_buf_free(&ctx);
    float *logits = mallocCheck(sizeof(float) * (size_t)cfg.V);
    int usable = tok ? tokenizer_vocab_size(tok) : 256;
    if (usable > cfg.V) usable = cfg.V;
    Sampler s;
    sampler_init(&s, seed, temperature);
    fputs(prompt, out);
    for (int k = 0; k < n; k++) {
        model_next_logits(m, ids, len, logits);
        int next = sampler_next(&s, logits, usable);
        ids[len++] = next;
        if (tok != NULL) {
            size_t bl;
            const uint8_t *bytes = tokenizer_decode(tok, next, &bl);
            if (bytes) fwrite(bytes, 1, bl, out);
        } else {
            fputc(next, out);
        }
    }
    fputc('\n', out);
    free(ids), free(logits);
}
