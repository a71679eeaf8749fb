/*
 * cmd_tokenize.c — `strait tokenize`: text files to llm.c's token shards with
 * GPT-2's byte-level BPE (kernels/tokenizer.h), and the tokenizer options
 * that `strait sample` shares.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "kernels/model.h"
#include "kernels/data.h"
#include "kernels/tokenizer.h"
#include "kernels/tokenizer.h"
#include "util/util.h"

Tokenizer *cli_tokenizer_open(const char *dir, const char *vocab, const char *merges, char *err) {
    char v[1024], m[1024];
    if (dir != NULL && vocab == NULL && merges == NULL) return tokenizer_load_dir(dir, err);
    if (dir != NULL) {
        snprintf(v, sizeof v, "%s/vocab.json", dir);
        snprintf(m, sizeof m, "%s/merges.txt", dir);
        vocab = vocab ? vocab : v;
        merges = merges ? merges : m;
    }
    if (vocab == NULL || merges == NULL) {
        err_set(err, "give --tokenizer DIR (tokenizer.json, or vocab.json and merges.txt) or both "
                     "--vocab and --merges");
        return NULL;
    }
    return tokenizer_load(vocab, merges, err);
}

static int dir_is_empty_or_absent(const char *path) {
    DIR *d = opendir(path);
    if (d == NULL) return errno == ENOENT;
    struct dirent *e;
    int empty = 1;
    while (empty && (e = readdir(d)) != NULL)
        empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    closedir(d);
    return empty;
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
    if (!dir_is_empty_or_absent(out))
        return cli_fail(cmd, "%s is not empty: give a new folder, so no old shard is mixed in",
                        out);
    char err[ERR_LEN];
    Tokenizer *tok = cli_tokenizer_open(tdir, vocab, merges, err);
    if (tok == NULL) return cli_fail(cmd, "%s", err);
    uint64_t total = 0;
    for (int i = optind; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0 || !S_ISREG(st.st_mode)) {
            tokenizer_free(tok);
            return cli_fail(cmd, "%s: not a readable file", argv[i]);
        }
        total += (uint64_t)st.st_size;
    }
    if (file_mkdir_p(out, 0755, err) != 0) {
        tokenizer_free(tok);
        return cli_fail(cmd, "%s", err);
    }
    ProgressBar pb;
    progress_init(&pb, stderr, "tokenize", total);
    ShardWriter w;
    shard_writer_init(&w, out, (size_t)shard_tokens);
    uint64_t done = 0;
    int rc = 0, eot = tokenizer_doc_start(tok);
    for (int i = optind; rc == 0 && i < argc; i++) {
        char *text, *norm;
        size_t len, pos = 0, nlen;
        if (file_read_all(argv[i], (size_t)1 << 34, &text, &len, err) != 0) {
            rc = -1;
            break;
        }
        if (tokenizer_normalize(tok, text, len, &norm, &nlen, err) != 0) { /* Qwen2's NFC */
            free(text);
            rc = -1;
            break;
        }
        if (norm) free(text), text = norm, len = nlen;
        /* each file is a document; like llm.c's data scripts, <|endoftext|> opens it
         * (<|begin_of_text|> where the tokenizer has one: Llama 3) */
        if (eot >= 0 && token_buf_push(&w.b, eot) != 0) {
            free(text);
            rc = err_set(err, "out of memory");
            break;
        }
        while (rc == 0 && pos < len) {
            size_t before = pos;
            rc = tokenizer_encode_some(tok, text, len, &pos, (size_t)1 << 20, &w.b, err);
            done += pos - before;
            char suffix[64];
            snprintf(suffix, sizeof suffix, "%zu tokens", w.written + w.b.n);
            progress_update(&pb, done, suffix);
            if (rc == 0) rc = shard_writer_flush(&w, 0, err);
        }
        free(text);
    }
    if (rc == 0) rc = shard_writer_flush(&w, 1, err);
    progress_finish(&pb, done, rc == 0 ? "done" : "failed");
    size_t n_tokens = w.written;
    int shards = w.shards;
    shard_writer_free(&w);
    int vocab_size = tokenizer_vocab_size(tok);
    tokenizer_free(tok);
    if (rc != 0) return cli_fail(cmd, "%s", err);
    printf("%d file%s, %llu bytes -> %zu tokens (%.2f bytes a token) in %d shard%s under %s; "
           "vocabulary %d\n",
           argc - optind, argc - optind == 1 ? "" : "s", (unsigned long long)total, n_tokens,
           n_tokens ? (double)total / (double)n_tokens : 0.0, shards, shards == 1 ? "" : "s", out,
           vocab_size);
    return EXIT_OK;
}
