/*
 * site.c — a site on several ranks against one process (docs/sites.md):
 * training tokens/s of `small` on one process of 2 threads, beside 2 ranks
 * of 1 thread each under mpirun on the same total batch (16 × 128), and the
 * gradient all-reduce's share of the ranks' step time. Then ZeRO-1's
 * memory: GPT-2 124M on 2 ranks (batches of 2 x 64 each, 3 steps), once
 * with every rank keeping the whole of AdamW's state and once sharded,
 * each rank's peak RSS and the moments it holds, and whether the two runs
 * end on the same parameters (they must: the same sums). Without MPI or
 * mpirun it says so on the ranks' lines and measures the one process only.
 * On a GPU machine the GPU scaling is bench/gpu's (1 and N GPUs).
 *
 *   build/bench/site [--full]      10 steps (30 with --full)
 *   (it runs itself under mpirun with --rank, and --zero 0|1, for the ranks)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "bench/bench.h"
#include "kernels/device.h"
#include "kernels/model.h"
#include "kernels/ranks.h"
#include "kernels/train.h"
#include "util/util.h"

#define B_TOTAL 16
#define T_SEQ   128

static uint64_t reduce_ns;

static void timed_mean(void *ctx, float *x, size_t n) {
    (void)ctx;
    uint64_t t0 = time_monotonic_ns();
    ranks_mean(x, n);
    reduce_ns += time_monotonic_ns() - t0;
}
static void root(void *ctx, float *x, size_t n) {
    (void)ctx;
    ranks_bcast(x, n * sizeof *x);
}

/* tokens/s of this process's share (B of the global batch), with its step
 * time's all-reduce share in *share */
static double run(const Ranks *rk, int threads, int steps, double *share) {
    ModelConfig cfg;
    model_config_preset("small", &cfg);
    Model m;
    char err[ERR_LEN];
    if (model_build(&m, &cfg, 1, err) != 0) DIE("%s", err);
    kernels_set_threads(threads);
    int B = B_TOTAL / rk->size;
    int *in = mallocCheck(sizeof(int) * B_TOTAL * T_SEQ),
        *tg = mallocCheck(sizeof(int) * B_TOTAL * T_SEQ);
    for (int i = 0; i < B_TOTAL * T_SEQ; i++) in[i] = (i * 31) % 256, tg[i] = (i * 17 + 1) % 256;
    TrainConfig c = train_defaults(1e-3f, steps + 2);
    Trainer *t = trainer_create(&m, &c, 0, B, T_SEQ, err);
    if (t == NULL) DIE("%s", err);
    TrainCollectives coll = {timed_mean, root, NULL};
    if (rk->size > 1 && trainer_set_collectives(t, &coll, err) != 0) DIE("%s", err);
    uint64_t t0 = 0;
    for (int s = 0; s < steps + 2; s++) {
        if (s == 2) t0 = time_monotonic_ns(), reduce_ns = 0; /* two warm-up steps */
        size_t off = (size_t)rk->rank * B * T_SEQ;
        trainer_step(t, in + off, tg + off, 1e-3f, NULL);
    }
    double secs = (double)(time_monotonic_ns() - t0) / 1e9;
    *share = (double)reduce_ns / 1e9 / secs;
    trainer_free(t);
    model_free(&m);
    free(in), free(tg);
    return (double)B_TOTAL * T_SEQ * steps / secs; /* the whole site's tokens */
}

/* One of 2 ranks training GPT-2 124M with AdamW's state sharded (zero) or
 * whole; rank 0 prints every rank's peak RSS (MB) and moments held (MB),
 * and the parameters' hash after the steps. */
static void zero_rank(const Ranks *rk, int zero) {
    ModelConfig cfg;
    model_config_preset("gpt2-124m", &cfg);
    Model m;
    char err[ERR_LEN];
    if (model_build(&m, &cfg, 1, err) != 0) DIE("%s", err);
    kernels_set_threads(1);
    enum { B = 2, T = 64, STEPS = 3 };
    int in[B * T], tg[B * T];
    TrainConfig c = train_defaults(1e-3f, STEPS);
    c.zero = zero;
    Trainer *t = trainer_create_ranks(&m, &c, 0, B, T, rk, err);
    if (t == NULL) DIE("%s", err);
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < B * T; i++)
            in[i] = (i * 31 + s + rk->rank * 7) % 50257, tg[i] = (in[i] * 17 + 1) % 50257;
        trainer_step(t, in, tg, 1e-3f, NULL);
    }
    size_t held = m.moments_hi ? m.moments_hi - m.moments_lo : m.n_params;
    /* [rss of rank 0, rss of rank 1, moments of 0, moments of 1]: each its own */
    float v[4] = {0}, *mine[2] = {&v[0], &v[2]};
    size_t bounds[3] = {0, 1, 2};
    for (int k = 0; k < 2; k++) {
        mine[k][rk->rank] = k ? (float)(held * 8.0 / 1e6) : (float)bench_peak_rss_mb();
        ranks_share(mine[k], sizeof(float), bounds);
    }
    uint64_t h = XXH64(m.params, m.n_params * sizeof(float), 0);
    if (rk->rank == 0)
        printf("%.1f %.1f %.1f %.1f %016llx\n", v[0], v[1], v[2], v[3], (unsigned long long)h);
    trainer_free(t);
    model_free(&m);
}

static void emit(const char *kase, int ranks, int threads, double tps, double share, double base,
                 const char *note) {
    json_t *o = json_object();
    json_object_set_new(o, "bench", json_string("site"));
    json_object_set_new(o, "case", json_string(kase));
    json_object_set_new(o, "model", json_string("small"));
    json_object_set_new(o, "batch_total", json_integer(B_TOTAL));
    json_object_set_new(o, "T", json_integer(T_SEQ));
    json_object_set_new(o, "ranks", json_integer(ranks));
    json_object_set_new(o, "threads_per_rank", json_integer(threads));
    if (tps > 0) json_object_set_new(o, "tokens_per_s", json_real(tps));
    if (ranks > 1 && tps > 0) json_object_set_new(o, "allreduce_share", json_real(share));
    if (base > 0 && tps > 0) {
        json_object_set_new(o, "baseline", json_string("1 process x 2 threads, same batch"));
        json_object_set_new(o, "baseline_tokens_per_s", json_real(base));
        json_object_set_new(o, "ratio", json_real(tps / base));
    }
    if (note) json_object_set_new(o, "note", json_string(note));
    json_emit_line(stdout, o);
}

int main(int argc, char **argv) {
    int full = 0, as_rank = 0, zero = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--full") == 0)
            full = 1;
        else if (strcmp(argv[i], "--rank") == 0)
            as_rank = 1;
        else if (strcmp(argv[i], "--zero") == 0 && i + 1 < argc)
            zero = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--full]\n", argv[0]);
            return 2;
        }
    }
    log_set_level(LOG_ERROR);
    int steps = full ? 30 : 10;
    char err[ERR_LEN];
    Ranks rk;
    if (ranks_init(&rk, err) != 0) DIE("%s", err);
    if (as_rank && zero >= 0) { /* ZeRO-1's memory, or the whole state's */
        zero_rank(&rk, zero);
        ranks_finalize();
        return 0;
    }
    if (as_rank) { /* one of the ranks mpirun started: rank 0 reports */
        double share, tps = run(&rk, 1, steps, &share);
        if (rk.rank == 0) printf("%.6f %.6f\n", tps, share);
        ranks_finalize();
        return 0;
    }
    double share, one = run(&rk, 2, steps, &share);
    emit("one_process", 1, 2, one, 0, 0, NULL);
    if (!kernels_build_caps().mpi) {
        emit("ranks", 2, 1, 0, 0, 0, "this strait is built without MPI");
        return 0;
    }
    char cmd[1400], exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    snprintf(cmd, sizeof cmd,
             "mpirun --allow-run-as-root --oversubscribe -np 2 '%s' --rank%s 2>/dev/null", exe,
             full ? " --full" : "");
    FILE *p = popen(cmd, "r");
    double tps = 0, rshare = 0;
    int got = p && fscanf(p, "%lf %lf", &tps, &rshare) == 2;
    if (p) pclose(p);
    emit("ranks", 2, 1, got ? tps : 0, rshare, one,
         got ? NULL : "mpirun did not run (not on PATH?)");
    char hash[2][20] = {"", ""};
    for (int z = 0; z < 2; z++) {
        snprintf(cmd, sizeof cmd,
                 "mpirun --allow-run-as-root --oversubscribe -np 2 '%s' --rank --zero %d "
                 "2>/dev/null",
                 exe, z);
        p = popen(cmd, "r");
        float v[4];
        got = p && fscanf(p, "%f %f %f %f %19s", &v[0], &v[1], &v[2], &v[3], hash[z]) == 5;
        if (p) pclose(p);
        json_t *o = json_object();
        json_object_set_new(o, "bench", json_string("site"));
        json_object_set_new(o, "case", json_string(z ? "ranks_zero1" : "ranks_whole_state"));
        json_object_set_new(o, "model", json_string("gpt2-124m"));
        json_object_set_new(o, "ranks", json_integer(2));
        json_object_set_new(o, "steps", json_integer(3));
        if (got) {
            json_object_set_new(o, "peak_rss_mb", json_pack("[f,f]", v[0], v[1]));
            json_object_set_new(o, "moments_mb", json_pack("[f,f]", v[2], v[3]));
        } else {
            json_object_set_new(o, "note", json_string("mpirun did not run (not on PATH?)"));
        }
        if (z && got && hash[0][0]) {
            json_object_set_new(o, "baseline", json_string("the same 2 ranks, whole state each"));
            json_object_set_new(o, "same_parameters", json_boolean(strcmp(hash[0], hash[1]) == 0));
        }
        json_emit_line(stdout, o);
    }
    return 0;
}
