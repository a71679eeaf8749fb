/*
 * cmd_init.c — `strait init DIR` and `strait coordinator start DIR`: create
 * a federation's home, and run its coordinator.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "coordinator/coordinator.h"
#include "kernels/model.h"
#include "util/util.h"

int cmd_init(const Command *cmd, int argc, char **argv) {
    static const struct option opts[] = {{"name", required_argument, NULL, 'n'},
                                         {"listen", required_argument, NULL, 'l'},
                                         {"advertise", required_argument, NULL, 'a'},
                                         {"model", required_argument, NULL, 'm'},
                                         {"force", no_argument, NULL, 'f'},
                                         {"recipe", required_argument, NULL, 'r'},
                                         {"init-from", required_argument, NULL, 'I'},
                                         CLI_LORA_OPTS,
                                         {NULL, 0, NULL, 0}};
    CoordInitOptions o = {0};
    int c;
    optind = 1;
    while ((c = cli_getopt(cmd, argc, argv, "", opts)) != -1) {
        switch (c) {
        case -2:
            return EXIT_USAGE;
        case 'n':
            o.name = optarg;
            break;
        case 'l':
            o.listen = optarg;
            break;
        case 'a':
            o.advertise = optarg;
            break;
        case 'm':
            o.model = optarg;
            break;
        case 'f':
            o.force = 1;
            break;
        case 'r':
            o.recipe = optarg;
            break;
        case 'I':
            o.init_from = optarg;
            break;
        CLI_LORA_CASES:
            if (cli_lora_opt(cmd, c, optarg, &o.lora) != 0) return EXIT_USAGE;
            break;
        }
    }
    if (cli_lora_done(cmd, &o.lora, 1, 1) != 0) return EXIT_USAGE; /* [model] seed */
    ModelConfig check; /* a preset's adapters here; a pretrained model's once it is read */
    char why[ERR_LEN];
    if (o.lora.rank > 0 && !o.init_from &&
        model_config_preset(o.model ? o.model : "small", &check) == 0) {
        check.lora = o.lora;
        if (model_config_check(&check, why) != 0)
            return cli_usage_error(cmd, "--lora-rank: %s", why);
    }
    if (optind != argc - 1) return cli_usage_error(cmd, "expected one folder DIR");
    ModelConfig preset;
    if (o.model && model_config_preset(o.model, &preset) != 0)
        return cli_usage_error(cmd, "unknown model '%s'; use one of %s", o.model,
                               model_preset_names());
    if (o.model && o.init_from)
        return cli_usage_error(cmd,
                               "--model or --init-from: the pretrained model has its own shape");
    char fp[65], err[ERR_LEN], source[PATH_MAX];
    /* recorded whole ([model] source), so export finds its tokenizer from anywhere */
    if (o.init_from && realpath(o.init_from, source) != NULL) o.init_from = source;
    if (coordinator_init_home(argv[optind], &o, fp, err) != 0) return cli_fail(cmd, "%s", err);
    printf("federation created in %s\n", argv[optind]);
    if (o.init_from)
        printf("round 0 starts from %s (copied to %s/model/initial.safetensors; its SHA-256 is in "
               "federation.ini and the audit log)\n",
               o.init_from, argv[optind]);
    printf("CA fingerprint (sites pin it): %s\n", fp);
    printf("next: strait coordinator start %s\n", argv[optind]);
    printf("      strait site enroll %s SITE-NAME\n", argv[optind]);
    return EXIT_OK;
}

static void print_listening(int port, void *ctx) {
    printf("strait coordinator: federation in %s listening on port %d\n", (const char *)ctx, port);
    fflush(stdout);
}

int cmd_coordinator_start(const Command *cmd, int argc, char **argv) {
    static const struct option opts[] = {{NULL, 0, NULL, 0}};
    int c;
    optind = 1;
    while ((c = cli_getopt(cmd, argc, argv, "", opts)) != -1)
        if (c == -2) return EXIT_USAGE;
    if (optind != argc - 1) return cli_usage_error(cmd, "expected one federation folder DIR");
    char err[ERR_LEN];
    if (coordinator_run(argv[optind], print_listening, argv[optind], err) != 0)
        return cli_fail(cmd, "%s", err);
    return EXIT_OK;
}
