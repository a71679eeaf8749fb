/*
 * harness.h — what the tests share beyond Criterion: running a real process
 * and capturing its output and exit status, and scratch folders.
 */
#ifndef STRAIT_TESTS_HARNESS_H
#define STRAIT_TESTS_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

/* Deterministic bytes from a seed (xorshift64), for payloads that a test
 * and a helper process must agree on. */
static inline void harness_fill(uint8_t *buf, size_t len, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        buf[i] = (uint8_t)(x >> 32);
    }
}

/* proc_run, proc_read_line, proc_stop and ProcResult: util/util.h. */

/* Starts argv in the background with stdout on a pipe (*out_fd, owned by
 * the caller) and stderr to /dev/null; returns the pid. */
int proc_spawn(char *const argv[], int *out_fd);

/* Runs the strait binary under test with the given arguments (a
 * NULL-terminated list); harness_strait(…) adds the NULL. */
ProcResult proc_run_strait(const char *first, ...);
#define harness_strait(...) proc_run_strait(__VA_ARGS__, (const char *)NULL)

/* The strait binary under test (STRAIT_BIN, set by make test). */
const char *harness_strait_bin(void);

/* The test build (STRAIT_TEST_BIN, set by make test; the test fails
 * without it). */
const char *harness_strait_test_bin(void);
/* With on, the strait processes started from here run the test build
 * (STRAIT_TEST_BIN: build/strait-test, with the fault injection and test
 * hooks of tests/faultsim/faultsim.h) instead of STRAIT_BIN; off puts
 * STRAIT_BIN back. Fails the test when make test did not set it. */
void harness_use_test_build(int on);

/* A fresh empty folder under /tmp; the caller removes it with
 * harness_rmtree. Returns a malloc'd path. */
char *harness_tmpdir(const char *tag);
void harness_rmtree(const char *path);

/* `strait coordinator start FED` in the background: its pid, with the
 * address it bound ("127.0.0.1:PORT", from its first line) in addr (64
 * bytes); -1 when it did not say within 300 s, with the last line it wrote
 * to stderr (kept in FED.stderr) on this process's stderr. */
int harness_start_coordinator(const char *fed, char *addr);

/* `strait site enroll FED NAME` then `strait site join DIR` with the token
 * and CA fingerprint it printed, as an operator would: the site's folder
 * DIR, joined to the coordinator at addr. */
void harness_enroll_join(const char *fed, const char *addr, const char *name, const char *dir);

/* A TCP port on 127.0.0.1 that was free a moment ago, below the kernel's
 * ephemeral range: an outgoing connection (another test's) never takes it,
 * so a coordinator stopped and started again gets it back. */
int harness_free_port(void);
/* "127.0.0.1:PORT" on harness_free_port()'s port, for `strait init
 * --listen`; a static buffer, overwritten by the next call. */
const char *harness_listen(void);
/* Replaces the line "key = …" of [section] in an INI file with "key =
 * value"; appends "[section]\nkey = value" when that section has no such
 * key (so the section must not already exist in that case). */
void harness_ini_set(const char *path, const char *section, const char *key, const char *value);
/* Number of '\n'-terminated lines in s. */
int harness_count_lines(const char *s);
/* Every scalar of a folder of TensorBoard event files, read by TensorBoard's
 * own reader (tests/python/check_tensorboard.py, under STRAIT_PYTHON):
 * {"tag": {"step": value, ...}, ...}, a jansson json_t * the caller
 * decrefs; asserts on failure. */
struct json_t *harness_tensorboard(const char *dir);
/* The value at step of a tag of harness_tensorboard's object (asserts
 * there is one). */
double harness_scalar(struct json_t *tb, const char *tag, int64_t step);

#endif
