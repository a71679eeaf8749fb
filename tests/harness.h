/*
 * harness.h — what the tests share beyond Criterion: running a real process
 * and capturing its output and exit status, and scratch folders.
 */
#ifndef STRAIT_TESTS_HARNESS_H
#define STRAIT_TESTS_HARNESS_H

#include <stddef.h>

typedef struct ProcResult {
    int status; /* exit status, or 128 + signal if killed */
    char *out;  /* stdout, NUL-terminated, owned */
    char *err;  /* stderr, NUL-terminated, owned */
} ProcResult;

/* Runs argv (argv[0] a path) to completion with stdin from /dev/null. */
ProcResult proc_run(char *const argv[]);
void proc_result_free(ProcResult *r);

/* The strait binary under test (STRAIT_BIN, set by make test). */
const char *harness_strait_bin(void);

/* A fresh empty folder under /tmp; the caller removes it with
 * harness_rmtree. Returns a malloc'd path. */
char *harness_tmpdir(const char *tag);
void harness_rmtree(const char *path);

/* Number of '\n'-terminated lines in s. */
int harness_count_lines(const char *s);

#endif
