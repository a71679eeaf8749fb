/*
 * test_tokenize.c — Strait's GPT-2 BPE against PyPI's `tokenizers` (in
 * build/venv): a byte-level BPE of 2000 merges trained by `tokenizers` on
 * Debian's fortunes, then every fortunes collection and a file of Unicode
 * edge cases encoded by both — the same ids, and decode(encode(x)) == x;
 * `strait tokenize` writes those ids into llm.c shards; `strait sample`
 * speaks BPE; bad vocabularies and merges are refused by name.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <criterion/criterion.h>

#include "kernels/model.h"
#include "kernels/data.h"
#include "kernels/tokenizer.h"
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
    cr_assert_not_null(strstr(e, "merges into a token vocab.json does not have"), "%s", e);
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
 * the normalized text), and `strait
 * tokenize` writes the wide ids into a version-2 shard. */
Test(tokenize, tokenizer_json_matches_pypi_tokenizers_in_gpt2_llama3_and_qwen2_styles,
     .timeout = 600) {
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
        size_t total = 0;
        for (int i = 0; i < n; i++) {
            char *text, *want, p[1000];
            size_t len, wlen;
            cr_assert_eq(file_read_all(files[i], (size_t)1 << 30, &text, &len, err), 0, "%s", err);
            snprintf(p, sizeof p, "%s/%d.ids", ids, i);
            cr_assert_eq(file_read_all(p, (size_t)1 << 30, &want, &wlen, err), 0, "%s", err);
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
            total += b.n;
            token_buf_free(&b);
            free(text), free(want);
        }
        tokenizer_free(t);
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
