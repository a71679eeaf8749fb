/*
 * train.c — CPU training throughput: tokens per second of full training
 * steps (forward, backward, clip, AdamW) for `small` with B=8, T=128 and for
 * `base`, at 1 and all threads, with peak memory; and the fused classifier's
 * memory against a naive one on gpt2-124m shapes; and GPT-2 124M beside
 * the Llama family's published shapes (SmolLM2-135M and 360M, Qwen2.5-0.5B,
 * Llama-3.2-1B, random weights) at B 4, T 64 on 2 threads: tokens/s, peak
 * RSS and model FLOPs utilization against the cores' measured sgemm rate,
 * or, where the training state would not fit, what it needs.
 *
 * GPT-2 124M's and SmolLM2-135M's peers are measured in the same run, each
 * in a process of its own, warm: transformers 5 on PyTorch (CPU) training
 * the same model in full, torch.compile'd (inductor; the row's "ratio")
 * and eager, in fp32 beside Strait's fp32 rows and under bf16 autocast
 * beside its --precision bf16 rows (bench/torch_train.py, in make test-hf's
 * venv, which make bench B=train makes; STRAIT_PEFT_PYTHON names its
 * Python); GPT-2's fp32 row also beside transformers' FlaxGPT2LMHeadModel
 * on JAX's CPU backend (bench/hf_train.py; STRAIT_HF_PYTHON). Every peer
 * is in the row's "baselines". llm.c's train_gpt2.c cannot be built here
 * (no network beyond Debian and PyPI): its figures stay beside as
 * references, labelled as such (about 3 900 tokens/s for `small`'s shape;
 * 51 tokens/s and 2.5 GB peak for GPT-2 124M at B 4, T 64 on 2 threads,
 * measured with upstream llm.c on this kind of machine). Each shape runs in
 * a child process so its peak memory is its own.
 *
 * LoRA rows: adapters of rank 16 (alpha 32) on q and v, A and B both
 * training as PEFT's do, over SmolLM2-135M's and Llama-3.2-1B's shapes
 * held in bf16 (random weights), B 4, T 128 on 2 threads, beside PEFT's
 * LoRA on transformers 5 and PyTorch (CPU) training the same adapters on
 * the same shape, threads and batch in the same run, warm
 * (bench/peft_train.py, in make test-hf's venv, which make bench B=train
 * makes; STRAIT_PEFT_PYTHON names its Python).
 *
 * Recompute rows: GPT-2 124M in fp32 at B 4, T 256 on 2 threads at each
 * --recompute level (every other row runs strait's default, 1): tokens/s,
 * peak RSS and the activations' bytes, beside transformers on PyTorch
 * (eager) without and with its gradient checkpointing (each block's
 * forward run again in the backward) in the same run.
 *
 *   build/bench/train [--full] [--lora] [--recompute]   (--full: more steps;
 *                     --lora, --recompute: those rows alone)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef STRAIT_HAVE_OPENMP
#include <omp.h>
#endif

#include "kernels/device.h"
#include "kernels/ops.h"
#include "kernels/model.h"
#include "kernels/train.h"
#include "bench/bench.h"
#include "util/util.h"

#define LLMC_REFERENCE_TOK_S      3900.0
#define LLMC_GPT2_REFERENCE_TOK_S 51.0
#define LLMC_GPT2_REFERENCE_MB    2500.0

static int bench_bf16;  /* this child keeps AdamW's moments in bf16 */
static int bench_lora;  /* this child trains the LoRA rows' adapters over a bf16 base */
static int bench_mixed; /* this child trains with --precision bf16 (bf16 products, fp32 sums) */
static int bench_recompute = MODEL_RECOMPUTE_DEFAULT; /* this child's --recompute */
static int bench_recompute_row;                       /* this child is a recompute row */
#define LORA_RANK 16

/* the LoRA rows' adapters: PEFT's, as bench/peft_train.py makes them */
static AdapterConfig lora_rows(void) {
    return (AdapterConfig){.rank = LORA_RANK,
                           .alpha = 2 * LORA_RANK,
                           .targets = LORA_Q | LORA_V,
                           .rule = LORA_RULE_FEDIT,
                           .base_bf16 = 1};
}

static double tokens_per_s(const char *preset, int B, int T, int threads, int steps) {
    ModelConfig cfg;
    model_config_preset(preset, &cfg);
    Model m;
    char err[ERR_LEN];
    if (model_build(&m, &cfg, 1, err) != 0) DIE("%s", err);
    AdapterConfig a = lora_rows();
    if (bench_lora && model_add_adapters(&m, &a, 2, err) != 0) DIE("%s", err);
    m.moments_bf16 = bench_bf16;
    m.precision_bf16 = bench_mixed;
    m.recompute = bench_recompute;
    kernels_set_threads(threads);
    int *in = mallocCheck(sizeof(int) * (size_t)B * T),
        *tg = mallocCheck(sizeof(int) * (size_t)B * T);
    for (int i = 0; i < B * T; i++) in[i] = (i * 31) % cfg.V, tg[i] = (i * 17 + 1) % cfg.V;
    TrainConfig c = train_defaults(1e-3f, steps + 2);
    Trainer *t = trainer_create(&m, &c, 0, B, T, err); /* the trainer every command uses */
    if (t == NULL) DIE("%s", err);
    uint64_t t0 = 0;
    for (int s = 0; s < steps + 2; s++) {
        if (s == 2) t0 = time_monotonic_ns(); /* two warm-up steps */
        trainer_step(t, in, tg, 1e-3f, NULL);
    }
    double secs = (double)(time_monotonic_ns() - t0) / 1e9;
    trainer_free(t);
    free(in), free(tg);
    model_free(&m);
    return (double)steps * B * T / secs;
}

/* The cores' attainable fp32 rate on `threads`: the best of three 2048³
 * OpenBLAS sgemms split over the threads as matmul_forward splits them —
 * the reference of model FLOPs utilization. */
static double sgemm_flops(int threads) {
    int n = 2048;
    float *a = callocCheck((size_t)n * n, sizeof(float)), *b = callocCheck((size_t)n * n, 4);
    float *c = callocCheck((size_t)n * n, sizeof(float));
    for (size_t i = 0; i < (size_t)n * n; i++) a[i] = b[i] = (float)(i % 7) * 0.1f;
    kernels_set_threads(threads);
    double best = 0;
    for (int k = 0; k < 3; k++) {
        uint64_t t0 = time_monotonic_ns();
        matmul_forward(c, a, b, NULL, n, n, n);
        double secs = (double)(time_monotonic_ns() - t0) / 1e9, f = 2.0 * n * n * (double)n / secs;
        best = f > best ? f : best;
    }
    free(a), free(b), free(c);
    return best;
}

/* The peers measured for a row reach its child through the environment:
 * slot k's JSON row (run_peer's) in STRAIT_BENCH_PEERk. */
#define PEER_SLOTS 3
static void peer_var(char *vn, size_t len, int slot) {
    snprintf(vn, len, "STRAIT_BENCH_PEER%d", slot);
}

/* The peers measured for this row, when they ran: slot 0 (the row's
 * target) as "baseline" and "ratio", every slot in "baselines"; no "ratio"
 * when slot 0's peer did not run. */
static void emit_peer(json_t *o, double tok_s) {
    json_t *all = json_array();
    for (int k = 0; k < PEER_SLOTS; k++) {
        char vn[40];
        peer_var(vn, sizeof vn, k);
        const char *txt = getenv(vn);
        json_t *row = txt ? json_loads(txt, 0, NULL) : NULL;
        const char *name = json_string_value(json_object_get(row, "peer"));
        double peer = json_number_value(json_object_get(row, "tokens_per_s"));
        double rss = json_number_value(json_object_get(row, "peak_rss_mb"));
        if (name != NULL && peer > 0) {
            char what[300];
            snprintf(what, sizeof what, "%s, same shape, threads and steps, measured in this run",
                     name);
            if (k == 0) { /* the row's target: torch.compile'd (PEFT for the LoRA rows) */
                json_object_set_new(o, "baseline", json_string(what));
                json_object_set_new(o, "baseline_tokens_per_s", json_real(peer));
                json_object_set_new(o, "baseline_peak_rss_mb", json_real(rss));
                json_object_set_new(o, "ratio", json_real(tok_s / peer));
            }
            json_array_append_new(all,
                                  json_pack("{s:s,s:f,s:f,s:f}", "baseline", what, "tokens_per_s",
                                            peer, "peak_rss_mb", rss, "ratio", tok_s / peer));
        }
        json_decref(row);
    }
    if (json_array_size(all) > 0)
        json_object_set_new(o, "baselines", all);
    else
        json_decref(all);
}

/* forgets every peer's figures (the next row has its own) */
static void peers_clear(void) {
    for (int k = 0; k < PEER_SLOTS; k++) {
        char vn[40];
        peer_var(vn, sizeof vn, k);
        unsetenv(vn);
    }
}

static void emit(const char *preset, int B, int T, int threads, double tok_s) {
    json_t *o = json_object();
    char name[64];
    snprintf(name, sizeof name, "%s%s", preset,
             bench_lora    ? "_lora_r16"
             : bench_mixed ? "_bf16_products"
                           : "");
    if (bench_recompute_row)
        snprintf(name, sizeof name, "%s_recompute_%d", preset, bench_recompute);
    json_object_set_new(o, "bench", json_string("train"));
    json_object_set_new(o, "case", json_string(name));
    json_object_set_new(o, "preset", json_string(preset));
    json_object_set_new(o, "B", json_integer(B));
    json_object_set_new(o, "T", json_integer(T));
    json_object_set_new(o, "threads", json_integer(threads));
    json_object_set_new(o, "tokens_per_s", json_real(tok_s));
    json_object_set_new(o, "peak_rss_mb", json_real(bench_peak_rss_mb()));
    json_object_set_new(o, "recompute", json_integer(bench_recompute));
    ModelConfig cfg;
    if (bench_recompute_row && model_config_preset(preset, &cfg) == 0) {
        /* the layout's activations and their gradients: what training
         * holds beyond its 16 bytes a parameter */
        double acts =
            model_train_bytes(&cfg, B, T, 0, bench_recompute) - 16.0 * model_config_params(&cfg);
        json_object_set_new(o, "activations_mb", json_real(acts / 1048576.0));
        emit_peer(o, tok_s);
    } else if (bench_lora && model_config_preset(preset, &cfg) == 0) {
        AdapterConfig a = lora_rows();
        cfg.lora = a;
        json_object_set_new(o, "arch", json_string(model_arch_name(cfg.arch)));
        json_object_set_new(o, "params", json_real(model_config_params(&cfg)));
        json_object_set_new(o, "trainable", json_real(model_adapter_trained(&cfg)));
        json_object_set_new(o, "adapters",
                            json_string("LoRA rank 16, alpha 32, on q and v; A and B train (as "
                                        "PEFT's); the base frozen in bf16"));
        emit_peer(o, tok_s);
    } else if (model_config_preset(preset, &cfg) == 0 && cfg.V > 256) { /* the published shapes */
        double params = model_config_params(&cfg), peak = sgemm_flops(threads);
        json_object_set_new(o, "arch", json_string(model_arch_name(cfg.arch)));
        json_object_set_new(o, "params", json_real(params));
        json_object_set_new(o, "memory",
                            json_string(bench_bf16 ? "fp32 parameters and gradients, bf16 AdamW "
                                                     "moments (--moments bf16)"
                                                   : "fp32 parameters, gradients, AdamW moments"));
        if (bench_mixed)
            json_object_set_new(o, "precision",
                                json_string("--precision bf16: matmul and classifier products in "
                                            "bf16, sums and the rest in fp32"));
        /* 6 x parameters FLOPs a token (attention's T² terms left out) */
        json_object_set_new(o, "model_flops_per_s", json_real(6.0 * params * tok_s));
        json_object_set_new(o, "peak_flops_per_s", json_real(peak));
        json_object_set_new(o, "peak", json_string("OpenBLAS sgemm 2048^3 on the same threads"));
        json_object_set_new(o, "mfu", json_real(6.0 * params * tok_s / peak));
        emit_peer(o, tok_s);
    }
    if (strcmp(preset, "gpt2-124m") == 0) {
        json_object_set_new(o, "reference",
                            json_string("llm.c train_gpt2.c, reference figure, not measured here"));
        json_object_set_new(o, "reference_tokens_per_s", json_real(LLMC_GPT2_REFERENCE_TOK_S));
        json_object_set_new(o, "reference_peak_rss_mb", json_real(LLMC_GPT2_REFERENCE_MB));
        json_object_set_new(o, "reference_ratio", json_real(tok_s / LLMC_GPT2_REFERENCE_TOK_S));
    }
    if (strcmp(preset, "small") == 0) {
        json_object_set_new(o, "baseline",
                            json_string("llm.c train_gpt2.c, reference figure, not measured here"));
        json_object_set_new(o, "baseline_tokens_per_s", json_real(LLMC_REFERENCE_TOK_S));
        json_object_set_new(o, "ratio", json_real(tok_s / LLMC_REFERENCE_TOK_S));
    }
    json_emit_line(stdout, o);
}

/* A peer in Python (the interpreter named by the environment variable
 * py_var, running bench/<script> with args): its JSON line goes out as it
 * is, under case_name with this bench's keys, and comes back (the caller
 * frees it) for peer_set; without its venv, or when it fails, one line
 * saying why and NULL. */
static json_t *run_peer(const char *py_var, const char *venv, const char *script, const char *args,
                        const char *case_name, int B, int T) {
    const char *py = getenv(py_var), *src = getenv("STRAIT_SRC");
    char why[400] = "", cmd[2048], line[4096], last[300] = "";
    json_t *row = NULL;
    if (py == NULL || !py[0] || access(py, X_OK) != 0) {
        snprintf(why, sizeof why, "no baseline: %s unset or not runnable (make bench makes %s)",
                 py_var, venv);
    } else {
        snprintf(cmd, sizeof cmd, "%s %s/bench/%s %s 2>&1", py, src && src[0] ? src : ".", script,
                 args);
        fflush(stdout);
        FILE *p = popen(cmd, "r");
        while (p && fgets(line, sizeof line, p)) {
            json_t *o = json_loads(line, 0, NULL);
            if (o && json_object_get(o, "peer")) {
                json_decref(row);
                row = o;
            } else {
                json_decref(o);
                line[strcspn(line, "\n")] = 0;
                if (line[0]) snprintf(last, sizeof last, "%.290s", line);
            }
        }
        int st = p ? pclose(p) : -1;
        if (row == NULL || st != 0)
            snprintf(why, sizeof why, "no baseline: %s ended (status %d): %s", script, st, last);
    }
    if (row == NULL || why[0]) {
        json_decref(row);
        json_emit_line(
            stdout, json_pack("{s:s,s:s,s:s}", "bench", "train", "case", case_name, "reason", why));
        return NULL;
    }
    json_t *o = json_pack("{s:s,s:s,s:i,s:i}", "bench", "train", "case", case_name, "B", B, "T", T);
    json_object_update(o, row);
    json_emit_line(stdout, o);
    return row;
}

/* a peer's row (run_peer's; NULL: none) into the environment the next
 * child reads, at slot (emit_peer) */
static void peer_set(int slot, const json_t *row) {
    if (row == NULL) return;
    char vn[40], *txt = json_dumps(row, JSON_COMPACT);
    peer_var(vn, sizeof vn, slot);
    if (txt) setenv(vn, txt, 1);
    free(txt);
}

/* transformers' GPT-2 124M trained by JAX at B x T on `threads` cores for
 * `steps` timed steps (bench/hf_train.py) */
static json_t *flax_peer(int B, int T, int threads, int steps) {
    char args[128];
    snprintf(args, sizeof args, "%d %d %d %d", B, T, threads, steps);
    return run_peer("STRAIT_HF_PYTHON", "build/venv-flax", "hf_train.py", args,
                    "gpt2-124m_transformers_flax", B, T);
}

/* transformers on PyTorch training preset's shape in full at B x T, eager
 * or torch.compile'd, in fp32 or under bf16 autocast (bench/torch_train.py) */
static json_t *torch_peer(const char *preset, int compiled, int bf16, int B, int T, int threads,
                          int steps, int checkpointing) {
    ModelConfig c;
    model_config_preset(preset, &c);
    char args[512], name[96];
    snprintf(args, sizeof args, "%s %s %s %d %d %d %d %d %d %d %d %d %d %d %g %g %d %s",
             model_arch_name(c.arch), compiled ? "compile" : "eager", bf16 ? "bf16" : "fp32",
             threads, B, T, steps, c.V, c.C, c.F, c.L, c.NH, c.NKV, c.HD, (double)c.eps,
             (double)c.rope.theta, c.tied, checkpointing ? "checkpointing" : "");
    snprintf(name, sizeof name, "%s%s_torch_%s%s", preset, bf16 ? "_bf16_products" : "",
             compiled ? "compile" : "eager", checkpointing ? "_checkpointing" : "");
    return run_peer("STRAIT_PEFT_PYTHON", "build/venv-hf", "torch_train.py", args, name, B, T);
}

/* PEFT's LoRA over preset's shape at B x T (bench/peft_train.py) */
static json_t *peft_peer(const char *preset, int B, int T, int threads, int steps) {
    ModelConfig c;
    model_config_preset(preset, &c);
    char args[512], name[64];
    snprintf(args, sizeof args, "%d %d %d %d %d %d %d %d %d %d %d %d %g %g %d", threads, LORA_RANK,
             B, T, steps, c.V, c.C, c.F, c.L, c.NH, c.NKV, c.HD, (double)c.eps,
             (double)c.rope.theta, c.tied);
    snprintf(name, sizeof name, "%s_lora_r16_peft", preset);
    return run_peer("STRAIT_PEFT_PYTHON", "build/venv-hf", "peft_train.py", args, name, B, T);
}

/* Runs this program again as a child for one row (exec, not fork: OpenMP's
 * thread pool, started in the parent, does not survive a fork); what kind:
 * fp32 or bf16 moments, mixed, lora, or recompute0 to recompute2. */
static void run_child(const char *preset, const char *kind, int full) {
    fflush(stdout);
    char *cargv[] = {"/proc/self/exe",       "--child", (char *)preset, (char *)kind,
                     full ? "--full" : NULL, NULL};
    int pid = proc_start(cargv, NULL);
    if (pid < 0 || proc_wait(pid) != 0) DIE("the %s (%s) case failed", preset, kind);
}

/* a row whose training state would not fit 80% of the memory available:
 * reported, not run; 1 then */
static int too_large(const ModelConfig *cfg, const char *preset, const char *kind, double need) {
    double have = kernels_mem_available();
    if (need <= 0.8 * have) return 0;
    json_emit_line(stdout, json_pack("{s:s,s:s,s:s,s:s,s:f,s:f,s:f,s:b}", "bench", "train", "case",
                                     preset, "arch", model_arch_name(cfg->arch), "kind", kind,
                                     "params", model_config_params(cfg), "needs_gb", need / 1e9,
                                     "available_gb", have / 1e9, "fits", 0));
    return 1;
}

/* LoRA over the published shapes, each beside PEFT's */
static void lora_bench(int threads, int full) {
    static const char *lora_shapes[] = {"smollm2-135m", "llama-3.2-1b"};
    for (size_t k = 0; k < sizeof lora_shapes / sizeof lora_shapes[0]; k++) {
        ModelConfig cfg;
        model_config_preset(lora_shapes[k], &cfg);
        cfg.lora = lora_rows();
        if (too_large(&cfg, lora_shapes[k], "lora",
                      model_train_bytes(&cfg, 4, 128, 0, MODEL_RECOMPUTE_DEFAULT)))
            continue;
        json_t *peer = peft_peer(lora_shapes[k], 4, 128, threads, full ? 10 : 3);
        peers_clear();
        peer_set(0, peer);
        json_decref(peer);
        run_child(lora_shapes[k], "lora", full);
    }
    peers_clear();
}

/* GPT-2 124M at each --recompute level, beside PyTorch eager without and
 * with gradient checkpointing */
#define RECOMPUTE_T 256
static void recompute_bench(int threads, int full) {
    int steps = full ? 5 : 2;
    peers_clear();
    for (int ckpt = 0; ckpt < 2; ckpt++) {
        json_t *peer = torch_peer("gpt2-124m", 0, 0, 4, RECOMPUTE_T, threads, steps, ckpt);
        peer_set(ckpt, peer);
        json_decref(peer);
    }
    for (int level = 0; level <= MODEL_RECOMPUTE_MAX; level++) {
        char kind[32];
        snprintf(kind, sizeof kind, "recompute%d", level);
        run_child("gpt2-124m", kind, full);
    }
    peers_clear();
}

int main(int argc, char **argv) {
    int full = 0, child = 0, lora_only = 0, recompute_only = 0;
    for (int i = 1; i < argc; i++) {
        full |= strcmp(argv[i], "--full") == 0;
        lora_only |= strcmp(argv[i], "--lora") == 0;
        recompute_only |= strcmp(argv[i], "--recompute") == 0;
        child |= i == 1 && strcmp(argv[i], "--child") == 0 && argc > 2;
    }
    log_set_level(LOG_ERROR);
    int max_threads = 1;
#ifdef STRAIT_HAVE_OPENMP
    max_threads = omp_get_max_threads();
#endif
    if (child) { /* a fresh process: its peak RSS is the model's alone */
        const char *preset = argv[2];
        int threads = max_threads < 2 ? max_threads : 2;
        bench_bf16 = argc > 3 && strcmp(argv[3], "bf16") == 0;
        bench_lora = argc > 3 && strcmp(argv[3], "lora") == 0;
        bench_mixed = argc > 3 && strcmp(argv[3], "mixed") == 0;
        if (argc > 3 && strncmp(argv[3], "recompute", 9) == 0)
            bench_recompute_row = 1, bench_recompute = atoi(argv[3] + 9);
        int T = bench_lora ? 128 : bench_recompute_row ? RECOMPUTE_T : 64;
        int steps = bench_recompute_row ? (full ? 5 : 2) : full ? 10 : 3;
        emit(preset, 4, T, threads, tokens_per_s(preset, 4, T, threads, steps));
        return 0;
    }
    if (lora_only) {
        lora_bench(max_threads < 2 ? max_threads : 2, full);
        return 0;
    }
    if (recompute_only) {
        recompute_bench(max_threads < 2 ? max_threads : 2, full);
        return 0;
    }
    /* the fused classifier on gpt2-124m shapes: B=4, T=1024, V=50257, C=768 */
    int N = 4 * 1024, C = 768, V = 50257;
    float *h = mallocCheck(sizeof(float) * (size_t)N * C),
          *wte = mallocCheck(sizeof(float) * (size_t)V * C);
    float *dh = callocCheck((size_t)N * C, sizeof(float)),
          *dw = callocCheck((size_t)V * C, sizeof(float));
    int *tg = mallocCheck(sizeof(int) * (size_t)N);
    for (size_t i = 0; i < (size_t)N * C; i++) h[i] = (float)((i * 2654435761u) % 1000) * 1e-4f;
    for (size_t i = 0; i < (size_t)V * C; i++) wte[i] = (float)((i * 40503u) % 1000) * 1e-5f;
    for (int i = 0; i < N; i++) tg[i] = (i * 7919) % V;
    memset(dh, 0, sizeof(float) * (size_t)N * C); /* touch the gradients: calloc's pages */
    memset(dw, 0, sizeof(float) * (size_t)V * C); /* are only mapped when first written */
    double before = bench_peak_rss_mb();
    kernels_set_threads(max_threads);
    uint64_t t0 = time_monotonic_ns();
    classifier_forward_backward(NULL, dh, dw, h, wte, tg, N, C, V);
    double secs = (double)(time_monotonic_ns() - t0) / 1e9;
    json_t *o = json_object();
    json_object_set_new(o, "bench", json_string("train"));
    json_object_set_new(o, "case", json_string("fused_classifier_gpt2_124m"));
    json_object_set_new(o, "N", json_integer(N));
    json_object_set_new(o, "V", json_integer(V));
    json_object_set_new(o, "inputs_mb",
                        json_real(2.0 * ((double)N * C + (double)V * C) * 4 / 1048576.0));
    json_object_set_new(o, "fused_extra_mb", json_real(bench_peak_rss_mb() - before));
    /* a naive classifier holds the logits and their gradient: 2 N V floats */
    json_object_set_new(o, "naive_logits_mb", json_real(2.0 * N * (double)V * 4 / 1048576.0));
    json_object_set_new(o, "seconds", json_real(secs));
    json_emit_line(stdout, o);
    free(h), free(wte), free(dh), free(dw), free(tg);
    /* GPT-2 124M at llm.c's CPU shape, and the Llama family's published
     * shapes beside it, each in a child: its peak RSS alone. The child is
     * this program run again (exec), not a fork: OpenMP's thread pool,
     * started by the classifier above, does not survive a fork. A shape
     * whose training state would not fit 80% of the memory available is
     * reported, not run. */
    int threads = max_threads < 2 ? max_threads : 2, steps = full ? 10 : 3;
    json_t *flax = flax_peer(4, 64, threads, steps);
    static const struct {
        const char *preset;
        int bf16;
    } shapes[] = {{"gpt2-124m", 0},    {"gpt2-124m", 2},    {"smollm2-135m", 0},
                  {"smollm2-135m", 2}, {"smollm2-360m", 0}, {"smollm2-360m", 1},
                  {"qwen2.5-0.5b", 0}, {"llama-3.2-1b", 0}, {"llama-3.2-1b", 1}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        ModelConfig cfg;
        model_config_preset(shapes[k].preset, &cfg);
        /* 1: bf16 moments; 2: bf16 products (where the chip has bf16 units) */
        if (shapes[k].bf16 == 2 && !bf16_units()) continue;
        const char *kind = shapes[k].bf16 == 1 ? "bf16" : shapes[k].bf16 == 2 ? "mixed" : "fp32";
        if (too_large(&cfg, shapes[k].preset, kind,
                      model_train_bytes(&cfg, 4, 64, shapes[k].bf16 == 1, MODEL_RECOMPUTE_DEFAULT)))
            continue;
        /* GPT-2 124M and SmolLM2-135M beside transformers on PyTorch,
         * torch.compile'd (the row's ratio) and eager, at the row's
         * precision; GPT-2's fp32 row beside Flax too */
        peers_clear();
        if (strcmp(shapes[k].preset, "gpt2-124m") == 0 ||
            strcmp(shapes[k].preset, "smollm2-135m") == 0) {
            for (int compiled = 1; compiled >= 0; compiled--) {
                json_t *peer = torch_peer(shapes[k].preset, compiled, shapes[k].bf16 == 2, 4, 64,
                                          threads, steps, 0);
                peer_set(1 - compiled, peer);
                json_decref(peer);
            }
            if (strcmp(shapes[k].preset, "gpt2-124m") == 0 && shapes[k].bf16 == 0)
                peer_set(2, flax);
        }
        run_child(shapes[k].preset, kind, full);
    }
    peers_clear();
    json_decref(flax);
    lora_bench(max_threads < 2 ? max_threads : 2, full);
    recompute_bench(max_threads < 2 ? max_threads : 2, full);
    int counts[2] = {1, max_threads};
    for (int k = 0; k < (max_threads > 1 ? 2 : 1); k++) {
        emit("small", 8, 128, counts[k], tokens_per_s("small", 8, 128, counts[k], full ? 50 : 15));
        emit("base", 4, 256, counts[k], tokens_per_s("base", 4, 256, counts[k], full ? 10 : 3));
    }
    return 0;
}
