/*
 * federated.c — the federation against the baseline it must match: `strait
 * demo` (4 site processes over mutual TLS, DiLoCo rounds of H local steps,
 * int8 and top-k updates) beside two centralized `strait train` runs on the
 * same twelve fortune collections with the same number of tokens, in the
 * same run: one at the sites' batch of 8 (four times a site's sequential
 * steps), and the data-parallel one (batch 32, a site's steps) that dense
 * per-step all-reduce among the four sites would compute. Every final model
 * is scored on the same held-out collections. Figures: validation loss of
 * each and the ratios, bytes the sites sent against dense fp32 exchange at
 * every step, wall time.
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
    double loss;
    char err[ERR_LEN];
    if (gpt_eval_checkpoint(ckpt, paths, 2, 8, 128, 16, &loss, err) != 0) DIE("%s", err);
    return loss;
}

/* `strait train` of small on the twelve collections; its held-out loss. */
static void train_baseline(const char *dir, const char *name, int steps, int batch,
                           char paths[12][256], double *loss, double *wall_s) {
    char out[1300], steps_s[32], batch_s[32];
    snprintf(out, sizeof out, "%s/%s.safetensors", dir, name);
    snprintf(steps_s, sizeof steps_s, "%d", steps);
    snprintf(batch_s, sizeof batch_s, "%d", batch);
    char *targv[48] = {strait_bin, "train", "--model", "small",       "--steps", steps_s, "--batch",
                       batch_s,    "--seq", "128",     "--val-every", "1000000", "--out", out};
    int a = 14;
    for (int i = 0; i < 12; i++) targv[a++] = "--data", targv[a++] = paths[i];
    targv[a] = NULL;
    uint64_t t0 = time_monotonic_ns();
    if (run(targv) != 0) DIE("strait train (%s) failed", name);
    *wall_s = (double)(time_monotonic_ns() - t0) / 1e9;
    *loss = held_out_loss(out);
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

    /* the baselines, on the same collections and tokens, one process each:
     * centralized training at the sites' batch (4x the sequential steps of
     * a site), and the data-parallel run that dense per-step all-reduce
     * across the sites computes (the sites' batches as one, a site's number
     * of steps) — what the bytes are compared with */
    static const char *const english[] = {"fortunes", "literature", "wisdom",    "science",
                                          "people",   "politics",   "computers", "humorists",
                                          "love",     "work",       "education", "men-women"};
    char paths[12][256];
    for (int i = 0; i < 12; i++) snprintf(paths[i], sizeof paths[i], FORTUNES "%s", english[i]);
    double central_loss, central_wall, dp_loss, dp_wall;
    train_baseline(dir, "central", SITES * rounds * steps, 8, paths, &central_loss, &central_wall);
    train_baseline(dir, "dataparallel", rounds * steps, 8 * SITES, paths, &dp_loss, &dp_wall);
    uint64_t t0;

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
        json_object_set_new(o, "dataparallel_val_loss", json_real(dp_loss));
        json_object_set_new(o, "dataparallel_loss_ratio", json_real(loss / dp_loss));
        json_object_set_new(o, "bytes_sent", json_integer((json_int_t)sent));
        json_object_set_new(o, "dense_bytes", json_real(dense));
        json_object_set_new(o, "bytes_ratio", json_real((double)sent / dense));
        json_object_set_new(o, "wall_s", json_real(wall));
        json_object_set_new(o, "central_wall_s", json_real(central_wall));
        json_object_set_new(o, "dataparallel_wall_s", json_real(dp_wall));
        json_emit_line(stdout, o);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
}
