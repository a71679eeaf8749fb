/*
 * federated.c — the federation against the baselines it must match, per
 * recipe (fedavg: fp32 up, exact model down; diloco: int8 both ways;
 * sparseloco: top-k with 2-bit values both ways) and per data split (IID:
 * disjoint English collections; non-IID: one language per site). Each run
 * is one `strait demo --baseline` (site processes over mutual TLS, the
 * coordinator, then a centralized and a data-parallel run of the one
 * trainer (kernels/train.h) inside the demo, on the same collections and
 * tokens, every model scored on held-out collections
 * no site trained on), at fixed seeds; its DIR/summary.json holds the
 * figures. Per case: the mean and spread over seeds of the global model's
 * held-out loss and its ratio to both baselines; bytes up, down and in all
 * against dense data-parallel exchange (docs/communication.md); and what
 * exchanging the same updates peer to peer would have moved.
 *
 *   build/bench/federated [--full] [--model M] [--sites N] [--rounds R]
 *                         [--steps H] [--seeds K] [--recipe NAME]
 *
 * Defaults: tiny, 4 sites, 10 rounds of 50 steps, 1 seed (--full: small,
 * 20 rounds, 3 seeds).
 */
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/util.h"

static char strait_bin[1200];

static int run(char *const argv[], const char *log) {
    unlink(log); /* each run's log alone */
    int pid = proc_start(argv, &(ProcIo){.log = log});
    return pid < 0 ? -1 : proc_wait(pid);
}

typedef struct Stat {
    double sum, min, max;
    int n;
} Stat;

static void stat_add(Stat *s, double x) {
    if (s->n == 0 || x < s->min) s->min = x;
    if (s->n == 0 || x > s->max) s->max = x;
    s->sum += x, s->n++;
}

static json_t *stat_json(const Stat *s) {
    json_t *o = json_object();
    json_object_set_new(o, "mean", json_real(s->n ? s->sum / s->n : NAN));
    json_object_set_new(o, "min", json_real(s->min));
    json_object_set_new(o, "max", json_real(s->max));
    return o;
}

static double num(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) DIE("summary without %s", key);
    return json_number_value(v);
}

int main(int argc, char **argv) {
    int sites = 4, rounds = 10, steps = 50, seeds = 1;
    const char *model = "tiny", *only = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--full") == 0)
            model = "small", rounds = 20, seeds = 3;
        else if (strcmp(a, "--model") == 0 && v)
            model = v, i++;
        else if (strcmp(a, "--sites") == 0 && v)
            sites = atoi(v), i++;
        else if (strcmp(a, "--rounds") == 0 && v)
            rounds = atoi(v), i++;
        else if (strcmp(a, "--steps") == 0 && v)
            steps = atoi(v), i++;
        else if (strcmp(a, "--seeds") == 0 && v)
            seeds = atoi(v), i++;
        else if (strcmp(a, "--recipe") == 0 && v)
            only = v, i++;
        else
            DIE("usage: federated [--full] [--model M] [--sites N] [--rounds R] [--steps H] "
                "[--seeds K] [--recipe NAME]");
    }
    if (sites < 2 || rounds < 1 || steps < 1 || seeds < 1)
        DIE("sizes must be positive, sites >= 2");
    log_set_level(LOG_ERROR);
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) DIE("cannot find this program");
    self[n] = '\0';
    snprintf(strait_bin, sizeof strait_bin, "%s/../strait", dirname(self));
    if (access(strait_bin, X_OK) != 0) DIE("no strait binary at %s", strait_bin);
    char dir[] = "/tmp/strait-bench-fed-XXXXXX";
    if (mkdtemp(dir) == NULL) DIE("mkdtemp");

    const char *recipes[] = {"fedavg", "diloco", "sparseloco"};
    char sites_s[16], rounds_s[16], steps_s[16];
    snprintf(sites_s, sizeof sites_s, "%d", sites);
    snprintf(rounds_s, sizeof rounds_s, "%d", rounds);
    snprintf(steps_s, sizeof steps_s, "%d", steps);
    for (int c = 0; c < 3; c++) {
        if (only && strcmp(only, recipes[c]) != 0) continue;
        for (int non_iid = 0; non_iid < 2; non_iid++) {
            Stat val = {0}, central = {0}, dp = {0}, vs_central = {0}, vs_dp = {0}, wall = {0};
            json_t *last = NULL;
            for (int seed = 1; seed <= seeds; seed++) {
                char run_dir[1200], log[1300], seed_s[16];
                snprintf(run_dir, sizeof run_dir, "%s/%s-%d-%d", dir, recipes[c], non_iid, seed);
                snprintf(log, sizeof log, "%s.log", run_dir);
                snprintf(seed_s, sizeof seed_s, "%d", 100 * seed);
                char *dargv[] = {strait_bin,    "demo",     "--model",
                                 (char *)model, "--sites",  sites_s,
                                 "--rounds",    rounds_s,   "--steps",
                                 steps_s,       "--recipe", (char *)recipes[c],
                                 "--seed",      seed_s,     "--baseline",
                                 "--dir",       run_dir,    non_iid ? "--non-iid" : NULL,
                                 NULL};
                if (run(dargv, log) != 0) DIE("strait demo failed; see %s", log);
                char path[1300];
                json_error_t je;
                snprintf(path, sizeof path, "%s/summary.json", run_dir);
                json_t *o = json_load_file(path, 0, &je);
                if (o == NULL) DIE("%s: %s", path, je.text);
                double v = num(o, "val_loss"), ce = num(o, "central_val_loss"),
                       d = num(o, "dataparallel_val_loss");
                stat_add(&val, v), stat_add(&central, ce), stat_add(&dp, d);
                stat_add(&vs_central, v / ce), stat_add(&vs_dp, v / d);
                stat_add(&wall, num(o, "wall_s"));
                if (last) json_decref(last);
                last = o; /* bytes are the same to within the zstd stage across seeds */
            }
            double up = num(last, "bytes_up"), down = num(last, "bytes_down"),
                   dense = num(last, "dense_bytes"), p2p = num(last, "p2p_bytes");
            json_t *o = json_object();
            json_object_set_new(o, "bench", json_string("federated"));
            char name[64];
            snprintf(name, sizeof name, "%s-%s", recipes[c], non_iid ? "non-iid" : "iid");
            json_object_set_new(o, "case", json_string(name));
            json_object_set_new(o, "recipe", json_string(recipes[c]));
            json_object_set_new(o, "non_iid", json_boolean(non_iid));
            json_object_set_new(o, "model", json_string(model));
            json_object_set_new(o, "sites", json_integer(sites));
            json_object_set_new(o, "rounds", json_integer(rounds));
            json_object_set_new(o, "inner_steps", json_integer(steps));
            json_object_set_new(o, "seeds", json_integer(seeds));
            json_object_set_new(o, "val_loss", stat_json(&val));
            json_object_set_new(o, "central_val_loss", stat_json(&central));
            json_object_set_new(o, "dataparallel_val_loss", stat_json(&dp));
            json_object_set_new(o, "loss_ratio_central", stat_json(&vs_central));
            json_object_set_new(o, "loss_ratio_dataparallel", stat_json(&vs_dp));
            json_object_set_new(o, "bytes_up", json_integer((json_int_t)up));
            json_object_set_new(o, "bytes_down", json_integer((json_int_t)down));
            json_object_set_new(o, "bytes_total", json_integer((json_int_t)(up + down)));
            json_object_set_new(o, "bytes_rejected",
                                json_integer((json_int_t)num(last, "bytes_rejected")));
            json_object_set_new(o, "dense_bytes", json_integer((json_int_t)dense));
            /* the demo's, from the store (docs/communication.md): one place */
            json_object_set_new(o, "dense_ratio", json_real(num(last, "dense_ratio")));
            json_object_set_new(o, "p2p_bytes", json_integer((json_int_t)p2p));
            json_object_set_new(o, "p2p_over_coordinator", json_real(p2p / (up + down)));
            json_object_set_new(o, "wall_s", stat_json(&wall));
            json_emit_line(stdout, o);
            fflush(stdout);
            json_decref(last);
        }
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
}
