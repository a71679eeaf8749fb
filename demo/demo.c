/*
 * demo.c — `strait demo`'s federation (demo.h): init, enroll, a
 * coordinator process and N site processes of this same program that join
 * over mutual TLS and train on disjoint parts of Debian's fortune
 * collections (or one language each when non-IID); the committed rounds
 * are reported as they land, a round every site's update was refused in
 * or a process that ended early stops it with the reason, then the scores
 * (score.c) and a text sample from the final model.
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "demo.h"
#include "coordinator/coordinator.h"
#include "kernels/model.h"
#include "kernels/formats.h"
#include "kernels/sampler.h"
#include "compress/compress.h"
#include "util/util.h"

#define FORTUNES DEMO_FORTUNES

/* SIGTERM, then SIGKILL if it has not ended within 10 s; reaps it. */
static void end_child(int pid) {
    proc_stop(pid, 10000);
}

/* Runs argv with stdout and stderr to log; its exit status. */
static int run_wait(char *const argv[], const char *log) {
    int pid = proc_start(argv, &(ProcIo){.log = log});
    return pid < 0 ? -1 : proc_wait(pid);
}

/* Whether path is a regular file (a collection; the language folders hold
 * subfolders too, such as es/off). */
static int regular_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* English collections for IID sites, one language per site for --non-iid;
 * regular files only, never a .dat index or a .u8 link. */
static int site_files(int site, int sites, int non_iid, char files[][512], int max) {
    static const char *const english[] = {"fortunes", "literature", "wisdom",    "science",
                                          "people",   "politics",   "computers", "humorists",
                                          "love",     "work",       "education", "men-women"};
    static const char *const langs[] = {NULL, "de", "es", "it"};
    int n = 0;
    if (non_iid && site % 4 != 0) {
        char dir[256];
        snprintf(dir, sizeof dir, "%s/%s", FORTUNES, langs[site % 4]);
        DIR *d = opendir(dir);
        struct dirent *e;
        while (d && (e = readdir(d)) && n < max) {
            size_t l = strlen(e->d_name);
            if (e->d_name[0] == '.' || (l > 4 && (!strcmp(e->d_name + l - 4, ".dat") ||
                                                  !strcmp(e->d_name + l - 3, ".u8"))))
                continue;
            snprintf(files[n], 512, "%s/%s", dir, e->d_name);
            n += regular_file(files[n]);
        }
        if (d) closedir(d);
        return n;
    }
    int k = (int)(sizeof english / sizeof english[0]);
    for (int i = site; i < k && n < max; i += non_iid ? k : sites) {
        snprintf(files[n], 512, "%s/%s", FORTUNES, english[i]);
        n += regular_file(files[n]);
    }
    return n;
}

/* The last non-empty line of a log, for a message about what ended. */
static void last_line(const char *path, char *out, size_t len) {
    snprintf(out, len, "(nothing in its log)");
    FILE *f = fopen(path, "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0]) snprintf(out, len, "%s", line);
    }
    if (f) fclose(f);
}

/* Prints the refusals of the live round not shown yet (*shown counts
 * them); returns 1 when every site had an update refused in it and none
 * was taken: a refused site waits for the next round, so this one cannot
 * close, and waiting would hang. */
static int refusals(Store *s, int64_t number, int sites, int64_t *attempt, int *shown, FILE *out) {
    StoreRound r;
    StoreUpdate *ups;
    size_t n;
    if (store_round_get(s, number, &r, NULL) != 0 ||
        store_updates_list(s, r.id, &ups, &n, NULL) != 0)
        return 0;
    if (r.id != *attempt) *attempt = r.id, *shown = 0;
    int refused = 0, taken = 0;
    for (size_t i = 0; i < n; i++) {
        int no = strcmp(ups[i].state, "rejected") == 0, again = 0;
        for (size_t k = 0; k < i; k++)
            again |= ups[k].site_id == ups[i].site_id && strcmp(ups[k].state, "rejected") == 0;
        refused += no && !again, taken += !no;
        if (no && (int)i >= *shown)
            fprintf(out, "  round %lld: %s's update refused (%s): %s\n", (long long)number,
                    ups[i].site_name, ups[i].reason_code, ups[i].reason);
    }
    if (n > (size_t)*shown) *shown = (int)n;
    free(ups);
    return taken == 0 && refused >= sites;
}

/* A site process that has ended before the federation finished: its
 * index, with its last log line in why; -1 when all run. A site ends
 * well only once the federation has finished. */
static int dead_site(int *pids, int sites, const char *dir, char *why, size_t len) {
    for (int i = 0; i < sites; i++) {
        int st;
        if (pids[i] <= 0 || proc_ended(pids[i], &st) != 1) continue;
        pids[i] = 0;
        if (st == 0) continue;
        char log[700];
        snprintf(log, sizeof log, "%s/site-%d.log", dir, i + 1);
        last_line(log, why, len);
        return i;
    }
    return -1;
}

int demo_check(const DemoOptions *o, char *err) {
    ModelConfig cfg;
    CodecParams cp;
    if (o->sites < 1 || o->sites > DEMO_MAX_SITES || o->rounds < 1 || o->steps < 1)
        return err_set(err, "--sites 1-%d, --rounds and --steps positive", DEMO_MAX_SITES);
    if (o->base) {
        if (demo_finetune_check(o, err) != 0) return -1;
    } else if (model_config_preset(o->model, &cfg) != 0 || cfg.V != 256) {
        return err_set(err, "--model %s (byte-level)", model_byte_preset_names());
    }
    if (o->codec && codec_params_parse(o->codec, &cp, err) != 0) return -1;
    if (strcmp(o->device, "cpu") != 0 && strcmp(o->device, "cuda") != 0)
        return err_set(err, "--device is cpu or cuda, not '%s'", o->device);
    if (o->seed < 0) return err_set(err, "--seed is a positive integer");
    if (o->n_sets < 0 || o->n_sets > DEMO_MAX_SETS)
        return err_set(err, "at most %d --set", DEMO_MAX_SETS);
    for (int i = 0; i < o->n_sets; i++) {
        const char *dot = strchr(o->sets[i], '.'), *eq = strchr(o->sets[i], '=');
        if (!dot || !eq || dot > eq)
            return err_set(err, "--set takes SECTION.KEY=VALUE, not '%s'", o->sets[i]);
    }
    return 0;
}

/* The federation's home in DIR/fed with the demo's settings and the --set
 * edits (checked by the coordinator at start, like any edit); fp: its CA's
 * fingerprint for the sites' pin. */
static int make_home(const DemoOptions *o, const char *fed, char fp[65], FILE *out, char *err) {
    CoordInitOptions io = {.name = "demo",
                           .listen = "127.0.0.1:0",
                           .model = o->base ? NULL : o->model,
                           .init_from = o->base,
                           .force = 1,
                           .rounds = o->rounds,
                           .min_sites = o->sites,
                           .inner_steps = o->steps,
                           .recipe = o->recipe,
                           .uplink = o->codec,
                           .deadline = "5m",
                           .lora = o->lora};
    if (coordinator_init_home(fed, &io, fp, err) != 0) return -1;
    /* the scores read every round's model (summary.json's round_val_losses):
     * a byte-level demo's models are small, it keeps them all (a --set may
     * say otherwise); a fine-tune's scores read the last round's alone */
    char ini[700];
    snprintf(ini, sizeof ini, "%s/federation.ini", fed);
    if (!o->base && config_file_set(ini, "store", "keep_every", "1", err) != 0) return -1;
    /* every round's scalars for TensorBoard, in DIR/fed/tb */
    if (config_file_set(ini, "metrics", "tensorboard", "tb", err) != 0) return -1;
    char num[16];
    if (o->base) { /* a fine-tune's batches: they bound the tokens a site claims a round */
        snprintf(num, sizeof num, "%d", DEMO_FINETUNE_BATCH);
        if (config_file_set(ini, "rounds", "batch", num, err) != 0) return -1;
        snprintf(num, sizeof num, "%d", DEMO_FINETUNE_SEQ);
        if (config_file_set(ini, "rounds", "seq", num, err) != 0) return -1;
    }
    for (int i = 0; i < o->n_sets; i++) {
        char section[64], key[64];
        const char *set = o->sets[i], *dot = strchr(set, '.'), *eq = strchr(set, '=');
        snprintf(section, sizeof section, "%.*s", (int)(dot - set), set);
        snprintf(key, sizeof key, "%.*s", (int)(eq - dot - 1), dot + 1);
        if (config_file_set(ini, section, key, eq + 1, err) != 0) return -1;
        fprintf(out, "  federation.ini: [%s] %s = %s\n", section, key, eq + 1);
    }
    return 0;
}

/* The coordinator process, its port read from the first line it prints
 * on stdout; *fd: that pipe, held open until it stops. */
static int start_coordinator(const DemoOptions *o, const char *dir, const char *fed, int *port,
                             int *fd, char *err) {
    char log[700], line[256];
    snprintf(log, sizeof log, "%s/coordinator.log", dir);
    char *argv[] = {(char *)o->exe, "coordinator", "start", (char *)fed, NULL};
    int pid = proc_start(argv, &(ProcIo){.log = log, .out_fd = fd});
    const char *p;
    int ok = pid > 0 && proc_read_line(*fd, line, sizeof line, 120000) > 0 &&
             (p = strstr(line, "port ")) != NULL && sscanf(p, "port %d", port) == 1;
    if (!ok) {
        if (pid > 0) end_child(pid), close(*fd);
        *fd = -1;
        return err_set(err, "the coordinator did not start; see %s", log);
    }
    return pid;
}

/* Enrolls, joins and starts site i (site-<i+1>); its pid. */
static int start_site(const DemoOptions *o, int i, const char *dir, const char *fed,
                      const char *addr, const char *fp, FILE *out, char *err) {
    char name[32], sdir[700], token[65], log[700];
    snprintf(name, sizeof name, "site-%d", i + 1);
    snprintf(sdir, sizeof sdir, "%s/%s", dir, name);
    snprintf(log, sizeof log, "%s/%s.log", dir, name);
    char join[300];
    if (coordinator_enroll(fed, name, 3600000, token, err) != 0 ||
        coordinator_join_address(fed, join, sizeof join, err) != 0)
        return -1;
    char *jargv[] = {(char *)o->exe, "site",          "join",        sdir,       "--name",
                     name,           "--coordinator", (char *)addr,  "--join",   join,
                     "--token",      token,           "--ca-sha256", (char *)fp, NULL};
    if (run_wait(jargv, log) != 0) return err_set(err, "%s could not join; see %s", name, log);
    char files[16][512], seed[16], lr[32];
    const char *lang = NULL;
    int nf = 1;
    if (o->base)
        demo_finetune_site(o->data, i, files[0], sizeof files[0], &lang);
    else
        nf = site_files(i, o->sites, o->non_iid, files, 16);
    snprintf(seed, sizeof seed, "%d", o->seed + i);
    snprintf(lr, sizeof lr, "%g", (double)o->lr);
    char *argv[48] = {(char *)o->exe, "site", "run",      sdir,
                      "--threads",    "1",    "--device", (char *)o->device};
    int a = 8;
    if (o->seed) argv[a++] = "--seed", argv[a++] = seed;
    char batch[16], seq[16];
    snprintf(batch, sizeof batch, "%d", DEMO_FINETUNE_BATCH);
    snprintf(seq, sizeof seq, "%d", DEMO_FINETUNE_SEQ);
    if (o->base) argv[a++] = "--init-from", argv[a++] = (char *)o->base;
    if (o->base) argv[a++] = "--batch", argv[a++] = batch, argv[a++] = "--seq", argv[a++] = seq;
    if (o->lr > 0) argv[a++] = "--lr", argv[a++] = lr;
    for (int f = 0; f < nf && a < 44; f++) argv[a++] = "--data", argv[a++] = files[f];
    argv[a] = NULL;
    int pid = proc_start(argv, &(ProcIo){.log = log});
    if (pid < 0) return err_set_errno(err, "cannot start %s", name);
    if (lang)
        fprintf(out, "  %s joined; fine-tunes on its %s collections\n", name, lang);
    else
        fprintf(out, "  %s joined; trains on %d collection%s%s\n", name, nf, nf == 1 ? "" : "s",
                o->non_iid && i % 4 ? " in its own language" : "");
    return pid;
}

/* Reports each committed round as it lands until the last; stops at a
 * round every site was refused in, a site or the coordinator that ended,
 * or an hour without the federation finishing. first and last: the sites'
 * validation loss after the first round and the last. */
static int watch(const DemoOptions *o, Store *s, const char *dir, int *pids, int *coord,
                 double *first, double *last, FILE *out, char *err) {
    int64_t shown = -1, t0 = time_wall_ms(), attempt = 0;
    int live_shown = 0;
    /* start: the global model the round began from, as the sites scored it
     * before training; val: their models after the round's steps */
    fprintf(out, "  round  sites  start loss  train loss  val loss    up (MB)  down (MB)\n");
    while (shown < o->rounds - 1) {
        StoreRound r;
        int64_t next = shown + 1;
        if (store_round_get(s, next, &r, NULL) == 0 && strcmp(r.state, "committed") == 0) {
            fprintf(out, "  %5lld  %5lld  %10.4f  %10.4f  %8.4f  %9.3f  %9.3f\n",
                    (long long)r.number, (long long)r.participants, r.start_eval_loss, r.train_loss,
                    r.eval_loss, r.bytes_up / 1e6, r.bytes_down / 1e6);
            fflush(out);
            if (isnan(*first)) *first = r.eval_loss;
            *last = r.eval_loss;
            shown = next;
            continue;
        }
        if (refusals(s, next, o->sites, &attempt, &live_shown, out))
            return err_set(err, "every site's update in round %lld was refused (above); see %s",
                           (long long)next, dir);
        char why[1024];
        int dead = dead_site(pids, o->sites, dir, why, sizeof why);
        if (dead >= 0)
            return err_set(err,
                           "site-%d stopped before the federation finished: %.300s (log: "
                           "%s/site-%d.log)",
                           dead + 1, why, dir, dead + 1);
        int st;
        if (proc_ended(*coord, &st) == 1) {
            *coord = -1;
            return err_set(err, "the coordinator stopped; see %s/coordinator.log", dir);
        }
        if (time_wall_ms() - t0 > 3600 * 1000)
            return err_set(err, "no progress for an hour; see the logs in %s", dir);
        usleep(300000);
    }
    return 0;
}

/* Waits for the sites, which end once the federation has finished; -1 with
 * err naming the first that ended badly. */
static int reap_sites(int *pids, int sites, const char *dir, char *err) {
    int rc = 0;
    for (int i = 0; i < sites; i++) {
        if (pids[i] <= 0) continue; /* ended well already */
        int st = proc_wait(pids[i]);
        pids[i] = 0;
        if (st != 0 && rc == 0)
            rc = err_set(err, "site-%d ended badly (status %d); see %s/site-%d.log", i + 1, st, dir,
                         i + 1);
    }
    return rc;
}

/* One federation of o's sites in DIR/fed, from its home to its last
 * round, watched and reported; tot and fed_ms: what it moved and how long
 * it ran. Every process it started has ended when it returns. */
static int federate(const DemoOptions *o, const char *dir, StoreTotals *tot, int64_t *fed_ms,
                    FILE *out, char *err) {
    char fed[600], fp[65], addr[64];
    snprintf(fed, sizeof fed, "%s/fed", dir);
    if (make_home(o, fed, fp, out, err) != 0) return -1;
    if (o->base)
        fprintf(out,
                "strait demo: %d sites fine-tune %s (%s) for %d rounds of %d steps, recipe %s%s%s; "
                "all in %s\n",
                o->sites, o->base, o->lora.rank ? "adapters" : "every parameter", o->rounds,
                o->steps, o->recipe, o->codec ? " with uplink " : "", o->codec ? o->codec : "",
                dir);
    else
        fprintf(out,
                "strait demo: %d sites train %s for %d rounds of %d steps, recipe %s%s%s; all in "
                "%s\n",
                o->sites, o->model, o->rounds, o->steps, o->recipe, o->codec ? " with uplink " : "",
                o->codec ? o->codec : "", dir);
    int port = 0, coord_out = -1, coord = start_coordinator(o, dir, fed, &port, &coord_out, err);
    if (coord < 0) return -1;
    int pids[DEMO_MAX_SITES] = {0}, rc = -1;
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    for (int i = 0; i < o->sites; i++)
        if ((pids[i] = start_site(o, i, dir, fed, addr, fp, out, err)) < 0) goto stop;
    fprintf(out,
            "  follow it from another terminal: strait rounds %s --watch (or strait status %s)\n",
            fed, fed);
    fflush(out);
    char db[700];
    snprintf(db, sizeof db, "%s/%s", fed, STORE_DB_FILE);
    Store *s = store_open(db, STORE_READONLY, err);
    if (s == NULL) goto stop;
    int64_t t0 = time_wall_ms();
    double first = NAN, last = NAN;
    rc = watch(o, s, dir, pids, &coord, &first, &last, out, err);
    if (rc == 0) rc = store_totals(s, tot, err);
    store_close(s);
    if (rc != 0) goto stop;
    *fed_ms = time_wall_ms() - t0;
    rc = reap_sites(pids, o->sites, dir, err);
    if (isnan(last)) /* distributed DP: the sites keep their losses */
        fprintf(out, "\nthe sites kept their losses to themselves (distributed DP)\n");
    else
        fprintf(out,
                "\nvalidation loss at the sites (their models after the local steps): %.4f after "
                "the first round, %.4f after round %d (nats/%s)\n",
                first, last, o->rounds - 1, o->base ? "token" : "byte");
    fflush(out);
stop:
    for (int i = 0; i < o->sites; i++)
        if (pids[i] > 0) end_child(pids[i]);
    if (coord > 0) end_child(coord);
    close(coord_out);
    return rc;
}

/* A fine-tune: the sites' data, the federation of adapters, with
 * --baseline the same federation training every parameter in DIR/full,
 * then the scores (finetune.c). */
static int finetune(const DemoOptions *o, const char *dir, FILE *out, char *err) {
    char fed[600];
    StoreTotals tot, full_tot;
    int64_t ms, full_ms = 0;
    if (demo_finetune_data(o, out, err) != 0 || federate(o, dir, &tot, &ms, out, err) != 0)
        return -1;
    snprintf(fed, sizeof fed, "%s/fed", dir);
    DemoRun run = {.exe = o->exe,
                   .dir = dir,
                   .fed = fed,
                   .model = o->base,
                   .recipe = o->recipe,
                   .sites = o->sites,
                   .rounds = o->rounds,
                   .steps = o->steps,
                   .non_iid = 1,
                   .seed = o->seed,
                   .fed_ms = ms};
    DemoRun full = run;
    char full_dir[600], full_fed[700];
    if (o->baseline) { /* every parameter trains, the same rounds, data and seeds */
        DemoOptions fo = *o;
        memset(&fo.lora, 0, sizeof fo.lora);
        fo.lr = DEMO_FINETUNE_FULL_LR;
        snprintf(full_dir, sizeof full_dir, "%s/full", dir);
        snprintf(full_fed, sizeof full_fed, "%s/fed", full_dir);
        fprintf(out, "\nbaseline: the same federation training every parameter (lr %g)\n",
                (double)fo.lr);
        if (file_mkdir_p(full_dir, 0700, err) != 0 ||
            federate(&fo, full_dir, &full_tot, &full_ms, out, err) != 0)
            return -1;
        full.dir = full_dir, full.fed = full_fed, full.fed_ms = full_ms;
    }
    return demo_finetune_score(o, &run, &tot, o->baseline ? &full : NULL, &full_tot, out, err);
}

/* The run as one page (coordinator/report.c), and where it is; a page
 * that cannot be written is said, and the demo's result stands. */
static void demo_report(const DemoOptions *o, const char *dir, const char *fed, FILE *out) {
    char page[700], err[ERR_LEN];
    snprintf(page, sizeof page, "%s/report.html", dir);
    Admin *a = admin_open(fed, err);
    if (a && report_write(a, fed, page, o->version ? o->version : "", 0, err) == 0)
        fprintf(out, "the run as one page: %s (open it in a browser, offline; strait report)\n",
                page);
    else
        fprintf(out, "the run's report could not be written: %s\n", err);
    if (a) admin_close(a);
}

int demo_run(const DemoOptions *o, FILE *out, char *err) {
    char dir[512], fed[600];
    ModelConfig cfg;
    if (demo_check(o, err) != 0) return -1;
    if (access(FORTUNES "/fortunes", R_OK) != 0)
        return err_set(err, "no fortune collections in %s; run 'make deps' (package fortunes)",
                       FORTUNES);
    if (o->dir) {
        snprintf(dir, sizeof dir, "%s", o->dir);
        if (file_mkdir_p(dir, 0700, err) != 0) return -1;
    } else {
        snprintf(dir, sizeof dir, "/tmp/strait-demo-XXXXXX");
        if (mkdtemp(dir) == NULL) return err_set_errno(err, "cannot make a folder in /tmp");
    }
    if (o->base) {
        char data[600];
        DemoOptions fo = *o;
        snprintf(data, sizeof data, "%s/data", dir);
        fo.data = data;
        int rc = finetune(&fo, dir, out, err);
        fprintf(out, "\nthe federation, its store and the logs stay in %s\n", dir);
        snprintf(fed, sizeof fed, "%s/fed", dir);
        if (rc == 0) demo_report(o, dir, fed, out);
        return rc;
    }
    model_config_preset(o->model, &cfg);
    snprintf(fed, sizeof fed, "%s/fed", dir);
    StoreTotals tot;
    int64_t fed_ms;
    if (federate(o, dir, &tot, &fed_ms, out, err) != 0) return -1;
    char files[64][512];
    int n_files = 0, rc = 0;
    for (int i = 0; i < o->sites && n_files < 48; i++)
        n_files += site_files(i, o->sites, o->non_iid, files + n_files, 48 - n_files);
    DemoRun run = {o->exe,    dir,      fed,        o->model, o->recipe, &cfg,  o->sites,
                   o->rounds, o->steps, o->non_iid, o->seed,  fed_ms,    files, n_files};
    char serr[ERR_LEN];
    if (demo_score(&run, &tot, o->baseline, out, serr) != 0) rc = err_set(err, "%s", serr);
    fflush(out);
    Model m;
    memset(&m, 0, sizeof m);
    char ckpt[800];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/round-%06d.safetensors", fed, o->rounds - 1);
    if (model_build(&m, &cfg, 1, serr) == 0 && model_load(&m, ckpt, NULL, serr) == 0) {
        fprintf(out, "\na sample from the final model:\n\n");
        model_sample_text(&m, NULL, "The ", 240, 0.8f, 7, out);
    }
    model_free(&m);
    fprintf(out, "\nthe federation, its store and the logs stay in %s\n", dir);
    int tb_moved = 0;
    for (int i = 0; i < o->n_sets; i++)
        tb_moved |= strncmp(o->sets[i], "metrics.tensorboard=", 20) == 0;
    if (!tb_moved) fprintf(out, "its rounds in TensorBoard: tensorboard --logdir %s/tb\n", fed);
    demo_report(o, dir, fed, out);
    return rc;
}
