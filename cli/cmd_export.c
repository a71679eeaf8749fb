/*
 * cmd_export.c — `strait export CKPT --format hf|gguf|llmc|peft OUT`: a
 * Strait checkpoint (a federation's round, or `strait train --out`) in
 * Hugging Face's, llama.cpp's or llm.c's format (kernels/hf.c,
 * kernels/gguf.h, kernels/formats.c). A checkpoint of LoRA adapters goes
 * out as PEFT's adapter folder (kernels/peft.c), or merged into its base
 * (--merge, with --base: the base it was trained over, checked by its
 * fingerprint) as Hugging Face's folder or a GGUF. A federation's round is held against retention
 * while it is read; a pruned one gets a clear error. Hugging Face's folder and a GGUF take their
 * tokenizer from --tokenizer (a Hugging Face folder or a GGUF file), else, for a federation's
 * round, from where the federation's model came from (federation.ini's [model] source).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "coordinator/store.h"
#include "kernels/model.h"
#include "kernels/formats.h"
#include "kernels/gguf.h"
#include "kernels/tokenizer.h"
#include "util/util.h"

/* A federation's round checkpoint (HOME/checkpoints/round-N.*, beside
 * HOME/strait.db) is held against the coordinator's retention while it is
 * read (store_hold: *fd, -1 for any other file); a round retention pruned
 * is refused, saying which rounds are kept. A hold that cannot be taken
 * (a store this binary cannot open, a folder it may not write) is said in
 * one line and the file read as it is: the export worked without it. */
static int hold_round(const char *ckpt, int *fd, char home[4096], char *err) {
    *fd = -1;
    home[0] = '\0';
    const char *base = strrchr(ckpt, '/');
    size_t dir = base ? (size_t)(base - ckpt) : 0, n = strlen(STORE_CHECKPOINT_DIR);
    if (base == NULL || dir < n || strncmp(base - n, STORE_CHECKPOINT_DIR, n) != 0 ||
        (dir > n && base[-(long)n - 1] != '/'))
        return 0; /* not in a federation's checkpoints folder */
    char db[4200];
    if (dir == n)
        snprintf(home, 4096, ".");
    else
        snprintf(home, 4096, "%.*s", (int)(dir - n - 1), ckpt);
    snprintf(db, sizeof db, "%s/%s", home, STORE_DB_FILE);
    if (access(db, F_OK) != 0) {
        home[0] = '\0';
        return 0;
    }
    Store *s = store_open(db, STORE_READONLY, err);
    int64_t round;
    int rc = s ? store_hold(s, home, ckpt, fd, &round, err) : -1;
    if (s) store_close(s);
    if (rc == STORE_PRUNED) return -1;
    if (rc < 0)
        fprintf(stderr,
                "strait export: reading %s unheld, so a running coordinator's retention "
                "may remove it meanwhile: %s\n",
                ckpt, err);
    return 0;
}

/* "5GB", "500MB", "2GiB" (transformers' units: GB is 10^9) or bytes */
static int shard_size(const char *s, size_t *out) {
    static const struct {
        const char *unit;
        double bytes;
    } units[] = {{"", 1},     {"B", 1},        {"KB", 1e3},        {"MB", 1e6},
                 {"GB", 1e9}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno != 0 || !(v > 0)) return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(end, units[i].unit) == 0 && v * units[i].bytes >= 1 &&
            v * units[i].bytes < 1e15) {
            *out = (size_t)(v * units[i].bytes);
            return 0;
        }
    return -1;
}

/* a folder with a Hugging Face tokenizer's files */
static int tokenizer_folder(const char *dir) {
    static const char *const files[] = {"tokenizer.json", "vocab.json", "tokenizer.model"};
    struct stat st;
    if (dir == NULL || stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return 0;
    char path[4200];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        if (access(path, R_OK) == 0) return 1;
    }
    return 0;
}

/* A federation's [model] source (HOME/federation.ini) when it is a
 * tokenizer folder or a GGUF file, into out; 0 if none. */
static int federation_tokenizer(const char *home, char *out, size_t len) {
    char path[4200], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/federation.ini", home);
    Config *c = home[0] ? config_load(path, err) : NULL;
    const char *src = c ? config_get(c, "model", "source") : NULL;
    int ok = src && (tokenizer_folder(src) || gguf_path_is(src));
    if (ok) snprintf(out, len, "%s", src);
    config_free(c);
    return ok;
}

/* The tokenizer of src as lists: a GGUF's own keys, or a Hugging Face
 * folder's tokenizer converted; 1 with lists, 0 when src is NULL, -1 with
 * err. */
static int tokenizer_lists_of(const char *src, TokenizerLists *tl, char *err) {
    if (src == NULL) return 0;
    if (gguf_path_is(src)) {
        Gguf *g = gguf_open(src, err);
        int rc = g ? gguf_tokenizer_lists(g, tl, err) : -1;
        gguf_close(g);
        return rc == 0 ? 1 : -1;
    }
    Tokenizer *t = tokenizer_load_dir(src, err);
    char why[ERR_LEN];
    int rc = t ? tokenizer_to_lists(t, tl, why) : -1;
    if (t && rc != 0) err_set(err, "%s: %s", src, why);
    tokenizer_free(t);
    return rc == 0 ? 1 : -1;
}

/* The lists padded to the model's vocabulary with unused tokens, as
 * llama.cpp's converter pads a vocabulary smaller than its embedding
 * (Qwen2.5: 151,665 tokens, 151,936 rows); more tokens than rows is not
 * this model's tokenizer. */
static int lists_fit(TokenizerLists *tl, int V, const char *src, char *err) {
    if (tl->n_tokens > V)
        return err_set(err, "%s's tokenizer has %d tokens, the model %d: not its tokenizer", src,
                       tl->n_tokens, V);
    if (tl->n_tokens == V) return 0;
    char **tokens = realloc(tl->tokens, sizeof *tokens * (size_t)V);
    if (tokens) tl->tokens = tokens;
    int32_t *types = tokens && tl->types ? realloc(tl->types, sizeof *types * (size_t)V) : NULL;
    if (types) tl->types = types;
    if (tokens == NULL || (tl->types && types == NULL)) return err_set(err, "out of memory");
    for (int i = tl->n_tokens; i < V; i++) {
        char name[32];
        snprintf(name, sizeof name, "[PAD%d]", i);
        if ((tl->tokens[i] = strdup(name)) == NULL) return err_set(err, "out of memory");
        if (tl->types) tl->types[i] = 5; /* unused */
        tl->n_tokens = i + 1;
    }
    return 0;
}

/* --format gguf, in dtype (f32 by default: the model of record, exact),
 * with the tokenizer of tok_src (NULL: none; a GGUF's tokenizer.* keys
 * copied verbatim) */
static int export_gguf(const Model *m, const char *out, int dtype, const char *tok_src, char *err) {
    TokenizerLists tl;
    int have = tokenizer_lists_of(tok_src, &tl, err);
    if (have < 0) return -1;
    /* a GGUF's own keys verbatim when its list is the model's; else the
     * lists (a folder's converted, or padded to the model's rows) */
    int n0 = have ? tl.n_tokens : 0, verbatim = have && n0 == m->cfg.V && gguf_path_is(tok_src);
    int rc = have ? lists_fit(&tl, m->cfg.V, tok_src, err) : 0;
    Gguf *src = rc == 0 && verbatim ? gguf_open(tok_src, err) : NULL;
    if (rc == 0 && verbatim && src == NULL) rc = -1;
    if (rc == 0) rc = model_export_gguf(m, out, dtype, have ? &tl : NULL, src, err);
    gguf_close(src);
    if (have) tokenizer_lists_free(&tl);
    return rc;
}

/* Whether the tokenizer of src serves a model of V tokens in this format:
 * 0, or -1 with err (what export would fail on, found before it writes). */
static int tokenizer_fits(const char *src, int V, char *err) {
    TokenizerLists tl;
    int have = tokenizer_lists_of(src, &tl, err);
    if (have <= 0) return have;
    int rc = tl.n_tokens > V ? err_set(err,
                                       "%s's tokenizer has %d tokens, the model %d: not its "
                                       "tokenizer",
                                       src, tl.n_tokens, V)
                             : 0;
    tokenizer_lists_free(&tl);
    return rc;
}

/* --format hf with the tokenizer of a GGUF file: the model's folder, then
 * the tokenizer's files written from the GGUF's lists, its bos, eos and
 * pad ids in config.json and generation_config.json */
static int export_hf_from_gguf(const Model *m, const char *out, HfExport *hf, const char *gguf,
                               char *err) {
    TokenizerLists tl;
    if (tokenizer_lists_of(gguf, &tl, err) < 0) return -1;
    char why[ERR_LEN];
    Tokenizer *t = tokenizer_from_lists(&tl, why);
    hf->bos = tl.bos, hf->eos = tl.eos, hf->pad = tl.pad;
    tokenizer_lists_free(&tl);
    if (t == NULL) return err_set(err, "%s: %s", gguf, why);
    hf->tokenizer_dir = NULL;
    int rc = model_export_hf(m, out, hf, err) == 0 && tokenizer_save_hf(t, out, err) == 0 ? 0 : -1;
    tokenizer_free(t);
    return rc;
}

/* What a checkpoint of adapters (cfg's lora rank) needs, and what one
 * without them cannot take: 0, or -1 with err saying what to give. */
static int adapters_fit(const ModelConfig *cfg, const char *ckpt, int is_peft, int merge,
                        const char *base, char *err) {
    if (cfg->lora.rank == 0) {
        if (is_peft || merge || base)
            return err_set(err,
                           "%s holds a whole model, not LoRA adapters: --format peft, --merge "
                           "and --base are for a checkpoint of adapters",
                           ckpt);
        return 0;
    }
    if (!is_peft && !merge)
        return err_set(err,
                       "%s holds LoRA adapters: give --format peft for the adapters, or --merge "
                       "--base PATH for the base with them merged",
                       ckpt);
    if (merge && base == NULL && cfg->lora.base_seed < 0)
        return err_set(err,
                       "%s holds LoRA adapters over a pretrained base: --merge needs it: give "
                       "--base PATH (the GGUF file or Hugging Face folder they were trained over)",
                       ckpt);
    return 0;
}

int cmd_export(const Command *cmd, int argc, char **argv) {
    static const struct option opts[] = {{"format", required_argument, NULL, 'f'},
                                         {"dtype", required_argument, NULL, 'd'},
                                         {"max-shard-size", required_argument, NULL, 's'},
                                         {"tokenizer", required_argument, NULL, 't'},
                                         {"merge", no_argument, NULL, 'm'},
                                         {"base", required_argument, NULL, 'b'},
                                         {NULL, 0, NULL, 0}};
    const char *format = NULL, *dtype = NULL, *tok = NULL, *base = NULL;
    HfExport hf = HF_EXPORT_DEFAULTS;
    int c, shard_flag = 0, merge = 0;
    optind = 1;
    while ((c = cli_getopt(cmd, argc, argv, "", opts)) != -1) {
        if (c == -2) return EXIT_USAGE;
        if (c == 'f') format = optarg;
        if (c == 'd') dtype = optarg;
        if (c == 's' && (shard_flag = 1, shard_size(optarg, &hf.max_shard) != 0))
            return cli_usage_error(cmd,
                                   "--max-shard-size %s: give bytes, or a size such as 5GB, "
                                   "500MB, 2GiB",
                                   optarg);
        if (c == 't') tok = optarg;
        if (c == 'm') merge = 1;
        if (c == 'b') base = optarg;
    }
    int is_hf = format && strcmp(format, "hf") == 0, is_gguf = format && !strcmp(format, "gguf");
    int is_peft = format && strcmp(format, "peft") == 0;
    if (format == NULL || (!is_hf && !is_gguf && !is_peft && strcmp(format, "llmc") != 0))
        return cli_usage_error(cmd, "give --format hf or peft (a folder), gguf or llmc (a file)");
    if (!is_hf && shard_flag) return cli_usage_error(cmd, "--max-shard-size is --format hf's");
    if (!is_hf && !is_gguf && (dtype || tok))
        return cli_usage_error(cmd, "--dtype and --tokenizer are --format hf's and gguf's");
    if (merge && !is_hf && !is_gguf)
        return cli_usage_error(cmd, "--merge is --format hf's and gguf's (the merged model)");
    int no_tok = tok && strcmp(tok, "none") == 0;
    if (no_tok) tok = NULL;
    int gguf_type = -1;
    if (is_gguf && (gguf_type = gguf_dtype_of(dtype ? dtype : "f32")) < 0)
        return cli_usage_error(cmd, "--dtype %s: give f32, f16, bf16 or q8_0", dtype);
    if (is_hf && dtype) {
        if (strcmp(dtype, "f32") == 0)
            hf.dtype = HF_F32;
        else if (strcmp(dtype, "bf16") == 0)
            hf.dtype = HF_BF16;
        else if (strcmp(dtype, "f16") == 0)
            hf.dtype = HF_F16;
        else
            return cli_usage_error(cmd, "--dtype %s: give f32, bf16 or f16", dtype);
    }
    if (optind != argc - 2) return cli_usage_error(cmd, "expected CKPT and OUT");
    const char *ckpt = argv[optind], *out = argv[optind + 1];
    char err[ERR_LEN], home[4096], source[4096];
    ModelConfig cfg;
    Model m;
    memset(&m, 0, sizeof m);
    int held;
    if (hold_round(ckpt, &held, home, err) != 0) return cli_fail(cmd, "%s", err);
    int auto_tok = tok == NULL && !no_tok && (is_hf || is_gguf) &&
                   federation_tokenizer(home, source, sizeof source);
    if (auto_tok) tok = source;
    /* a GGUF file or a Hugging Face folder: converted whole, its tokenizer its own */
    struct stat st;
    int foreign = cli_gguf_file(ckpt) || (stat(ckpt, &st) == 0 && S_ISDIR(st.st_mode));
    if (foreign && (is_peft || merge || base)) {
        if (held >= 0) close(held);
        return cli_usage_error(cmd,
                               "%s is a whole model, without adapters: --format peft, "
                               "--merge and --base take a checkpoint of adapters",
                               ckpt);
    }
    if (foreign && !auto_tok && tok == NULL && !no_tok && (is_hf || is_gguf)) tok = ckpt;
    int bad;
    if (foreign) {
        bad = model_import(&m, ckpt, err) != 0;
        cfg = m.cfg;
    } else {
        bad =
            model_read_config(ckpt, &cfg, NULL, err) != 0 ||
            adapters_fit(&cfg, ckpt, is_peft, merge, base, err) != 0 ||
            (base ? model_import_base(&m, &cfg, base, err) : model_build(&m, &cfg, 0, err)) != 0 ||
            model_load(&m, ckpt, NULL, err) != 0;
    }
    if (bad) {
        model_free(&m);
        if (held >= 0) close(held);
        return cli_fail(cmd, "%s", err);
    }
    if (merge && base == NULL && model_base_fingerprint(&m) != cfg.lora.base) {
        model_free(&m);
        if (held >= 0) close(held);
        return cli_fail(cmd,
                        "%s: the base drawn from seed %lld is not the one the adapters were "
                        "trained over (its fingerprint differs): give --base PATH",
                        ckpt, (long long)cfg.lora.base_seed);
    }
    if (merge) { /* the base with the adapters merged: a plain model */
        Model merged;
        int rc = model_merge_adapters(&m, &merged, err);
        model_free(&m);
        if (rc != 0) {
            if (held >= 0) close(held);
            return cli_fail(cmd, "%s", err);
        }
        m = merged;
    }
    int tok_gguf = tok && gguf_path_is(tok);
    /* a tokenizer that has to be converted is tried before anything is
     * written: given, its failure is the export's; taken from the
     * federation's source, the model goes out without it, said in one line */
    char why[ERR_LEN];
    if (tok && (is_gguf || tok_gguf) && tokenizer_fits(tok, m.cfg.V, why) != 0) {
        if (!auto_tok) {
            if (held >= 0) close(held);
            model_free(&m);
            return cli_fail(cmd, "%s", why);
        }
        fprintf(stderr, "strait export: without the federation's tokenizer: %s\n", why);
        tok = NULL, tok_gguf = 0;
    }
    if (is_hf && !tok_gguf) hf.tokenizer_dir = tok;
    if (held >= 0) close(held); /* read whole: retention may have it */
    int rc = is_peft             ? model_export_peft(&m, out, base, err)
             : is_hf && tok_gguf ? export_hf_from_gguf(&m, out, &hf, tok, err)
             : is_hf             ? model_export_hf(&m, out, &hf, err)
             : is_gguf           ? export_gguf(&m, out, gguf_type, tok, err)
                                 : model_export_llmc(&m, out, err);
    int arch = m.cfg.arch, rank = m.cfg.lora.rank;
    float alpha = m.cfg.lora.alpha;
    model_free(&m);
    if (rc != 0) return cli_fail(cmd, "%s", err);
    if (merge && base) printf("the adapters merged into the base %s\n", base);
    if (merge && !base)
        printf("the adapters merged into the base drawn from seed %lld\n",
               (long long)cfg.lora.base_seed);
    if (is_peft) {
        printf("exported %s to %s (PEFT's LoRA adapter, r %d, lora_alpha %g: "
               "PeftModel.from_pretrained reads it over the base)\n",
               ckpt, out, rank, (double)alpha);
    } else if (is_gguf) {
        printf("exported %s to %s (GGUF, %s, %s: llama.cpp loads it)\n", ckpt, out,
               dtype ? dtype : "f32", tok ? "with the tokenizer" : "no tokenizer");
        if (tok == NULL)
            printf("no tokenizer written: give --tokenizer with the GGUF or Hugging Face folder "
                   "the model came from\n");
    } else if (is_hf) {
        static const char *const names[] = {[HF_F32] = "f32", [HF_BF16] = "bf16", [HF_F16] = "f16"};
        printf("exported %s to %s (%s, %s: transformers' %s.from_pretrained reads it)\n", ckpt, out,
               names[hf.dtype], tok ? "with the tokenizer" : "no tokenizer", model_hf_class(arch));
        if (tok)
            printf("tokenizer files from %s\n", tok);
        else
            printf("no tokenizer files written: add them with --tokenizer DIR, the Hugging Face "
                   "folder the model came from\n");
    } else {
        printf("exported %s to %s (llm.c's checkpoint format, version 3, fp32)\n", ckpt, out);
    }
    return EXIT_OK;
}
