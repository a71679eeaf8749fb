/*
 * config.c — INI files (federation.ini, site.ini) read through inih into a
 * flat list of (section, key, value), with typed getters that validate.
 *
 * A key given twice in one section is an error rather than "last one wins":
 * a federation's settings should never depend on which line a reader saw.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <ini.h>

#include "util.h"

typedef struct ConfigEntry {
    char *section, *key, *value;
} ConfigEntry;

struct Config {
    ConfigEntry *entries; /* owned, with all their strings */
    size_t n, cap;
    char origin[256]; /* file name for messages */
    char dup_error[ERR_LEN];
    int out_of_memory; /* the handler's: inih would name the line as invalid */
};

static const ConfigEntry *config_find(const Config *cfg, const char *section, const char *key) {
    for (size_t i = 0; i < cfg->n; i++)
        if (strcmp(cfg->entries[i].section, section) == 0 && strcmp(cfg->entries[i].key, key) == 0)
            return &cfg->entries[i];
    return NULL;
}

static int config_handler(void *user, const char *section, const char *key, const char *value) {
    Config *cfg = user;
    if (config_find(cfg, section, key) != NULL) {
        if (cfg->dup_error[0] == '\0')
            snprintf(cfg->dup_error, sizeof cfg->dup_error,
                     "%s: key '%s' appears twice in section [%s]; keep one", cfg->origin, key,
                     section);
        return 0;
    }
    if (cfg->n == cfg->cap) {
        size_t ncap = cfg->cap ? cfg->cap * 2 : 16;
        ConfigEntry *ne = realloc(cfg->entries, ncap * sizeof *ne);
        if (ne == NULL) return cfg->out_of_memory = 1, 0;
        cfg->entries = ne;
        cfg->cap = ncap;
    }
    ConfigEntry *e = &cfg->entries[cfg->n];
    e->section = strdup(section);
    e->key = strdup(key);
    e->value = strdup(value);
    if (!e->section || !e->key || !e->value) {
        free(e->section);
        free(e->key);
        free(e->value);
        cfg->out_of_memory = 1;
        return 0;
    }
    cfg->n++;
    return 1;
}

static Config *config_finish(Config *cfg, int rc, char *err) {
    if (rc == 0) return cfg;
    if (cfg->dup_error[0])
        err_set(err, "%s", cfg->dup_error);
    else if (rc == -1)
        err_set_errno(err, "cannot open %s", cfg->origin);
    else if (rc == -2 || cfg->out_of_memory)
        err_set(err, "out of memory reading %s", cfg->origin);
    else
        err_set(err, "%s:%d: not a valid INI line; expected 'key = value' or '[section]'",
                cfg->origin, rc);
    config_free(cfg);
    return NULL;
}

Config *config_load(const char *path, char *err) {
    Config *cfg = calloc(1, sizeof *cfg);
    if (cfg == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    snprintf(cfg->origin, sizeof cfg->origin, "%s", path);
    return config_finish(cfg, ini_parse(path, config_handler, cfg), err);
}

Config *config_parse_string(const char *text, const char *origin, char *err) {
    Config *cfg = calloc(1, sizeof *cfg);
    if (cfg == NULL) {
        err_set(err, "out of memory");
        return NULL;
    }
    snprintf(cfg->origin, sizeof cfg->origin, "%s", origin);
    return config_finish(cfg, ini_parse_string(text, config_handler, cfg), err);
}

void config_free(Config *cfg) {
    if (cfg == NULL) return;
    for (size_t i = 0; i < cfg->n; i++) {
        free(cfg->entries[i].section);
        free(cfg->entries[i].key);
        free(cfg->entries[i].value);
    }
    free(cfg->entries);
    free(cfg);
}

const char *config_get(const Config *cfg, const char *section, const char *key) {
    const ConfigEntry *e = config_find(cfg, section, key);
    return e ? e->value : NULL;
}

const char *config_get_str(const Config *cfg, const char *section, const char *key,
                           const char *def) {
    const char *v = config_get(cfg, section, key);
    return v ? v : def;
}

int config_get_int(const Config *cfg, const char *section, const char *key, int64_t def,
                   int64_t min, int64_t max, int64_t *out, char *err) {
    const char *v = config_get(cfg, section, key);
    if (v == NULL) {
        *out = def;
        return 0;
    }
    errno = 0;
    char *end;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end != '\0' || errno != 0)
        return err_set(err, "%s: [%s] %s = '%s' is not an integer", cfg->origin, section, key, v);
    if (x < min || x > max)
        return err_set(err, "%s: [%s] %s = %lld is out of range; use %lld to %lld", cfg->origin,
                       section, key, x, (long long)min, (long long)max);
    *out = x;
    return 0;
}

int config_get_double(const Config *cfg, const char *section, const char *key, double def,
                      double *out, char *err) {
    const char *v = config_get(cfg, section, key);
    if (v == NULL) {
        *out = def;
        return 0;
    }
    errno = 0;
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end != '\0' || errno != 0 || !isfinite(x))
        return err_set(err, "%s: [%s] %s = '%s' is not a finite number", cfg->origin, section, key,
                       v);
    *out = x;
    return 0;
}

int config_get_bool(const Config *cfg, const char *section, const char *key, int def, int *out,
                    char *err) {
    const char *v = config_get(cfg, section, key);
    if (v == NULL) {
        *out = def;
        return 0;
    }
    static const char *const yes[] = {"1", "true", "yes", "on"}, *const no[] = {"0", "false", "no",
                                                                                "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0) return *out = 1, 0;
        if (strcasecmp(v, no[i]) == 0) return *out = 0, 0;
    }
    return err_set(err, "%s: [%s] %s = '%s' is not a boolean; use true or false", cfg->origin,
                   section, key, v);
}

int config_get_duration_ms(const Config *cfg, const char *section, const char *key, int64_t def_ms,
                           int64_t *out_ms, char *err) {
    const char *v = config_get(cfg, section, key);
    if (v == NULL) {
        *out_ms = def_ms;
        return 0;
    }
    char why[ERR_LEN];
    if (time_parse_duration_ms(v, out_ms, why) != 0)
        return err_set(err, "%s: [%s] %s: %s", cfg->origin, section, key, why);
    return 0;
}

int config_check_keys(const Config *cfg, const char *section, const char *const *known, char *err) {
    for (size_t i = 0; i < cfg->n; i++) {
        if (strcmp(cfg->entries[i].section, section) != 0) continue;
        int ok = 0;
        for (const char *const *k = known; *k && !ok; k++)
            ok = strcmp(*k, cfg->entries[i].key) == 0;
        if (!ok)
            return err_set(err, "%s: unknown key '%s' in section [%s]; check its spelling",
                           cfg->origin, cfg->entries[i].key, section);
    }
    return 0;
}

int config_check_sections(const Config *cfg, const char *const *known, char *err) {
    for (size_t i = 0; i < cfg->n; i++) {
        int ok = 0;
        for (const char *const *k = known; *k && !ok; k++)
            ok = strcmp(*k, cfg->entries[i].section) == 0;
        if (!ok)
            return err_set(err, "%s: unknown section [%s]; check its spelling", cfg->origin,
                           cfg->entries[i].section);
    }
    return 0;
}

int config_file_set(const char *path, const char *section, const char *key, const char *value,
                    char *err) {
    char *text, current[128] = "";
    if (strchr(value, '\n') || strchr(key, '\n') || strchr(section, ']'))
        return err_set(err, "%s: a value with a newline cannot be set", path);
    if (file_read_all(path, 1 << 20, &text, NULL, err) != 0) return -1;
    size_t cap = strlen(text) + strlen(section) + strlen(key) + strlen(value) + 16;
    char *out = malloc(cap), *o = out;
    if (out == NULL) {
        free(text);
        return err_set(err, "out of memory");
    }
    size_t klen = strlen(key);
    int found = 0;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '[')
            snprintf(current, sizeof current, "%.*s", (int)strcspn(line + 1, "]"), line + 1);
        if (!found && strcmp(current, section) == 0 && strncmp(line, key, klen) == 0 &&
            (line[klen] == ' ' || line[klen] == '=')) {
            o += sprintf(o, "%s = %s\n", key, value);
            found = 1;
        } else {
            o += sprintf(o, "%s\n", line);
        }
    }
    if (!found) sprintf(o, "[%s]\n%s = %s\n", section, key, value);
    int rc = file_write_atomic(path, out, strlen(out), 0644, err);
    free(text), free(out);
    return rc;
}
