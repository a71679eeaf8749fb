/*
 * progress.c — a one-line progress bar redrawn in place with '\r'.
 *
 * It draws only when its stream is a terminal, so logs, pipes and CI output
 * never fill with carriage returns, and at most ten times a second, so a hot
 * loop can call progress_update on every step.
 */
#include <string.h>
#include <unistd.h>

#include "util.h"

#define PROGRESS_WIDTH           30
#define PROGRESS_MIN_INTERVAL_NS 100000000ull

void progress_init(ProgressBar *pb, FILE *out, const char *label, uint64_t total) {
    memset(pb, 0, sizeof *pb);
    pb->out = out;
    pb->enabled = out != NULL && isatty(fileno(out));
    snprintf(pb->label, sizeof pb->label, "%s", label ? label : "");
    pb->total = total;
}

static void progress_draw(ProgressBar *pb, uint64_t done, const char *suffix) {
    char bar[PROGRESS_WIDTH + 1];
    if (pb->total > 0) {
        uint64_t d = done > pb->total ? pb->total : done;
        int fill = (int)(d * PROGRESS_WIDTH / pb->total);
        for (int i = 0; i < PROGRESS_WIDTH; i++) bar[i] = i < fill ? '#' : '.';
        bar[PROGRESS_WIDTH] = '\0';
        fprintf(pb->out, "\r%s [%s] %3d%% %llu/%llu %s\033[K", pb->label, bar,
                (int)(d * 100 / pb->total), (unsigned long long)done, (unsigned long long)pb->total,
                suffix ? suffix : "");
    } else {
        fprintf(pb->out, "\r%s %llu %s\033[K", pb->label, (unsigned long long)done,
                suffix ? suffix : "");
    }
    fflush(pb->out);
    pb->drawn = 1;
}

void progress_update(ProgressBar *pb, uint64_t done, const char *suffix) {
    if (!pb->enabled) return;
    uint64_t now = time_monotonic_ns();
    if (pb->drawn && now - pb->last_draw_ns < PROGRESS_MIN_INTERVAL_NS) return;
    pb->last_draw_ns = now;
    progress_draw(pb, done, suffix);
}

void progress_finish(ProgressBar *pb, uint64_t done, const char *suffix) {
    if (!pb->enabled) return;
    progress_draw(pb, done, suffix);
    fputc('\n', pb->out);
    fflush(pb->out);
    pb->drawn = 0;
}
