/*
 * cmd_admin.c — watching a federation: `strait rounds` (a table, JSON
 * lines, or a live view redrawn in place), `strait status`, `strait round
 * show`, and `strait admin export` (a kit for another machine). DIR is a
 * federation folder or an admin kit; both read through the Admin API
 * (coordinator/admin_client.c), and a stopped federation from its store.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "cli.h"
#include "coordinator/coordinator.h"
#include "net/net.h"
#include "util/util.h"

/* "850ms", "41.2s", "5m12s", "3h05m", "2d04h" */
static char *fmt_duration(int64_t ms, char *buf, size_t len) {
    if (ms < 0) ms = 0;
    if (ms < 1000)
        snprintf(buf, len, "%lldms", (long long)ms);
    else if (ms < 60000)
        snprintf(buf, len, "%.1fs", ms / 1000.0);
    else if (ms < 3600000)
        snprintf(buf, len, "%lldm%02llds", (long long)(ms / 60000), (long long)(ms / 1000 % 60));
    else if (ms < 86400000)
        snprintf(buf, len, "%lldh%02lldm", (long long)(ms / 3600000), (long long)(ms / 60000 % 60));
    else
        snprintf(buf, len, "%lldd%02lldh", (long long)(ms / 86400000),
                 (long long)(ms / 3600000 % 24));
    return buf;
}

static json_t *json_real_or_null(double v) {
    return isfinite(v) ? json_real(v) : json_null();
}

static json_t *json_lines(const char *text) {
    json_t *a = json_array();
    char copy[2048];
    snprintf(copy, sizeof copy, "%s", text);
    for (char *save = NULL, *p = strtok_r(copy, "\n", &save); p; p = strtok_r(NULL, "\n", &save))
        json_array_append_new(a, json_string(p));
    return a;
}

static int64_t round_ms(const AdminRound *a, int64_t now) {
    return (a->r.closed_at ? a->r.closed_at : now) - a->r.opened_at;
}

static int live(const AdminRound *a) {
    return strcmp(a->r.state, "open") == 0 || strcmp(a->r.state, "aggregating") == 0;
}

static json_t *round_json(const AdminRound *a, int64_t now) {
    const StoreRound *r = &a->r;
    json_t *o = json_object();
    json_object_set_new(o, "round", json_integer(r->number));
    json_object_set_new(o, "attempt", json_integer(r->attempt));
    json_object_set_new(o, "state", json_string(r->state));
    json_object_set_new(o, "participants", json_integer(r->participants));
    json_object_set_new(o, "expected", json_integer(a->expected));
    json_object_set_new(o, "tokens", json_integer(r->tokens));
    json_object_set_new(o, "train_loss", json_real_or_null(r->train_loss));
    json_object_set_new(o, "eval_loss", json_real_or_null(r->eval_loss));
    json_object_set_new(o, "start_eval_loss", json_real_or_null(r->start_eval_loss));
    json_object_set_new(o, "bytes_up", json_integer(r->bytes_up));
    json_object_set_new(o, "bytes_down", json_integer(r->bytes_down));
    json_object_set_new(o, "bytes_rejected", json_integer(r->bytes_rejected));
    json_object_set_new(o, "dense_bytes", json_integer(r->dense_bytes));
    json_object_set_new(o, "refusals_unrecorded", json_integer(r->refusals_unrecorded));
    double vs = store_dense_ratio(r->dense_bytes, r->bytes_up, r->bytes_down);
    json_object_set_new(o, "dense_ratio", vs > 0 ? json_real(vs) : json_null());
    json_object_set_new(o, "raw_bytes", json_integer(a->raw_bytes));
    json_object_set_new(o, "compression",
                        r->bytes_up ? json_real((double)a->raw_bytes / (double)r->bytes_up)
                                    : json_null());
    json_object_set_new(o, "duration_ms", json_integer(round_ms(a, now)));
    json_object_set_new(o, "wall_ms", a->wall_ms ? json_integer(a->wall_ms) : json_null());
    json_object_set_new(o, "utilization", json_real_or_null(a->utilization));
    json_object_set_new(o, "goodput", json_real_or_null(a->goodput));
    json_object_set_new(o, "opened_at", json_integer(r->opened_at));
    json_object_set_new(o, "closed_at", r->closed_at ? json_integer(r->closed_at) : json_null());
    json_object_set_new(o, "failed_reason",
                        r->failed_reason[0] ? json_string(r->failed_reason) : json_null());
    json_object_set_new(o, live(a) ? "waiting_for" : "missed", json_lines(a->missed));
    json_object_set_new(o, "rejected", json_lines(a->rejected));
    json_object_set_new(o, "late", json_lines(r->late));
    json_object_set_new(o, "dp_noise", json_real_or_null(r->dp_noise));
    json_object_set_new(o, "dp_epsilon", json_real_or_null(r->dp_epsilon));
    json_object_set_new(o, "dp_delta", json_real_or_null(r->dp_delta));
    return o;
}

/* One table line of a round; width bounds the notes column. */
static void round_line(const AdminRound *a, int64_t now, char *out, size_t len) {
    const StoreRound *r = &a->r;
    char sites[24], train[16] = "-", val[16] = "-", start[16] = "-", ratio[16] = "-", dur[24],
                    util[16] = "-", good[16] = "-", notes[1024] = "";
    if (isfinite(a->utilization)) snprintf(util, sizeof util, "%.1f%%", 100 * a->utilization);
    if (isfinite(a->goodput)) snprintf(good, sizeof good, "%.1f%%", 100 * a->goodput);
    snprintf(sites, sizeof sites, "%lld/%lld", (long long)r->participants, (long long)a->expected);
    if (isfinite(r->train_loss)) snprintf(train, sizeof train, "%.4f", r->train_loss);
    if (isfinite(r->eval_loss)) snprintf(val, sizeof val, "%.4f", r->eval_loss);
    if (isfinite(r->start_eval_loss)) snprintf(start, sizeof start, "%.4f", r->start_eval_loss);
    double vs = store_dense_ratio(r->dense_bytes, r->bytes_up, r->bytes_down);
    if (vs > 0) snprintf(ratio, sizeof ratio, "%.0fx", vs);
    fmt_duration(round_ms(a, now), dur, sizeof dur);
    size_t n = 0;
    if (r->failed_reason[0]) n += (size_t)snprintf(notes, sizeof notes, "%s; ", r->failed_reason);
    if (isfinite(r->dp_epsilon))
        n += (size_t)snprintf(notes + n, sizeof notes - n, "\u03b5 %.3g (\u03b4 %g); ",
                              r->dp_epsilon, r->dp_delta);
    if (r->bytes_rejected)
        n += (size_t)snprintf(notes + n, sizeof notes - n, "%.3f MB refused; ",
                              r->bytes_rejected / 1e6);
    if (r->refusals_unrecorded)
        n += (size_t)snprintf(notes + n, sizeof notes - n, "%lld more refused at the header; ",
                              (long long)r->refusals_unrecorded);
    const char *lists[3] = {r->late, a->missed, a->rejected};
    const char *labels[3] = {"late ", live(a) ? "waiting for " : "missed ", "rejected "};
    for (int k = 0; k < 3 && n < sizeof notes; k++) {
        if (!lists[k][0]) continue;
        char joined[1024];
        snprintf(joined, sizeof joined, "%s", lists[k]);
        n += (size_t)snprintf(notes + n, sizeof notes - n, "%s", labels[k]);
        const char *sep = "";
        for (char *save = NULL, *p = strtok_r(joined, "\n", &save); p && n < sizeof notes;
             p = strtok_r(NULL, "\n", &save), sep = ", ")
            n += (size_t)snprintf(notes + n, sizeof notes - n, "%s%s", sep, p);
        if (n < sizeof notes) n += (size_t)snprintf(notes + n, sizeof notes - n, "; ");
    }
    /* drop the last separators */
    while (n > 0 && n < sizeof notes &&
           (notes[n - 1] == ' ' || notes[n - 1] == ';' || notes[n - 1] == ','))
        notes[--n] = '\0';
    snprintf(out, len, "%6lld  %-10s %6s %9lld %8s %8s %8s %8.3f %8.3f %7s %8s %6s %7s  %s",
             (long long)r->number, r->state, sites, (long long)r->tokens, start, train, val,
             r->bytes_up / 1e6, r->bytes_down / 1e6, ratio, dur, util, good, notes);
}

/* UTIL: compute utilization, GOODPUT: accepted tokens over what the sites
 * could have trained in the round's wall time (docs/operations.md) */
static const char ROUNDS_HEADER[] =
    " ROUND  STATE       SITES    TOKENS    START    TRAIN      VAL    MB UP  "
    "MB DOWN   RATIO     TIME   UTIL GOODPUT  NOTES";

/* ---- strait rounds ------------------------------------------------------------ */

/* ▁▂▃▄▅▆▇█ over the values, oldest first. */
static void sparkline(const double *v, int n, char *out, size_t len) {
    static const char *const bars[8] = {"\u2581", "\u2582", "\u2583", "\u2584",
                                        "\u2585", "\u2586", "\u2587", "\u2588"};
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n; i++) lo = fmin(lo, v[i]), hi = fmax(hi, v[i]);
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < n && used + 4 < len; i++) {
        int k = hi > lo ? (int)lround(7.0 * (v[i] - lo) / (hi - lo)) : 0;
        used += (size_t)snprintf(out + used, len - used, "%s", bars[k < 0 ? 0 : k > 7 ? 7 : k]);
    }
}

static void term_size(int *rows, int *cols) {
    struct winsize ws;
    *rows = 24, *cols = 100;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0)
        *rows = ws.ws_row, *cols = ws.ws_col;
}

/* One frame of --watch, drawn from the top of the screen. */
static int watch_frame(const Command *cmd, Admin *a, char *err) {
    AdminStatus st;
    AdminRound *rounds;
    size_t n;
    if (admin_status(a, &st, err) != 0 || admin_rounds(a, 60, 0, &rounds, &n, err) != 0) return -1;
    (void)cmd;
    int rows, cols;
    term_size(&rows, &cols);
    int64_t now = time_wall_ms();
    double losses[60], starts[60];
    int nl = 0, ns = 0;
    int64_t committed_ms = 0, committed = 0;
    for (size_t i = n; i-- > 0;) { /* oldest first */
        if (strcmp(rounds[i].r.state, "committed") != 0) continue;
        if (isfinite(rounds[i].r.eval_loss)) losses[nl++] = rounds[i].r.eval_loss;
        if (isfinite(rounds[i].r.start_eval_loss)) starts[ns++] = rounds[i].r.start_eval_loss;
        committed_ms += round_ms(&rounds[i], now), committed++;
    }
    char line[2048], spark[256] = "", eta[64] = "-", up[24], age[24];
    /* the global model's loss (at each round's start) when the sites measured
     * it, else their local models' */
    const char *what = "val loss (sites' models)";
    if (ns >= 2)
        memcpy(losses, starts, sizeof(double) * (size_t)ns), nl = ns, what = "global model";
    sparkline(losses, nl, spark, sizeof spark);
    int64_t left = st.total_rounds - (st.last_commit_round + 1);
    if (strcmp(st.round_state, "finished") == 0)
        snprintf(eta, sizeof eta, "finished");
    else if (committed && left > 0)
        fmt_duration(committed_ms / committed * left, eta, sizeof eta);
    printf("\033[H");
    snprintf(line, sizeof line, "strait rounds — %s at %s%s — up %s", st.federation, admin_where(a),
             st.running             ? ""
             : admin_unreachable(a) ? " (cannot reach the coordinator)"
                                    : " (coordinator not running)",
             fmt_duration(st.uptime_ms, up, sizeof up));
    printf("%.*s\033[K\n", cols, line);
    char where[160] = "";
    if (st.round_opened_at)
        snprintf(where, sizeof where, " for %s, %lld update%s in",
                 fmt_duration(now - st.round_opened_at, age, sizeof age),
                 (long long)st.sites_reported, st.sites_reported == 1 ? "" : "s");
    snprintf(line, sizeof line,
             "round %lld of %lld: %s%s; sites %lld online, %lld offline, %lld revoked",
             (long long)st.current_round, (long long)st.total_rounds, st.round_state, where,
             (long long)st.sites_online, (long long)st.sites_offline, (long long)st.sites_revoked);
    printf("%.*s\033[K\n", cols, line);
    if (nl)
        printf("%s %s %.4f -> %.4f   ETA %s\033[K\n", what, spark, losses[0], losses[nl - 1], eta);
    else
        printf("val loss: no round committed yet   ETA %s\033[K\n", eta);
    printf("\033[K\n%.*s\033[K\n", cols, ROUNDS_HEADER);
    int room = rows - 7;
    size_t shown = room < 1 ? 1 : (size_t)room < n ? (size_t)room : n;
    for (size_t i = shown; i-- > 0;) {
        round_line(&rounds[i], now, line, sizeof line);
        printf("%.*s\033[K\n", cols, line);
    }
    printf("\033[K\nCtrl-C to quit\033[K\033[J");
    fflush(stdout);
    free(rounds);
    return 0;
}

static int watch(const Command *cmd, Admin *a) {
    net_global_init(); /* SIGINT now arrives through net_wait_signal */
    printf("\033[?25l\033[2J");
    int rc = EXIT_OK;
    char err[ERR_LEN];
    for (;;) {
        if (watch_frame(cmd, a, err) != 0) {
            /* a coordinator restarting is routine: say so and keep watching */
            printf("\033[H\033[2J%s\nretrying every second; Ctrl-C to quit\n", err);
            fflush(stdout);
        }
        int sig = net_wait_signal(1000);
        if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) break;
    }
    printf("\033[?25h\n");
    fflush(stdout);
    return rc;
}

int cmd_rounds(const Command *cmd, int argc, char **argv) {
    static const struct option opts[] = {{"last", required_argument, NULL, 'n'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"watch", no_argument, NULL, 'w'},
                                         {NULL, 0, NULL, 0}};
    int last = 20, json = 0, watching = 0, c;
    optind = 1;
    while ((c = cli_getopt(cmd, argc, argv, "", opts)) != -1) {
        if (c == -2) return EXIT_USAGE;
        if (c == 'n' && cli_int(cmd, "--last", &last)) return EXIT_USAGE;
        if (c == 'j') json = 1;
        if (c == 'w') watching = 1;
    }
    if (optind != argc - 1)
        return cli_usage_error(cmd, "expected one federation folder or admin kit DIR");
    if (last < 1) return cli_usage_error(cmd, "--last must be at least 1");
    if (watching && json) return cli_usage_error(cmd, "--watch and --json do not mix");
    char err[ERR_LEN];
    Admin *a = admin_open(argv[optind], err);
    if (a == NULL) return cli_fail(cmd, "%s", err);
    if (watching) {
        int rc = watch(cmd, a);
        admin_close(a);
        return rc;
    }
    AdminRound *rounds;
    size_t n;
    if (admin_rounds(a, last, 0, &rounds, &n, err) != 0) {
        admin_close(a);
        return cli_fail(cmd, "%s", err);
    }
    if (admin_unreachable(a)) /* on stderr: --json output stays clean */
        fprintf(stderr, "strait rounds: cannot reach the coordinator: %s; read from %s\n",
                admin_unreachable(a), admin_where(a));
    else if (!admin_running(a))
        fprintf(stderr, "strait rounds: the coordinator is not running; read from %s\n",
                admin_where(a));
    int64_t now = time_wall_ms();
    if (!json) printf("%s\n", ROUNDS_HEADER);
    for (size_t i = n; i-- > 0;) { /* oldest first */
        if (json) {
            json_emit_line(stdout, round_json(&rounds[i], now));
        } else {
            char line[2048];
            round_line(&rounds[i], now, line, sizeof line);
            printf("%s\n", line);
        }
    }
    free(rounds);
    admin_close(a);
    return EXIT_OK;
}

/* ---- strait status --------------------------------------------------------------- */

/* "disk  1.62 GB in 3 checkpoints (12 pruned), 41.3 GB free: room for 25
 * of the 40 commits left, 1.62 GB each as it is written", and SHORT while
 * that is under DISK_ROUNDS_WARN and not all of them. */
static void print_disk(const AdminStatus *st) {
    printf("disk         %.2f GB in %lld checkpoint%s (%lld pruned)", st->disk.used / 1e9,
           (long long)st->disk.kept, st->disk.kept == 1 ? "" : "s", (long long)st->disk.pruned);
    if (st->disk.free >= 0) printf(", %.2f GB free", st->disk.free / 1e9);
    if (st->disk_rounds_left >= 0)
        printf(": room for %lld of the %lld commits left, %.2f GB each as it is written%s",
               (long long)st->disk_rounds_left,
               (long long)(st->total_rounds - (st->last_commit_round + 1)),
               st->disk.round_bytes / 1e9,
               admin_disk_short(st) ? ", SHORT: free space, or raise [store] keep_every (0: no "
                                      "milestones)"
                                    : "");
    printf("\n");
}

int cmd_status(const Command *cmd, int argc, char **argv) {
    int json = cli_json_flag(cmd, argc, argv);
    if (json < 0) return EXIT_USAGE;
    if (optind != argc - 1)
        return cli_usage_error(cmd, "expected one federation folder or admin kit DIR");
    char err[ERR_LEN];
    Admin *a = admin_open(argv[optind], err);
    if (a == NULL) return cli_fail(cmd, "%s", err);
    AdminStatus st;
    AdminSite *sites = NULL;
    size_t n = 0;
    if (admin_status(a, &st, err) != 0 || admin_sites(a, &sites, &n, err) != 0) {
        admin_close(a);
        return cli_fail(cmd, "%s", err);
    }
    int64_t now = time_wall_ms();
    char t1[40], t2[40];
    if (json) {
        json_t *o = json_object();
        json_object_set_new(o, "federation", json_string(st.federation));
        json_object_set_new(o, "running", json_boolean(st.running));
        json_object_set_new(o, "coordinator", json_string(admin_where(a)));
        json_object_set_new(o, "model", json_string(st.model));
        json_object_set_new(o, "model_params", json_integer(st.model_params));
        json_object_set_new(o, "uptime_ms", st.running ? json_integer(st.uptime_ms) : json_null());
        json_object_set_new(o, "rss_bytes", st.running ? json_integer(st.rss_bytes) : json_null());
        json_object_set_new(o, "current_round", json_integer(st.current_round));
        json_object_set_new(o, "total_rounds", json_integer(st.total_rounds));
        json_object_set_new(o, "round_state", json_string(st.round_state));
        json_object_set_new(o, "round_updates", json_integer(st.sites_reported));
        json_object_set_new(o, "sites_online", json_integer(st.sites_online));
        json_object_set_new(o, "sites_offline", json_integer(st.sites_offline));
        json_object_set_new(o, "sites_revoked", json_integer(st.sites_revoked));
        json_object_set_new(o, "last_commit_round", json_integer(st.last_commit_round));
        json_object_set_new(o, "last_commit_at",
                            st.last_commit_at ? json_integer(st.last_commit_at) : json_null());
        json_object_set_new(o, "last_eval_loss", json_real_or_null(st.last_eval_loss));
        json_object_set_new(o, "dp_epsilon", json_real_or_null(st.dp_epsilon));
        json_object_set_new(o, "dp_delta", json_real_or_null(st.dp_delta));
        json_object_set_new(o, "rounds_committed", json_integer(st.totals.rounds_committed));
        json_object_set_new(o, "rounds_failed", json_integer(st.totals.rounds_failed));
        json_object_set_new(o, "updates_rejected", json_integer(st.totals.updates_rejected));
        json_object_set_new(o, "bytes_up", json_integer(st.totals.bytes_up));
        json_object_set_new(o, "bytes_down", json_integer(st.totals.bytes_down));
        json_object_set_new(o, "bytes_rejected", json_integer(st.totals.bytes_rejected));
        json_object_set_new(o, "dense_bytes", json_integer(st.totals.dense_bytes));
        double vs =
            store_dense_ratio(st.totals.dense_bytes, st.totals.bytes_up, st.totals.bytes_down);
        json_object_set_new(o, "dense_ratio", vs > 0 ? json_real(vs) : json_null());
        json_object_set_new(o, "utilization", json_real_or_null(st.utilization));
        json_object_set_new(o, "goodput", json_real_or_null(st.goodput));
        json_object_set_new(o, "utilization_rounds", json_integer(st.utilization_rounds));
        json_object_set_new(o, "disk_used", json_integer(st.disk.used));
        json_object_set_new(o, "disk_free",
                            st.disk.free >= 0 ? json_integer(st.disk.free) : json_null());
        json_object_set_new(o, "disk_round_bytes", json_integer(st.disk.round_bytes));
        json_object_set_new(o, "disk_rounds_left",
                            st.disk_rounds_left >= 0 ? json_integer(st.disk_rounds_left)
                                                     : json_null());
        json_object_set_new(o, "disk_short", json_boolean(admin_disk_short(&st)));
        json_object_set_new(o, "checkpoints_kept", json_integer(st.disk.kept));
        json_object_set_new(o, "checkpoints_pruned", json_integer(st.disk.pruned));
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++) {
            json_t *s = json_object();
            json_object_set_new(s, "site", json_string(sites[i].s.name));
            json_object_set_new(s, "state", json_string(sites[i].s.state));
            json_object_set_new(s, "online", json_boolean(sites[i].online));
            json_object_set_new(s, "last_seen",
                                sites[i].s.last_seen ? json_integer(sites[i].s.last_seen)
                                                     : json_null());
            json_array_append_new(arr, s);
        }
        json_object_set_new(o, "sites", arr);
        json_emit_line(stdout, o);
    } else {
        printf("federation   %s (model %s", st.federation, st.model);
        if (st.model_params) printf(", %.2fM parameters", st.model_params / 1e6);
        printf(")\n");
        if (st.running)
            printf("coordinator  %s, up %s, resident memory %.1f MB\n", admin_where(a),
                   fmt_duration(st.uptime_ms, t1, sizeof t1), st.rss_bytes / 1e6);
        else if (admin_unreachable(a))
            printf("coordinator  running, but cannot reach it: %s (read from %s)\n",
                   admin_unreachable(a), admin_where(a));
        else
            printf("coordinator  not running (read from %s)\n", admin_where(a));
        printf("round        %lld of %lld, %s", (long long)st.current_round,
               (long long)st.total_rounds, st.round_state);
        if (st.running && st.round_opened_at && strcmp(st.round_state, "finished") != 0)
            printf(" for %s, %lld update%s in",
                   fmt_duration(now - st.round_opened_at, t1, sizeof t1),
                   (long long)st.sites_reported, st.sites_reported == 1 ? "" : "s");
        printf("\n");
        printf("sites        %lld online, %lld offline, %lld revoked\n", (long long)st.sites_online,
               (long long)st.sites_offline, (long long)st.sites_revoked);
        for (size_t i = 0; i < n; i++) {
            const char *state = strcmp(sites[i].s.state, "active") != 0 ? "revoked"
                                : sites[i].online                       ? "online"
                                                                        : "offline";
            if (sites[i].s.last_seen)
                printf("  %-24s %-8s last seen %s ago\n", sites[i].s.name, state,
                       fmt_duration(now - sites[i].s.last_seen, t1, sizeof t1));
            else
                printf("  %-24s %-8s never seen\n", sites[i].s.name, state);
        }
        if (st.last_commit_round >= 0)
            printf("last commit  round %lld at %s (%s ago), validation loss %.4f\n",
                   (long long)st.last_commit_round,
                   time_format_iso8601(st.last_commit_at, t2, sizeof t2),
                   fmt_duration(now - st.last_commit_at, t1, sizeof t1), st.last_eval_loss);
        else
            printf("last commit  none yet\n");
        if (isfinite(st.dp_epsilon))
            printf("privacy      \u03b5 %.4g at \u03b4 %g after round %lld (differential "
                   "privacy; docs/privacy.md)\n",
                   st.dp_epsilon, st.dp_delta, (long long)st.last_commit_round);
        printf("rounds       %lld committed, %lld failed attempts\n",
               (long long)st.totals.rounds_committed, (long long)st.totals.rounds_failed);
        if (isfinite(st.utilization)) {
            char good[16] = "-";
            if (isfinite(st.goodput)) snprintf(good, sizeof good, "%.1f%%", 100 * st.goodput);
            printf("compute      %.1f%% utilization (training over wall time), %s goodput "
                   "(accepted tokens over what the sites could train), last %lld round%s\n",
                   100 * st.utilization, good, (long long)st.utilization_rounds,
                   st.utilization_rounds == 1 ? "" : "s");
        }
        double vs =
            store_dense_ratio(st.totals.dense_bytes, st.totals.bytes_up, st.totals.bytes_down);
        printf("traffic      %.3f MB up, %.3f MB down, %.3f MB refused", st.totals.bytes_up / 1e6,
               st.totals.bytes_down / 1e6, st.totals.bytes_rejected / 1e6);
        if (vs > 0) printf("; %.0fx less than dense data-parallel training", vs);
        printf("\n");
        print_disk(&st);
        printf("rejected     %lld update%s ('strait round show DIR N' says why)\n",
               (long long)st.totals.updates_rejected, st.totals.updates_rejected == 1 ? "" : "s");
    }
    free(sites);
    admin_close(a);
    return EXIT_OK;
}

/* ---- strait round show -------------------------------------------------------------- */

int cmd_round_show(const Command *cmd, int argc, char **argv) {
    int json = cli_json_flag(cmd, argc, argv);
    if (json < 0) return EXIT_USAGE;
    if (optind != argc - 2) return cli_usage_error(cmd, "expected DIR and a round number N");
    char *end;
    long long number = strtoll(argv[optind + 1], &end, 10);
    if (end == argv[optind + 1] || *end || number < 0)
        return cli_usage_error(cmd, "round '%s' is not a round number (0, 1, ...)",
                               argv[optind + 1]);
    char err[ERR_LEN];
    Admin *a = admin_open(argv[optind], err);
    if (a == NULL) return cli_fail(cmd, "%s", err);
    AdminRound round;
    StoreUpdate *ups = NULL;
    size_t n = 0;
    int rc = admin_round_updates(a, number, &round, &ups, &n, err);
    admin_close(a);
    if (rc == STORE_NOT_FOUND)
        return cli_fail(cmd, "no round %lld yet; 'strait rounds DIR' lists them", number);
    if (rc != 0) return cli_fail(cmd, "%s", err);
    int64_t now = time_wall_ms();
    if (json) {
        for (size_t i = 0; i < n; i++) {
            const StoreUpdate *u = &ups[i];
            json_t *o = json_object();
            json_object_set_new(o, "round", json_integer(round.r.number));
            json_object_set_new(o, "attempt", json_integer(round.r.attempt));
            json_object_set_new(o, "site", json_string(u->site_name));
            json_object_set_new(o, "codec", json_string(u->codec));
            json_object_set_new(o, "raw_bytes", json_integer(u->raw_bytes));
            json_object_set_new(o, "wire_bytes", json_integer(u->wire_bytes));
            json_object_set_new(o, "tokens", json_integer(u->tokens));
            json_object_set_new(o, "train_loss", json_real_or_null(u->train_loss));
            json_object_set_new(o, "eval_loss", json_real_or_null(u->eval_loss));
            json_object_set_new(o, "start_eval_loss", json_real_or_null(u->start_eval_loss));
            json_object_set_new(o, "train_ms", json_integer(u->train_ms));
            json_object_set_new(o, "upload_ms", json_integer(u->upload_ms));
            json_object_set_new(o, "download_ms", json_integer(u->download_ms));
            json_object_set_new(o, "decode_ms", json_integer(u->decode_ms));
            json_object_set_new(o, "eval_ms", json_integer(u->eval_ms));
            json_object_set_new(o, "encode_ms", json_integer(u->encode_ms));
            json_object_set_new(o, "staleness", json_integer(u->staleness));
            json_object_set_new(o, "wait_ms",
                                u->wait_ms >= 0 ? json_integer(u->wait_ms) : json_null());
            json_object_set_new(o, "utilization", json_real_or_null(u->utilization));
            json_object_set_new(o, "state", json_string(u->state));
            json_object_set_new(o, "reason", u->reason[0] ? json_string(u->reason) : json_null());
            json_object_set_new(o, "received_at", json_integer(u->received_at));
            json_emit_line(stdout, o);
        }
        free(ups);
        return EXIT_OK;
    }
    char dur[24], line[2048];
    printf("round %lld (attempt %lld): %s, %lld of %lld sites, %lld tokens, %s\n",
           (long long)round.r.number, (long long)round.r.attempt, round.r.state,
           (long long)round.r.participants, (long long)round.expected, (long long)round.r.tokens,
           fmt_duration(round_ms(&round, now), dur, sizeof dur));
    if (round.r.failed_reason[0]) printf("failed: %s\n", round.r.failed_reason);
    if (round.r.late[0]) {
        printf("not waited for, late:");
        for (char *save = NULL, *p = strtok_r(round.r.late, "\n", &save); p;
             p = strtok_r(NULL, "\n", &save))
            printf(" %s", p);
        printf("\n");
    }
    if (round.wall_ms > 0) {
        char util[16] = "-", good[16] = "-";
        if (isfinite(round.utilization))
            snprintf(util, sizeof util, "%.1f%%", 100 * round.utilization);
        if (isfinite(round.goodput)) snprintf(good, sizeof good, "%.1f%%", 100 * round.goodput);
        printf("wall time %s since the round before committed: %s compute utilization, %s "
               "goodput\n",
               fmt_duration(round.wall_ms, dur, sizeof dur), util, good);
    }
    /* where each site's round went, in ms: the model's download and decode,
     * held-out scoring, training, encoding (the site's claims), the upload
     * and the wait for the round's close (the coordinator's measures) */
    printf("%-20s %-6s %9s %9s %7s %8s %8s %8s %7s %7s %7s %8s %7s %7s %7s %6s  %s\n", "SITE",
           "CODEC", "RAW MB", "WIRE MB", "RATIO", "TOKENS", "TRAIN", "VAL", "DOWN", "DECODE",
           "EVAL", "TRAIN MS", "ENCODE", "UPLOAD", "WAIT", "UTIL", "STATE");
    for (size_t i = 0; i < n; i++) {
        const StoreUpdate *u = &ups[i];
        char train[16] = "-", val[16] = "-", ratio[16] = "-";
        if (isfinite(u->train_loss)) snprintf(train, sizeof train, "%.4f", u->train_loss);
        if (isfinite(u->eval_loss)) snprintf(val, sizeof val, "%.4f", u->eval_loss);
        if (u->wire_bytes)
            snprintf(ratio, sizeof ratio, "%.1fx", (double)u->raw_bytes / u->wire_bytes);
        char wait[24] = "-", util[16] = "-";
        if (u->wait_ms >= 0) snprintf(wait, sizeof wait, "%lld", (long long)u->wait_ms);
        if (isfinite(u->utilization)) snprintf(util, sizeof util, "%.1f%%", 100 * u->utilization);
        char age[64] = ""; /* async: trained from an older model */
        if (u->staleness > 0)
            snprintf(age, sizeof age, " (from the model %lld round%s before)",
                     (long long)u->staleness, u->staleness == 1 ? "" : "s");
        snprintf(line, sizeof line,
                 "%-20s %-6s %9.3f %9.3f %7s %8lld %8s %8s %7lld %7lld %7lld %8lld %7lld %7lld "
                 "%7s %6s  %s%s%s%s",
                 u->site_name, u->codec, u->raw_bytes / 1e6, u->wire_bytes / 1e6, ratio,
                 (long long)u->tokens, train, val, (long long)u->download_ms,
                 (long long)u->decode_ms, (long long)u->eval_ms, (long long)u->train_ms,
                 (long long)u->encode_ms, (long long)u->upload_ms, wait, util, u->state, age,
                 u->reason[0] ? ": " : "", u->reason);
        printf("%s\n", line);
    }
    if (round.missed[0]) {
        printf("%s:", live(&round) ? "waiting for" : "no update from");
        for (char *save = NULL, *p = strtok_r(round.missed, "\n", &save); p;
             p = strtok_r(NULL, "\n", &save))
            printf(" %s", p);
        printf("\n");
    }
    free(ups);
    return EXIT_OK;
}

/* ---- strait admin export ------------------------------------------------------------- */

int cmd_admin_export(const Command *cmd, int argc, char **argv) {
    static const struct option opts[] = {{"coordinator", required_argument, NULL, 'c'},
                                         {NULL, 0, NULL, 0}};
    const char *address = NULL;
    int c;
    optind = 1;
    while ((c = cli_getopt(cmd, argc, argv, "", opts)) != -1) {
        if (c == -2) return EXIT_USAGE;
        address = optarg;
    }
    if (optind != argc - 2)
        return cli_usage_error(cmd, "expected the federation folder DIR and the kit folder OUT");
    char err[ERR_LEN];
    if (admin_export(argv[optind], argv[optind + 1], address, err) != 0)
        return cli_fail(cmd, "%s", err);
    printf("admin kit written to %s (admin.key is a secret: keep the folder 0700)\n",
           argv[optind + 1]);
    printf("from any machine that reaches the coordinator:\n  strait status %s\n  strait rounds "
           "%s --watch\n",
           argv[optind + 1], argv[optind + 1]);
    return EXIT_OK;
}

/* ---- strait events ------------------------------------------------------------------ */

int cmd_events(const Command *cmd, int argc, char **argv) {
    static const struct option opts[] = {{"last", required_argument, NULL, 'n'},
                                         {"json", no_argument, NULL, 'j'},
                                         {NULL, 0, NULL, 0}};
    int last = 50, json = 0, c;
    optind = 1;
    while ((c = cli_getopt(cmd, argc, argv, "", opts)) != -1) {
        if (c == -2) return EXIT_USAGE;
        if (c == 'n' && cli_int(cmd, "--last", &last)) return EXIT_USAGE;
        if (c == 'j') json = 1;
    }
    if (optind != argc - 1)
        return cli_usage_error(cmd, "expected one federation folder or admin kit DIR");
    if (last < 1) return cli_usage_error(cmd, "--last must be at least 1");
    char err[ERR_LEN];
    Admin *a = admin_open(argv[optind], err);
    if (a == NULL) return cli_fail(cmd, "%s", err);
    StoreEvent *ev;
    size_t n;
    int rc = admin_events(a, last, 0, &ev, &n, err);
    admin_close(a);
    if (rc != 0) return cli_fail(cmd, "%s", err);
    if (!json) printf("%-24s %-24s %-16s %s\n", "WHEN", "WHO", "WHAT", "DETAIL");
    for (size_t i = n; i-- > 0;) { /* oldest first */
        char when[40];
        time_format_iso8601(ev[i].at, when, sizeof when);
        if (json) {
            json_t *o = json_object();
            json_object_set_new(o, "id", json_integer(ev[i].id));
            json_object_set_new(o, "at", json_string(when));
            json_object_set_new(o, "actor", json_string(ev[i].actor));
            json_object_set_new(o, "action", json_string(ev[i].action));
            json_object_set_new(o, "detail", json_string(ev[i].detail));
            json_emit_line(stdout, o);
        } else {
            printf("%-24s %-24s %-16s %s\n", when, ev[i].actor, ev[i].action, ev[i].detail);
        }
    }
    free(ev);
    return EXIT_OK;
}
