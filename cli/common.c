/*
 * common.c — what every subcommand shares: one-line errors with the exit
 * status conventions, getopt_long without getopt's own messages, flag
 * values read as numbers with nothing left over, and --data's operands.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "kernels/model.h"
#include "util/util.h"

int cli_usage_error(const Command *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "strait %s: ", cmd->name);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "; see 'strait help %s'\n", cmd->name);
    va_end(ap);
    return EXIT_USAGE;
}

int cli_fail(const Command *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "strait %s: ", cmd->name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return EXIT_FAILED;
}

int cli_getopt(const Command *cmd, int argc, char **argv, const char *shortopts,
               const struct option *longopts) {
    opterr = 0;
    char spec[128];
    /* a leading ':' makes getopt tell a missing value from an unknown flag */
    snprintf(spec, sizeof spec, ":%s", shortopts ? shortopts : "");
    int c = getopt_long(argc, argv, spec, longopts, NULL);
    if (c == '?') {
        const char *bad = argv[optind - 1];
        if (optopt && !(bad[0] == '-' && bad[1] == '-'))
            cli_usage_error(cmd, "unknown flag '-%c'", optopt);
        else
            cli_usage_error(cmd, "unknown flag '%s'", bad);
        return -2;
    }
    if (c == ':') {
        cli_usage_error(cmd, "flag '%s' needs a value", argv[optind - 1]);
        return -2;
    }
    return c;
}

int cli_json_flag(const Command *cmd, int argc, char **argv) {
    static const struct option opts[] = {{"json", no_argument, NULL, 'j'}, {NULL, 0, NULL, 0}};
    int c, json = 0;
    optind = 1;
    while ((c = cli_getopt(cmd, argc, argv, "", opts)) != -1) {
        if (c == -2) return -2;
        json = 1;
    }
    return json;
}

int cli_int(const Command *cmd, const char *flag, int *out) {
    char *end;
    errno = 0;
    long v = strtol(optarg, &end, 10);
    if (end == optarg || *end != '\0' || errno != 0 || v < INT_MIN || v > INT_MAX) {
        cli_usage_error(cmd, "%s '%s' is not a whole number", flag, optarg);
        return -2;
    }
    *out = (int)v;
    return 0;
}

int cli_float(const Command *cmd, const char *flag, float *out) {
    char *end;
    errno = 0;
    float v = strtof(optarg, &end);
    if (end == optarg || *end != '\0' || errno != 0) {
        cli_usage_error(cmd, "%s '%s' is not a number", flag, optarg);
        return -2;
    }
    *out = v;
    return 0;
}

int cli_matmul(const Command *cmd, const char *value) {
    if (strcmp(value, "tf32") == 0) return 1;
    if (strcmp(value, "fp32") == 0) return 0;
    cli_usage_error(cmd, "--matmul is tf32 or fp32, not '%s'", value);
    return -2;
}

int cli_recompute(const Command *cmd, const char *value) {
    if (value[0] >= '0' && value[0] <= '0' + MODEL_RECOMPUTE_MAX && value[1] == '\0')
        return value[0] - '0';
    cli_usage_error(cmd,
                    "--recompute is 0 (keep every activation), 1 (compute the MLP's activation "
                    "again in the backward, the default) or 2 (also the norms' outputs), "
                    "not '%s'",
                    value);
    return -2;
}

int cli_base_blocks(const Command *cmd, const char *value) {
    if (strcmp(value, "on") == 0) return 0;
    if (strcmp(value, "off") == 0) return 1;
    cli_usage_error(cmd,
                    "--base-blocks is on (a quantized GGUF base kept in its blocks, unpacked at "
                    "each use) or off (held as a bf16 copy: faster, more memory), not '%s'",
                    value);
    return -1;
}

int cli_u64(const Command *cmd, const char *flag, unsigned long long *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(optarg, &end, 10);
    if (end == optarg || *end != '\0' || errno != 0 || optarg[0] == '-') {
        cli_usage_error(cmd, "%s '%s' is not a non-negative whole number", flag, optarg);
        return -2;
    }
    *out = v;
    return 0;
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int cli_data_add(const Command *cmd, const char **data, int *n, const char *path) {
    static char *found[64]; /* a folder's shard paths, for the process's life */
    static int n_found;
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) { /* a file; its errors are the loader's */
        if (*n == 64) return cli_usage_error(cmd, "at most 64 --data paths");
        data[(*n)++] = path;
        return 0;
    }
    DIR *d = opendir(path);
    if (d == NULL)
        return cli_usage_error(cmd, "cannot read the folder %s: %s", path, strerror(errno));
    char *names[64];
    int k = 0, over = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "tokens_", 7) != 0 || len < 11 ||
            strcmp(e->d_name + len - 4, ".bin") != 0)
            continue;
        if (k == 64 || *n + k == 64 || n_found + k == 64) {
            over = 1;
            break;
        }
        size_t sz = strlen(path) + len + 2;
        names[k] = malloc(sz);
        if (names[k] == NULL) break;
        snprintf(names[k++], sz, "%s/%s", path, e->d_name);
    }
    closedir(d);
    if (over || k == 0) {
        for (int i = 0; i < k; i++) free(names[i]);
        return over ? cli_usage_error(cmd, "%s holds more token shards than the 64 --data takes",
                                      path)
                    : cli_usage_error(cmd,
                                      "%s is a folder without token shards (tokens_*.bin, as "
                                      "strait tokenize --out writes them); give files or such a "
                                      "folder",
                                      path);
    }
    qsort(names, (size_t)k, sizeof names[0], name_cmp);
    for (int i = 0; i < k; i++) data[(*n)++] = found[n_found++] = names[i];
    return 0;
}

int cli_lora_opt(const Command *cmd, int c, const char *value, AdapterConfig *a) {
    char err[ERR_LEN];
    switch (c) {
    case CLI_OPT_LORA_RANK:
        if (cli_int(cmd, "--lora-rank", &a->rank)) return -2;
        if (a->rank < 1 || a->rank > LORA_RANK_MAX)
            return cli_usage_error(cmd, "--lora-rank is 1 to %d", LORA_RANK_MAX);
        return 0;
    case CLI_OPT_LORA_ALPHA:
        if (cli_float(cmd, "--lora-alpha", &a->alpha)) return -2;
        if (!(a->alpha > 0 && a->alpha < 1e6f))
            return cli_usage_error(cmd, "--lora-alpha must be more than 0 (PEFT's lora_alpha)");
        return 0;
    case CLI_OPT_LORA_RULE:
        if (model_lora_rule_of(value) < 0)
            return cli_usage_error(cmd,
                                   "--lora-rule is ffa (A frozen: only B trains, averaged "
                                   "exactly), fedsb (A and B frozen: only R between them trains, "
                                   "averaged exactly) or fedit (A and B averaged apart), not '%s'",
                                   value);
        a->rule = 1 + model_lora_rule_of(value); /* 0: not said; cli_lora_done takes 1 off */
        return 0;
    case CLI_OPT_LORA_BASE_DTYPE:
        if (strcmp(value, "bf16") != 0 && strcmp(value, "f32") != 0)
            return cli_usage_error(cmd,
                                   "--lora-base-dtype is bf16 (the base's matmuls in bf16, sums "
                                   "in fp32) or f32, not '%s'",
                                   value);
        a->base_bf16 = strcmp(value, "bf16") == 0 ? 1 : 2; /* 2: f32 said; 0 when done */
        return 0;
    case CLI_OPT_LORA_DROPOUT:
        if (cli_float(cmd, "--lora-dropout", &a->dropout)) return -2;
        if (!(a->dropout >= 0 && a->dropout < 1))
            return cli_usage_error(cmd, "--lora-dropout is 0 (none) or more, below 1 (PEFT's "
                                        "lora_dropout)");
        return 0;
    case CLI_OPT_LORA_TARGETS:
        if (model_lora_targets_parse(value, &a->targets, err) != 0)
            return cli_usage_error(cmd, "--lora-targets: %s", err);
        return 0;
    }
    return -2;
}

int cli_lora_done(const Command *cmd, AdapterConfig *a, int federated, uint64_t seed) {
    if (a->rank == 0)
        return a->alpha == 0 && a->targets == 0 && a->rule == 0 && a->base_bf16 == 0 &&
                       a->dropout == 0
                   ? 0
                   : cli_usage_error(cmd, "--lora-alpha, --lora-targets, --lora-rule, "
                                          "--lora-base-dtype and --lora-dropout need "
                                          "--lora-rank (a PEFT folder from --adapters brings "
                                          "its own)");
    if (a->alpha == 0) a->alpha = (float)a->rank;
    if (a->targets == 0) a->targets = LORA_Q | LORA_V;
    a->rule = a->rule == 0 ? (federated ? LORA_RULE_FFA : LORA_RULE_FEDIT) : a->rule - 1;
    a->base_bf16 = a->base_bf16 != 2; /* bf16 unless f32 was said */
    if (seed > INT64_MAX)             /* the configuration's JSON carries it as an integer */
        return cli_usage_error(cmd, "with --lora-rank, --seed is at most 2^63 - 1");
    a->a_seed = seed;
    return 0;
}

int cli_gguf_file(const char *path) {
    char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(magic, 1, 4, f) : 0;
    if (f) fclose(f);
    return n == 4 && memcmp(magic, "GGUF", 4) == 0;
}
