/*
 * test_cli.c — the real `strait` binary run as a separate process: help,
 * version and its capability line, the usage-error conventions (one line
 * on stderr, exit status 2), --data taking a folder of token shards, and
 * a coordinator that refuses each bad setting of federation.ini before it
 * touches its store, the demo's fine-tune flags, and the CPU's kernels
 * named.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "compress/compress.h"
#include "coordinator/coordinator.h"
#include "kernels/device.h"
#include "kernels/model.h"
#include "kernels/tokenizer.h"
#include "kernels/ops.h"
#include "tests/harness.h"
#include "util/util.h"

static ProcResult strait(const char *a1, const char *a2, const char *a3) {
    char *argv[] = {(char *)harness_strait_bin(), (char *)a1, (char *)a2, (char *)a3, NULL};
    return proc_run(argv);
}

Test(cli, version_prints_capability_line) {
    ProcResult r = strait("version", NULL, NULL);
    cr_assert_eq(r.status, 0, "stderr: %s", r.err);
    cr_assert_eq(strncmp(r.out, "strait 0.", 9), 0, "got: %s", r.out);
    cr_assert_not_null(strstr(r.out, "\nbuild: CUDA "), "got: %s", r.out);
    cr_assert_not_null(strstr(r.out, ", OpenBLAS "), "got: %s", r.out);
    cr_assert_not_null(strstr(r.out, ", OpenMP "), "got: %s", r.out);
    cr_assert_not_null(strstr(r.out, "\ndevices: "), "got: %s", r.out);
    cr_assert_str_eq(r.err, "");
    proc_result_free(&r);
}

Test(cli, version_json_is_one_object) {
    ProcResult r = strait("version", "--json", NULL);
    cr_assert_eq(r.status, 0, "stderr: %s", r.err);
    cr_assert_eq(harness_count_lines(r.out), 1);
    json_error_t je;
    json_t *o = json_loads(r.out, 0, &je);
    cr_assert_not_null(o, "not JSON: %s (%s)", r.out, je.text);
    cr_assert(json_is_string(json_object_get(o, "version")));
    cr_assert(json_is_boolean(json_object_get(o, "cuda")));
    cr_assert(json_is_integer(json_object_get(o, "gpus")));
    json_decref(o);
    proc_result_free(&r);
}

Test(cli, unknown_command_is_a_one_line_usage_error) {
    ProcResult r = strait("nosuch", NULL, NULL);
    cr_assert_eq(r.status, 2);
    cr_assert_str_eq(r.out, "");
    cr_assert_eq(harness_count_lines(r.err), 1, "stderr: %s", r.err);
    cr_assert_not_null(strstr(r.err, "unknown command 'nosuch'"), "stderr: %s", r.err);
    proc_result_free(&r);
}

Test(cli, unknown_flag_is_a_one_line_usage_error) {
    ProcResult r = strait("version", "--bogus", NULL);
    cr_assert_eq(r.status, 2);
    cr_assert_eq(harness_count_lines(r.err), 1, "stderr: %s", r.err);
    cr_assert_str_eq(r.err, "strait version: unknown flag '--bogus'; see 'strait help version'\n");
    proc_result_free(&r);
    r = strait("version", "-q", NULL);
    cr_assert_eq(r.status, 2);
    cr_assert_str_eq(r.err, "strait version: unknown flag '-q'; see 'strait help version'\n");
    proc_result_free(&r);
    r = strait("version", "extra", NULL);
    cr_assert_eq(r.status, 2);
    cr_assert_not_null(strstr(r.err, "unexpected argument 'extra'"), "stderr: %s", r.err);
    proc_result_free(&r);
}

Test(cli, numeric_flag_with_junk_is_a_usage_error_naming_the_flag) {
    /* without the check, "10x" read as 10 and "many" as 0 went on silently */
    ProcResult r = strait("train", "--steps", "10x");
    cr_assert_eq(r.status, 2, "stderr: %s", r.err);
    cr_assert_eq(harness_count_lines(r.err), 1, "stderr: %s", r.err);
    cr_assert_str_eq(
        r.err, "strait train: --steps '10x' is not a whole number; see 'strait help train'\n");
    proc_result_free(&r);
    r = strait("demo", "--sites", "many");
    cr_assert_eq(r.status, 2, "stderr: %s", r.err);
    cr_assert_not_null(strstr(r.err, "--sites 'many' is not a whole number"), "stderr: %s", r.err);
    proc_result_free(&r);
    r = strait("train", "--lr", "3e-3.5");
    cr_assert_eq(r.status, 2, "stderr: %s", r.err);
    cr_assert_not_null(strstr(r.err, "--lr '3e-3.5' is not a number"), "stderr: %s", r.err);
    proc_result_free(&r);
    r = strait("sample", "--seed", "-1");
    cr_assert_eq(r.status, 2, "stderr: %s", r.err);
    cr_assert_not_null(strstr(r.err, "--seed '-1' is not a non-negative whole number"),
                       "stderr: %s", r.err);
    proc_result_free(&r);
}

Test(cli, site_run_device_flags_are_checked_before_anything_runs) {
    ProcResult r = harness_strait("demo", "--device", "tpu");
    cr_assert_eq(r.status, 2, "stderr: %s", r.err);
    cr_assert_str_eq(r.err,
                     "strait demo: --device is cpu or cuda, not 'tpu'; see 'strait help demo'\n");
    proc_result_free(&r);
    r = harness_strait("site", "run", "/nonexistent", "--data", "x", "--device", "tpu");
    cr_assert_eq(r.status, 2, "stderr: %s", r.err);
    cr_assert_not_null(strstr(r.err, "--device is cpu or cuda, not 'tpu'"), "stderr: %s", r.err);
    proc_result_free(&r);
    r = harness_strait("site", "run", "/nonexistent", "--data", "x", "--gpus", "2");
    cr_assert_eq(r.status, 2, "stderr: %s", r.err);
    cr_assert_not_null(strstr(r.err, "--gpus needs --device cuda"), "stderr: %s", r.err);
    proc_result_free(&r);
    /* --matmul: a precision of the GPU's matmuls, refused elsewhere and
     * beyond its two values, for site run and train alike */
    const char *matmul[][3] = {{"--matmul", "tf32", "--matmul tf32 needs --device cuda"},
                               {"--matmul", "fp16", "--matmul is tf32 or fp32, not 'fp16'"}};
    for (int i = 0; i < 2; i++) {
        r = harness_strait("site", "run", "/nonexistent", "--data", "x", matmul[i][0],
                           matmul[i][1]);
        cr_assert_eq(r.status, 2, "stderr: %s", r.err);
        cr_assert_eq(harness_count_lines(r.err), 1, "stderr: %s", r.err);
        cr_assert_not_null(strstr(r.err, matmul[i][2]), "stderr: %s", r.err);
        proc_result_free(&r);
        r = harness_strait("train", "--data", "x", matmul[i][0], matmul[i][1]);
        cr_assert_eq(r.status, 2, "stderr: %s", r.err);
        cr_assert_not_null(strstr(r.err, matmul[i][2]), "stderr: %s", r.err);
        proc_result_free(&r);
    }
    /* admin commands need a federation folder or a kit */
    r = harness_strait("rounds", "/nonexistent");
    cr_assert_eq(r.status, 1, "stderr: %s", r.err);
    cr_assert_eq(harness_count_lines(r.err), 1, "stderr: %s", r.err);
    cr_assert_not_null(strstr(r.err, "neither a federation folder"), "stderr: %s", r.err);
    proc_result_free(&r);
    r = harness_strait("rounds", "/tmp", "--last", "0");
    cr_assert_eq(r.status, 2, "stderr: %s", r.err);
    proc_result_free(&r);
}

Test(cli, help_lists_commands_and_explains_one) {
    ProcResult r = strait("--help", NULL, NULL);
    cr_assert_eq(r.status, 0);
    cr_assert_not_null(strstr(r.out, "  version "), "got: %s", r.out);
    proc_result_free(&r);
    r = strait("help", "version", NULL);
    cr_assert_eq(r.status, 0);
    cr_assert_not_null(strstr(r.out, "usage: strait version [--json]"), "got: %s", r.out);
    proc_result_free(&r);
    r = strait("version", "--help", NULL);
    cr_assert_eq(r.status, 0);
    cr_assert_not_null(strstr(r.out, "usage: strait version"), "got: %s", r.out);
    proc_result_free(&r);
    r = strait("help", "nosuch", NULL);
    cr_assert_eq(r.status, 2);
    cr_assert_eq(harness_count_lines(r.err), 1);
    proc_result_free(&r);
}

Test(cli, no_arguments_is_a_usage_error) {
    ProcResult r = strait(NULL, NULL, NULL);
    cr_assert_eq(r.status, 2);
    cr_assert_not_null(strstr(r.err, "usage: strait COMMAND"));
    proc_result_free(&r);
}

/* `strait coordinator start` reads and checks every setting before it
 * touches anything: each bad value below is refused with one line that
 * names its key, exit status 1, and the store is as it was (a start marks
 * an open round failed: never for a typo). */
Test(cli, coordinator_start_refuses_each_bad_setting_before_touching_the_store, .timeout = 120) {
    char *root = harness_tmpdir("cli-settings"), fed[600], ini[700], db[700], err[ERR_LEN];
    snprintf(fed, sizeof fed, "%s/fed", root);
    snprintf(ini, sizeof ini, "%s/federation.ini", fed);
    snprintf(db, sizeof db, "%s/strait.db", fed);
    ProcResult r = harness_strait("init", fed, "--listen", harness_listen(), "--model", "tiny");
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    char *original = NULL, *db_before = NULL;
    size_t len, db_len;
    cr_assert_eq(file_read_all(ini, 1 << 20, &original, &len, err), 0, "%s", err);
    cr_assert_eq(file_read_all(db, 64 << 20, &db_before, &db_len, err), 0, "%s", err);
    static const struct {
        const char *section, *key, *value, *names;
    } cases[] = {
        {"federation", "listen", "nowhere", "listen"},
        {"security", "site_cert_days", "0", "[security] site_cert_days"},
        {"security", "token_ttl", "forever", "[security] token_ttl"},
        {"security", "renew_overlap", "soon", "[security] renew_overlap"},
        {"limits", "workers", "1", "[limits] workers"},
        {"limits", "calls_per_site", "0", "[limits] calls_per_site"},
        {"limits", "admin_reserve", "65", "[limits] admin_reserve"},
        {"limits", "admin_reserve", "16", "admin_reserve = 16; use fewer than workers"},
        {"limits", "join_failures", "0", "[limits] join_failures"},
        {"limits", "transport_memory", "1", "[limits] transport_memory"},
        {"limits", "connections", "1", "[limits] connections"},
        {"limits", "connections_per_address", "0", "[limits] connections_per_address"},
        {"limits", "connections_per_site_address", "0", "[limits] connections_per_site_address"},
        {"limits", "streams_per_connection", "1", "[limits] streams_per_connection"},
        {"model", "preset", "gpt-17", "[model] preset = gpt-17"},
        {"model", "init", "../elsewhere.safetensors", "[model] init"},
        {"model", "init", "/etc/passwd", "[model] init"},
        {"rounds", "total", "0", "[rounds] total"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert_eq(file_write_atomic(ini, original, len, 0600, err), 0, "%s", err);
        cr_assert_eq(config_file_set(ini, cases[i].section, cases[i].key, cases[i].value, err), 0,
                     "%s", err);
        r = harness_strait("coordinator", "start", fed);
        cr_assert_eq(r.status, 1, "[%s] %s = %s: status %d: %s", cases[i].section, cases[i].key,
                     cases[i].value, r.status, r.err);
        cr_assert_not_null(strstr(r.err, cases[i].names), "want '%s' named, got: %s",
                           cases[i].names, r.err);
        cr_assert_eq(harness_count_lines(r.err), 1, "not one line: %s", r.err);
        proc_result_free(&r);
        char *db_now = NULL;
        size_t now_len;
        cr_assert_eq(file_read_all(db, 64 << 20, &db_now, &now_len, err), 0, "%s", err);
        cr_assert(now_len == db_len && memcmp(db_now, db_before, db_len) == 0,
                  "[%s] %s = %s changed the store", cases[i].section, cases[i].key, cases[i].value);
        free(db_now);
    }
    free(original), free(db_before);
    harness_rmtree(root);
    free(root);
}

/* --data FOLDER is the folder's token shards in name order, as strait
 * tokenize --out writes them: the same training as naming each shard */
Test(cli, data_takes_a_folder_of_token_shards) {
    char *root = harness_tmpdir("cli-data"), dir[600], empty[600], a[700], b[700], err[ERR_LEN];
    snprintf(dir, sizeof dir, "%s/shards", root);
    snprintf(empty, sizeof empty, "%s/empty", root);
    cr_assert_eq(file_mkdir_p(empty, 0755, err), 0, "%s", err);
    cr_assert_eq(file_mkdir_p(dir, 0755, err), 0, "%s", err);
    ShardWriter w;
    shard_writer_init(&w, dir, 3000);
    uint64_t s = 7;
    for (int i = 0; i < 5000; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        cr_assert_eq(token_buf_push(&w.b, (int)((s >> 33) % 200) / (1 + i % 3)), 0);
    }
    cr_assert_eq(shard_writer_flush(&w, 1, err), 0, "%s", err);
    cr_assert_eq(w.shards, 2);
    shard_writer_free(&w);
    snprintf(a, sizeof a, "%s/tokens_000000.bin", dir);
    snprintf(b, sizeof b, "%s/tokens_000001.bin", dir);
    char *by_files[] = {(char *)harness_strait_bin(),
                        "train",
                        "--model",
                        "tiny",
                        "--vocab",
                        "256",
                        "--steps",
                        "3",
                        "--batch",
                        "2",
                        "--data",
                        a,
                        "--data",
                        b,
                        NULL};
    char *by_dir[] = {(char *)harness_strait_bin(),
                      "train",
                      "--model",
                      "tiny",
                      "--vocab",
                      "256",
                      "--steps",
                      "3",
                      "--batch",
                      "2",
                      "--data",
                      dir,
                      NULL};
    ProcResult r1 = proc_run(by_files), r2 = proc_run(by_dir);
    cr_assert_eq(r1.status, 0, "%s", r1.err);
    cr_assert_eq(r2.status, 0, "%s", r2.err);
    const char *l1 = strstr(r1.out, "final loss"), *l2 = strstr(r2.out, "final loss");
    cr_assert(l1 && l2, "%s / %s", r1.out, r2.out);
    cr_assert_str_eq(l1, l2);
    proc_result_free(&r1);
    proc_result_free(&r2);
    ProcResult r = harness_strait("train", "--data", empty);
    cr_assert_eq(r.status, 2, "%s", r.err);
    cr_assert_eq(harness_count_lines(r.err), 1, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "without token shards"), "%s", r.err);
    proc_result_free(&r);
    r = harness_strait("site", "run", "/nonexistent", "--data", empty);
    cr_assert_eq(r.status, 2, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "without token shards"), "%s", r.err);
    proc_result_free(&r);
    harness_rmtree(root);
    free(root);
}

/* each name of list ("a, b, c or d") appears in text */
static void each_named(const char *list, const char *text, const char *what) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", list);
    int n = 0;
    for (char *save = NULL, *w = strtok_r(buf, ", ", &save); w; w = strtok_r(NULL, ", ", &save)) {
        if (strcmp(w, "or") == 0) continue;
        char word[80];
        snprintf(word, sizeof word, " %s", w); /* a whole name, not a part of another */
        cr_expect(strstr(text, word) != NULL, "%s: '%s' is not named in its help:\n%s", what, w,
                  text);
        n++;
    }
    cr_assert_gt(n, 1, "%s: no names in '%s'", what, list);
}

/* The help names every choice the code knows, from the same tables, so
 * the two cannot drift: presets (init, train), the byte-level ones (demo),
 * recipes (init, demo), codecs (demo), formats (export). */
Test(cli, help_names_every_preset_recipe_codec_and_format) {
    ProcResult init = strait("help", "init", NULL), train = strait("help", "train", NULL),
               demo = strait("help", "demo", NULL), exp = strait("help", "export", NULL);
    cr_assert(init.status == 0 && train.status == 0 && demo.status == 0 && exp.status == 0);
    each_named(model_preset_names(), init.out, "strait help init");
    each_named(model_preset_names(), train.out, "strait help train");
    each_named(model_byte_preset_names(), demo.out, "strait help demo");
    each_named(coordinator_recipe_names(), init.out, "strait help init");
    each_named(coordinator_recipe_names(), demo.out, "strait help demo");
    each_named(codec_names(), demo.out, "strait help demo");
    each_named("hf, gguf, llmc or peft", exp.out, "strait help export");
    cr_assert_null(strchr(init.out, '{'), "a list left unfilled:\n%s", init.out);
    cr_assert_null(strchr(demo.out, '{'), "a list left unfilled:\n%s", demo.out);
    proc_result_free(&init), proc_result_free(&train), proc_result_free(&demo);
    proc_result_free(&exp);
}

/* strait demo --finetune's own flags are checked before anything runs:
 * the base readable, a site per language at most, --base and --lr only
 * with it */
Test(cli, the_finetune_demos_flags_are_checked_before_anything_runs) {
    const char *cases[][5] = {
        {"--base", "x.gguf", NULL, NULL, "--base and --lr go with --finetune"},
        {"--lr", "1e-3", NULL, NULL, "--base and --lr go with --finetune"},
        {"--finetune", "--lr", "2", NULL, "--lr is between 0 and 1"},
        {"--finetune", "--sites", "5", NULL, "--finetune takes 1 to 4 sites, one per language"},
        {"--finetune", "--base", "/nonexistent.gguf", NULL,
         "cannot read the base /nonexistent.gguf"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *argv[] = {(char *)harness_strait_bin(), "demo",
                        (char *)cases[i][0],          (char *)cases[i][1],
                        (char *)cases[i][2],          NULL};
        ProcResult r = proc_run(argv);
        cr_assert_eq(r.status, 2, "case %zu: status %d, stderr: %s", i, r.status, r.err);
        cr_assert_eq(harness_count_lines(r.err), 1, "case %zu: %s", i, r.err);
        cr_assert_not_null(strstr(r.err, cases[i][4]), "case %zu: %s", i, r.err);
        proc_result_free(&r);
    }
}

/* The CPU's kernels: strait version names OpenBLAS's and the one the
 * chip's instructions allow; a kernel below the chip (here chosen by the
 * user, whom strait leaves be) is said in one line by version and by
 * train, which still trains */
Test(cli, a_blas_kernel_below_the_chip_is_named_in_one_line) {
    unsetenv("OPENBLAS_CORETYPE"); /* strait chooses, not the environment */
    ProcResult r = harness_strait("version", "--json");
    cr_assert_eq(r.status, 0, "%s", r.err);
    json_error_t je;
    json_t *o = json_loads(r.out, 0, &je);
    cr_assert_not_null(o, "%s", r.out);
    const char *core = json_string_value(json_object_get(o, "blas_core"));
    const char *chip = json_string_value(json_object_get(o, "blas_core_for_chip"));
    cr_assert(core && chip && json_string_value(json_object_get(o, "bf16_matmuls")), "%s", r.out);
    cr_assert_geq(kernels_blas_rank(core), kernels_blas_rank(chip),
                  "strait runs %s on a chip that allows %s: it should have started with %s", core,
                  chip, chip);
    int chip_rank = kernels_blas_rank(chip); /* chip lives in o */
    json_decref(o);
    proc_result_free(&r);
    if (chip_rank < 2) cr_skip("this chip has no kernel above Prescott's");
    setenv("OPENBLAS_CORETYPE", "Prescott", 1);
    r = harness_strait("version");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "kernels: OpenBLAS Prescott") &&
                  strstr(r.out, "several times below it; unset OPENBLAS_CORETYPE"),
              "%s", r.out);
    proc_result_free(&r);
    r = harness_strait("train", "--model", "tiny", "--data", "/usr/share/games/fortunes/fortunes",
                       "--steps", "1", "--batch", "2", "--seq", "16");
    unsetenv("OPENBLAS_CORETYPE");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.err, "strait train: OpenBLAS runs its Prescott kernels"), "%s", r.err);
    proc_result_free(&r);
}

/* --precision: bf16 products on a CPU that has bf16 units (3 steps of
 * `small` train and report their loss), refused by name elsewhere, with
 * adapters (their base's precision is its own flag's), or for a value it
 * does not know */
Test(cli, precision_bf16_trains_where_the_chip_has_bf16_and_is_refused_elsewhere) {
    const char *data = "/usr/share/games/fortunes/fortunes";
    ProcResult r = harness_strait("train", "--data", data, "--precision", "fp16");
    cr_assert_eq(r.status, 2, "stderr: %s", r.err);
    cr_assert_not_null(strstr(r.err, "--precision is fp32 or bf16"), "stderr: %s", r.err);
    proc_result_free(&r);
    r = harness_strait("site", "run", "/nonexistent", "--data", "x", "--precision", "int8");
    cr_assert_eq(r.status, 2, "stderr: %s", r.err);
    cr_assert_not_null(strstr(r.err, "--precision is fp32 or bf16, not 'int8'"), "stderr: %s",
                       r.err);
    proc_result_free(&r);
    r = harness_strait("train", "--data", data, "--model", "llama-tiny", "--lora-rank", "4",
                       "--precision", "bf16", "--steps", "1");
    cr_assert_neq(r.status, 0);
    cr_assert_not_null(strstr(r.err, "is for whole-model training"), "stderr: %s", r.err);
    proc_result_free(&r);
    r = harness_strait("train", "--data", data, "--precision", "bf16", "--steps", "3", "--batch",
                       "2", "--seq", "32");
    if (bf16_units()) {
        cr_assert_eq(r.status, 0, "stderr: %s", r.err);
        cr_assert_not_null(strstr(r.out, "final loss"), "stdout: %s", r.out);
    } else {
        cr_assert_neq(r.status, 0);
        cr_assert_not_null(strstr(r.err, "needs a chip with bf16 instructions"), "stderr: %s",
                           r.err);
    }
    proc_result_free(&r);
}

/* --recompute: each level trains `small` to the same checkpoint, byte
 * for byte (the layers' activations computed again are the same values);
 * a level it does not know is refused by both commands, naming the three */
Test(cli, recompute_levels_train_the_same_checkpoint_and_a_wrong_one_is_refused, .timeout = 120) {
    const char *data = "/usr/share/games/fortunes/fortunes";
    ProcResult r = harness_strait("train", "--data", data, "--recompute", "3");
    cr_assert_eq(r.status, 2, "stderr: %s", r.err);
    cr_assert_not_null(strstr(r.err, "--recompute is 0 (keep every activation), 1"), "stderr: %s",
                       r.err);
    proc_result_free(&r);
    r = harness_strait("site", "run", "/nonexistent", "--data", "x", "--recompute", "all");
    cr_assert_eq(r.status, 2, "stderr: %s", r.err);
    cr_assert_not_null(strstr(r.err, "not 'all'"), "stderr: %s", r.err);
    proc_result_free(&r);
    char *dir = harness_tmpdir("cli-recompute"), out[3][700], err[ERR_LEN];
    char *bytes[3];
    size_t len[3];
    for (int level = 0; level < 3; level++) {
        char lv[2] = {(char)('0' + level), 0};
        snprintf(out[level], sizeof out[level], "%s/r%d.ckpt", dir, level);
        r = harness_strait("train", "--data", data, "--model", "small", "--steps", "4", "--batch",
                           "2", "--seq", "64", "--threads", "2", "--recompute", lv, "--out",
                           out[level]);
        cr_assert_eq(r.status, 0, "level %d: %s", level, r.err);
        proc_result_free(&r);
        cr_assert_eq(file_read_all(out[level], 64u << 20, &bytes[level], &len[level], err), 0, "%s",
                     err);
    }
    for (int level = 1; level < 3; level++)
        cr_assert(len[level] == len[0] && memcmp(bytes[level], bytes[0], len[0]) == 0,
                  "--recompute %d wrote another checkpoint than 0", level);
    for (int level = 0; level < 3; level++) free(bytes[level]);
    harness_rmtree(dir);
    free(dir);
}

/* --zero on strait train takes 1 or 0 alone; and a CUDA plugin from another
 * build (here a library that is no plugin at all), whose functions would
 * take other arguments, is refused by name before anything of it is called */
Test(cli, train_zero_is_checked_and_a_foreign_cuda_plugin_is_refused) {
    const char *data = "/usr/share/games/fortunes/fortunes";
    ProcResult r = harness_strait("train", "--data", data, "--zero", "2");
    cr_assert_eq(r.status, 2, "stderr: %s", r.err);
    cr_assert_not_null(strstr(r.err, "--zero is 1 (each GPU keeps its share"), "stderr: %s", r.err);
    proc_result_free(&r);
#ifdef STRAIT_HAVE_CUDA
    const char *foreign = "/lib/x86_64-linux-gnu/libz.so.1"; /* Debian's zlib, on amd64 */
    if (access(foreign, R_OK) != 0) cr_skip_test("no %s on this machine", foreign);
    setenv("STRAIT_CUDA_PLUGIN", foreign, 1);
    r = harness_strait("train", "--data", data, "--device", "cuda", "--steps", "1");
    unsetenv("STRAIT_CUDA_PLUGIN");
    cr_assert_neq(r.status, 0, "stdout: %s", r.out);
    cr_assert_not_null(strstr(r.err, "libz.so.1 is not a strait CUDA plugin"), "stderr: %s", r.err);
    proc_result_free(&r);
#endif
}

/* strait train --tensorboard: a point a step of loss, learning rate,
 * gradient norm and speed, and eval/loss where it validated, with the
 * values its --json lines print (to their six digits); a second run is a
 * second file. */
Test(cli, train_writes_tensorboard_scalars_as_its_json_lines_print_them) {
    char *root = harness_tmpdir("cli-tb"), tb[700];
    snprintf(tb, sizeof tb, "%s/tb", root);
    char *argv[] = {(char *)harness_strait_bin(),
                    "train",
                    "--model",
                    "tiny",
                    "--data",
                    "/usr/share/games/fortunes/wisdom",
                    "--steps",
                    "20",
                    "--batch",
                    "2",
                    "--seq",
                    "32",
                    "--val-every",
                    "10",
                    "--threads",
                    "1",
                    "--json",
                    "--tensorboard",
                    tb,
                    NULL};
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "%s", r.err);
    json_t *got = harness_tensorboard(tb);
    cr_assert_eq(json_object_size(json_object_get(got, "train/loss")), 20);
    cr_assert_eq(json_object_size(json_object_get(got, "eval/loss")), 2, "validated at 10 and 20");
    int lines = 0;
    for (char *save = NULL, *line = strtok_r(r.out, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save), lines++) {
        json_t *o = json_loads(line, 0, NULL);
        cr_assert_not_null(o, "%s", line);
        int64_t step = json_integer_value(json_object_get(o, "step"));
#define SAME(tag, key)                                                                             \
    cr_assert_float_eq(harness_scalar(got, tag, step), json_number_value(json_object_get(o, key)), \
                       1e-5 * fabs(json_number_value(json_object_get(o, key))) + 1e-7,             \
                       "step %lld: %s", (long long)step, tag)
        SAME("train/loss", "loss");
        SAME("train/learning_rate", "lr");
        SAME("train/grad_norm", "grad_norm");
        SAME("eval/loss", "val_loss");
#undef SAME
        cr_assert_gt(harness_scalar(got, "train/tokens_per_second", step), 0);
        json_decref(o);
    }
    cr_assert_eq(lines, 2, "--json prints steps 10 and 20: %s", r.out);
    json_decref(got);
    proc_result_free(&r);
    /* a second run: a file of its own beside the first */
    argv[7] = "5";
    r = proc_run(argv);
    cr_assert_eq(r.status, 0, "%s", r.err);
    proc_result_free(&r);
    r = proc_run((char *[]){"/bin/sh", "-c", "ls \"$0\"/events.out.tfevents.*", tb, NULL});
    cr_assert_eq(harness_count_lines(r.out), 2, "%s", r.out);
    proc_result_free(&r);
    r = proc_run((char *[]){(char *)harness_strait_bin(), "train", "--data",
                            "/usr/share/games/fortunes/wisdom", "--tensorboard", "/proc/no", NULL});
    cr_assert_eq(r.status, 1, "an event folder that cannot be made: %s", r.err);
    cr_assert(strstr(r.err, "--tensorboard"), "%s", r.err);
    proc_result_free(&r);
    harness_rmtree(root);
    free(root);
}
