/*
 * finetune.c — `strait demo --finetune` (demo.h): a real fine-tune of a
 * pretrained model across sites that each hold one language's fortunes
 * (English, German, Spanish, Italian from Debian's packages), each
 * tokenized by the base's own tokenizer; then each site's held-out loss
 * before and after, what a round moved, the adapters out for PEFT and
 * merged into a GGUF llama.cpp loads, a sample from the base and
 * from the merged model, and with --baseline the same federation training
 * every parameter and one centralized LoRA run at equal tokens.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "demo.h"
#include "coordinator/coordinator.h"
#include "kernels/device.h"
#include "kernels/formats.h"
#include "kernels/gguf.h"
#include "kernels/train.h"
#include "util/util.h"

/* Each site's language: what it trains on and a collection of the same
 * language no site trains on, its held-out text. */
typedef struct Language {
    const char *name, *train[4], *held_out;
} Language;

static const Language LANGS[DEMO_FINETUNE_SITES] = {
    {"English", {"fortunes", "literature", "wisdom", "science"}, "platitudes"},
    {"German", {"de/sprueche", "de/anekdoten", "de/letzteworte", "de/regeln"}, "de/stilblueten"},
    {"Spanish",
     {"es/sabiduria.fortunes", "es/vida.fortunes", "es/humanos.fortunes"},
     "es/proverbios.fortunes"},
    {"Italian", {"it/leggi", "it/luke", "it/formiche"}, "it/definizioni"},
};

#define HELD_OUT_BATCHES 8
#define SAMPLE_PROMPT    "Ein altes Sprichwort sagt:"

int demo_finetune_check(const DemoOptions *o, char *err) {
    if (o->sites < 1 || o->sites > DEMO_FINETUNE_SITES)
        return err_set(err, "--finetune takes 1 to %d sites, one per language",
                       DEMO_FINETUNE_SITES);
    if (access(o->base, R_OK) != 0)
        return err_set_errno(err,
                             "cannot read the base %s (make models fetches SmolLM2-135M-Instruct; "
                             "or give --base GGUF|HF-FOLDER)",
                             o->base);
    if (o->lora.rank == 0)
        return err_set(err, "--finetune trains adapters: give --lora-rank (default 8)");
    for (int i = 0; i < o->sites; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", DEMO_FORTUNES, LANGS[i].held_out);
        if (access(path, R_OK) != 0)
            return err_set(err, "no %s in %s; run 'make deps' (packages fortunes-de, -es, -it)",
                           LANGS[i].held_out, DEMO_FORTUNES);
    }
    return 0;
}

void demo_finetune_site(const char *data, int i, char *path, size_t len, const char **lang) {
    snprintf(path, len, "%s/site-%d", data, i + 1);
    *lang = LANGS[i].name;
}

/* `strait tokenize --tokenizer BASE --out OUT FILES...`, its log beside */
static int tokenize(const DemoOptions *o, const char *out, const char *const *names, int n,
                    char *err) {
    char paths[4][512], log[600];
    char *argv[16] = {(char *)o->exe,  "tokenize", "--tokenizer",
                      (char *)o->base, "--out",    (char *)out};
    int a = 6;
    for (int k = 0; k < n && k < 4; k++) {
        snprintf(paths[k], sizeof paths[k], "%s/%s", DEMO_FORTUNES, names[k]);
        argv[a++] = paths[k];
    }
    argv[a] = NULL;
    snprintf(log, sizeof log, "%s.log", out);
    int pid = proc_start(argv, &(ProcIo){.log = log});
    if (pid < 0 || proc_wait(pid) != 0)
        return err_set(err, "cannot tokenize %s with %s's tokenizer; see %s", names[0], o->base,
                       log);
    return 0;
}

int demo_finetune_data(const DemoOptions *o, FILE *out, char *err) {
    char path[600];
    if (file_mkdir_p(o->data, 0700, err) != 0) return -1;
    fprintf(out, "tokenizing each site's collections with %s's tokenizer...\n", o->base);
    fflush(out);
    for (int i = 0; i < o->sites; i++) {
        const Language *l = &LANGS[i];
        int n = 0;
        while (n < 4 && l->train[n]) n++;
        snprintf(path, sizeof path, "%s/site-%d", o->data, i + 1);
        if (tokenize(o, path, l->train, n, err) != 0) return -1;
        snprintf(path, sizeof path, "%s/site-%d-held-out", o->data, i + 1);
        if (tokenize(o, path, &l->held_out, 1, err) != 0) return -1;
    }
    return 0;
}

/* The mean loss of a checkpoint (over the base when it holds adapters)
 * on site i's held-out text. */
static int held_out(const DemoOptions *o, const char *ckpt, int i, double *loss, char *err) {
    char shard[700];
    snprintf(shard, sizeof shard, "%s/site-%d-held-out/tokens_000000.bin", o->data, i + 1);
    Model m;
    ModelConfig cfg;
    if (model_read_config(ckpt, &cfg, NULL, err) != 0 ||
        model_load_checkpoint(&m, &cfg, ckpt, cfg.lora.rank ? o->base : NULL, err) != 0)
        return -1;
    TokenSet ts;
    const char *paths[1] = {shard};
    if (tokens_load(&ts, paths, 1, err) != 0) {
        model_free(&m);
        return -1;
    }
    kernels_set_threads(0);
    TokenView v = {ts.tokens, ts.n};
    *loss = model_eval_tokens(&m, v, DEMO_FINETUNE_BATCH, DEMO_FINETUNE_SEQ, HELD_OUT_BATCHES);
    tokens_free(&ts);
    model_free(&m);
    return isnan(*loss) ? err_set(err, "%s holds too few tokens for one batch", shard) : 0;
}

/* Runs this program with argv[1..], its output to log; 0 when it ended well. */
static int run_strait(char *const argv[], const char *log, char *err) {
    int pid = proc_start(argv, &(ProcIo){.log = log});
    if (pid < 0 || proc_wait(pid) != 0)
        return err_set(err, "strait %s %s failed; see %s", argv[1], argv[2], log);
    return 0;
}

/* A sample's log, line by line: the prompt and its continuation, at
 * temperature 0.7 from a fixed seed (greedy, a model of fortunes repeats
 * their "%" separator). */
static void sample(const DemoOptions *o, const char *model, const char *log, FILE *out) {
    char *argv[] = {(char *)o->exe, "sample",   (char *)model, "--prompt",
                    SAMPLE_PROMPT,  "--tokens", "40",          "--temperature",
                    "0.7",          "--seed",   "1",           NULL};
    char err[ERR_LEN], line[2048];
    if (run_strait(argv, log, err) != 0) {
        fprintf(out, "    (%s)\n", err);
        return;
    }
    FILE *f = fopen(log, "r");
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (line[strspn(line, " ")]) fprintf(out, "    %s\n", line);
    }
    if (f) fclose(f);
}

/* Every site's training tokens as one stream that takes each site in
 * turn, a sequence's worth at a time (a site that runs out starts again),
 * the longest's whole sequences times the sites: DATA/central, what
 * a centralized run reads, so its batches mix the sites' languages as the
 * federation's rounds do instead of reading one language after another. */
static int interleave(const DemoOptions *o, int sites, char *dir, size_t len, char *err) {
    TokenSet ts[DEMO_FINETUNE_SITES];
    char paths[DEMO_FINETUNE_SITES][700], path[800];
    size_t longest = 0, span = DEMO_FINETUNE_SEQ;
    int n = 0, rc = 0; /* n: loaded */
    while (n < sites && rc == 0) {
        snprintf(paths[n], sizeof paths[n], "%s/site-%d/tokens_000000.bin", o->data, n + 1);
        const char *p = paths[n];
        if ((rc = tokens_load(&ts[n], &p, 1, err)) != 0) break;
        n++;
        if (ts[n - 1].n < span)
            rc = err_set(err, "%s holds fewer tokens than a sequence", paths[n - 1]);
        else if (ts[n - 1].n > longest)
            longest = ts[n - 1].n;
    }
    size_t total = rc == 0 ? longest / span * span * (size_t)sites : 0, at = 0;
    uint32_t *all = rc == 0 ? mallocCheck(total * sizeof(uint32_t)) : NULL;
    for (size_t k = 0; rc == 0 && at < total; k++)
        for (int i = 0; i < sites; i++, at += span) {
            size_t blocks = ts[i].n / span, b = k % blocks;
            memcpy(all + at, ts[i].tokens + b * span, span * sizeof(uint32_t));
        }
    snprintf(dir, len, "%s/central", o->data);
    snprintf(path, sizeof path, "%s/tokens_000000.bin", dir);
    if (rc == 0 &&
        (file_mkdir_p(dir, 0700, err) != 0 || tokens_write_bin(path, all, total, err) != 0))
        rc = -1;
    free(all);
    for (int i = 0; i < n; i++) tokens_free(&ts[i]);
    return rc;
}

/* One centralized LoRA run on every site's text (interleaved) at the
 * federation's tokens (sites x rounds x steps batches), A and B both
 * training as PEFT trains them, through `strait train` on all this
 * machine's cores. */
static int centralized(const DemoOptions *o, const DemoRun *d, const char *ckpt, char *err) {
    char steps[16], rank[16], alpha[32], lr[32], batch[16], seq[16], log[700], data[600];
    char dropout[32];
    if (interleave(o, d->sites, data, sizeof data, err) != 0) return -1;
    snprintf(steps, sizeof steps, "%d", d->sites * d->rounds * d->steps);
    snprintf(rank, sizeof rank, "%d", o->lora.rank);
    snprintf(alpha, sizeof alpha, "%g", (double)o->lora.alpha);
    snprintf(lr, sizeof lr, "%g", o->lr > 0 ? (double)o->lr : 3e-3);
    snprintf(batch, sizeof batch, "%d", DEMO_FINETUNE_BATCH);
    snprintf(seq, sizeof seq, "%d", DEMO_FINETUNE_SEQ);
    snprintf(log, sizeof log, "%s/centralized.log", d->dir);
    char *argv[40] = {(char *)o->exe, "train", "--init-from",  (char *)o->base,
                      "--lora-rank",  rank,    "--lora-alpha", alpha,
                      "--lora-rule",  "fedit", "--steps",      steps,
                      "--batch",      batch,   "--seq",        seq,
                      "--lr",         lr,      "--out",        (char *)ckpt};
    int a = 20;
    argv[a++] = "--lora-base-dtype", argv[a++] = o->lora.base_bf16 ? "bf16" : "f32";
    snprintf(dropout, sizeof dropout, "%g", (double)o->lora.dropout);
    argv[a++] = "--lora-dropout", argv[a++] = dropout;
    char targets[128];
    model_lora_targets_names(o->lora.targets, targets, sizeof targets);
    argv[a++] = "--lora-targets", argv[a++] = targets;
    argv[a++] = "--data", argv[a++] = data;
    argv[a] = NULL;
    return run_strait(argv, log, err);
}

int demo_finetune_score(const DemoOptions *o, const DemoRun *d, const StoreTotals *tot,
                        const DemoRun *full, const StoreTotals *full_tot, FILE *out, char *err) {
    char ckpt[800], full_ckpt[800], central[700], path[800];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/round-%06d.safetensors", d->fed, d->rounds - 1);
    if (full)
        snprintf(full_ckpt, sizeof full_ckpt, "%s/checkpoints/round-%06d.safetensors", full->fed,
                 full->rounds - 1);
    snprintf(central, sizeof central, "%s/centralized.safetensors", d->dir);
    if (full) {
        fprintf(out,
                "\nbaseline: one centralized LoRA run on all the sites' text at equal tokens "
                "(%d steps)...\n",
                d->sites * d->rounds * d->steps);
        fflush(out);
        if (centralized(o, d, central, err) != 0) return -1;
    }
    ModelConfig cfg;
    if (model_read_config(ckpt, &cfg, NULL, err) != 0) return -1;
    /* before: the federation's round 0 start, the base under adapters that
     * add nothing yet, computed as the rounds computed it */
    char initial[800];
    snprintf(initial, sizeof initial, "%s/%s", d->fed, COORD_INIT_MODEL);
    ModelConfig whole = cfg;
    memset(&whole.lora, 0, sizeof whole.lora);
    double adapters = model_adapter_trained(&cfg); /* what trains and travels */
    json_t *o_json = json_object(), *sites = json_array();
    double sum[4] = {0, 0, 0, 0};
    fprintf(out, "\nheld-out loss at each site (nats/token, a collection of its language no site "
                 "trained on):\n");
    fprintf(out, "  site    language   before    after%s\n",
            full ? "   full fine-tune  centralized LoRA" : "");
    int rc = 0;
    for (int i = 0; i < d->sites && rc == 0; i++) {
        double before, after, f = NAN, c = NAN;
        rc = held_out(o, initial, i, &before, err);
        if (rc == 0) rc = held_out(o, ckpt, i, &after, err);
        if (rc == 0 && full) rc = held_out(o, full_ckpt, i, &f, err);
        if (rc == 0 && full) rc = held_out(o, central, i, &c, err);
        if (rc != 0) break;
        fprintf(out, "  site-%d  %-9s  %6.4f   %6.4f", i + 1, LANGS[i].name, before, after);
        if (full) fprintf(out, "   %14.4f  %16.4f", f, c);
        fprintf(out, "\n");
        fflush(out);
        sum[0] += before, sum[1] += after, sum[2] += f, sum[3] += c;
        json_t *s = json_object();
        json_object_set_new(s, "language", json_string(LANGS[i].name));
        json_object_set_new(s, "held_out_before", json_real(before));
        json_object_set_new(s, "held_out_after", json_real(after));
        if (full) {
            json_object_set_new(s, "held_out_full", json_real(f));
            json_object_set_new(s, "held_out_centralized", json_real(c));
        }
        json_array_append_new(sites, s);
    }
    if (rc != 0) {
        json_decref(sites), json_decref(o_json);
        return -1;
    }
    int n = d->sites;
    fprintf(out, "  mean              %6.4f   %6.4f", sum[0] / n, sum[1] / n);
    if (full)
        fprintf(out,
                "   %14.4f  %16.4f\n  federated LoRA / full fine-tune %.3f, / centralized "
                "LoRA %.3f\n",
                sum[2] / n, sum[3] / n, sum[1] / sum[2], sum[1] / sum[3]);
    else
        fprintf(out, "\n");
    /* a round's bytes, per site, both ways, against the adapters' own size */
    double per = (double)d->rounds * d->sites;
    fprintf(out,
            "bytes a round, per site: %.3f MB up and %.3f MB down (the adapters: %.0f values, "
            "%.3f MB in fp32; the whole model's: %.1f MB)\n",
            tot->bytes_up / per / 1e6, tot->bytes_down / per / 1e6, adapters, adapters * 4 / 1e6,
            model_config_params(&whole) * 4 / 1e6);
    if (full)
        fprintf(out,
                "training every parameter moved %.3f MB up and %.3f MB down a round per site\n",
                full_tot->bytes_up / per / 1e6, full_tot->bytes_down / per / 1e6);
    json_object_set_new(o_json, "base", json_string(o->base));
    json_object_set_new(o_json, "sites", json_integer(d->sites));
    json_object_set_new(o_json, "rounds", json_integer(d->rounds));
    json_object_set_new(o_json, "inner_steps", json_integer(d->steps));
    json_object_set_new(o_json, "rank", json_integer(o->lora.rank));
    json_object_set_new(o_json, "adapter_values", json_integer((json_int_t)adapters));
    if (full) {
        json_object_set_new(o_json, "full_bytes_up", json_integer(full_tot->bytes_up));
        json_object_set_new(o_json, "full_bytes_down", json_integer(full_tot->bytes_down));
    }
    json_object_set_new(o_json, "bytes_up", json_integer(tot->bytes_up));
    json_object_set_new(o_json, "bytes_down", json_integer(tot->bytes_down));
    json_object_set_new(o_json, "wall_s", json_real(d->fed_ms / 1000.0));
    json_object_set_new(o_json, "sites_held_out", sites);
    /* out: PEFT's adapter folder, and the base with them merged as a GGUF */
    char peft[700], merged[700], log[700];
    snprintf(peft, sizeof peft, "%s/peft", d->dir);
    snprintf(merged, sizeof merged, "%s/merged.gguf", d->dir);
    snprintf(log, sizeof log, "%s/export.log", d->dir);
    char *pargv[] = {(char *)o->exe, "export",        ckpt, "--format", "peft",
                     "--base",       (char *)o->base, peft, NULL};
    char *gargv[] = {(char *)o->exe, "export",        ckpt,     "--format",
                     "gguf",         "--merge",       "--base", (char *)o->base,
                     "--tokenizer",  (char *)o->base, merged,   NULL};
    if (run_strait(pargv, log, err) != 0 || run_strait(gargv, log, err) != 0) {
        json_decref(o_json);
        return -1;
    }
    fprintf(out, "the adapters for PEFT: %s (PeftModel.from_pretrained over the base)\n", peft);
    fprintf(out, "the base with them merged, for llama.cpp: %s\n", merged);
    fprintf(out, "\na sample from the base (temperature 0.7, seed 1):\n");
    snprintf(log, sizeof log, "%s/sample-base.log", d->dir);
    sample(o, o->base, log, out);
    fprintf(out, "and from the merged model:\n");
    snprintf(log, sizeof log, "%s/sample-merged.log", d->dir);
    sample(o, merged, log, out);
    snprintf(path, sizeof path, "%s/summary.json", d->dir);
    char *text = json_dumps(o_json, JSON_COMPACT);
    json_decref(o_json);
    rc = text == NULL ? err_set(err, "cannot format the summary")
                      : file_write_atomic(path, text, strlen(text), 0644, err);
    free(text);
    return rc;
}
