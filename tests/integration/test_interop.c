/*
 * test_interop.c — a Strait checkpoint read by the reference safetensors
 * package from PyPI (in build/venv): every tensor compared with the model's
 * parameters, bit for bit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "kernels/kernels.h"
#include "tests/harness.h"
#include "util/util.h"

Test(interop, pytorch_safetensors_reads_every_tensor, .timeout = 120) {
    const char *py = getenv("STRAIT_PYTHON"), *src = getenv("STRAIT_SRC");
    cr_assert(py && src, "run through make test (it builds build/venv with safetensors)");
    char *dir = harness_tmpdir("interop"), ckpt[700], raw[700], index[700], script[700];
    char err[ERR_LEN];
    snprintf(ckpt, sizeof ckpt, "%s/m.safetensors", dir);
    snprintf(raw, sizeof raw, "%s/params.f32", dir);
    snprintf(index, sizeof index, "%s/index.json", dir);
    snprintf(script, sizeof script, "%s/tests/python/check_safetensors.py", src);
    GPTConfig cfg;
    gpt_config_preset("tiny", &cfg);
    GPT m;
    cr_assert_eq(gpt_build(&m, &cfg, 11, err), 0);
    cr_assert_eq(gpt_save(&m, ckpt, 0, err), 0, "%s", err);
    cr_assert_eq(file_write_atomic(raw, m.params, m.n_params * 4, 0644, err), 0);
    json_t *arr = json_array();
    for (int i = 0; i < m.n_views; i++) {
        const ParamView *v = &m.views[i];
        json_t *shape = json_array();
        for (int d = 0; d < v->ndim; d++) json_array_append_new(shape, json_integer(v->shape[d]));
        json_array_append_new(arr, json_pack("{s:s,s:I,s:o}", "name", v->name, "offset",
                                             (json_int_t)v->offset, "shape", shape));
    }
    char *text = json_dumps(arr, 0);
    json_decref(arr);
    cr_assert_eq(file_write_atomic(index, text, strlen(text), 0644, err), 0);
    free(text);
    char *argv[] = {(char *)py, script, ckpt, raw, index, NULL};
    ProcResult r = proc_run(argv);
    cr_assert_eq(r.status, 0, "python said: %s %s", r.out, r.err);
    char want[64];
    snprintf(want, sizeof want, "ok %d tensors", m.n_views);
    cr_assert_not_null(strstr(r.out, want), "%s", r.out);
    proc_result_free(&r);
    gpt_free(&m);
    harness_rmtree(dir);
    free(dir);
}
