/*
 * cmd_demo.c — `strait demo`: a whole federation on this machine from
 * nothing. init, enroll, a coordinator process, and N site processes that
 * join over mutual TLS and train on disjoint parts of Debian's fortune
 * collections (or one language each with --non-iid); the committed rounds
 * are shown as they land, then a summary: validation loss at the first and
 * the last round, bytes sent against dense fp32 exchange at every step, with
 * --baseline a centralized `strait train` on the same tokens scored beside
 * it on held-out text, and a text sample from the final model.
 *
 * This process never starts gRPC: every networked part runs in a child
 * process (this same binary), so forking stays safe.
 */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "coordinator/coordinator.h"
#include "kernels/model.h"
#include "kernels/formats.h"
#include "kernels/sampler.h"
#include "util/util.h"

#define FORTUNES DEMO_FORTUNES

static pid_t spawn(char *const argv[], const char *log_path, int *stdout_pipe) {
    int p[2] = {-1, -1};
    if (stdout_pipe && pipe(p) != 0) return -1;
    pid_t pid = fork();
    if (pid != 0) {
        if (stdout_pipe) {
            close(p[1]);
            *stdout_pipe = p[0];
        }
        return pid;
    }
    /* the children take signals whatever this process was started with
     * blocked (a test runner's mask would make SIGTERM wait forever) */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    int log = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    dup2(stdout_pipe ? p[1] : log, 1);
    dup2(log, 2);
    execv(argv[0], argv);
    _exit(127);
}

/* SIGTERM, then SIGKILL if it has not ended within 10 s; reaps it. */
static void end_child(pid_t pid) {
    kill(pid, SIGTERM);
    for (int i = 0; i < 100; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid) return;
        usleep(100000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

int demo_run_wait(char *const argv[], const char *log_path) {
    pid_t pid = spawn(argv, log_path, NULL);
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
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
static int refusals(Store *s, int64_t number, int sites, int64_t *attempt, int *shown) {
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
            printf("  round %lld: %s's update refused (%s): %s\n", (long long)number,
                   ups[i].site_name, ups[i].reason_code, ups[i].reason);
    }
    if (n > (size_t)*shown) *shown = (int)n;
    free(ups);
    return taken == 0 && refused >= sites;
}

/* A site process that has ended before the federation finished: its
 * index, with its last log line in why; -1 when all run. A site ends
 * well only once the federation has finished. */
static int dead_site(pid_t *pids, int sites, const char *dir, char *why, size_t len) {
    for (int i = 0; i < sites; i++) {
        int st;
        if (pids[i] <= 0 || waitpid(pids[i], &st, WNOHANG) != pids[i]) continue;
        pids[i] = 0;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
        char log[700];
        snprintf(log, sizeof log, "%s/site-%d.log", dir, i + 1);
        last_line(log, why, len);
        return i;
    }
    return -1;
}

int cmd_demo(const Command *cmd, int argc, char **argv) {
    static const struct option opts[] = {{"sites", required_argument, NULL, 's'},
                                         {"rounds", required_argument, NULL, 'r'},
                                         {"model", required_argument, NULL, 'm'},
                                         {"steps", required_argument, NULL, 'H'},
                                         {"codec", required_argument, NULL, 'c'},
                                         {"dir", required_argument, NULL, 'd'},
                                         {"non-iid", no_argument, NULL, 'n'},
                                         {"baseline", no_argument, NULL, 'b'},
                                         {"recipe", required_argument, NULL, 'R'},
                                         {"seed", required_argument, NULL, 'S'},
                                         {"set", required_argument, NULL, 'X'},
                                         {"device", required_argument, NULL, 'D'},
                                         {NULL, 0, NULL, 0}};
    int sites = 3, rounds = 20, steps = 50, non_iid = 0, baseline = 0, seed = 0, n_sets = 0, c;
    const char *sets[32];
    const char *model = "small", *codec = NULL, *recipe = "diloco", *dir_arg = NULL,
               *device = "cpu";
    optind = 1;
    while ((c = cli_getopt(cmd, argc, argv, "", opts)) != -1) {
        switch (c) {
        case -2:
            return EXIT_USAGE;
        case 's':
            if (cli_int(cmd, "--sites", &sites)) return EXIT_USAGE;
            break;
        case 'r':
            if (cli_int(cmd, "--rounds", &rounds)) return EXIT_USAGE;
            break;
        case 'm':
            model = optarg;
            break;
        case 'H':
            if (cli_int(cmd, "--steps", &steps)) return EXIT_USAGE;
            break;
        case 'c':
            codec = optarg;
            break;
        case 'd':
            dir_arg = optarg;
            break;
        case 'n':
            non_iid = 1;
            break;
        case 'b':
            baseline = 1;
            break;
        case 'R':
            recipe = optarg;
            break;
        case 'X':
            if (n_sets == 32) return cli_usage_error(cmd, "at most 32 --set");
            if (!strchr(optarg, '.') || !strchr(optarg, '=') ||
                strchr(optarg, '.') > strchr(optarg, '='))
                return cli_usage_error(cmd, "--set takes SECTION.KEY=VALUE, not '%s'", optarg);
            sets[n_sets++] = optarg;
            break;
        case 'D':
            if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "cuda") != 0)
                return cli_usage_error(cmd, "--device is cpu or cuda, not '%s'", optarg);
            device = optarg;
            break;
        case 'S':
            if (cli_int(cmd, "--seed", &seed)) return EXIT_USAGE;
            if (seed < 1) return cli_usage_error(cmd, "--seed is a positive integer");
            break;
        }
    }
    if (optind != argc) return cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
    if (sites < 1 || sites > 12 || rounds < 1 || steps < 1)
        return cli_usage_error(cmd, "--sites 1-12, --rounds and --steps positive");
    char err[ERR_LEN], dir[512], fed[600], exe[1024];
    GPTConfig cfg;
    CodecParams cp;
    if (gpt_config_preset(model, &cfg) != 0 || cfg.V != 256)
        return cli_usage_error(cmd, "--model tiny, small, base, llama-tiny, llama-small or "
                                    "qwen2-tiny (byte-level)");
    if (codec && codec_params_parse(codec, &cp, err) != 0) return cli_usage_error(cmd, "%s", err);
    if (access(FORTUNES "/fortunes", R_OK) != 0)
        return cli_fail(cmd, "no fortune collections in %s; run 'make deps' (package fortunes)",
                        FORTUNES);
    ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (el <= 0) return cli_fail(cmd, "cannot find this program's path");
    exe[el] = '\0';
    if (dir_arg) {
        snprintf(dir, sizeof dir, "%s", dir_arg);
        if (file_mkdir_p(dir, 0700, err) != 0) return cli_fail(cmd, "%s", err);
    } else {
        snprintf(dir, sizeof dir, "/tmp/strait-demo-XXXXXX");
        if (mkdtemp(dir) == NULL) return cli_fail(cmd, "cannot make a folder in /tmp");
    }
    snprintf(fed, sizeof fed, "%s/fed", dir);
    char fp[65];
    CoordInitOptions io = {.name = "demo",
                           .listen = "127.0.0.1:0",
                           .model = model,
                           .force = 1,
                           .rounds = rounds,
                           .min_sites = sites,
                           .inner_steps = steps,
                           .recipe = recipe,
                           .uplink = codec,
                           .deadline = "5m"};
    if (coordinator_init_home(fed, &io, fp, err) != 0) return cli_fail(cmd, "%s", err);
    for (int i = 0; i < n_sets; i++) { /* checked by the coordinator at start, like any edit */
        char section[64], key[64], ini[700];
        const char *dot = strchr(sets[i], '.'), *eq = strchr(sets[i], '=');
        snprintf(section, sizeof section, "%.*s", (int)(dot - sets[i]), sets[i]);
        snprintf(key, sizeof key, "%.*s", (int)(eq - dot - 1), dot + 1);
        snprintf(ini, sizeof ini, "%s/federation.ini", fed);
        if (config_file_set(ini, section, key, eq + 1, err) != 0) return cli_fail(cmd, "%s", err);
        printf("  federation.ini: [%s] %s = %s\n", section, key, eq + 1);
    }
    printf("strait demo: %d sites train %s for %d rounds of %d steps, recipe %s%s%s; all in %s\n",
           sites, model, rounds, steps, recipe, codec ? " with uplink " : "", codec ? codec : "",
           dir);

    char log[700], line[256];
    snprintf(log, sizeof log, "%s/coordinator.log", dir);
    char *cargv[] = {exe, "coordinator", "start", fed, NULL};
    int cfd = -1;
    pid_t coord = spawn(cargv, log, &cfd);
    int port = 0;
    FILE *cf = coord > 0 ? fdopen(cfd, "r") : NULL;
    if (cf == NULL || fgets(line, sizeof line, cf) == NULL || !strstr(line, "port ") ||
        sscanf(strstr(line, "port "), "port %d", &port) != 1) {
        if (coord > 0) kill(coord, SIGKILL);
        return cli_fail(cmd, "the coordinator did not start; see %s", log);
    }
    pid_t *pids = calloc((size_t)sites, sizeof *pids);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    int rc = EXIT_FAILED;
    for (int i = 0; i < sites; i++) {
        char name[32], sdir[700], token[65];
        snprintf(name, sizeof name, "site-%d", i + 1);
        snprintf(sdir, sizeof sdir, "%s/%s", dir, name);
        snprintf(log, sizeof log, "%s/%s.log", dir, name);
        if (coordinator_enroll(fed, name, 3600000, token, err) != 0) {
            cli_fail(cmd, "%s", err);
            goto stop;
        }
        char *jargv[] = {exe,  "site",    "join", sdir,          "--name", name, "--coordinator",
                         addr, "--token", token,  "--ca-sha256", fp,       NULL};
        if (demo_run_wait(jargv, log) != 0) {
            cli_fail(cmd, "%s could not join; see %s", name, log);
            goto stop;
        }
        char files[16][512];
        int nf = site_files(i, sites, non_iid, files, 16);
        char seed_s[16];
        snprintf(seed_s, sizeof seed_s, "%d", seed + i);
        char *rargv[48] = {exe, "site", "run", sdir, "--threads", "1", "--device", (char *)device};
        int a = 8;
        if (seed) rargv[a++] = "--seed", rargv[a++] = seed_s;
        for (int f = 0; f < nf && a < 44; f++) rargv[a++] = "--data", rargv[a++] = files[f];
        rargv[a] = NULL;
        pids[i] = spawn(rargv, log, NULL);
        printf("  %s joined; trains on %d collection%s%s\n", name, nf, nf == 1 ? "" : "s",
               non_iid && i % 4 ? " in its own language" : "");
    }
    printf("  follow it from another terminal: strait rounds %s --watch (or strait status %s)\n",
           fed, fed);
    /* watch the store as rounds land */
    char db[700];
    snprintf(db, sizeof db, "%s/%s", fed, STORE_DB_FILE);
    Store *s = store_open(db, STORE_READONLY, err);
    if (s == NULL) {
        cli_fail(cmd, "%s", err);
        goto stop;
    }
    int64_t shown = -1, t0 = time_wall_ms(), fed_ms = 0, live_attempt = 0;
    int live_shown = 0;
    double first_eval = NAN, last_eval = NAN;
    /* start: the global model the round began from, as the sites scored it
     * before training; val: their models after the round's steps */
    printf("  round  sites  start loss  train loss  val loss    up (MB)  down (MB)\n");
    while (shown < rounds - 1) {
        StoreRound r;
        int64_t next = shown + 1;
        if (store_round_get(s, next, &r, NULL) == 0 && strcmp(r.state, "committed") == 0) {
            printf("  %5lld  %5lld  %10.4f  %10.4f  %8.4f  %9.3f  %9.3f\n", (long long)r.number,
                   (long long)r.participants, r.start_eval_loss, r.train_loss, r.eval_loss,
                   r.bytes_up / 1e6, r.bytes_down / 1e6);
            fflush(stdout);
            if (isnan(first_eval)) first_eval = r.eval_loss;
            last_eval = r.eval_loss;
            shown = next;
            continue;
        }
        if (refusals(s, next, sites, &live_attempt, &live_shown)) {
            cli_fail(cmd, "every site's update in round %lld was refused (above); see %s",
                     (long long)next, dir);
            store_close(s);
            goto stop;
        }
        char why[1024];
        int dead = dead_site(pids, sites, dir, why, sizeof why);
        if (dead >= 0) {
            cli_fail(cmd,
                     "site-%d stopped before the federation finished: %s (log: %s/site-%d.log)",
                     dead + 1, why, dir, dead + 1);
            store_close(s);
            goto stop;
        }
        int st;
        if (waitpid(coord, &st, WNOHANG) == coord) {
            cli_fail(cmd, "the coordinator stopped; see %s/coordinator.log", dir);
            coord = -1;
            store_close(s);
            goto stop;
        }
        if (time_wall_ms() - t0 > 3600 * 1000) {
            cli_fail(cmd, "no progress for an hour; see the logs in %s", dir);
            store_close(s);
            goto stop;
        }
        usleep(300000);
    }
    StoreTotals tot;
    int have_totals = store_totals(s, &tot, err) == 0;
    store_close(s);
    fed_ms = time_wall_ms() - t0;
    int site_failed = 0;
    for (int i = 0; i < sites; i++) {
        int st = 0;
        if (pids[i] <= 0) continue; /* ended well already */
        waitpid(pids[i], &st, 0);
        pids[i] = 0;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "strait demo: site-%d ended badly (status %d); see %s/site-%d.log\n",
                    i + 1, st, dir, i + 1);
            site_failed = 1;
        }
    }
    printf("\nvalidation loss at the sites (their models after the local steps): %.4f after the "
           "first round, %.4f after round %d (nats/byte)\n",
           first_eval, last_eval, rounds - 1);
    char files[64][512];
    int n_files = 0;
    for (int i = 0; i < sites && n_files < 48; i++)
        n_files += site_files(i, sites, non_iid, files + n_files, 48 - n_files);
    DemoRun run = {exe,    dir,   fed,     model, recipe, &cfg,  sites,
                   rounds, steps, non_iid, seed,  fed_ms, files, n_files};
    if (!have_totals || demo_score(&run, &tot, baseline, err) != 0) {
        fprintf(stderr, "strait demo: %s\n", err);
        site_failed = 1;
    }
    GPT m;
    memset(&m, 0, sizeof m);
    char ckpt[800];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/round-%06d.safetensors", fed, rounds - 1);
    if (gpt_build(&m, &cfg, 1, err) == 0 && gpt_load(&m, ckpt, NULL, err) == 0) {
        printf("\na sample from the final model:\n\n");
        gpt_sample_text(&m, NULL, "The ", 240, 0.8f, 7, stdout);
    }
    gpt_free(&m);
    printf("\nthe federation, its store and the logs stay in %s\n", dir);
    rc = site_failed ? EXIT_FAILED : EXIT_OK;
stop:
    for (int i = 0; i < sites; i++)
        if (pids[i] > 0) end_child(pids[i]);
    if (coord > 0) end_child(coord);
    if (cf) fclose(cf);
    free(pids);
    return rc;
}
