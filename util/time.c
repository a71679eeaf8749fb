/*
 * time.c — monotonic time for durations, wall time for records, ISO 8601
 * formatting, and the duration syntax used by flags and federation.ini
 * ("90s", "15m", "24h").
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util.h"

uint64_t time_monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int64_t time_wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct timespec time_after_ms(int clock, int64_t ms) {
    struct timespec t;
    clock_gettime((clockid_t)clock, &t);
    t.tv_sec += (time_t)(ms / 1000);
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
    return t;
}

char *time_format_iso8601(int64_t wall_ms, char *buf, size_t size) {
    time_t secs = (time_t)(wall_ms / 1000);
    int ms = (int)(wall_ms % 1000);
    if (ms < 0) {
        ms += 1000;
        secs -= 1;
    }
    struct tm tm;
    gmtime_r(&secs, &tm);
    char base[24];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, size, "%s.%03dZ", base, ms);
    return buf;
}

int time_parse_duration_ms(const char *text, int64_t *out_ms, char *err) {
    static const struct {
        const char *suffix;
        int64_t ms;
    } units[] = {{"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}, {"d", 86400000}, {"", 1000}};
    if (text == NULL || *text == '\0')
        return err_set(err, "empty duration; write it like 90s, 15m, 24h or 7d");
    errno = 0;
    char *end;
    double v = strtod(text, &end);
    if (end == text || errno != 0 || v < 0)
        return err_set(err, "bad duration '%s'; write it like 90s, 15m, 24h or 7d", text);
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suffix) != 0) continue;
        double ms = v * (double)units[i].ms;
        if (ms > (double)INT64_MAX / 2) return err_set(err, "duration '%s' is too long", text);
        *out_ms = (int64_t)(ms + 0.5);
        return 0;
    }
    return err_set(err, "bad duration unit in '%s'; use ms, s, m, h or d", text);
}
