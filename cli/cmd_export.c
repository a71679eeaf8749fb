/*
 * cmd_export.c — `strait export CKPT --format hf|llmc OUT`: a Strait
 * checkpoint (a federation's round, or `strait train --out`) in Hugging
 * Face's or llm.c's format (kernels/export.c). A federation's round is
 * held against retention while it is read; a pruned one gets a clear error.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "coordinator/store.h"
#include "kernels/model.h"
#include "kernels/formats.h"
#include "kernels/gguf.h"
#include "util/util.h"

/* A federation's round checkpoint (HOME/checkpoints/round-N.*, beside
 * HOME/strait.db) is held against the coordinator's retention while it is
 * read (store_hold: *fd, -1 for any other file); a round retention pruned
 * is refused, saying which rounds are kept. A hold that cannot be taken
 * (a store this binary cannot open, a folder it may not write) is said in
 * one line and the file read as it is: the export worked without it. */
static int hold_round(const char *ckpt, int *fd, char *err) {
    *fd = -1;
    const char *base = strrchr(ckpt, '/');
    size_t dir = base ? (size_t)(base - ckpt) : 0, n = strlen(STORE_CHECKPOINT_DIR);
    if (base == NULL || dir < n || strncmp(base - n, STORE_CHECKPOINT_DIR, n) != 0 ||
        (dir > n && base[-(long)n - 1] != '/'))
        return 0; /* not in a federation's checkpoints folder */
    char home[4096], db[4200];
    if (dir == n)
        snprintf(home, sizeof home, ".");
    else
        snprintf(home, sizeof home, "%.*s", (int)(dir - n - 1), ckpt);
    snprintf(db, sizeof db, "%s/%s", home, STORE_DB_FILE);
    if (access(db, F_OK) != 0) return 0;
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

/* --format gguf: in dtype (f32 by default: the model of record, exact),
 * with the tokenizer of the GGUF file tok_src when given */
static int export_gguf(const GPT *m, const char *out, const char *dtype, const char *tok_src,
                       char *err) {
    int type = gguf_dtype_of(dtype ? dtype : "f32");
    if (type < 0) return err_set(err, "--dtype %s; use f32, f16, bf16 or q8_0", dtype);
    TokenizerLists tl;
    Gguf *g = tok_src ? gguf_open(tok_src, err) : NULL;
    if (tok_src && (g == NULL || gguf_tokenizer_lists(g, &tl, err) != 0)) {
        gguf_close(g);
        return -1;
    }
    int rc = gpt_export_gguf(m, out, type, g ? &tl : NULL, err);
    if (g) gguf_tokenizer_lists_free(&tl), gguf_close(g);
    return rc;
}

int cmd_export(const Command *cmd, int argc, char **argv) {
    static const struct option opts[] = {{"format", required_argument, NULL, 'f'},
                                         {"dtype", required_argument, NULL, 'd'},
                                         {"tokenizer", required_argument, NULL, 't'},
                                         {NULL, 0, NULL, 0}};
    const char *format = NULL, *dtype = NULL, *tok = NULL;
    int c;
    optind = 1;
    while ((c = cli_getopt(cmd, argc, argv, "", opts)) != -1) {
        if (c == -2) return EXIT_USAGE;
        if (c == 'f') format = optarg;
        if (c == 'd') dtype = optarg;
        if (c == 't') tok = optarg;
    }
    int gguf = format && strcmp(format, "gguf") == 0;
    if (format == NULL || (strcmp(format, "hf") != 0 && strcmp(format, "llmc") != 0 && !gguf))
        return cli_usage_error(cmd, "give --format hf (a folder), gguf or llmc (a file)");
    if (optind != argc - 2) return cli_usage_error(cmd, "expected CKPT and OUT");
    const char *ckpt = argv[optind], *out = argv[optind + 1];
    char err[ERR_LEN];
    GPTConfig cfg;
    GPT m;
    memset(&m, 0, sizeof m);
    int held;
    if (hold_round(ckpt, &held, err) != 0) return cli_fail(cmd, "%s", err);
    if (gpt_read_config(ckpt, &cfg, NULL, err) != 0 || gpt_build(&m, &cfg, 0, err) != 0 ||
        gpt_load(&m, ckpt, NULL, err) != 0) {
        gpt_free(&m);
        if (held >= 0) close(held);
        return cli_fail(cmd, "%s", err);
    }
    if (held >= 0) close(held); /* read whole: retention may have it */
    int rc = gguf                        ? export_gguf(&m, out, dtype, tok, err)
             : strcmp(format, "hf") == 0 ? gpt_export_hf(&m, out, err)
                                         : gpt_export_llmc(&m, out, err);
    int arch = m.cfg.arch;
    gpt_free(&m);
    if (rc != 0) return cli_fail(cmd, "%s", err);
    if (gguf)
        printf("exported %s to %s (GGUF, %s: llama.cpp loads it)\n", ckpt, out,
               dtype ? dtype : "f32");
    else if (strcmp(format, "hf") == 0)
        printf("exported %s to %s (config.json, model.safetensors: transformers' "
               "%s.from_pretrained reads it)\n",
               ckpt, out, model_hf_class(arch));
    else
        printf("exported %s to %s (llm.c's checkpoint format, version 3, fp32)\n", ckpt, out);
    return EXIT_OK;
}
