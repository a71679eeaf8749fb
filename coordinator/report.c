/*
 * report.c — a federation's run as one self-contained HTML page (`strait
 * report`, and `strait demo` at its end): inline SVG charts, no script,
 * nothing fetched, so it opens offline and can be attached to a message.
 * The loss curves (the global model each round started from, the sites'
 * validation and training losses, each site's), bytes per round up and
 * down against dense data-parallel training, each round's wall time and
 * each site's utilization, refusals and revocations on the time axis,
 * and the configuration. Read through the Admin API, as strait rounds
 * reads: from a running coordinator, or the store of a stopped one.
 * Every point carries its value (data-x, data-y and a tooltip), so the
 * page says what it plots.
 */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator.h"
#include "store.h"
#include "util/util.h"

#define MAX_SERIES 24
#define MAX_SITES  12  /* sites drawn by name; more are said, not drawn */
#define W          900 /* an SVG's size, and its plot area's margins */
#define H          320
#define LEFT       118
#define RIGHT      190
#define TOP        20
#define BOTTOM     48

static const char *const palette[] = {
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#aec7e8", "#ff9896", "#98df8a", "#ffbb78", "#c5b0d5", "#c49c94"};

typedef struct Series {
    char name[80];
    const char *color;
    int dashed, scatter; /* scatter: points only */
    double *x, *y;
    char **tip; /* NULL, or a tooltip a point (owned) */
    int n, cap;
} Series;

typedef struct Chart {
    const char *title, *xlabel, *ylabel;
    int log_y;
    const char *const *rows; /* a chart of rows: y is the row's index */
    int n_rows;
    Series s[MAX_SERIES];
    int ns;
    int fixed;          /* the chart's own series, before its sites' */
    int sites_left_out; /* updates of sites past MAX_SITES, not drawn */
} Chart;

static Series *series_add(Chart *c, const char *name, int dashed) {
    if (c->ns == MAX_SERIES) return NULL;
    Series *s = &c->s[c->ns];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->color = palette[c->ns % (int)(sizeof palette / sizeof *palette)];
    s->dashed = dashed;
    c->ns++;
    return s;
}

/* A site's series, after the chart's own (a site may be named "train"):
 * NULL, counted in sites_left_out, past MAX_SITES sites. */
static Series *site_series(Chart *c, const char *site) {
    char name[96];
    snprintf(name, sizeof name, "site %s", site);
    for (int i = c->fixed; i < c->ns; i++)
        if (strcmp(c->s[i].name, name) == 0) return &c->s[i];
    if (c->ns >= c->fixed + MAX_SITES) {
        c->sites_left_out++;
        return NULL;
    }
    return series_add(c, name, 0);
}

/* A point; one that is not finite (unknown) is left out. */
static int point(Series *s, double x, double y, const char *tip, char *err) {
    if (s == NULL || !isfinite(x) || !isfinite(y)) return 0;
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        double *nx = realloc(s->x, cap * sizeof *nx);
        if (nx) s->x = nx;
        double *ny = realloc(s->y, cap * sizeof *ny);
        if (ny) s->y = ny;
        char **nt = realloc(s->tip, cap * sizeof *nt);
        if (nt) s->tip = nt;
        if (!nx || !ny || !nt) return err_set(err, "out of memory for the report");
        s->cap = cap;
    }
    s->x[s->n] = x, s->y[s->n] = y;
    s->tip[s->n] = tip ? strdup(tip) : NULL;
    s->n++;
    return 0;
}

static void chart_free(Chart *c) {
    for (int i = 0; i < c->ns; i++) {
        for (int k = 0; k < c->s[i].n; k++) free(c->s[i].tip[k]);
        free(c->s[i].x), free(c->s[i].y), free(c->s[i].tip);
    }
    c->ns = 0;
}

static void html_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '"')
            fputs("&quot;", f);
        else
            fputc(*s, f);
    }
}

/* Tick values of a nice step (1, 2 or 5 times a power of ten) over [lo, hi]. */
static int ticks(double lo, double hi, double *out, int max) {
    double span = hi - lo, raw = span / 5, mag = pow(10, floor(log10(raw)));
    double step = raw / mag < 1.5   ? mag
                  : raw / mag < 3.5 ? 2 * mag
                  : raw / mag < 7.5 ? 5 * mag
                                    : 10 * mag;
    int n = 0;
    for (double t = ceil(lo / step) * step; t <= hi + step * 1e-9 && n < max; t += step)
        out[n++] = fabs(t) < step * 1e-9 ? 0 : t;
    return n;
}

static void fmt_value(double v, char *out, size_t len) {
    double a = fabs(v);
    if (a >= 1e9)
        snprintf(out, len, "%.3g G", v / 1e9);
    else if (a >= 1e6)
        snprintf(out, len, "%.3g M", v / 1e6);
    else if (a >= 1e4)
        snprintf(out, len, "%.3g k", v / 1e3);
    else
        snprintf(out, len, "%.4g", v);
}

static void chart_svg(FILE *f, const Chart *c) {
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int i = 0; i < c->ns; i++)
        for (int k = 0; k < c->s[i].n; k++) {
            double y = c->s[i].y[k];
            if (c->log_y && !(y > 0)) continue;
            x0 = fmin(x0, c->s[i].x[k]), x1 = fmax(x1, c->s[i].x[k]);
            y0 = fmin(y0, c->log_y ? log10(y) : y), y1 = fmax(y1, c->log_y ? log10(y) : y);
        }
    fprintf(f,
            "<svg class=\"chart\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"",
            W, H, W, H);
    html_text(f, c->title);
    fprintf(f, "\">\n");
    if (!(x0 <= x1)) {
        fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"none\">nothing to plot yet</text></svg>\n",
                W / 2 - 60, H / 2);
        return;
    }
    if (c->rows) y0 = -0.5, y1 = c->n_rows - 0.5;
    if (x1 - x0 < 1e-12) x0 -= 0.5, x1 += 0.5;
    if (y1 - y0 < 1e-12)
        y0 -= c->log_y ? 0.5 : fabs(y0) * 0.1 + 0.5, y1 += c->log_y ? 0.5 : fabs(y1) * 0.1 + 0.5;
    if (c->log_y) y0 = floor(y0), y1 = ceil(y1); /* whole decades */
    double pad = c->rows || c->log_y ? 0 : (y1 - y0) * 0.05;
    y0 -= pad, y1 += pad;
    double pw = W - LEFT - RIGHT, ph = H - TOP - BOTTOM;
#define PX(x) (LEFT + ((x)-x0) / (x1 - x0) * pw)
#define PY(y) (TOP + ph - ((y)-y0) / (y1 - y0) * ph)
    double t[32];
    int nt = ticks(x0, x1, t, 32);
    for (int i = 0; i < nt; i++) {
        fprintf(f, "<line class=\"grid\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%.0f\"/>", PX(t[i]),
                TOP, PX(t[i]), TOP + ph);
        char v[32];
        fmt_value(t[i], v, sizeof v);
        fprintf(f, "<text class=\"tick\" x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%s</text>\n",
                PX(t[i]), TOP + ph + 16, v);
    }
    if (c->rows) {
        for (int i = 0; i < c->n_rows; i++) {
            fprintf(f, "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\"/>", LEFT,
                    PY(i), LEFT + pw, PY(i));
            fprintf(f, "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">", LEFT - 6,
                    PY(i) + 4);
            html_text(f, c->rows[i]);
            fprintf(f, "</text>\n");
        }
    } else {
        nt = ticks(y0, y1, t, 32);
        for (int i = 0; i < nt; i++) {
            char v[32];
            fmt_value(c->log_y ? pow(10, t[i]) : t[i], v, sizeof v);
            if (c->log_y && fabs(t[i] - round(t[i])) > 1e-9) continue; /* decades only */
            fprintf(f, "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\"/>", LEFT,
                    PY(t[i]), LEFT + pw, PY(t[i]));
            fprintf(f, "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                    LEFT - 6, PY(t[i]) + 4, v);
        }
    }
    fprintf(f, "<rect class=\"frame\" x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\"/>\n", LEFT,
            TOP, pw, ph);
    fprintf(f, "<text class=\"label\" x=\"%.0f\" y=\"%d\" text-anchor=\"middle\">", LEFT + pw / 2,
            H - 8);
    html_text(f, c->xlabel);
    fprintf(f,
            "</text>\n<text class=\"label\" transform=\"translate(16 %.0f) rotate(-90)\" "
            "text-anchor=\"middle\">",
            TOP + ph / 2);
    html_text(f, c->ylabel);
    fprintf(f, "</text>\n");
    for (int i = 0; i < c->ns; i++) {
        const Series *s = &c->s[i];
        fprintf(f, "<g class=\"series\" data-series=\"");
        html_text(f, s->name);
        fprintf(f, "\" stroke=\"%s\" fill=\"%s\">\n", s->color, s->color);
        if (!s->scatter && s->n > 1) {
            fprintf(f, "<polyline fill=\"none\" stroke-width=\"2\"%s points=\"",
                    s->dashed ? " stroke-dasharray=\"6 4\"" : "");
            for (int k = 0; k < s->n; k++) {
                double y = c->log_y ? log10(s->y[k]) : s->y[k];
                if (c->log_y && !(s->y[k] > 0)) continue;
                fprintf(f, "%.1f,%.1f ", PX(s->x[k]), PY(y));
            }
            fprintf(f, "\"/>\n");
        }
        for (int k = 0; k < s->n; k++) {
            if (c->log_y && !(s->y[k] > 0)) continue;
            double y = c->log_y ? log10(s->y[k]) : s->y[k];
            fprintf(f,
                    "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%d\" data-x=\"%.17g\" "
                    "data-y=\"%.17g\"><title>",
                    PX(s->x[k]), PY(y), s->scatter ? 5 : 3, s->x[k], s->y[k]);
            html_text(f, s->name);
            if (s->tip[k]) {
                fputs(": ", f);
                html_text(f, s->tip[k]);
            } else {
                fprintf(f, " at %g: %.6g", s->x[k], s->y[k]);
            }
            fprintf(f, "</title></circle>\n");
        }
        fprintf(f, "</g>\n");
        /* the legend, right of the plot */
        double ly = TOP + 8 + 18 * i;
        fprintf(f,
                "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" "
                "stroke-width=\"3\"%s/><text class=\"legend\" x=\"%.0f\" y=\"%.0f\">",
                LEFT + pw + 12, ly, LEFT + pw + 32, ly, s->color,
                s->dashed ? " stroke-dasharray=\"6 4\"" : "", LEFT + pw + 38, ly + 4);
        html_text(f, s->name);
        fprintf(f, "</text>\n");
    }
#undef PX
#undef PY
    fprintf(f, "</svg>\n");
}

static void section(FILE *f, const char *id, const Chart *c, const char *note) {
    fprintf(f, "<section id=\"%s\"><h2>", id);
    html_text(f, c->title);
    fprintf(f, "</h2>\n");
    chart_svg(f, c);
    if (note) {
        fprintf(f, "<p class=\"note\">");
        html_text(f, note);
        if (c->sites_left_out)
            fprintf(f,
                    " The first %d sites to send an update are drawn; %d more updates of "
                    "later sites are not (strait round show lists them).",
                    MAX_SITES, c->sites_left_out);
        fprintf(f, "</p>\n");
    }
    fprintf(f, "</section>\n");
}

static void fact(FILE *f, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fact(FILE *f, const char *name, const char *fmt, ...) {
    char v[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof v, fmt, ap);
    va_end(ap);
    fprintf(f, "<tr><th>");
    html_text(f, name);
    fprintf(f, "</th><td>");
    html_text(f, v);
    fprintf(f, "</td></tr>\n");
}

static const char *when(int64_t ms, char *buf, size_t len) {
    time_format_iso8601(ms, buf, len);
    return buf;
}

/* What the report reads, kept together. */
typedef struct Run {
    AdminStatus st;
    AdminRound *rounds; /* oldest first */
    size_t n_rounds;
    StoreEvent *events;
    size_t n_events;
    int64_t t0; /* the first round's opening: the time axis's zero */
} Run;

/* The audit log back to the first round's opening, newest first, page by
 * page (a page may be shorter than asked: the Admin API caps it). */
static int read_events(Admin *a, Run *run, char *err) {
    int64_t before = 0;
    for (;;) {
        StoreEvent *ev;
        size_t n;
        if (admin_events(a, 1000, before, &ev, &n, err) != 0) return -1;
        if (n == 0) {
            free(ev);
            return 0;
        }
        StoreEvent *all = realloc(run->events, (run->n_events + n) * sizeof *all);
        if (all == NULL) {
            free(ev);
            return err_set(err, "out of memory for the report");
        }
        memcpy(all + run->n_events, ev, n * sizeof *ev);
        free(ev);
        run->events = all, run->n_events += n;
        const StoreEvent *oldest = &all[run->n_events - 1];
        if (oldest->at < run->t0 || oldest->id <= 1) return 0;
        before = oldest->id;
    }
}

/* The loss chart, the utilization chart and the refusals, from each
 * committed round's updates. */
static int per_site(Admin *a, const Run *run, Chart *loss, Chart *util, Chart *marks, char *err) {
    for (size_t i = 0; i < run->n_rounds; i++) {
        const AdminRound *ar = &run->rounds[i];
        AdminRound round;
        StoreUpdate *ups = NULL;
        size_t n = 0;
        /* the round's committed attempt (else its latest) and its updates */
        if (admin_round_updates(a, ar->r.number, &round, &ups, &n, err) != 0) return -1;
        int committed = strcmp(ar->r.state, "committed") == 0 && round.r.id == ar->r.id;
        for (size_t k = 0; k < n && committed; k++) {
            const StoreUpdate *u = &ups[k];
            char tip[160];
            if (strcmp(u->state, "accepted") != 0) continue;
            snprintf(tip, sizeof tip, "round %lld: held-out %.4f", (long long)ar->r.number,
                     u->eval_loss);
            if (point(site_series(loss, u->site_name), (double)ar->r.number, u->eval_loss, tip,
                      err) != 0 ||
                point(site_series(util, u->site_name), (double)ar->r.number, u->utilization, NULL,
                      err) != 0) {
                free(ups);
                return -1;
            }
        }
        if (round.r.id == ar->r.id) { /* the attempt's updates: each refusal when it came */
            for (size_t k = 0; k < n; k++) {
                const StoreUpdate *u = &ups[k];
                if (strcmp(u->state, "rejected") != 0) continue;
                char tip[400], at[40];
                snprintf(tip, sizeof tip, "%s, round %lld, %s: %s",
                         when(u->received_at, at, sizeof at), (long long)ar->r.number, u->site_name,
                         u->reason);
                if (point(&marks->s[1], (double)(u->received_at - run->t0) / 60000.0, 1, tip,
                          err) != 0) {
                    free(ups);
                    return -1;
                }
            }
        } else { /* an earlier attempt: its refusals as it lists them, at its close */
            char lines[sizeof ar->rejected];
            memcpy(lines, ar->rejected, sizeof lines);
            for (char *save = NULL, *l = strtok_r(lines, "\n", &save); l;
                 l = strtok_r(NULL, "\n", &save)) {
                char tip[400];
                snprintf(tip, sizeof tip, "round %lld, attempt %lld: %s", (long long)ar->r.number,
                         (long long)ar->r.attempt, l);
                if (point(&marks->s[1], (double)(ar->r.closed_at - run->t0) / 60000.0, 1, tip,
                          err) != 0) {
                    free(ups);
                    return -1;
                }
            }
        }
        free(ups);
    }
    return 0;
}

static void write_config(FILE *f, const char *fed_dir) {
    char path[1200], *text = NULL, err[ERR_LEN];
    size_t len;
    snprintf(path, sizeof path, "%s/federation.ini", fed_dir);
    fprintf(f, "<section id=\"config\"><h2>Configuration</h2>\n");
    if (fed_dir[0] && file_read_all(path, 1 << 20, &text, &len, err) == 0) {
        fprintf(f, "<p class=\"note\">federation.ini as it is now (a setting changed between "
                   "restarts shows its last value)</p>\n<pre>");
        html_text(f, text);
        fprintf(f, "</pre>\n");
        free(text);
    } else {
        fprintf(f, "<p class=\"note\">read through an admin kit: the coordinator's "
                   "federation.ini is not at hand (the facts above are the coordinator's)</p>\n");
    }
    fprintf(f, "</section>\n");
}

static void write_page(FILE *f, Run *run, Chart *ch, const char *fed_dir, const char *version) {
    const AdminStatus *st = &run->st;
    char buf[64];
    fprintf(f, "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
               "<title>Strait: ");
    html_text(f, st->federation);
    fprintf(f,
            "</title>\n<style>\n"
            "body{font-family:'DejaVu Sans',sans-serif;margin:24px;color:#222;max-width:1000px}\n"
            "h1{font-size:22px}h2{font-size:17px;margin:28px 0 6px}\n"
            "table.facts th{text-align:left;padding-right:18px;font-weight:normal;color:#555}\n"
            ".grid{stroke:#e4e4e4}.frame{fill:none;stroke:#888}\n"
            ".tick,.legend{font-size:11px;fill:#444}.label{font-size:12px;fill:#222}\n"
            ".note{font-size:12px;color:#555;max-width:900px}.none{fill:#999}\n"
            "pre{background:#f6f6f6;padding:10px;font-size:12px;overflow:auto}\n"
            "</style></head><body>\n<h1>Federation ");
    html_text(f, st->federation);
    fprintf(f, "</h1>\n<table class=\"facts\">\n");
    if (st->model_params > 0)
        fact(f, "model", "%s, %lld parameters", st->model, (long long)st->model_params);
    else
        fact(f, "model", "%s", st->model);
    fact(f, "rounds", "%lld committed of %lld (%s)", (long long)st->totals.rounds_committed,
         (long long)st->total_rounds, st->round_state);
    fact(f, "sites", "%lld enrolled: %lld online, %lld offline, %lld revoked",
         (long long)st->sites_total, (long long)st->sites_online, (long long)st->sites_offline,
         (long long)st->sites_revoked);
    fact(f, "tokens trained", "%lld", (long long)st->totals.tokens);
    char up[32], down[32], dense[32];
    fmt_value((double)st->totals.bytes_up, up, sizeof up);
    fmt_value((double)st->totals.bytes_down, down, sizeof down);
    fmt_value((double)st->totals.dense_bytes, dense, sizeof dense);
    fact(f, "bytes", "%sB up, %sB down; dense data-parallel training would have moved %sB", up,
         down, dense);
    if (isfinite(st->last_eval_loss))
        fact(f, "held-out loss", "%.4f after the last committed round", st->last_eval_loss);
    if (isfinite(st->dp_epsilon))
        fact(f, "differential privacy", "epsilon %.3g at delta %.3g", st->dp_epsilon, st->dp_delta);
    if (run->n_rounds) fact(f, "first round opened", "%s", when(run->t0, buf, sizeof buf));
    fact(f, "report", "%s, by strait %s, read from %s", when(time_wall_ms(), buf, sizeof buf),
         version, st->running ? "the running coordinator" : "the store (coordinator stopped)");
    fprintf(f, "</table>\n");
    section(f, "loss", &ch[0],
            "The global model each round started from as the sites scored it on their held-out "
            "text (global), the sites' models after the round's training (validation and train: "
            "medians) and each site's held-out loss after training, by round.");
    section(f, "bytes", &ch[1],
            "The updates the coordinator took (up), the model bytes it served (down), and what "
            "dense data-parallel training of the same tokens would have moved, per round "
            "(logarithmic).");
    section(f, "time", &ch[2], "Each committed round's wall time, failed attempts and all.");
    section(f, "utilization", &ch[3],
            "Each site's training time over the round's wall time, as its update claims.");
    section(f, "events", &ch[4],
            "Round commits, refused updates and revoked sites, in minutes since the first "
            "round opened (hover a point for what it was).");
    write_config(f, fed_dir);
    fprintf(f, "</body></html>\n");
}

int report_write(Admin *a, const char *fed_dir, const char *out, const char *version, int last,
                 char *err) {
    Run run;
    memset(&run, 0, sizeof run);
    AdminRound *newest = NULL;
    size_t n = 0;
    if (admin_status(a, &run.st, err) != 0 ||
        admin_rounds(a, last > 0 ? last : INT_MAX, 0, &newest, &n, err) != 0)
        return -1;
    run.rounds = calloc(n + 1, sizeof *run.rounds);
    if (run.rounds == NULL) {
        free(newest);
        return err_set(err, "out of memory for the report");
    }
    for (size_t i = 0; i < n; i++) run.rounds[i] = newest[n - 1 - i]; /* oldest first */
    run.n_rounds = n;
    free(newest);
    run.t0 = n ? run.rounds[0].r.opened_at : 0;
    static const char *const rows[] = {"round committed", "update refused", "site revoked"};
    Chart ch[5] = {
        {.title = "Loss", .xlabel = "round", .ylabel = "loss (nats per token)", .fixed = 3},
        {.title = "Bytes per round", .xlabel = "round", .ylabel = "bytes", .log_y = 1},
        {.title = "Round time", .xlabel = "round", .ylabel = "seconds"},
        {.title = "Utilization by site", .xlabel = "round", .ylabel = "training time / wall time"},
        {.title = "Refusals and revocations",
         .xlabel = "minutes since the first round opened",
         .ylabel = "",
         .rows = rows,
         .n_rows = 3},
    };
    int rc = 0;
    Series *global = series_add(&ch[0], "global", 1), *val = series_add(&ch[0], "validation", 0),
           *train = series_add(&ch[0], "train", 1);
    val->color = "#c2185b"; /* its own: the tests find the curve by it */
    Series *up = series_add(&ch[1], "up", 0), *down = series_add(&ch[1], "down", 0),
           *dense = series_add(&ch[1], "dense", 1);
    Series *secs = series_add(&ch[2], "wall time", 0);
    for (int i = 0; i < 3; i++) series_add(&ch[4], rows[i], 0)->scatter = 1;
    for (size_t i = 0; i < run.n_rounds && rc == 0; i++) {
        const StoreRound *r = &run.rounds[i].r;
        if (strcmp(r->state, "committed") != 0) continue;
        double x = (double)r->number;
        char tip[128], at[40];
        snprintf(tip, sizeof tip, "round %lld, %s", (long long)r->number,
                 when(r->closed_at, at, sizeof at));
        rc = point(global, x, r->start_eval_loss > 0 ? r->start_eval_loss : NAN, NULL, err) ||
             point(val, x, r->eval_loss, NULL, err) || point(train, x, r->train_loss, NULL, err) ||
             point(up, x, (double)r->bytes_up, NULL, err) ||
             point(down, x, (double)r->bytes_down, NULL, err) ||
             point(dense, x, r->dense_bytes ? (double)r->dense_bytes : NAN, NULL, err) ||
             point(secs, x, run.rounds[i].wall_ms ? run.rounds[i].wall_ms / 1000.0 : NAN, NULL,
                   err) ||
             point(&ch[4].s[0], (double)(r->closed_at - run.t0) / 60000.0, 0, tip, err);
    }
    if (rc == 0) rc = per_site(a, &run, &ch[0], &ch[3], &ch[4], err);
    if (rc == 0 && run.n_rounds) rc = read_events(a, &run, err); /* t0 is the first round's */
    for (size_t i = 0; i < run.n_events && rc == 0; i++) {
        const StoreEvent *e = &run.events[i];
        if (strcmp(e->action, "site.revoke") != 0 || e->at < run.t0) continue;
        char tip[400], at[40];
        snprintf(tip, sizeof tip, "%s: %s revoked by %s", when(e->at, at, sizeof at), e->detail,
                 e->actor);
        rc = point(&ch[4].s[2], (double)(e->at - run.t0) / 60000.0, 2, tip, err);
    }
    if (rc == 0) { /* made in memory, then written whole (a temporary file renamed) */
        char *page = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&page, &len);
        if (f == NULL) {
            rc = err_set(err, "out of memory for the report");
        } else {
            write_page(f, &run, ch, fed_dir ? fed_dir : "", version);
            if (ferror(f) | fclose(f))
                rc = err_set(err, "out of memory for the report");
            else
                rc = file_write_atomic(out, page, len, 0644, err);
        }
        free(page);
    }
    for (int i = 0; i < 5; i++) chart_free(&ch[i]);
    free(run.rounds), free(run.events);
    return rc ? -1 : 0;
}
