/*
 * score.c — the scores of `strait demo`: the federation's final model
 * on held-out collections no site trained on and, with --baseline, the two
 * runs it must match at equal tokens, trained in this process by the
 * trainer `strait train` uses:
 * centralized training at a site's batch (sites × rounds × H steps) and
 * data-parallel training (the sites' batches as one, rounds × H steps —
 * what dense per-step exchange among the sites computes), and every
 * round's global model, so a reader sees whether it ever got worse than the
 * untrained one. Everything goes to DIR/summary.json (one object), which
 * bench/federated and the learning-quality tests read.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "demo.h"
#include "coordinator/store.h"
#include "kernels/device.h"
#include "kernels/formats.h"
#include "kernels/train.h"
#include "util/util.h"

static const char *const HELD_OUT[] = {DEMO_FORTUNES "/platitudes", DEMO_FORTUNES "/miscellaneous"};
#define HELD_OUT_BATCHES 16

static int held_out(const DemoRun *d, const char *ckpt, double *loss, char *err) {
    int T = d->cfg->T < 128 ? d->cfg->T : 128; /* what the sites train on */
    return model_eval_checkpoint(ckpt, HELD_OUT, 2, 8, T, HELD_OUT_BATCHES, loss, err);
}

static int baseline_progress(void *ctx, Trainer *t, const TrainProgress *p) {
    (void)t;
    char suffix[64];
    snprintf(suffix, sizeof suffix, "loss %.3f %.0f tok/s", p->loss, p->tokens_per_s);
    progress_update(ctx, (uint64_t)p->step, suffix);
    return 0;
}

/* One centralized run on every site's collections, in this process through
 * the trainer `strait train` uses, with its defaults (seed 1, lr 3e-3, the
 * last 10% of the data held out); saved as DIR/NAME.safetensors and scored
 * on the held-out collections. */
static int train_baseline(const DemoRun *d, const char *name, long long steps, int batch,
                          double *loss, double *wall_s, FILE *report, char *err) {
    char out[700];
    int T = d->cfg->T < 128 ? d->cfg->T : 128;
    snprintf(out, sizeof out, "%s/%s.safetensors", d->dir, name);
    fprintf(report, "baseline: %s, on the sites' %d collections, %lld steps of %d x %d...\n", name,
            d->n_files, steps, batch, T);
    fflush(report);
    const char *paths[256];
    int n = d->n_files < 256 ? d->n_files : 256;
    for (int i = 0; i < n; i++) paths[i] = d->files[i];
    TokenSet ts;
    if (tokens_load(&ts, paths, n, err) != 0) return -1;
    TokenView train, val;
    tokens_split(&ts, 0.1, &train, &val);
    Model m;
    int64_t t0 = time_wall_ms();
    int rc = model_build(&m, d->cfg, 1, err);
    if (rc == 0) {
        TrainConfig c = train_defaults(3e-3f, (int)steps);
        ProgressBar pb;
        progress_init(&pb, stderr, name, (uint64_t)steps);
        kernels_set_threads(0);
        rc = train_run(&m, &c, train, 0, batch, T, 1, baseline_progress, &pb, err);
        progress_finish(&pb, (uint64_t)steps, rc == 0 ? "done" : "failed");
        if (rc == 0) rc = model_save(&m, out, (int)steps, err);
        model_free(&m);
    }
    tokens_free(&ts);
    *wall_s = (time_wall_ms() - t0) / 1000.0;
    return rc == 0 ? held_out(d, out, loss, err) : -1;
}

int demo_score(const DemoRun *d, const StoreTotals *tot, int baseline, FILE *out, char *err) {
    char ckpt[800], path[700];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/round-%06d.safetensors", d->fed, d->rounds - 1);
    double fed;
    if (held_out(d, ckpt, &fed, err) != 0) return -1;
    double untrained = logf((float)d->cfg->V);
    fprintf(out,
            "the final global model on held-out text (platitudes, miscellaneous): %.4f "
            "(an untrained model: %.2f)\n",
            fed, untrained);
    /* both ways, against dense data-parallel training (docs/communication.md) */
    double ratio = store_dense_ratio(tot->dense_bytes, tot->bytes_up, tot->bytes_down);
    fprintf(out,
            "bytes moved: %.2f MB up and %.2f MB down (%.2f MB refused); dense data-parallel "
            "training, one fp32 gradient up and down per step, would move %.1f MB: %.0fx more\n",
            tot->bytes_up / 1e6, tot->bytes_down / 1e6, tot->bytes_rejected / 1e6,
            tot->dense_bytes / 1e6, ratio);
    json_t *o = json_object();
    json_object_set_new(o, "recipe", json_string(d->recipe));
    json_object_set_new(o, "model", json_string(d->model));
    json_object_set_new(o, "sites", json_integer(d->sites));
    json_object_set_new(o, "rounds", json_integer(d->rounds));
    json_object_set_new(o, "inner_steps", json_integer(d->steps));
    json_object_set_new(o, "non_iid", json_boolean(d->non_iid));
    json_object_set_new(o, "seed", json_integer(d->seed));
    json_object_set_new(o, "val_loss", json_real(fed));
    json_object_set_new(o, "untrained_val_loss", json_real(untrained));
    json_object_set_new(o, "bytes_up", json_integer(tot->bytes_up));
    json_object_set_new(o, "bytes_down", json_integer(tot->bytes_down));
    json_object_set_new(o, "bytes_rejected", json_integer(tot->bytes_rejected));
    json_object_set_new(o, "dense_bytes", json_integer(tot->dense_bytes));
    json_object_set_new(o, "dense_ratio", json_real(ratio));
    /* the same updates exchanged peer to peer (an all-gather, as SparseLoCo
     * and DeMo do): each crosses the network once to every other site */
    json_object_set_new(o, "p2p_bytes", json_integer(tot->bytes_up * (d->sites - 1)));
    json_object_set_new(o, "wall_s", json_real(d->fed_ms / 1000.0));
    int rc = 0;
    if (baseline) {
        double central, central_s, dp, dp_s;
        long long sequential = (long long)d->rounds * d->steps;
        if (train_baseline(d, "centralized", sequential * d->sites, 8, &central, &central_s, out,
                           err) != 0 ||
            train_baseline(d, "data-parallel", sequential, 8 * d->sites, &dp, &dp_s, out, err) !=
                0) {
            json_decref(o);
            return -1;
        }
        fprintf(out, "held-out loss (platitudes, miscellaneous: no site trained on them):\n");
        fprintf(out, "  federated      %.4f  (%d sites, %d rounds, %.0f s)\n", fed, d->sites,
                d->rounds, d->fed_ms / 1000.0);
        fprintf(out, "  centralized    %.4f  (%.0f s)   federated / centralized   %.3f\n", central,
                central_s, fed / central);
        fprintf(out, "  data-parallel  %.4f  (%.0f s)   federated / data-parallel %.3f\n", dp, dp_s,
                fed / dp);
        json_object_set_new(o, "central_val_loss", json_real(central));
        json_object_set_new(o, "dataparallel_val_loss", json_real(dp));
        json_object_set_new(o, "central_wall_s", json_real(central_s));
        json_object_set_new(o, "dataparallel_wall_s", json_real(dp_s));
        /* every round's global model: does it ever fall back past untrained? */
        json_t *rounds = json_array();
        for (int r = 0; r < d->rounds && rc == 0; r++) {
            double loss;
            snprintf(ckpt, sizeof ckpt, "%s/checkpoints/round-%06d.safetensors", d->fed, r);
            rc = held_out(d, ckpt, &loss, err);
            json_array_append_new(rounds, json_real(rc == 0 ? loss : NAN));
        }
        json_object_set_new(o, "round_val_losses", rounds);
    }
    snprintf(path, sizeof path, "%s/summary.json", d->dir);
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (rc == 0 && (text == NULL || file_write_atomic(path, text, strlen(text), 0644, err) != 0))
        rc = text ? -1 : err_set(err, "cannot format the summary");
    free(text);
    return rc;
}
