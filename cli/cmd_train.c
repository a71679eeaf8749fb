/*
 * cmd_train.c — `strait train` (the trainer without federation: the
 * baseline every federated run is compared with) and `strait sample`.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "kernels/device.h"
#include "kernels/model.h"
#include "kernels/formats.h"
#include "kernels/gguf.h"
#include "kernels/data.h"
#include "kernels/tokenizer.h"
#include "kernels/train.h"
#include "kernels/sampler.h"
#include "util/util.h"

/* What strait train prints as it goes: a progress bar, a line per
 * validation, or JSON lines. */
typedef struct TrainOut {
    ProgressBar pb;
    TokenView val;
    int B, T, steps, val_every, json, have_val, cuda, started;
    float val_loss, loss;
    EventFile *events; /* --tensorboard: a record a step */
} TrainOut;

/* TensorBoard's scalars of a step, under the names Hugging Face's Trainer
 * gives them (eval/loss only where the step validated). A file that cannot
 * be written is said once and closed: the training goes on. */
static void train_events(TrainOut *o, const TrainProgress *p, int validated) {
    static const char *const tags[] = {"train/loss", "train/learning_rate", "train/grad_norm",
                                       "train/tokens_per_second", "eval/loss"};
    double v[] = {p->loss, p->lr, p->grad_norm, p->tokens_per_s, validated ? o->val_loss : NAN};
    char err[ERR_LEN];
    if (events_scalars(o->events, p->step, time_wall_ms() / 1000.0, tags, v, 5, err) != 0) {
        fprintf(stderr, "strait train: %s; TensorBoard's file is not written from here on\n", err);
        events_close(o->events);
        o->events = NULL;
    }
}

static void train_started(void *ctx, const TrainJobStart *s) {
    TrainOut *o = ctx;
    o->val = s->val, o->T = s->T, o->started = 1;
    o->have_val = s->val.n > (size_t)o->B * s->T; /* at least one batch of validation */
    if (!o->json && s->n_frozen)
        fprintf(stderr,
                "training adapters of %s (%zu parameters over a frozen base of %zu, its "
                "matmuls in %s) on %zu tokens, %d steps of %d x %d%s\n",
                s->name, s->n_params, s->n_frozen,
                s->base_bf16 ? "bf16 (--lora-base-dtype f32 for fp32)" : "fp32", s->train_tokens,
                o->steps, o->B, s->T, o->cuda ? " per GPU" : "");
    else if (!o->json)
        fprintf(stderr, "training %s (%zu parameters) on %zu tokens, %d steps of %d x %d%s\n",
                s->name, s->n_params, s->train_tokens, o->steps, o->B, s->T,
                o->cuda ? " per GPU" : "");
    progress_init(&o->pb, stderr, "train", (uint64_t)o->steps);
}

static int train_observe(void *ctx, Trainer *t, const TrainProgress *p) {
    TrainOut *o = ctx;
    int last = p->step == p->steps;
    o->loss = p->loss;
    int validated = o->have_val && (p->step % o->val_every == 0 || last);
    if (validated) {
        /* where it trains: a GPU scores its own parameters (and an adapted
         * model's fp32 base there, which the host would hold in bf16) */
        o->val_loss = (float)trainer_eval_tokens(t, o->val, 8);
    }
    if (o->events) train_events(o, p, validated);
    if (o->json && (p->step % 10 == 0 || last || p->step % o->val_every == 0)) {
        json_t *j = json_object();
        json_object_set_new(j, "step", json_integer(p->step));
        json_object_set_new(j, "loss", json_real(p->loss));
        json_object_set_new(j, "val_loss",
                            isnan(o->val_loss) ? json_null() : json_real(o->val_loss));
        json_object_set_new(j, "lr", json_real(p->lr));
        json_object_set_new(j, "grad_norm",
                            isnan(p->grad_norm) ? json_null() : json_real(p->grad_norm));
        json_object_set_new(j, "tokens_per_s", json_real(p->tokens_per_s));
        json_emit_line(stdout, j);
    }
    char suffix[96];
    snprintf(suffix, sizeof suffix, "loss %.3f val %.3f %.0f tok/s", p->loss, o->val_loss,
             p->tokens_per_s);
    progress_update(&o->pb, (uint64_t)p->step, suffix);
    if (!o->json && !o->pb.enabled && (p->step % o->val_every == 0 || last))
        fprintf(stderr, "step %d/%d loss %.4f val %.4f %.0f tok/s\n", p->step, p->steps, p->loss,
                o->val_loss, p->tokens_per_s);
    return 0;
}

int cmd_train(const Command *cmd, int argc, char **argv) {
    static const struct option opts[] = {{"data", required_argument, NULL, 'd'},
                                         {"model", required_argument, NULL, 'm'},
                                         {"steps", required_argument, NULL, 's'},
                                         {"batch", required_argument, NULL, 'b'},
                                         {"seq", required_argument, NULL, 't'},
                                         {"lr", required_argument, NULL, 'l'},
                                         {"threads", required_argument, NULL, 'j'},
                                         {"device", required_argument, NULL, 'D'},
                                         {"out", required_argument, NULL, 'o'},
                                         {"val-every", required_argument, NULL, 'v'},
                                         {"gpus", required_argument, NULL, 'g'},
                                         {"seed", required_argument, NULL, 'S'},
                                         {"json", no_argument, NULL, 'J'},
                                         {"init-from", required_argument, NULL, 'I'},
                                         {"vocab", required_argument, NULL, 'V'},
                                         {"moments", required_argument, NULL, 'M'},
                                         {"matmul", required_argument, NULL, 'x'},
                                         {"adapters", required_argument, NULL, 'P'},
                                         {"base-blocks", required_argument, NULL, 'K'},
                                         {"precision", required_argument, NULL, 'Q'},
                                         {"recompute", required_argument, NULL, 'R'},
                                         {"zero", required_argument, NULL, 'Z'},
                                         {"tensorboard", required_argument, NULL, 'E'},
                                         CLI_LORA_OPTS,
                                         {NULL, 0, NULL, 0}};
    AdapterConfig lora = {0};
    const char *adapters = NULL;
    const char *data[64], *preset = "small", *out = NULL, *device = "cpu", *init_from = NULL,
                          *tensorboard = NULL;
    int n_data = 0, vocab = 0, steps = 1000, B = 8, T = 0, threads = 0, val_every = 100, json = 0,
        gpus = 1, moments_bf16 = 0, tf32 = -1, blocks_off = 0, precision_bf16 = 0,
        recompute = MODEL_RECOMPUTE_DEFAULT, unsharded = 0;
    float lr = 3e-3f;
    unsigned long long seed = 1;
    int c;
    optind = 1;
    while ((c = cli_getopt(cmd, argc, argv, "", opts)) != -1) {
        switch (c) {
        case -2:
            return EXIT_USAGE;
        case 'd':
            if (cli_data_add(cmd, data, &n_data, optarg) != 0) return EXIT_USAGE;
            break;
        case 'm':
            preset = optarg;
            break;
        case 's':
            if (cli_int(cmd, "--steps", &steps)) return EXIT_USAGE;
            break;
        case 'b':
            if (cli_int(cmd, "--batch", &B)) return EXIT_USAGE;
            break;
        case 't':
            if (cli_int(cmd, "--seq", &T)) return EXIT_USAGE;
            break;
        case 'l':
            if (cli_float(cmd, "--lr", &lr)) return EXIT_USAGE;
            break;
        case 'j':
            if (cli_int(cmd, "--threads", &threads)) return EXIT_USAGE;
            break;
        case 'D':
            device = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case 'v':
            if (cli_int(cmd, "--val-every", &val_every)) return EXIT_USAGE;
            break;
        case 'g':
            if (cli_int(cmd, "--gpus", &gpus)) return EXIT_USAGE;
            break;
        case 'S':
            if (cli_u64(cmd, "--seed", &seed)) return EXIT_USAGE;
            break;
        case 'J':
            json = 1;
            break;
        case 'I':
            init_from = optarg;
            break;
        case 'V':
            if (cli_int(cmd, "--vocab", &vocab)) return EXIT_USAGE;
            break;
        case 'M':
            if (strcmp(optarg, "fp32") != 0 && strcmp(optarg, "bf16") != 0)
                return cli_usage_error(cmd, "--moments is fp32 or bf16, not '%s'", optarg);
            moments_bf16 = strcmp(optarg, "bf16") == 0;
            break;
        case 'x':
            if ((tf32 = cli_matmul(cmd, optarg)) < 0) return EXIT_USAGE;
            break;
        case 'K':
            if ((blocks_off = cli_base_blocks(cmd, optarg)) < 0) return EXIT_USAGE;
            break;
        case 'Q':
            if (strcmp(optarg, "fp32") != 0 && strcmp(optarg, "bf16") != 0)
                return cli_usage_error(
                    cmd,
                    "--precision is fp32 or bf16 (the matmuls' products in bf16, "
                    "sums and everything else in fp32), not '%s'",
                    optarg);
            precision_bf16 = optarg[0] == 'b';
            break;
        case 'R':
            if ((recompute = cli_recompute(cmd, optarg)) < 0) return EXIT_USAGE;
            break;
        case 'Z':
            if (strcmp(optarg, "0") != 0 && strcmp(optarg, "1") != 0)
                return cli_usage_error(cmd,
                                       "--zero is 1 (each GPU keeps its share of AdamW's state, "
                                       "the default) or 0 (each keeps all of it), not '%s'",
                                       optarg);
            unsharded = optarg[0] == '0';
            break;
        case 'P':
            adapters = optarg;
            break;
        case 'E':
            tensorboard = optarg;
            break;
        CLI_LORA_CASES:
            if (cli_lora_opt(cmd, c, optarg, &lora) != 0) return EXIT_USAGE;
            break;
        }
    }
    if (cli_lora_done(cmd, &lora, 0, seed) != 0) return EXIT_USAGE;
    for (; optind < argc; optind++) /* paths may follow --data as plain operands */
        if (cli_data_add(cmd, data, &n_data, argv[optind]) != 0) return EXIT_USAGE;
    if (n_data == 0) return cli_usage_error(cmd, "give the training text with --data PATH");
    if (steps < 1 || B < 1 || T < 0 || !(lr > 0) || val_every < 1)
        return cli_usage_error(cmd, "--steps, --batch and --val-every must be positive, --lr > 0");
    int cuda = strcmp(device, "cuda") == 0;
    if (!cuda && strcmp(device, "cpu") != 0)
        return cli_usage_error(cmd, "--device is cpu or cuda, not '%s'", device);
#ifndef STRAIT_HAVE_CUDA
    if (cuda) return cli_usage_error(cmd, "--device cuda: this strait was built without CUDA");
#endif
    if (gpus < 1) return cli_usage_error(cmd, "--gpus must be at least 1");
    if (tf32 == 1 && !cuda) return cli_usage_error(cmd, "--matmul tf32 needs --device cuda");
    if (vocab < 0 || vocab > 65536 || (vocab && init_from))
        return cli_usage_error(cmd, "--vocab is 1 to 65536, and not with --init-from (its "
                                    "config.json has one)");
    ModelConfig cfg; /* a preset's flags are checked here; a folder's, once it is read */
    if (!init_from && model_config_preset(preset, &cfg) != 0)
        return cli_usage_error(cmd, "unknown model '%s'; use one of %s", preset,
                               model_preset_names());
    if (!init_from && T > cfg.T)
        return cli_usage_error(cmd, "--seq %d is longer than %s's %d", T, preset, cfg.T);
    kernels_set_threads(threads);
    char err[ERR_LEN], slow[300];
    if (kernels_blas_check(err) != 0) return cli_fail(cmd, "%s", err);
    if (kernels_blas_below_chip(slow, sizeof slow)) fprintf(stderr, "strait train: %s\n", slow);
    TrainJob job = {.data = data,
                    .n_data = n_data,
                    .preset = preset,
                    .init_from = init_from,
                    .out = out,
                    .vocab = vocab,
                    .steps = steps,
                    .B = B,
                    .T = T,
                    .gpus = cuda ? gpus : 0,
                    .moments_bf16 = moments_bf16,
                    .blocks_off = blocks_off,
                    .precision_bf16 = precision_bf16,
                    .recompute = recompute,
                    .unsharded = unsharded,
                    .tf32 = cuda && tf32 != 0,
                    .lr = lr,
                    .seed = seed,
                    .lora = lora,
                    .adapters = adapters};
    TrainOut o = {.B = B,
                  .steps = steps,
                  .val_every = val_every,
                  .json = json,
                  .val_loss = NAN,
                  .cuda = cuda};
    /* a file of its own each run, in the folder TensorBoard is pointed at */
    if (tensorboard && (o.events = events_open(tensorboard, err)) == NULL)
        return cli_fail(cmd, "--tensorboard: %s", err);

    if (train_job(&job, train_started, train_observe, &o, err) != 0) {
        events_close(o.events); /* what it has, synced */
        if (o.started) progress_finish(&o.pb, 0, "failed");
        return cli_fail(cmd, "%s%s", cuda && o.started ? "--device cuda: " : "", err);
    }
    progress_finish(&o.pb, (uint64_t)steps, "done");
    if (o.events && !json) fprintf(stderr, "TensorBoard's events in %s\n", events_path(o.events));
    events_close(o.events);
    if (out && !json) fprintf(stderr, "checkpoint written to %s\n", out);
    if (!json) printf("final loss %.4f, validation loss %.4f\n", o.loss, o.val_loss);
    return EXIT_OK;
}

int cmd_sample(const Command *cmd, int argc, char **argv) {
    static const struct option opts[] = {{"prompt", required_argument, NULL, 'p'},
                                         {"tokens", required_argument, NULL, 'n'},
                                         {"temperature", required_argument, NULL, 't'},
                                         {"seed", required_argument, NULL, 's'},
                                         {"tokenizer", required_argument, NULL, 'T'},
                                         {"vocab", required_argument, NULL, 'v'},
                                         {"merges", required_argument, NULL, 'm'},
                                         {"base", required_argument, NULL, 'B'},
                                         {NULL, 0, NULL, 0}};
    const char *prompt = "", *tdir = NULL, *vocab = NULL, *merges = NULL, *base = NULL;
    int n = 200;
    float temperature = 1.0f;
    unsigned long long seed = 1;
    int c;
    optind = 1;
    while ((c = cli_getopt(cmd, argc, argv, "", opts)) != -1) {
        switch (c) {
        case -2:
            return EXIT_USAGE;
        case 'p':
            prompt = optarg;
            break;
        case 'n':
            if (cli_int(cmd, "--tokens", &n)) return EXIT_USAGE;
            break;
        case 't':
            if (cli_float(cmd, "--temperature", &temperature)) return EXIT_USAGE;
            break;
        case 's':
            if (cli_u64(cmd, "--seed", &seed)) return EXIT_USAGE;
            break;
        case 'T':
            tdir = optarg;
            break;
        case 'v':
            vocab = optarg;
            break;
        case 'm':
            merges = optarg;
            break;
        case 'B':
            base = optarg;
            break;
        }
    }
    if (optind != argc - 1) return cli_usage_error(cmd, "expected one checkpoint CKPT");
    if (n < 1 || !(temperature >= 0))
        return cli_usage_error(cmd, "--tokens > 0, --temperature >= 0");
    char err[ERR_LEN];
    const char *ckpt = argv[optind];
    /* a Strait checkpoint, or a pretrained model as people hold it (a GGUF
     * file, a Hugging Face folder), which is also its own tokenizer */
    struct stat st;
    int pretrained = (stat(ckpt, &st) == 0 && S_ISDIR(st.st_mode)) || cli_gguf_file(ckpt);
    Model m;
    memset(&m, 0, sizeof m);
    if (pretrained ? model_import(&m, ckpt, err) != 0
                   : model_read_config(ckpt, &m.cfg, NULL, err) != 0)
        return cli_fail(cmd, "%s", err);
    ModelConfig cfg = m.cfg;
    if (pretrained && !tdir && !vocab && !merges && cfg.V != 256) tdir = ckpt; /* its own */
    Tokenizer *tok = NULL;
    if (tdir || vocab || merges) {
        if ((tok = cli_tokenizer_open(tdir, vocab, merges, err)) == NULL) {
            model_free(&m);
            return cli_fail(cmd, "%s", err);
        }
        if (tokenizer_vocab_size(tok) > cfg.V) {
            int tv = tokenizer_vocab_size(tok);
            tokenizer_free(tok);
            model_free(&m);
            return cli_fail(cmd,
                            "the tokenizer has %d tokens, the model only %d: not its tokenizer", tv,
                            cfg.V);
        }
    } else if (cfg.V != 256) {
        return cli_fail(cmd,
                        "this checkpoint uses a %d-token vocabulary: give its BPE tokenizer with "
                        "--tokenizer DIR (tokenizer.json, or vocab.json and merges.txt) or "
                        "FILE.gguf",
                        cfg.V);
    }
    if (!pretrained && model_load_checkpoint(&m, &cfg, ckpt, base, err) != 0) {
        tokenizer_free(tok);
        model_free(&m);
        return cli_fail(cmd, "%s", err);
    }
    model_sample_text(&m, tok, prompt, n, temperature, seed, stdout);
    tokenizer_free(tok);
    model_free(&m);
    return EXIT_OK;
}
