/*
 * cmd_tokenize.c — `strait tokenize`: its flags, then text files to llm.c's
 * token shards (kernels/tokenizer.h's tokenize_files), and the tokenizer
 * options that `strait sample` shares.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kernels/model.h"
#include "kernels/data.h"
#include "kernels/gguf.h"
#include "kernels/tokenizer.h"
#include "util/util.h"

Tokenizer *cli_tokenizer_gguf(const char *path, char *err) {
    Gguf *g = gguf_open(path, err);
    TokenizerLists tl;
    if (g == NULL || gguf_tokenizer_lists(g, &tl, err) != 0) {
        gguf_close(g);
        return NULL;
    }
    gguf_close(g);
    char why[ERR_LEN];
    Tokenizer *t = tokenizer_from_lists(&tl, why);
    tokenizer_lists_free(&tl);
    if (t == NULL) err_set(err, "%s: %s", path, why);
    return t;
}

Tokenizer *cli_tokenizer_open(const char *dir, const char *vocab, const char *merges, char *err) {
    char v[1024], m[1024];
    if (dir != NULL && vocab == NULL && merges == NULL)
        return gguf_path_is(dir) ? cli_tokenizer_gguf(dir, err) : tokenizer_load_dir(dir, err);
    if (dir != NULL) {
        snprintf(v, sizeof v, "%s/vocab.json", dir);
        snprintf(m, sizeof m, "%s/merges.txt", dir);
        vocab = vocab ? vocab : v;
        merges = merges ? merges : m;
    }
    if (vocab == NULL || merges == NULL) {
        err_set(err, "give --tokenizer DIR (tokenizer.json, or vocab.json and merges.txt) or "
                     "FILE.gguf, or both --vocab and --merges");
        return NULL;
    }
    return tokenizer_load(vocab, merges, err);
}

int cmd_tokenize(const Command *cmd, int argc, char **argv) {
    static const struct option opts[] = {
        {"tokenizer", required_argument, NULL, 'T'},    {"vocab", required_argument, NULL, 'v'},
        {"merges", required_argument, NULL, 'm'},       {"out", required_argument, NULL, 'o'},
        {"shard-tokens", required_argument, NULL, 's'}, {NULL, 0, NULL, 0}};
    const char *tdir = NULL, *vocab = NULL, *merges = NULL, *out = NULL;
    int shard_tokens = 100000000;
    int c;
    optind = 1;
    while ((c = cli_getopt(cmd, argc, argv, "", opts)) != -1) {
        switch (c) {
        case -2:
            return EXIT_USAGE;
        case 'T':
            tdir = optarg;
            break;
        case 'v':
            vocab = optarg;
            break;
        case 'm':
            merges = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case 's':
            if (cli_int(cmd, "--shard-tokens", &shard_tokens)) return EXIT_USAGE;
            break;
        }
    }
    if (out == NULL) return cli_usage_error(cmd, "give the output folder with --out DIR");
    if (optind == argc) return cli_usage_error(cmd, "give the text files to tokenize");
    if (shard_tokens < 1024) return cli_usage_error(cmd, "--shard-tokens must be at least 1024");
    char err[ERR_LEN];
    if (tokenize_dir_check(out, err) != 0) return cli_fail(cmd, "%s", err);
    Tokenizer *tok = cli_tokenizer_open(tdir, vocab, merges, err);
    if (tok == NULL) return cli_fail(cmd, "%s", err);
    TokenizeStats ts;
    int rc = tokenize_files(tok, argv + optind, argc - optind, out, (size_t)shard_tokens, stderr,
                            &ts, err);
    int vocab_size = tokenizer_vocab_size(tok);
    tokenizer_free(tok);
    if (rc != 0) return cli_fail(cmd, "%s", err);
    uint64_t total = ts.bytes;
    size_t n_tokens = ts.tokens;
    int shards = ts.shards;
    printf("%d file%s, %llu bytes -> %zu tokens (%.2f bytes a token) in %d shard%s under %s; "
           "vocabulary %d\n",
           argc - optind, argc - optind == 1 ? "" : "s", (unsigned long long)total, n_tokens,
           n_tokens ? (double)total / (double)n_tokens : 0.0, shards, shards == 1 ? "" : "s", out,
           vocab_size);
    return EXIT_OK;
}
