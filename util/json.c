/*
 * json.c — machine-readable output: one compact JSON object per line
 * (JSON Lines), through jansson, for every `--json` flag and every benchmark.
 * Reals carry six significant digits: figures, not bit patterns. Also a
 * float's shortest decimal, for settings written out to be read back.
 */
#include <stdlib.h>

#include "util.h"

void float_text(char *buf, size_t len, float v) {
    for (int digits = 1; digits <= 9; digits++) { /* nine always read back */
        snprintf(buf, len, "%.*g", digits, (double)v);
        if ((float)strtod(buf, NULL) == v) return;
    }
}

double float_decimal(float v) {
    char buf[32];
    float_text(buf, sizeof buf, v);
    return strtod(buf, NULL);
}

int json_emit_line(FILE *f, json_t *obj) {
    if (obj == NULL) return -1;
    int rc = json_dumpf(obj, f, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(obj);
    if (rc != 0) return -1;
    if (fputc('\n', f) == EOF) return -1;
    return fflush(f) == 0 ? 0 : -1;
}
