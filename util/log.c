/*
 * log.c — leveled, timestamped log lines on stderr.
 *
 * One line per call, written with a single fprintf under a mutex so lines
 * from gRPC's threads and ours never interleave. The level comes from
 * STRAIT_LOG on first use unless log_set_level was called before.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static LogLevel log_level = LOG_INFO;
static int log_level_set = 0;
static FILE *log_stream = NULL;

static void log_init_from_env(void) {
    const char *env = getenv("STRAIT_LOG");
    LogLevel lvl;
    pthread_mutex_lock(&log_lock);
    if (!log_level_set && env != NULL && log_level_parse(env, &lvl) == 0) log_level = lvl;
    pthread_mutex_unlock(&log_lock);
}

int log_level_parse(const char *name, LogLevel *out) {
    static const char *const names[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i < 5; i++) {
        if (strcmp(name, names[i]) == 0) {
            *out = (LogLevel)i;
            return 0;
        }
    }
    return -1;
}

void log_set_level(LogLevel level) {
    pthread_once(&log_once, log_init_from_env);
    pthread_mutex_lock(&log_lock);
    log_level = level;
    log_level_set = 1;
    pthread_mutex_unlock(&log_lock);
}

LogLevel log_get_level(void) {
    pthread_once(&log_once, log_init_from_env);
    pthread_mutex_lock(&log_lock);
    LogLevel lvl = log_level;
    pthread_mutex_unlock(&log_lock);
    return lvl;
}

void log_set_stream(FILE *f) {
    pthread_mutex_lock(&log_lock);
    log_stream = f;
    pthread_mutex_unlock(&log_lock);
}

void log_vmsg(LogLevel level, const char *module, const char *fmt, va_list ap) {
    if (level >= LOG_OFF || level < log_get_level()) return;
    static const char tags[] = "DIWE";
    char when[32], text[2048];
    time_format_iso8601(time_wall_ms(), when, sizeof when);
    vsnprintf(text, sizeof text, fmt, ap);
    /* One record is one line: a newline inside a message (from a peer, say)
     * would let it forge a second record. */
    for (char *p = text; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    pthread_mutex_lock(&log_lock);
    FILE *f = log_stream ? log_stream : stderr;
    fprintf(f, "%s %c [%s] %s\n", when, tags[level], module ? module : "-", text);
    fflush(f);
    pthread_mutex_unlock(&log_lock);
}

void log_msg(LogLevel level, const char *module, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_vmsg(level, module, fmt, ap);
    va_end(ap);
}
