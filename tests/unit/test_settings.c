/*
 * test_settings.c — federation.ini's round settings (coordinator/settings.c),
 * read from text: every key refused with a message that names it when its
 * value is not of its kind or out of its range, the combinations that
 * contradict each other refused, and each recipe read with its own codecs
 * and optimizer, a key written in the file winning over the recipe's.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "coordinator/coordinator_internal.h"
#include "kernels/model.h"
#include "util/util.h"

static int read_text(const char *text, RoundsSettings *o, char *err) {
    ModelConfig gc;
    cr_assert_eq(model_config_preset("tiny", &gc), 0);
    Config *cfg = config_parse_string(text, "federation.ini", err);
    cr_assert_not_null(cfg, "%s: %s", text, err);
    int rc = rounds_settings_read(cfg, &gc, o, err);
    config_free(cfg);
    return rc;
}

/* [model]'s settings read from text into a coordinator of its own */
static int read_model(const char *text, Coordinator *co, char *err) {
    memset(co, 0, sizeof *co);
    Config *cfg = config_parse_string(text, "federation.ini", err);
    cr_assert_not_null(cfg, "%s: %s", text, err);
    err[0] = '\0';
    int rc = model_settings_read(cfg, co, err);
    config_free(cfg);
    return rc;
}

/* a refusal of ini: one line naming the file and `names` */
static void assert_refusal(const char *ini, const char *err, const char *names) {
    cr_assert_not_null(strstr(err, names), "%s: want '%s' named, got '%s'", ini, names, err);
    cr_assert_not_null(strstr(err, "federation.ini"), "%s: '%s' does not name the file", ini, err);
    cr_assert_null(strchr(err, '\n'), "more than one line: %s", err);
}

Test(settings, every_bad_value_is_refused_naming_its_key) {
    static const struct {
        const char *ini, *names;
    } cases[] = {
        {"[rounds]\ntotal = 0\n", "[rounds] total"},
        {"[rounds]\ntotal = ten\n", "[rounds] total"},
        {"[rounds]\nmin_sites = 0\n", "[rounds] min_sites"},
        {"[rounds]\nmin_sites = most\n", "[rounds] min_sites"},
        {"[rounds]\ndeadline = soon\n", "[rounds] deadline"},
        {"[rounds]\ndeadline = 10ms\n", "[rounds] deadline"},
        {"[rounds]\ninner_steps = 0\n", "[rounds] inner_steps"},
        {"[rounds]\nmax_extensions = -1\n", "[rounds] max_extensions"},
        {"[rounds]\ntime_budget = a while\n", "[rounds] time_budget"},
        {"[rounds]\ntime_budget = 30d\n", "[rounds] time_budget"},
        {"[rounds]\noverlap = perhaps\n", "[rounds] overlap"},
        {"[rounds]\noverlap = on\nlookahead = 1.5\n", "[rounds] lookahead"},
        {"[rounds]\noverlap = on\nlookahead = -0.1\n", "[rounds] lookahead"},
        {"[rounds]\nlookahead = ahead\n", "[rounds] lookahead"},
        {"[rounds]\nmode = lockstep\n", "[rounds] mode"},
        {"[rounds]\nmode = async\nstaleness = 0\n", "[rounds] staleness"},
        {"[rounds]\ngrace = long\n", "[rounds] grace"},
        {"[rounds]\ngrace = 11\n", "[rounds] grace"},
        {"[rounds]\nmode = async\noverlap = on\n", "overlap = on"},
        {"[rounds]\nadaptive_deadline = sometimes\n", "[rounds] adaptive_deadline"},
        {"[rounds]\nbatch = 0\n", "[rounds] batch"},
        {"[rounds]\nseq = 100000\n", "[rounds] seq"},
        {"[rounds]\nmax_update_ratio = big\n", "[rounds] max_update_ratio"},
        {"[rounds]\nmax_update_ratio = -1\n", "[rounds] max_update_ratio"},
        {"[rounds]\nnorm_bound = wide\n", "[rounds] norm_bound"},
        {"[rounds]\nnorm_bound = 0.5\n", "[rounds] norm_bound"},
        {"[rounds]\nclip = 0.5\n", "[rounds] clip"},
        {"[rounds]\nclip = x\n", "[rounds] clip"},
        {"[rounds]\nweight_cap = 2e6\n", "[rounds] weight_cap"},
        {"[rounds]\nweight_cap = y\n", "[rounds] weight_cap"},
        {"[rounds]\nrobust_start = sometimes\n", "[rounds] robust_start"},
        {"[rounds]\ntrim = 0.5\n", "[rounds] trim"},
        {"[rounds]\ntrim = some\n", "[rounds] trim"},
        {"[rounds]\naggregate = majority\n", "[rounds] aggregate"},
        {"[limits]\nupload_min_rate = -1\n", "[limits] upload_min_rate"},
        {"[limits]\nupload_grace = never\n", "[limits] upload_grace"},
        {"[limits]\nupload_grace = 10ms\n", "[limits] upload_grace"},
        {"[limits]\nrefusals_per_round = 0\n", "[limits] refusals_per_round"},
        {"[limits]\ndownloads_per_round = 0\n", "[limits] downloads_per_round"},
        {"[limits]\nspool = 1\n", "[limits] spool"},
        {"[limits]\nspool_per_site = -1\n", "[limits] spool_per_site"},
        {"[limits]\nupload_header = x\n", "[limits] upload_header"},
        {"[limits]\nupload_header = 10ms\n", "[limits] upload_header"},
        {"[limits]\nupload_idle = x\n", "[limits] upload_idle"},
        {"[limits]\nupload_idle = 10ms\n", "[limits] upload_idle"},
        {"[limits]\nupload_life = x\n", "[limits] upload_life"},
        {"[limits]\nupload_life = 100ms\n", "[limits] upload_life"},
        {"[model]\nseed = -1\n", "[model] seed"},
        {"[recipe]\nname = sgd\n", "[recipe] name"},
        {"[codec]\nuplink = zip\n", "[codec] uplink"},
        {"[codec]\ndensity = thin\n", "[codec] density"},
        {"[codec]\ndensity = 0.9\n", "[codec] density"},
        {"[codec]\ndownlink = zip\n", "[codec] downlink"},
        {"[codec]\nef_decay = slow\n", "[codec] ef_decay"},
        {"[codec]\nef_decay = 0\n", "[codec] ef_decay"},
        {"[optimizer]\nouter = sgd\n", "[optimizer] outer"},
        {"[optimizer]\nlr = fast\n", "[optimizer] lr"},
        {"[optimizer]\nlr = 0\n", "[optimizer] lr"},
        {"[optimizer]\nlr = 11\n", "[optimizer] lr"},
        {"[optimizer]\nmomentum = lots\n", "[optimizer] momentum"},
        {"[optimizer]\nmomentum = 1\n", "[optimizer] momentum"},
        {"[optimizer]\neps = tiny\n", "[optimizer] eps"},
        {"[optimizer]\neps = 0\n", "[optimizer] eps"},
        {"[optimizer]\neps = 2\n", "[optimizer] eps"},
        {"[optimizer]\nouter = avg\nmomentum = 0.5\n", "outer = avg"},
        {"[store]\nkeep_last = 0\n", "[store] keep_last"},
        {"[store]\nkeep_last = all\n", "[store] keep_last"},
        {"[store]\nkeep_every = -5\n", "[store] keep_every"},
        {"[store]\nkeep_every = often\n", "[store] keep_every"},
        {"[privacy]\ndp = local\n", "[privacy] dp"},
        {"[privacy]\nclip = 1\n", "[privacy] clip"}, /* dp off: a key that does nothing */
        {"[privacy]\ndp = central\nnoise_multiplier = 1\ndelta = 1e-5\n", "clip"},
        {"[privacy]\ndp = central\nclip = 1\ndelta = 1e-5\n", "noise_multiplier"},
        {"[privacy]\ndp = central\nclip = 1\nnoise_multiplier = 1\n", "delta"},
        {"[privacy]\ndp = central\nclip = 0\nnoise_multiplier = 1\ndelta = 1e-5\n",
         "[privacy] clip"},
        {"[privacy]\ndp = central\nclip = 1\nnoise_multiplier = 0\ndelta = 1e-5\n",
         "[privacy] noise_multiplier"},
        {"[privacy]\ndp = central\nclip = 1\nnoise_multiplier = lots\ndelta = 1e-5\n",
         "[privacy] noise_multiplier"},
        {"[privacy]\ndp = central\nclip = 1\nnoise_multiplier = 1\ndelta = 0.5\n",
         "[privacy] delta"},
        {"[privacy]\ndp = central\nclip = 1\nnoise_multiplier = 1\ndelta = 1e-5\n"
         "epsilon_budget = -1\n",
         "[privacy] epsilon_budget"},
        {"[rounds]\naggregate = median\n[privacy]\ndp = central\nclip = 1\n"
         "noise_multiplier = 1\ndelta = 1e-5\n",
         "aggregate = median"},
        /* secure aggregation: what needs each update in the clear, by name */
        {"[privacy]\nsecure_aggregation = maybe\n", "[privacy] secure_aggregation"},
        {"[privacy]\nrange = 1\n", "[privacy] range"}, /* off: a key that does nothing */
        {"[privacy]\nsecure_aggregation = on\n", "range"},
        {"[privacy]\nsecure_aggregation = on\nrange = 0\n", "[privacy] range"},
        {"[privacy]\nsecure_aggregation = on\nrange = 1\nbits = 4\n", "[privacy] bits"},
        {"[privacy]\nsecure_aggregation = on\nrange = 1\nbits = 40\n", "[privacy] bits"},
        {"[privacy]\nsecure_aggregation = on\nrange = 1\nphase_timeout = 10ms\n", "phase_timeout"},
        {"[rounds]\naggregate = median\n[privacy]\nsecure_aggregation = on\nrange = 1\n",
         "robust rule"},
        {"[rounds]\nmode = async\n[privacy]\nsecure_aggregation = on\nrange = 1\n", "async"},
        {"[rounds]\noverlap = on\n[privacy]\nsecure_aggregation = on\nrange = 1\n", "overlapped"},
        {"[codec]\nuplink = topk\n[privacy]\nsecure_aggregation = on\nrange = 1\n", "top-k"},
        {"[privacy]\ndp = central\nclip = 1\nnoise_multiplier = 1\ndelta = 1e-5\n"
         "secure_aggregation = on\nrange = 1\n",
         "dp = central"},
        {"[privacy]\ndp = distributed\nclip = 1\nnoise_multiplier = 1\ndelta = 1e-5\n",
         "secure_aggregation = on"},
        {"[privacy]\ndp = distributed\nclip = 1\ndelta = 1e-5\nsecure_aggregation = on\n"
         "range = 1\n",
         "noise_multiplier"},
        {"[rounds]\naggregate = median\n[privacy]\ndp = distributed\nclip = 1\n"
         "noise_multiplier = 1\ndelta = 1e-5\nsecure_aggregation = on\nrange = 1\n",
         "aggregate = mean"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        RoundsSettings o;
        char err[ERR_LEN] = "";
        cr_assert_eq(read_text(cases[i].ini, &o, err), -1, "taken: %s", cases[i].ini);
        assert_refusal(cases[i].ini, err, cases[i].names);
    }
}

/* [privacy] secure_aggregation = on: read as written, the phase timeout
 * and bits defaulted, the norm bound off (no update is seen); off by
 * default. */
Test(settings, secure_aggregation_is_read_and_off_by_default) {
    RoundsSettings o;
    char err[ERR_LEN] = "";
    cr_assert_eq(read_text("[privacy]\nsecure_aggregation = on\nrange = 0.05\n", &o, err), 0, "%s",
                 err);
    cr_assert(o.secagg);
    cr_assert_float_eq(o.secagg_range, 0.05, 1e-12);
    cr_assert_eq(o.secagg_bits, 0);
    cr_assert_eq(o.secagg_timeout_ms, 60000);
    cr_assert_eq(o.norm_bound, 0);
    cr_assert_eq(read_text("[privacy]\nsecure_aggregation = on\nrange = 2\nbits = 20\n"
                           "phase_timeout = 5s\n",
                           &o, err),
                 0, "%s", err);
    cr_assert(o.secagg_bits == 20 && o.secagg_timeout_ms == 5000);
    cr_assert_eq(read_text("", &o, err), 0, "%s", err);
    cr_assert(!o.secagg);
}

/* [privacy] dp = distributed: read with secure aggregation, nothing of the
 * central path's (its clip and noise are the sites'). */
Test(settings, distributed_dp_is_read_beside_secure_aggregation) {
    RoundsSettings o;
    char err[ERR_LEN] = "";
    cr_assert_eq(read_text("[privacy]\ndp = distributed\nclip = 0.5\nnoise_multiplier = 1.2\n"
                           "delta = 1e-6\nsecure_aggregation = on\nrange = 0.05\n",
                           &o, err),
                 0, "%s", err);
    cr_assert(o.dp == 1 && o.dp_distributed == 1 && o.secagg == 1);
    cr_assert_float_eq(o.dp_clip, 0.5, 0);
    cr_assert_float_eq(o.dp_noise, 1.2, 0);
    cr_assert_eq(o.norm_bound, 0);
    cr_assert_eq(read_text("[privacy]\ndp = central\nclip = 0.5\nnoise_multiplier = 1.2\n"
                           "delta = 1e-6\n",
                           &o, err),
                 0, "%s", err);
    cr_assert(o.dp == 1 && o.dp_distributed == 0);
}

/* [privacy] dp = central: read as written, and the norm gate that judges
 * one site's update by the others' norms is off (the fixed clip bounds
 * each); off by default. */
Test(settings, central_dp_is_read_and_turns_the_relative_norm_gate_off) {
    RoundsSettings o;
    char err[ERR_LEN] = "";
    cr_assert_eq(read_text("[rounds]\ntotal = 5\n", &o, err), 0, "%s", err);
    cr_assert_eq(o.dp, 0);
    cr_assert_gt(o.norm_bound, 0);
    cr_assert_eq(read_text("[privacy]\ndp = central\nclip = 0.5\nnoise_multiplier = 1.2\n"
                           "delta = 1e-6\nepsilon_budget = 8\n",
                           &o, err),
                 0, "%s", err);
    cr_assert_eq(o.dp, 1);
    cr_assert_float_eq(o.dp_clip, 0.5, 0);
    cr_assert_float_eq(o.dp_noise, 1.2, 0);
    cr_assert_float_eq(o.dp_delta, 1e-6, 0);
    cr_assert_float_eq(o.dp_budget, 8, 0);
    cr_assert_eq(o.norm_bound, 0);
}

Test(settings, each_recipe_brings_its_codecs_and_optimizer) {
    RoundsSettings o;
    char err[ERR_LEN];
    cr_assert_eq(read_text("", &o, err), 0, "%s", err);
    cr_assert_str_eq(o.recipe, "diloco");
    cr_assert_eq(o.uplink.id, CODEC_INT8);
    cr_assert_eq(o.outer, OUTER_NESTEROV);
    cr_assert_eq(o.min_sites, 0, "min_sites unset is a quorum");
    cr_assert_eq(o.total, 10);
    cr_assert_eq(o.staleness, 0, "sync rounds take no stale updates");
    cr_assert_eq(o.robust_start, 1, "a federation starts robust");

    cr_assert_eq(read_text("[recipe]\nname = fedavg\n", &o, err), 0, "%s", err);
    cr_assert_eq(o.uplink.id, CODEC_FP32);
    cr_assert(o.downlink_lossless, "fedavg sends the exact model down");
    cr_assert_eq(o.outer, OUTER_AVG);
    cr_assert_float_eq(o.outer_lr, 1.0, 1e-12);

    cr_assert_eq(read_text("[recipe]\nname = sparseloco\n", &o, err), 0, "%s", err);
    cr_assert_eq(o.uplink.id, CODEC_TOPK);
    cr_assert_float_eq(o.uplink.density, 256.0 / 4096, 1e-9);
    cr_assert_float_eq(o.ef_decay, 0.95, 1e-12);

    /* a key in the file wins; another outer optimizer brings its own defaults */
    cr_assert_eq(read_text("[recipe]\nname = fedavg\n[optimizer]\nouter = nesterov\n", &o, err), 0,
                 "%s", err);
    cr_assert_eq(o.outer, OUTER_NESTEROV);
    cr_assert_float_eq(o.outer_lr, 0.7, 1e-12);
    cr_assert_float_eq(o.momentum, 0.3, 1e-12);
    cr_assert_eq(read_text("[optimizer]\nouter = adam\n", &o, err), 0, "%s", err);
    cr_assert_float_eq(o.outer_lr, 0.01, 1e-12);
    cr_assert_float_eq(o.momentum, 0.9, 1e-12);
    cr_assert_eq(read_text("[codec]\nuplink = topk\ndownlink = topk\ndensity = 0.01\n[rounds]\n"
                           "mode = async\nstaleness = 3\nmin_sites = quorum\naggregate = median\n",
                           &o, err),
                 0, "%s", err);
    cr_assert_float_eq(o.uplink.density, 0.01, 1e-12);
    cr_assert_float_eq(o.downlink.density, 0.01, 1e-12, "density applies to both directions");
    cr_assert(o.async);
    cr_assert_eq(o.staleness, 3);
    cr_assert(o.keeps_updates, "the median keeps every update");
}

/* The look-ahead a site of an overlapped federation takes: [rounds]
 * lookahead (0.5 unless set) of the outer optimizer's step for one mean
 * update with no momentum behind it, and none without overlap, with
 * lookahead = 0 or with adam (its step is no multiple of Δ̄). */
Test(settings, the_lookahead_is_the_outer_step_of_one_update) {
    static const struct {
        const char *ini;
        double want;
    } cases[] = {
        {"[rounds]\noverlap = on\n", 0.5 * 0.7 * 1.3},
        {"[rounds]\noverlap = on\nlookahead = 1\n", 0.7 * 1.3},
        {"[rounds]\noverlap = on\nlookahead = 1\n[optimizer]\nlr = 0.5\nmomentum = 0.9\n",
         0.5 * 1.9},
        {"[recipe]\nname = fedavg\n[rounds]\noverlap = on\nlookahead = 0.25\n", 0.25},
        {"[recipe]\nname = sparseloco\n[rounds]\noverlap = on\n", 0.5},
        {"[recipe]\nname = fedadam\n[rounds]\noverlap = on\n", 0},
        {"[rounds]\noverlap = on\nlookahead = 0\n", 0},
        {"", 0},
        {"[rounds]\nlookahead = 1\n", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        RoundsSettings o;
        char err[ERR_LEN];
        cr_assert_eq(read_text(cases[i].ini, &o, err), 0, "%s: %s", cases[i].ini, err);
        cr_assert_float_eq(rounds_lookahead(&o), cases[i].want, 1e-12, "%s: %g", cases[i].ini,
                           rounds_lookahead(&o));
    }
}

/* Retention: the defaults, and the models a restart reads back kept
 * whatever keep_last says (the round before's; async rounds' staleness). */
Test(settings, retention_keeps_what_a_restart_reads_back) {
    RoundsSettings o;
    char err[ERR_LEN];
    cr_assert_eq(read_text("", &o, err), 0, "%s", err);
    cr_assert_eq(o.retain.keep_last, 2);
    cr_assert_eq(o.retain.keep_every, 0);
    cr_assert_eq(o.retain.keep_back, 1);
    cr_assert_eq(read_text("[rounds]\nmode = async\nstaleness = 6\n[store]\nkeep_last = 1\n"
                           "keep_every = 50\n",
                           &o, err),
                 0, "%s", err);
    cr_assert_eq(o.retain.keep_last, 1);
    cr_assert_eq(o.retain.keep_every, 50);
    cr_assert_eq(o.retain.keep_back, 6);
}

/* [model]'s adapter keys: each bad value refused in one line naming its
 * key, the adapters' keys refused without adapter = lora, and what is
 * taken reaches the model's configuration (dropout among them: it changes
 * what the sites train, so never a silent default). */
Test(settings, the_adapter_keys_are_read_and_checked) {
    static const struct {
        const char *ini, *names;
    } bad[] = {
        {"[model]\npreset = llama-tiny\nadapter = lora\ndropout = 1\n", "[model] dropout"},
        {"[model]\npreset = llama-tiny\nadapter = lora\ndropout = -0.1\n", "[model] dropout"},
        {"[model]\npreset = llama-tiny\nadapter = lora\ndropout = nan\n", "[model] dropout"},
        {"[model]\npreset = llama-tiny\nadapter = lora\ndropout = some\n", "[model] dropout"},
        {"[model]\npreset = llama-tiny\ndropout = 0.1\n", "dropout are the adapters'"},
        {"[model]\npreset = llama-tiny\nadapter = lora\nbase_dtype = fp8\n", "[model] base_dtype"},
        {"[model]\npreset = llama-tiny\nadapter = lora\nrule = fedex\n", "[model] rule"},
        {"[model]\npreset = llama-tiny\nadapter = lora\nalpha = 0\n", "[model] alpha"},
        {"[model]\npreset = llama-tiny\nadapter = dora\n", "[model] adapter"},
    };
    char err[ERR_LEN];
    static Coordinator co; /* large: not on the stack */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(read_model(bad[i].ini, &co, err), -1, "taken: %s", bad[i].ini);
        assert_refusal(bad[i].ini, err, bad[i].names);
    }
    cr_assert_eq(read_model("[model]\npreset = llama-tiny\nadapter = lora\nrank = 4\n"
                            "dropout = 0.05\n",
                            &co, err),
                 0, "%s", err);
    cr_assert(co.model_cfg.lora.rank == 4 && co.model_cfg.lora.dropout == 0.05f,
              "rank %d, dropout %g", co.model_cfg.lora.rank, co.model_cfg.lora.dropout);
    cr_assert_eq(read_model("[model]\npreset = llama-tiny\nadapter = lora\n", &co, err), 0, "%s",
                 err);
    cr_assert_eq(co.model_cfg.lora.dropout, 0, "absent: no dropout");
}
