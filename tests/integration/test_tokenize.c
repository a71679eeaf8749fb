/*
 * test_tokenize.c — Strait's GPT-2 BPE against PyPI's `tokenizers` (in
 * build/venv): a byte-level BPE of 2000 merges trained by `tokenizers` on
 * Debian's fortunes, then every fortunes collection and a file of Unicode
 * edge cases encoded by both — the same ids, and decode(encode(x)) == x;
 * `strait tokenize` writes those ids into llm.c shards; `strait sample`
 * speaks BPE; bad vocabularies and merges are refused by name. SmolLM2's
 * vocabulary, from the GGUF's lists, against `tokenizers` built from the
 * same lists; bytes without a token; GGUF's lists and Hugging Face's files
 * written back and read by `tokenizers`.
 */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <criterion/criterion.h>

#include "kernels/model.h"
#include "kernels/data.h"
#include "kernels/tokenizer.h"
#include "tests/harness.h"
#include "util/util.h"

#define FORTUNES "/usr/share/games/fortunes"

/* Emoji (with ZWJ and skin tone), combining marks, CJK, RTL, contractions
 * in and out of words, runs of spaces, tabs and newlines, NBSP and other
 * Unicode spaces, digits of other scripts, and punctuation runs. */
static const char EDGE[] =
    "Hello, world! It's the cat's toy; we'll see, they've gone, I'm here, you'd know.\n"
    "IT'S LOUD'LL 'S 's 't 're 've 'm 'll 'd '' ''s don't\n"
    "emoji: \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb "
    "\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80!\n"
    "combining: e\xcc\x81 n\xcc\x83 a\xcc\x8a\xcc\x81 \xe1\xb8\x89\n"
    "CJK: \xe4\xb8\xad\xe6\x96\x87\xe5\xad\x97\xe7\xac\xa6 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e"
    "\xe3\x81\xae\xe3\x81\x8b\xe3\x81\xaa \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4\n"
    "RTL: \xd7\xa9\xd7\x9c\xd7\x95\xd7\x9d \xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7\n"
    "digits: 12345 \xd9\xa1\xd9\xa2\xd9\xa3 \xe0\xa5\xa7\xe0\xa5\xa8 3.14159 1,000,000\n"
    "spaces:    four  two\t\ttabs \xc2\xa0nbsp\xe2\x80\x83"
    "em\xe3\x80\x80ideographic  \n"
    "\n\n\n   \n\t\n"
    "punct: ...!!!??? --- *** ((())) \"quoted\" \xe2\x80\x9csmart\xe2\x80\x9d \xc2\xab\xc2\xbb\n"
    "   trailing spaces   ";

static char *reference(const char *cmd, const char *a, const char *b, const char *c, const char *d,
                       char **files, int n);

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every fortunes collection (the text files, not the .dat indexes), sorted. */
static int fortunes_files(char **paths, int max) {
    int n = 0;
    const char *dirs[] = {FORTUNES, FORTUNES "/de", FORTUNES "/es", FORTUNES "/it"};
    for (size_t d = 0; d < sizeof dirs / sizeof *dirs; d++) {
        DIR *dir = opendir(dirs[d]);
        if (dir == NULL) continue;
        struct dirent *e;
        while ((e = readdir(dir)) != NULL && n < max) {
            size_t l = strlen(e->d_name);
            if (e->d_name[0] == '.' || (l > 4 && strcmp(e->d_name + l - 4, ".dat") == 0)) continue;
            char p[600];
            snprintf(p, sizeof p, "%s/%s", dirs[d], e->d_name);
            struct stat st;
            if (lstat(p, &st) != 0 || !S_ISREG(st.st_mode)) continue; /* not the .u8 links */
            paths[n++] = strdup(p);
        }
        closedir(dir);
    }
    qsort(paths, (size_t)n, sizeof *paths, cmp_str);
    return n;
}

static char *train_reference(char **files, int n_files) {
    const char *py = getenv("STRAIT_PYTHON"), *src = getenv("STRAIT_SRC");
    cr_assert(py && src, "run through make test (it builds build/venv with tokenizers)");
    char *dir = harness_tmpdir("bpe"), script[700], tok[700];
    snprintf(script, sizeof script, "%s/tests/python/bpe_reference.py", src);
    snprintf(tok, sizeof tok, "%s/tok", dir);
    char **argv = calloc((size_t)n_files + 6, sizeof *argv);
    argv[0] = (char *)py, argv[1] = script, argv[2] = "train", argv[3] = tok, argv[4] = "2000";
    for (int i = 0; i < n_files; i++) argv[5 + i] = files[i];
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "tokenizers train: %s %s", r.out, r.err);
    proc_result_free(&r);
    free(argv);
    return dir;
}

Test(tokenize, matches_pypi_tokenizers_on_every_fortunes_collection, .timeout = 300) {
#if defined(__SANITIZE_ADDRESS__)
    /* millions of ids against PyPI's: the plain build checks them; the
     * sanitizers see the tokenizer in this file's other tests (SmolLM2's
     * Llama 3 style among them) and in its three fuzzers */
    cr_skip_test("ids against PyPI tokenizers are checked in the plain build (minutes under ASan)");
#endif
    char *files[1024];
    int n = fortunes_files(files, 1023);
    cr_assert_gt(n, 100, "the fortunes packages are installed by make deps");
    char *dir = train_reference(files, n), edge[700], tokdir[700], ids[700], script[700];
    char err[ERR_LEN];
    snprintf(edge, sizeof edge, "%s/edge.txt", dir);
    cr_assert_eq(file_write_atomic(edge, EDGE, strlen(EDGE), 0644, err), 0);
    files[n++] = strdup(edge);
    snprintf(tokdir, sizeof tokdir, "%s/tok", dir);
    snprintf(ids, sizeof ids, "%s/ids", dir);
    snprintf(script, sizeof script, "%s/tests/python/bpe_reference.py", getenv("STRAIT_SRC"));
    char **argv = calloc((size_t)n + 6, sizeof *argv);
    argv[0] = (char *)getenv("STRAIT_PYTHON"), argv[1] = script, argv[2] = "encode";
    argv[3] = tokdir, argv[4] = ids;
    for (int i = 0; i < n; i++) argv[5 + i] = files[i];
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "tokenizers encode: %s %s", r.out, r.err);
    proc_result_free(&r);

    char vocab[800], merges[800];
    snprintf(vocab, sizeof vocab, "%s/vocab.json", tokdir);
    snprintf(merges, sizeof merges, "%s/merges.txt", tokdir);
    Tokenizer *t = tokenizer_load(vocab, merges, err);
    cr_assert_not_null(t, "%s", err);
    cr_assert_eq(tokenizer_merges(t), 2000);
    cr_assert_eq(tokenizer_eot(t), 0, "tokenizers puts its special token first");
    size_t total = 0, bytes = 0;
    for (int i = 0; i < n; i++) {
        char *text, *want, p[800];
        size_t len, wlen;
        cr_assert_eq(file_read_all(files[i], (size_t)1 << 30, &text, &len, err), 0, "%s", err);
        snprintf(p, sizeof p, "%s/%d.ids", ids, i);
        cr_assert_eq(file_read_all(p, (size_t)1 << 30, &want, &wlen, err), 0, "%s", err);
        TokenBuf b = {0};
        cr_assert_eq(tokenizer_encode(t, text, len, &b, err), 0, "%s", err);
        size_t first_diff = 0;
        while (first_diff < b.n && first_diff * 2 < wlen &&
               memcmp(&b.ids[first_diff], want + first_diff * 2, 2) == 0)
            first_diff++;
        cr_assert(b.n * 2 == wlen && first_diff == b.n,
                  "%s: %zu ids here, %zu from tokenizers; first difference at id %zu", files[i],
                  b.n, wlen / 2, first_diff);
        /* decode(encode(x)) == x, byte for byte */
        size_t at = 0;
        for (size_t k = 0; k < b.n; k++) {
            size_t bl;
            const uint8_t *bytes = tokenizer_decode(t, b.ids[k], &bl);
            cr_assert(bytes && at + bl <= len && memcmp(text + at, bytes, bl) == 0,
                      "%s: token %zu does not decode to the text", files[i], k);
            at += bl;
        }
        cr_assert_eq(at, len);
        total += b.n, bytes += len;
        token_buf_free(&b);
        free(text), free(want);
    }
    cr_assert_lt(2.0 * (double)total, (double)bytes,
                 "%zu tokens for %zu bytes: 2000 merges halve them", total, bytes);

    /* strait tokenize: the same ids, each file opened by <|endoftext|>, in shards */
    char shards[700];
    snprintf(shards, sizeof shards, "%s/shards", dir);
    char **targv = calloc((size_t)n + 10, sizeof *targv);
    int k = 0;
    targv[k++] = (char *)harness_strait_bin(), targv[k++] = "tokenize";
    targv[k++] = "--tokenizer", targv[k++] = tokdir, targv[k++] = "--out", targv[k++] = shards;
    targv[k++] = "--shard-tokens", targv[k++] = "1000000";
    for (int i = 0; i < n; i++) targv[k++] = files[i];
    r = proc_run(targv);
    cr_assert_eq(r.status, 0, "%s", r.err);
    int n_shards = (int)((total + (size_t)n + 999999) / 1000000);
    char want[64];
    snprintf(want, sizeof want, "in %d shards", n_shards);
    cr_assert_not_null(strstr(r.out, want), "%zu tokens in 1M shards: %s", total, r.out);
    proc_result_free(&r);
    const char *paths[64];
    char pbuf[64][800];
    cr_assert_lt(n_shards, 64);
    for (int s = 0; s < n_shards; s++) {
        snprintf(pbuf[s], sizeof pbuf[s], "%s/tokens_%06d.bin", shards, s);
        paths[s] = pbuf[s];
    }
    TokenSet ts;
    cr_assert_eq(tokens_load(&ts, paths, n_shards, err), 0, "%s", err);
    cr_assert_eq(ts.n, total + (size_t)n, "every id, and one <|endoftext|> a file");
    cr_assert_eq(ts.tokens[0], 0);
    tokens_free(&ts);

    tokenizer_free(t);
    for (int i = 0; i < n; i++) free(files[i]);
    free(argv), free(targv);
    harness_rmtree(dir);
    free(dir);
}

/* A tiny vocabulary written by hand: the 256 bytes in GPT-2's alphabet, then
 * extra tokens; merges as given. */
static char *hand_vocab(const char *extra) {
    size_t cap = 8192, n = 0;
    char *s = malloc(cap);
    n += (size_t)snprintf(s + n, cap - n, "{");
    int shift = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        unsigned cp = printable ? (unsigned)b : 256u + (unsigned)shift++;
        char u[8];
        if (cp < 0x80) {
            if (cp == '"' || cp == '\\')
                snprintf(u, sizeof u, "\\%c", cp);
            else
                snprintf(u, sizeof u, "%c", cp);
        } else {
            snprintf(u, sizeof u, "%c%c", 0xc0 | (cp >> 6), 0x80 | (cp & 0x3f));
        }
        n += (size_t)snprintf(s + n, cap - n, "%s\"%s\":%d", b ? "," : "", u, b);
    }
    snprintf(s + n, cap - n, "%s}", extra);
    return s;
}

static const char *refusal(const char *vocab, const char *merges) {
    static char err[ERR_LEN];
    Tokenizer *t = tokenizer_parse(vocab, strlen(vocab), merges, strlen(merges), err);
    if (t != NULL) {
        tokenizer_free(t);
        return NULL;
    }
    return err;
}

Test(tokenize, hand_made_merges_apply_by_rank_and_bad_files_are_refused_by_name) {
    char *v = hand_vocab(",\"he\":256,\"ll\":257,\"hell\":258,\"o\xc4\xa0\":259");
    const char *merges = "#version: 0.2\nh e\nl l\nhe ll\n";
    char err[ERR_LEN];
    Tokenizer *t = tokenizer_parse(v, strlen(v), merges, strlen(merges), err);
    cr_assert_not_null(t, "%s", err);
    TokenBuf b = {0};
    cr_assert_eq(tokenizer_encode(t, "hello hell", 10, &b, err), 0);
    /* "hello" -> hell + o; " hell" -> space + hell (the space is its own byte token here) */
    uint32_t want[] = {258, 'o', ' ', 258};
    cr_assert_eq(b.n, 4);
    cr_assert_arr_eq(b.ids, want, sizeof want);
    token_buf_free(&b);
    /* any bytes round-trip, invalid UTF-8 included */
    uint8_t raw[4096];
    harness_fill(raw, sizeof raw, 3);
    cr_assert_eq(tokenizer_encode(t, (const char *)raw, sizeof raw, &b, err), 0);
    size_t at = 0;
    for (size_t k = 0; k < b.n; k++) {
        size_t bl;
        const uint8_t *bytes = tokenizer_decode(t, b.ids[k], &bl);
        cr_assert(bytes && memcmp(raw + at, bytes, bl) == 0);
        at += bl;
    }
    cr_assert_eq(at, sizeof raw);
    token_buf_free(&b);
    tokenizer_free(t);

    const char *e;
    cr_assert_not_null(e = refusal(v, "h e\nl x\n"));
    cr_assert_not_null(strstr(e, "line 2"), "%s", e);
    cr_assert_not_null(e = refusal(v, "h e\nh l\n"));
    cr_assert_not_null(strstr(e, "merges into a token the vocabulary does not have"), "%s", e);
    cr_assert_not_null(e = refusal(v, "h  e\n"));
    cr_assert_not_null(strstr(e, "two tokens"), "%s", e);
    char *blank = malloc((1 << 20) + 2); /* a merges.txt sized to make a huge table */
    memset(blank, '\n', (1 << 20) + 1);
    blank[(1 << 20) + 1] = '\0';
    cr_assert_not_null(e = refusal(v, blank));
    cr_assert_not_null(strstr(e, "lines"), "%s", e);
    free(blank);
    cr_assert_not_null(e = refusal("{\"a\":0}", ""));
    cr_assert_not_null(strstr(e, "no token for byte"), "%s", e);
    cr_assert_not_null(e = refusal("[1,2]", ""));
    cr_assert_not_null(strstr(e, "object"), "%s", e);
    free(v);
    v = hand_vocab(",\"he\":5000000"); /* past 2^22, the largest vocabulary a model has */
    cr_assert_not_null(e = refusal(v, ""));
    cr_assert_not_null(strstr(e, "0..4194303"), "%s", e);
    free(v);
    v = hand_vocab(",\"he\":5");
    cr_assert_not_null(e = refusal(v, ""));
    cr_assert_not_null(strstr(e, "id 5 is given to two tokens"), "%s", e);
    free(v);
}

Test(tokenize, cli_refuses_a_used_folder_and_a_missing_tokenizer) {
    char *dir = harness_tmpdir("tokcli"), text[700], used[700];
    char err[ERR_LEN];
    snprintf(text, sizeof text, "%s/t.txt", dir);
    cr_assert_eq(file_write_atomic(text, "hi", 2, 0644, err), 0);
    ProcResult r = harness_strait("tokenize", "--out", dir, text);
    cr_assert_eq(r.status, 1, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "not empty"), "%s", r.err);
    proc_result_free(&r);
    snprintf(used, sizeof used, "%s/new", dir);
    r = harness_strait("tokenize", "--out", used, text);
    cr_assert_neq(r.status, 0);
    cr_assert_not_null(strstr(r.err, "--tokenizer DIR"), "%s", r.err);
    proc_result_free(&r);
    harness_rmtree(dir);
    free(dir);
}

/* ---- tokenizer.json ------------------------------------------------------------- */

/* tokenizer.json files built by `tokenizers` in each of the three
 * pre-tokenizer patterns (GPT-2's, Llama 3's with ignore_merges, Qwen2's
 * with its NFC normalizer and every id moved past 65535): identical ids on
 * every fortunes collection and the edge cases, decode(encode(x)) == x (of
 * the normalized text), and `strait tokenize` writes the wide ids into a
 * version-2 shard. Each also goes out as GGUF's lists under llama.cpp's
 * pre name and back, then out as Strait's tokenizer.json: the same ids
 * from Strait and from tokenizers reading that file. */
Test(tokenize, tokenizer_json_matches_pypi_tokenizers_in_gpt2_llama3_and_qwen2_styles,
     .timeout = 600) {
#if defined(__SANITIZE_ADDRESS__)
    /* millions of ids against PyPI's: the plain build checks them; the
     * sanitizers see the tokenizer in this file's other tests (SmolLM2's
     * Llama 3 style among them) and in its three fuzzers */
    cr_skip_test("ids against PyPI tokenizers are checked in the plain build (minutes under ASan)");
#endif
    const char *py = getenv("STRAIT_PYTHON"), *src = getenv("STRAIT_SRC");
    cr_assert(py && src, "run through make test (it builds build/venv with tokenizers)");
    char *files[1024];
    int n = fortunes_files(files, 1022);
    cr_assert_gt(n, 100, "the fortunes packages are installed by make deps");
    char *dir = harness_tmpdir("tokjson"), edge[700], script[700], err[ERR_LEN];
    snprintf(edge, sizeof edge, "%s/edge.txt", dir);
    cr_assert_eq(file_write_atomic(edge, EDGE, strlen(EDGE), 0644, err), 0);
    files[n++] = strdup(edge);
    snprintf(script, sizeof script, "%s/tests/python/bpe_reference.py", src);
    const char *styles[3] = {"gpt2", "llama3", "qwen2"};
    for (int s = 0; s < 3; s++) {
        char out[800], json[900], ids[900];
        snprintf(out, sizeof out, "%s/%s", dir, styles[s]);
        snprintf(json, sizeof json, "%s/tokenizer.json", out);
        snprintf(ids, sizeof ids, "%s/ids", out);
        char **argv = calloc((size_t)n + 8, sizeof *argv);
        argv[0] = (char *)py, argv[1] = script, argv[2] = "train-json", argv[3] = out;
        argv[4] = (char *)styles[s], argv[5] = "2000";
        for (int i = 0; i < 40; i++) argv[6 + i] = files[i * (n / 40)]; /* a spread to train on */
        ProcResult r = proc_run(argv);
        cr_assert_eq(r.status, 0, "tokenizers train: %s %s", r.out, r.err);
        proc_result_free(&r);
        memset(argv, 0, sizeof *argv * ((size_t)n + 8));
        argv[0] = (char *)py, argv[1] = script, argv[2] = "encode-json", argv[3] = json;
        argv[4] = ids;
        for (int i = 0; i < n; i++) argv[5 + i] = files[i];
        r = proc_run(argv);
        cr_assert_eq(r.status, 0, "tokenizers encode: %s %s", r.out, r.err);
        proc_result_free(&r);
        free(argv);
        Tokenizer *t = tokenizer_load_dir(out, err);
        cr_assert_not_null(t, "%s: %s", styles[s], err);
        int base = s == 2 ? 70000 : 0;
        cr_assert_eq(tokenizer_doc_start(t), base, "%s: the document marker is the first special",
                     styles[s]);
        cr_assert_gt(tokenizer_vocab_size(t), base + 2000);
        /* as GGUF's lists under llama.cpp's name, and back; then Strait's
         * tokenizer.json of that, encoded by tokenizers */
        static const char *pre_names[3] = {"gpt2", "llama-bpe", "qwen2"};
        TokenizerLists lists;
        cr_assert_eq(tokenizer_to_lists(t, &lists, err), 0, "%s: %s", styles[s], err);
        cr_assert_str_eq(lists.pre, pre_names[s]);
        Tokenizer *t2 = tokenizer_from_lists(&lists, err);
        cr_assert_not_null(t2, "%s: %s", styles[s], err);
        tokenizer_lists_free(&lists);
        char saved[900], saved_json[1000], saved_ids[1000];
        snprintf(saved, sizeof saved, "%s/strait", out);
        snprintf(saved_json, sizeof saved_json, "%s/tokenizer.json", saved);
        snprintf(saved_ids, sizeof saved_ids, "%s/ids", saved);
        cr_assert_eq(tokenizer_save_hf(t2, saved, err), 0, "%s", err);
        free(reference("encode-json", saved_json, saved_ids, NULL, NULL, files, n));
        size_t total = 0;
        for (int i = 0; i < n; i++) {
            char *text, *want, *want2, p[1100];
            size_t len, wlen, wlen2;
            cr_assert_eq(file_read_all(files[i], (size_t)1 << 30, &text, &len, err), 0, "%s", err);
            snprintf(p, sizeof p, "%s/%d.ids", ids, i);
            cr_assert_eq(file_read_all(p, (size_t)1 << 30, &want, &wlen, err), 0, "%s", err);
            snprintf(p, sizeof p, "%s/%d.ids", saved_ids, i);
            cr_assert_eq(file_read_all(p, (size_t)1 << 30, &want2, &wlen2, err), 0, "%s", err);
            cr_assert(wlen == wlen2 && memcmp(want, want2, wlen) == 0,
                      "%s, %s: tokenizers' ids differ with Strait's tokenizer.json", styles[s],
                      files[i]);
            free(want2);
            char *norm;
            size_t nlen;
            cr_assert_eq(tokenizer_normalize(t, text, len, &norm, &nlen, err), 0, "%s", err);
            cr_assert_eq(norm != NULL, s == 2, "only Qwen2's style normalizes (NFC)");
            if (norm) {
                if (strstr(files[i], "edge.txt"))
                    cr_assert_lt(nlen, len, "NFC composes the edge cases' combining marks");
                free(text), text = norm, len = nlen;
            }
            TokenBuf b = {0};
            cr_assert_eq(tokenizer_encode(t, text, len, &b, err), 0, "%s", err);
            size_t first = 0;
            while (first < b.n && first * 4 < wlen &&
                   memcmp(&b.ids[first], want + first * 4, 4) == 0)
                first++;
            cr_assert(b.n * 4 == wlen && first == b.n,
                      "%s, %s: %zu ids here, %zu from tokenizers; first difference at id %zu",
                      styles[s], files[i], b.n, wlen / 4, first);
            size_t at = 0;
            for (size_t k = 0; k < b.n; k++) {
                size_t bl;
                const uint8_t *bytes = tokenizer_decode(t, (int)b.ids[k], &bl);
                cr_assert(bytes && at + bl <= len && memcmp(text + at, bytes, bl) == 0,
                          "%s, %s: token %zu does not decode to the text", styles[s], files[i], k);
                at += bl;
            }
            cr_assert_eq(at, len);
            TokenBuf b2 = {0};
            cr_assert_eq(tokenizer_encode(t2, text, len, &b2, err), 0, "%s", err);
            cr_assert(b2.n == b.n && memcmp(b2.ids, b.ids, b.n * sizeof *b.ids) == 0,
                      "%s, %s: the tokenizer from its own lists encodes differently", styles[s],
                      files[i]);
            token_buf_free(&b2);
            total += b.n;
            token_buf_free(&b);
            free(text), free(want);
        }
        tokenizer_free(t), tokenizer_free(t2);
        fprintf(stderr, "tokenizer.json, %s style: %zu ids equal to tokenizers' on %d files\n",
                styles[s], total, n);
        if (s == 2) { /* the wide ids through strait tokenize into a shard */
            char shards[900], bin[1000];
            snprintf(shards, sizeof shards, "%s/shards", out);
            ProcResult tr =
                harness_strait("tokenize", "--tokenizer", out, "--out", shards, files[0]);
            cr_assert_eq(tr.status, 0, "%s %s", tr.out, tr.err);
            proc_result_free(&tr);
            snprintf(bin, sizeof bin, "%s/tokens_000000.bin", shards);
            TokenSet ts;
            const char *paths[1] = {bin};
            cr_assert_eq(tokens_load(&ts, paths, 1, err), 0, "%s", err);
            cr_assert_eq(ts.tokens[0], 70000, "a document opens with <|endoftext|>");
            cr_assert_gt(ts.vocab, 70000);
            tokens_free(&ts);
        }
    }
    for (int i = 0; i < n; i++) free(files[i]);
    harness_rmtree(dir);
    free(dir);
}

/* What Strait cannot compute exactly is refused, naming the setting. */
Test(tokenize, tokenizer_json_settings_strait_cannot_compute_are_refused) {
    static const char head[] =
        "{\"model\":{\"type\":\"BPE\",\"vocab\":%s,\"merges\":[]%s},"
        "\"pre_tokenizer\":{\"type\":\"%s\"},\"normalizer\":%s,\"added_tokens\":[%s]}";
    /* a vocabulary of the 256 bytes, in GPT-2's alphabet */
    char vocab[8192] = "{", *p = vocab + 1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        static int shift;
        if (b == 0) shift = 0;
        int cp = printable ? b : 256 + shift++;
        p += sprintf(p, "%s\"\\u%04x\":%d", b ? "," : "", cp, b);
    }
    strcpy(p, "}");
    static const struct {
        const char *extra, *pre, *norm, *added, *said;
    } cases[] = {
        {"", "ByteLevel", "null", "", NULL},
        {"", "ByteLevel", "{\"type\":\"NFC\"}", "", NULL},
        {"", "ByteLevel", "{\"type\":\"NFKC\"}", "", "normalizer NFKC"},
        {",\"byte_fallback\":true", "ByteLevel", "null", "", "byte_fallback"},
        {"", "Metaspace", "null", "", "pre_tokenizer Metaspace"},
        {"", "ByteLevel", "null", "{\"id\":256,\"content\":\"<x>\",\"special\":false}",
         "not special"},
        {"", "ByteLevel", "null", "{\"id\":9999999,\"content\":\"<x>\",\"special\":true}",
         "outside"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char *json = malloc(strlen(vocab) + 1024), err[ERR_LEN];
        sprintf(json, head, vocab, cases[k].extra, cases[k].pre, cases[k].norm, cases[k].added);
        Tokenizer *t = tokenizer_parse_json(json, strlen(json), err);
        if (cases[k].said == NULL) {
            cr_assert_not_null(t, "%s", err);
            tokenizer_free(t);
        } else {
            cr_assert_null(t, "case %zu accepted", k);
            cr_assert_not_null(strstr(err, cases[k].said), "case %zu: %s", k, err);
        }
        free(json);
    }
}

/* ---- vocabularies as they are: SmolLM2's, bytes without a token, GGUF's lists ---- */

/* Runs tests/python/bpe_reference.py with up to 4 arguments then files;
 * its stdout returned (malloc'd). */
static char *reference(const char *cmd, const char *a, const char *b, const char *c, const char *d,
                       char **files, int n) {
    const char *py = getenv("STRAIT_PYTHON"), *src = getenv("STRAIT_SRC");
    cr_assert(py && src, "run through make test (it builds build/venv with tokenizers)");
    char script[700];
    snprintf(script, sizeof script, "%s/tests/python/bpe_reference.py", src);
    char **argv = calloc((size_t)n + 8, sizeof *argv);
    int k = 0;
    argv[k++] = (char *)py, argv[k++] = script, argv[k++] = (char *)cmd;
    const char *args[4] = {a, b, c, d};
    for (int i = 0; i < 4 && args[i]; i++) argv[k++] = (char *)args[i];
    for (int i = 0; i < n; i++) argv[k++] = files[i];
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "bpe_reference.py %s: %s %s", cmd, r.out, r.err);
    char *out = strdup(r.out ? r.out : "");
    proc_result_free(&r);
    free(argv);
    return out;
}

/* GGUF's lists as bpe_reference.py gguf-lists writes them (read by the
 * gguf package) into a TokenizerLists, owned */
static TokenizerLists lists_read(const char *path) {
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    cr_assert_not_null(j, "%s: %s", path, je.text);
    TokenizerLists l = {0};
    json_t *toks = json_object_get(j, "tokens"), *types = json_object_get(j, "types");
    json_t *merges = json_object_get(j, "merges");
    l.n_tokens = (int)json_array_size(toks);
    l.tokens = calloc((size_t)l.n_tokens, sizeof *l.tokens);
    l.types = calloc((size_t)l.n_tokens, sizeof *l.types);
    for (int i = 0; i < l.n_tokens; i++) {
        l.tokens[i] = strdup(json_string_value(json_array_get(toks, (size_t)i)));
        l.types[i] = (int32_t)json_integer_value(json_array_get(types, (size_t)i));
    }
    l.n_merges = (int)json_array_size(merges);
    l.merges = calloc((size_t)l.n_merges, sizeof *l.merges);
    for (int i = 0; i < l.n_merges; i++)
        l.merges[i] = strdup(json_string_value(json_array_get(merges, (size_t)i)));
    l.pre = strdup(json_string_value(json_object_get(j, "pre")));
    l.bos = (int)json_integer_value(json_object_get(j, "bos"));
    l.eos = (int)json_integer_value(json_object_get(j, "eos"));
    l.unk = (int)json_integer_value(json_object_get(j, "unk"));
    l.pad = (int)json_integer_value(json_object_get(j, "pad"));
    const char *tpl = json_string_value(json_object_get(j, "chat_template"));
    l.chat_template = tpl ? strdup(tpl) : NULL;
    json_decref(j);
    return l;
}

/* two lists hold the same vocabulary, merges, pre-tokenizer and specials */
static void lists_assert_equal(const TokenizerLists *a, const TokenizerLists *b, const char *what) {
    cr_assert_eq(a->n_tokens, b->n_tokens, "%s: token count", what);
    for (int i = 0; i < a->n_tokens; i++) {
        cr_assert_str_eq(a->tokens[i], b->tokens[i], "%s: token %d", what, i);
        cr_assert_eq(a->types[i], b->types[i], "%s: type of token %d", what, i);
    }
    cr_assert_eq(a->n_merges, b->n_merges, "%s: merge count", what);
    for (int i = 0; i < a->n_merges; i++)
        cr_assert_str_eq(a->merges[i], b->merges[i], "%s: merge %d", what, i + 1);
    cr_assert_str_eq(a->pre, b->pre, "%s", what);
    cr_assert(a->bos == b->bos && a->eos == b->eos && a->unk == b->unk && a->pad == b->pad,
              "%s: special ids %d %d %d %d, %d %d %d %d", what, a->bos, a->eos, a->unk, a->pad,
              b->bos, b->eos, b->unk, b->pad);
    cr_assert((a->chat_template == NULL) == (b->chat_template == NULL), "%s: template", what);
    if (a->chat_template) cr_assert_str_eq(a->chat_template, b->chat_template, "%s", what);
}

static int utf8_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int extra = s[i] < 0x80             ? 0
                    : (s[i] & 0xe0) == 0xc0 ? 1
                    : (s[i] & 0xf0) == 0xe0 ? 2
                    : (s[i] & 0xf8) == 0xf0 ? 3
                                            : -1;
        if (extra < 0 || i + (size_t)extra >= n + (extra == 0)) return 0;
        for (int k = 1; k <= extra; k++)
            if (i + (size_t)k >= n || (s[i + k] & 0xc0) != 0x80) return 0;
        i += (size_t)extra + 1;
    }
    return 1;
}

/* t's ids for text equal the reference's (dir/<i>.ids); their bytes are
 * the text without the bytes t has no token for (unk_text: or that token
 * instead, for each), and, where they are UTF-8, tokenizers' decode of the
 * same ids (dir/<i>.txt). Returns the count of ids. */
static size_t assert_encodes_as_reference(Tokenizer *t, const char *text, size_t len,
                                          const char *dir, int i, const char *what) {
    char p[1000], *want, *dec, err[ERR_LEN];
    size_t wlen, dlen;
    snprintf(p, sizeof p, "%s/%d.ids", dir, i);
    cr_assert_eq(file_read_all(p, (size_t)1 << 30, &want, &wlen, err), 0, "%s", err);
    snprintf(p, sizeof p, "%s/%d.txt", dir, i);
    cr_assert_eq(file_read_all(p, (size_t)1 << 30, &dec, &dlen, err), 0, "%s", err);
    TokenBuf b = {0};
    cr_assert_eq(tokenizer_encode(t, text, len, &b, err), 0, "%s", err);
    size_t first = 0;
    while (first < b.n && first * 4 < wlen && memcmp(&b.ids[first], want + first * 4, 4) == 0)
        first++;
    cr_assert(b.n * 4 == wlen && first == b.n,
              "%s: %zu ids here, %zu from tokenizers; first difference at id %zu", what, b.n,
              wlen / 4, first);
    uint8_t *bytes = malloc(len * 8 + 64);
    size_t at = 0;
    for (size_t k = 0; k < b.n; k++) {
        size_t bl;
        const uint8_t *tb = tokenizer_decode(t, (int)b.ids[k], &bl);
        cr_assert_not_null(tb);
        memcpy(bytes + at, tb, bl);
        at += bl;
    }
    if (utf8_valid(bytes, at))
        cr_assert(at == dlen && memcmp(bytes, dec, at) == 0, "%s: decode differs from tokenizers'",
                  what);
    token_buf_free(&b);
    free(bytes), free(want), free(dec);
    return first;
}

/* the same text without the bytes t has no token for (malloc'd) */
static char *without_missing(const Tokenizer *t, const char *text, size_t len, size_t *out) {
    char *s = malloc(len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        if (tokenizer_byte_token(t, (uint8_t)text[i]) >= 0) s[n++] = text[i];
    *out = n;
    return s;
}

/* Bytes SmolLM2 has no token for (control bytes, 0xf1, 0xf2 as UTF-8 lead
 * bytes of planes 1..3), digits of every kind next to spaces (Digits
 * splits before GPT-2's pattern sees them: "  1" is not " ", " 1"),
 * fractions and numerals that are Unicode N but not decimal digits. */
static const char SMOL_EDGE[] =
    "a\x04"
    "b a\x04\x06"
    "b \x04\x04 !\x04?! x\x13\x13\x13 y\x14\x16\x1d z\n"
    "planes: \xf1\x80\x80\x80 \xf2\x80\x80\x81 ok\n"
    "  1  12 123  1234 x1y2z3 3.14159 1,000,000 -5 +7 #1 v2.0\n"
    "arabic \xd9\xa1\xd9\xa2\xd9\xa3 devanagari \xe0\xa5\xa7\xe0\xa5\xa8 "
    "fractions \xc2\xbd\xc2\xbc superscript x\xc2\xb2 roman \xe2\x85\xab \xe2\x91\xa0\n"
    "\t1\t 2\n3\n\n 4 \xc2\xa0"
    "5 \xe3\x80\x80"
    "6 ";

Test(tokenize,
     smollm2_vocabulary_from_its_gguf_lists_matches_pypi_tokenizers_on_every_fortunes_collection,
     .timeout = 900) {
    const char *gguf = getenv("STRAIT_SMOLLM2");
    struct stat st;
    if (gguf == NULL || stat(gguf, &st) != 0)
        cr_skip("SmolLM2's GGUF is not there (STRAIT_SMOLLM2; make models fetches it)");
    char *files[1024];
    int n = fortunes_files(files, 1021);
    cr_assert_gt(n, 100, "the fortunes packages are installed by make deps");
    char *dir = harness_tmpdir("smol"), path[1000], err[ERR_LEN];
    const char *edges[2] = {EDGE, SMOL_EDGE};
    for (int e = 0; e < 2; e++) {
        snprintf(path, sizeof path, "%s/edge%d.txt", dir, e);
        cr_assert_eq(file_write_atomic(path, edges[e], strlen(edges[e]), 0644, err), 0, "%s", err);
        files[n++] = strdup(path);
    }
    /* the lists, and tokenizers' own tokenizer from them */
    char *said = reference("gguf-lists", gguf, dir, NULL, NULL, NULL, 0);
    cr_assert_not_null(strstr(said,
                              "49152 tokens 48900 merges pre smollm; no token for 21 bytes: "
                              "04 06 13 14 16 1d c0 c1 f1 f2 f5 f6 f7 f8 f9 fa fb fc fd fe ff"),
                       "%s", said);
    free(said);
    snprintf(path, sizeof path, "%s/lists.json", dir);
    TokenizerLists lists = lists_read(path);
    Tokenizer *t = tokenizer_from_lists(&lists, err);
    cr_assert_not_null(t, "%s", err);
    int missing = 0;
    for (int b = 0; b < 256; b++) missing += tokenizer_byte_token(t, b) < 0;
    cr_assert_eq(missing, 21);
    int bos, eos, unk, pad;
    const char *tpl;
    tokenizer_special(t, &bos, &eos, &unk, &pad, &tpl);
    cr_assert(bos == 1 && eos == 2 && unk == 0 && pad == 2, "%d %d %d %d", bos, eos, unk, pad);
    cr_assert(tpl && strstr(tpl, "<|im_start|>"), "SmolLM2's chat template");
    cr_assert_eq(tokenizer_doc_start(t), 0, "<|endoftext|> opens a document");

    /* Strait's Hugging Face files, and tokenizers' ids with both tokenizers */
    char ref[900], ref_ids[900], out[900], out_ids[900];
    snprintf(ref, sizeof ref, "%s/ref/tokenizer.json", dir);
    snprintf(ref_ids, sizeof ref_ids, "%s/ref_ids", dir);
    snprintf(out, sizeof out, "%s/strait", dir);
    snprintf(out_ids, sizeof out_ids, "%s/strait_ids", dir);
    cr_assert_eq(tokenizer_save_hf(t, out, err), 0, "%s", err);
    free(reference("encode-json", ref, ref_ids, NULL, NULL, files, n));
    snprintf(path, sizeof path, "%s/tokenizer.json", out);
    free(reference("encode-json", path, out_ids, NULL, NULL, files, n));

    /* read back: Strait's files give the same lists (tokenizer_config.json's specials too) */
    TokenizerLists back;
    cr_assert_eq(tokenizer_to_lists(t, &back, err), 0, "%s", err);
    lists_assert_equal(&lists, &back, "to_lists of from_lists");
    tokenizer_lists_free(&back);
    Tokenizer *saved = tokenizer_load_dir(out, err);
    cr_assert_not_null(saved, "%s", err);
    cr_assert_eq(tokenizer_to_lists(saved, &back, err), 0, "%s", err);
    lists_assert_equal(&lists, &back, "to_lists of tokenizer_save_hf's files");
    tokenizer_lists_free(&back);

    size_t total = 0;
    for (int i = 0; i < n; i++) {
        char *text, what[900];
        size_t len;
        cr_assert_eq(file_read_all(files[i], (size_t)1 << 30, &text, &len, err), 0, "%s", err);
        snprintf(what, sizeof what, "SmolLM2 (GGUF lists), %s", files[i]);
        total += assert_encodes_as_reference(t, text, len, ref_ids, i, what);
        snprintf(what, sizeof what, "tokenizers on Strait's tokenizer.json, %s", files[i]);
        assert_encodes_as_reference(t, text, len, out_ids, i, what);
        snprintf(what, sizeof what, "Strait's tokenizer.json read back, %s", files[i]);
        assert_encodes_as_reference(saved, text, len, ref_ids, i, what);
        free(text);
    }
    fprintf(stderr, "SmolLM2: %zu ids equal to tokenizers' on %d files\n", total, n);

    /* strait tokenize on Strait's folder: the same ids, each file opened by <|endoftext|> */
    char shards[900];
    snprintf(shards, sizeof shards, "%s/shards", dir);
    char **targv = calloc((size_t)n + 10, sizeof *targv);
    int k = 0;
    targv[k++] = (char *)harness_strait_bin(), targv[k++] = "tokenize";
    targv[k++] = "--tokenizer", targv[k++] = out, targv[k++] = "--out", targv[k++] = shards;
    targv[k++] = "--shard-tokens", targv[k++] = "100000000";
    for (int i = 0; i < n; i++) targv[k++] = files[i];
    ProcResult r = proc_run(targv);
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    snprintf(path, sizeof path, "%s/tokens_000000.bin", shards);
    const char *paths[1] = {path};
    TokenSet ts;
    cr_assert_eq(tokens_load(&ts, paths, 1, err), 0, "%s", err);
    cr_assert_eq(ts.n, total + (size_t)n, "every id, and one <|endoftext|> a file");
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        char p[1000], *want;
        size_t wlen;
        snprintf(p, sizeof p, "%s/%d.ids", ref_ids, i);
        cr_assert_eq(file_read_all(p, (size_t)1 << 30, &want, &wlen, err), 0, "%s", err);
        cr_assert_eq(ts.tokens[at++], 0);
        for (size_t j = 0; j < wlen / 4; j++) {
            uint32_t id;
            memcpy(&id, want + j * 4, 4);
            cr_assert_eq(ts.tokens[at], id, "strait tokenize, %s: id %zu", files[i], j);
            at++;
        }
        free(want);
    }
    tokens_free(&ts);
    free(targv);
    tokenizer_free(saved);
    tokenizer_free(t);
    tokenizer_lists_free(&lists);
    for (int i = 0; i < n; i++) free(files[i]);
    harness_rmtree(dir);
    free(dir);
}

/* A vocabulary without tokens for 0x04, 0x06, 0x13 and 0xf1, with and
 * without model.unk_token (and fuse_unk): the byte is dropped and its
 * neighbours merge as if it were not there, or it becomes <unk> (one for a
 * run, fused), which merges too — the ids and the decode of tokenizers. */
Test(tokenize, a_byte_without_a_token_is_dropped_or_unk_as_pypi_tokenizers_does) {
    static const char *cases[] = {
        "a\x04"
        "b",
        "a\x04\x06"
        "b",
        "\x04\x04",
        "!\x04?",
        "!\x04\x06?!",
        "\x04!?!",
        "!?\x04!",
        "x\x13\x13\x13 y\x04",
        "ab\x06"
        "ab\x13",
        "\xf1\x80\x80\x80 ok",
        "plain text",
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    char *dir = harness_tmpdir("tokmissing"), *files[16], err[ERR_LEN];
    for (int i = 0; i < n; i++) {
        char p[800];
        snprintf(p, sizeof p, "%s/case%d.txt", dir, i);
        cr_assert_eq(file_write_atomic(p, cases[i], strlen(cases[i]), 0644, err), 0);
        files[i] = strdup(p);
    }
    static const struct {
        const char *unk, *fuse;
    } variants[] = {{"0", "0"}, {"1", "0"}, {"1", "1"}};
    for (size_t v = 0; v < 3; v++) {
        char out[800], ids[900], json[900];
        snprintf(out, sizeof out, "%s/v%zu", dir, v);
        snprintf(ids, sizeof ids, "%s/ids", out);
        snprintf(json, sizeof json, "%s/tokenizer.json", out);
        free(reference("missing-json", out, variants[v].unk, variants[v].fuse, NULL, NULL, 0));
        free(reference("encode-json", json, ids, NULL, NULL, files, n));
        Tokenizer *t = tokenizer_load_dir(out, err);
        cr_assert_not_null(t, "%s", err);
        for (int i = 0; i < n; i++) {
            char what[300];
            snprintf(what, sizeof what, "unk %s fuse %s, case %d", variants[v].unk,
                     variants[v].fuse, i);
            assert_encodes_as_reference(t, cases[i], strlen(cases[i]), ids, i, what);
        }
        if (v == 0) { /* dropped: the bytes are the text without them */
            TokenBuf b = {0};
            const char *text = cases[9];
            cr_assert_eq(tokenizer_encode(t, text, strlen(text), &b, err), 0);
            size_t wl, at = 0;
            char *want = without_missing(t, text, strlen(text), &wl);
            for (size_t k = 0; k < b.n; k++) {
                size_t bl;
                const uint8_t *tb = tokenizer_decode(t, (int)b.ids[k], &bl);
                cr_assert(at + bl <= wl && memcmp(want + at, tb, bl) == 0);
                at += bl;
            }
            cr_assert_eq(at, wl);
            free(want);
            token_buf_free(&b);
        } else { /* GGUF's lists cannot say that bytes become <unk> */
            TokenizerLists l;
            cr_assert_eq(tokenizer_to_lists(t, &l, err), -1);
            cr_assert_not_null(strstr(err, "unk_token"), "%s", err);
        }
        tokenizer_free(t);
    }
    for (int i = 0; i < n; i++) free(files[i]);
    harness_rmtree(dir);
    free(dir);
}

/* tokenizer_config.json's special tokens as strings or {"content": ...},
 * a chat template from a list or from chat_template.jinja (which wins),
 * and a token the vocabulary lacks left unknown (a legacy folder's pad
 * from added_tokens.json, which is not read, must not refuse the folder). */
Test(tokenize, special_tokens_and_chat_template_come_from_tokenizer_config_json) {
    char *dir = harness_tmpdir("tokconfig"), p[800], err[ERR_LEN];
    free(reference("missing-json", dir, "1", "0", NULL, NULL, 0));
    static const char config[] =
        "{\"bos_token\":\"a\",\"eos_token\":{\"content\":\"<unk>\",\"lstrip\":false},"
        "\"unk_token\":\"<unk>\",\"pad_token\":null,"
        "\"model_max_length\":1000000000000000019884624838656," /* transformers 5's "none" */
        "\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"T\"},"
        "{\"name\":\"default\",\"template\":\"{{ messages }}\"}]}";
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    cr_assert_eq(file_write_atomic(p, config, strlen(config), 0644, err), 0);
    Tokenizer *t = tokenizer_load_dir(dir, err);
    cr_assert_not_null(t, "%s", err);
    int bos, eos, unk, pad;
    const char *tpl;
    tokenizer_special(t, &bos, &eos, &unk, &pad, &tpl);
    cr_assert(bos == 'a' + 1 - 3 && eos == 0 && unk == 0 && pad == -1, "%d %d %d %d", bos, eos, unk,
              pad); /* "a": byte 0x61, after <unk> and 0x04, 0x06 missing */
    cr_assert_str_eq(tpl, "{{ messages }}");
    tokenizer_free(t);
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    cr_assert_eq(file_write_atomic(p, "{{ jinja }}", 11, 0644, err), 0);
    t = tokenizer_load_dir(dir, err);
    cr_assert_not_null(t, "%s", err);
    tokenizer_special(t, NULL, NULL, NULL, NULL, &tpl);
    cr_assert_str_eq(tpl, "{{ jinja }}");
    /* the specials travel through Strait's files */
    char out[900];
    snprintf(out, sizeof out, "%s/out", dir);
    cr_assert_eq(tokenizer_save_hf(t, out, err), 0, "%s", err);
    tokenizer_free(t);
    t = tokenizer_load_dir(out, err);
    cr_assert_not_null(t, "%s", err);
    tokenizer_special(t, &bos, &eos, &unk, &pad, &tpl);
    cr_assert(bos == 'a' + 1 - 3 && eos == 0 && unk == 0 && pad == -1);
    cr_assert_str_eq(tpl, "{{ jinja }}");
    tokenizer_free(t);
    static const char bad[] = "{\"eos_token\":\"<|im_end|>\"}";
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    cr_assert_eq(file_write_atomic(p, bad, strlen(bad), 0644, err), 0);
    t = tokenizer_load_dir(dir, err); /* a legacy folder's token only added_tokens.json has */
    cr_assert_not_null(t, "%s", err);
    tokenizer_special(t, &bos, &eos, &unk, &pad, &tpl);
    cr_assert_eq(eos, -1, "an eos the vocabulary lacks is left unknown, not %d", eos);
    tokenizer_free(t);
    harness_rmtree(dir);
    free(dir);
}

/* GGUF's lists that Strait cannot compute exactly are refused by name. */
Test(tokenize, gguf_lists_strait_cannot_compute_are_refused_by_name) {
    char *tokens[260], *merges[1] = {"a b"}, err[ERR_LEN];
    int32_t types[260];
    int n = 0;
    for (int b = 0; b < 256; b++) { /* the 256 bytes in GPT-2's alphabet */
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        static unsigned shift;
        if (b == 0) shift = 0;
        unsigned cp = printable ? (unsigned)b : 256u + shift++;
        char u[4] = {0};
        if (cp < 0x80)
            u[0] = (char)cp;
        else
            u[0] = (char)(0xc0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3f));
        tokens[n] = strdup(u), types[n++] = 1;
    }
    tokens[n] = strdup("ab"), types[n++] = 1;
    tokens[n] = strdup("<|endoftext|>"), types[n++] = 3;
    TokenizerLists l = {tokens, n, types, merges, 1, "smollm", -1, n - 1, -1, -1, NULL};
    Tokenizer *t = tokenizer_from_lists(&l, err);
    cr_assert_not_null(t, "%s", err);
    TokenBuf b = {0};
    cr_assert_eq(tokenizer_encode(t, "ab12<|endoftext|>", 17, &b, err), 0);
    uint32_t want[] = {256, '1', '2', '<', '|', 'e', 'n', 'd',
                       'o', 'f', 't', 'e', 'x', 't', '|', '>'};
    cr_assert_eq(b.n, 16, "a control token is never produced from text: %zu ids", b.n);
    cr_assert_arr_eq(b.ids, want, sizeof want);
    token_buf_free(&b);
    tokenizer_free(t);
    static const struct {
        const char *pre;
        int type_at, type, eos;
        const char *said;
    } cases[] = {
        {"deepseek-llm", -1, 0, -1, "tokenizer.ggml.pre \"deepseek-llm\""},
        {NULL, -1, 0, -1, "(missing)"},
        {"gpt2", 65, 6, -1, "byte token"},
        {"gpt2", 65, 9, -1, "type 9"},
        {"gpt2", 32, 3, -1, "no token for byte 0x20"},
        {"gpt2", -1, 0, 9999, "eos_token_id 9999"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        TokenizerLists c = l;
        int32_t ctypes[260];
        memcpy(ctypes, types, sizeof ctypes);
        if (cases[k].type_at >= 0) ctypes[cases[k].type_at] = cases[k].type;
        c.types = ctypes, c.pre = (char *)cases[k].pre, c.eos = cases[k].eos;
        cr_assert_null(tokenizer_from_lists(&c, err), "case %zu accepted", k);
        cr_assert_not_null(strstr(err, cases[k].said), "case %zu: %s", k, err);
    }
    /* a pre-tokenization llama.cpp has no name for is not written as lists */
    json_t *vocab = json_object();
    for (int i = 0; i < n - 1; i++) json_object_set_new(vocab, tokens[i], json_integer(i));
    json_t *j = json_pack("{s:{s:s, s:o, s:[]}, s:{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s, s:b}]}}",
                          "model", "type", "BPE", "vocab", vocab, "merges", "pre_tokenizer", "type",
                          "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex", "\\s+",
                          "behavior", "Isolated", "type", "ByteLevel", "use_regex", 0);
    char *text = json_dumps(j, 0);
    t = tokenizer_parse_json(text, strlen(text), err);
    cr_assert_not_null(t, "%s", err);
    TokenizerLists out;
    cr_assert_eq(tokenizer_to_lists(t, &out, err), -1);
    cr_assert_not_null(strstr(err, "no llama.cpp name"), "%s", err);
    tokenizer_free(t);
    free(text);
    json_decref(j);
    t = tokenizer_from_lists(&l, err);
    cr_assert_eq(tokenizer_to_lists(t, &out, err), 0, "%s", err);
    cr_assert_str_eq(out.pre, "smollm");
    cr_assert_eq(out.types[n - 1], 3);
    cr_assert_str_eq(out.tokens[n - 1], "<|endoftext|>");
    tokenizer_lists_free(&out);
    tokenizer_free(t);
    /* an older name of Llama 3's is read, and written back as llama-bpe */
    l.pre = "llama3";
    t = tokenizer_from_lists(&l, err);
    cr_assert_not_null(t, "%s", err);
    cr_assert_eq(tokenizer_to_lists(t, &out, err), 0, "%s", err);
    cr_assert_str_eq(out.pre, "llama-bpe");
    tokenizer_lists_free(&out);
    tokenizer_free(t);
    for (int i = 0; i < n; i++) free(tokens[i]);
}
