/*
 * federated.c — the federation against the baseline it must match: `strait
 * demo` (4 site processes over mutual TLS, DiLoCo rounds of H local steps,
 * int8 and top-k updates) beside a centralized `strait train` on the same
 * twelve fortune collections with the same number of tokens, in the same
 * run. Both final models are scored on the same held-out collections.
 * Figures: validation loss of each and their ratio, bytes the sites sent
 * against dense fp32 exchange at every step, wall time.
 *
 *   build/bench/federated [--full]   5 rounds of 25 steps (20 of 50 with --full)
 */
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coordinator/store.h"
#include "kernels/kernels.h"
#include "util/util.h"

#define FORTUNES "/usr/share/games/fortunes/"
#define SITES    4

static char strait_bin[1200];

static int run(char *const argv[]) {
    pid_t pid = fork();
    if (pid == 0) {
        FILE *null = freopen("/dev/null", "w", stdout);
        (void)null;
        execv(argv[0], argv);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Mean loss of a checkpoint over held-out collections neither run trained on. */
static double held_out_loss(const char *ckpt) {
    const char *paths[] = {FORTUNES "platitudes", FORTUNES "miscellaneous"};
    TokenSet ts;
    char err[ERR_LEN];
    if (tokens_load(&ts, paths, 2, err) != 0) DIE("%s", err);
    GPTConfig cfg;
    GPT m;
    if (gpt_read_config(ckpt, &cfg, NULL, err) != 0 || gpt_build(&m, &cfg, 0, err) != 0 ||
        gpt_load(&m, ckpt, NULL, err) != 0)
        DIE("%s", err);
    TokenView all = {ts.tokens, ts.n};
    Loader ld;
    int B = 8, T = 128, batches = 16;
    if (loader_init(&ld, all, B, T, 0, 1, 0, err) != 0) DIE("%s", err);
    ld.pos = 0;
    int *in = mallocCheck(sizeof(int) * B * T), *tg = mallocCheck(sizeof(int) * B * T);
    double s = 0;
    for (int k = 0; k < batches; k++) {
        loader_next(&ld, in, tg);
        s += gpt_forward(&m, in, tg, B, T);
    }
    free(in), free(tg);
    gpt_free(&m);
    tokens_free(&ts);
    return s / batches;
}

int main(int argc, char **argv) {
    int full = argc > 1 && strcmp(argv[1], "--full") == 0;
    int rounds = full ? 20 : 5, steps = full ? 50 : 25;
    log_set_level(LOG_ERROR);
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) DIE("cannot find this program");
    self[n] = '\0';
    snprintf(strait_bin, sizeof strait_bin, "%s/../strait", dirname(self));
    if (access(strait_bin, X_OK) != 0) DIE("no strait binary at %s", strait_bin);
    char dir[] = "/tmp/strait-bench-fed-XXXXXX";
    if (mkdtemp(dir) == NULL) DIE("mkdtemp");
    kernels_set_threads(0);

    /* the centralized baseline: the same collections and tokens, one process */
    static const char *const english[] = {"fortunes", "literature", "wisdom",    "science",
                                          "people",   "politics",   "computers", "humorists",
                                          "love",     "work",       "education", "men-women"};
    char central[1300], steps_s[32], paths[12][256];
    snprintf(central, sizeof central, "%s/central.safetensors", dir);
    snprintf(steps_s, sizeof steps_s, "%d", SITES * rounds * steps);
    char *targv[48] = {strait_bin, "train", "--model", "small",       "--steps", steps_s, "--batch",
                       "8",        "--seq", "128",     "--val-every", "1000000", "--out", central};
    int a = 14;
    for (int i = 0; i < 12; i++) {
        snprintf(paths[i], sizeof paths[i], FORTUNES "%s", english[i]);
        targv[a++] = "--data", targv[a++] = paths[i];
    }
    targv[a] = NULL;
    uint64_t t0 = time_monotonic_ns();
    if (run(targv) != 0) DIE("strait train failed");
    double central_wall = (double)(time_monotonic_ns() - t0) / 1e9;
    double central_loss = held_out_loss(central);

    const char *codecs[] = {"int8", "topk"};
    for (int c = 0; c < 2; c++) {
        char fdir[1300], rounds_s[16], h_s[16];
        snprintf(fdir, sizeof fdir, "%s/%s", dir, codecs[c]);
        snprintf(rounds_s, sizeof rounds_s, "%d", rounds);
        snprintf(h_s, sizeof h_s, "%d", steps);
        char *dargv[] = {strait_bin, "demo", "--sites", "4",     "--rounds", rounds_s,
                         "--steps",  h_s,    "--model", "small", "--codec",  (char *)codecs[c],
                         "--dir",    fdir,   NULL};
        t0 = time_monotonic_ns();
        if (run(dargv) != 0) DIE("strait demo failed (%s); see %s", codecs[c], fdir);
        double wall = (double)(time_monotonic_ns() - t0) / 1e9;
        char db[1400], err[ERR_LEN];
        snprintf(db, sizeof db, "%s/fed/%s", fdir, STORE_DB_FILE);
        Store *s = store_open(db, STORE_READONLY, err);
        if (s == NULL) DIE("%s", err);
        int64_t sent = 0;
        StoreRound last = {0};
        for (int r = 0; r < rounds; r++) {
            if (store_round_get(s, r, &last, err) != 0) DIE("round %d missing", r);
            sent += last.bytes_up;
        }
        store_close(s);
        char ckpt[2000];
        snprintf(ckpt, sizeof ckpt, "%s/fed/%s", fdir, last.checkpoint_path);
        double loss = held_out_loss(ckpt);
        GPTConfig cfg;
        gpt_config_preset("small", &cfg);
        GPT m;
        gpt_build(&m, &cfg, 0, err);
        double dense = (double)SITES * rounds * steps * 4.0 * (double)m.n_params;
        gpt_free(&m);
        json_t *o = json_object();
        json_object_set_new(o, "bench", json_string("federated"));
        json_object_set_new(o, "case", json_string(codecs[c]));
        json_object_set_new(o, "codec", json_string(codecs[c]));
        json_object_set_new(o, "sites", json_integer(SITES));
        json_object_set_new(o, "rounds", json_integer(rounds));
        json_object_set_new(o, "inner_steps", json_integer(steps));
        json_object_set_new(o, "val_loss", json_real(loss));
        json_object_set_new(o, "central_val_loss", json_real(central_loss));
        json_object_set_new(o, "loss_ratio", json_real(loss / central_loss));
        json_object_set_new(o, "bytes_sent", json_integer((json_int_t)sent));
        json_object_set_new(o, "dense_bytes", json_real(dense));
        json_object_set_new(o, "bytes_ratio", json_real((double)sent / dense));
        json_object_set_new(o, "wall_s", json_real(wall));
        json_object_set_new(o, "central_wall_s", json_real(central_wall));
        json_emit_line(stdout, o);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
}
