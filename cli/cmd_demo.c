/*
 * cmd_demo.c — `strait demo`: its flags, then the demo module's federation
 * on this machine (demo/demo.h), reported on stdout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "demo/demo.h"
#include "util/util.h"

int cmd_demo(const Command *cmd, int argc, char **argv) {
    static const struct option opts[] = {{"sites", required_argument, NULL, 's'},
                                         {"rounds", required_argument, NULL, 'r'},
                                         {"model", required_argument, NULL, 'm'},
                                         {"steps", required_argument, NULL, 'H'},
                                         {"codec", required_argument, NULL, 'c'},
                                         {"dir", required_argument, NULL, 'd'},
                                         {"non-iid", no_argument, NULL, 'n'},
                                         {"baseline", no_argument, NULL, 'b'},
                                         {"recipe", required_argument, NULL, 'R'},
                                         {"seed", required_argument, NULL, 'S'},
                                         {"set", required_argument, NULL, 'X'},
                                         {"device", required_argument, NULL, 'D'},
                                         {"finetune", no_argument, NULL, 'F'},
                                         {"base", required_argument, NULL, 'B'},
                                         {"lr", required_argument, NULL, 'L'},
                                         CLI_LORA_OPTS,
                                         {NULL, 0, NULL, 0}};
    DemoOptions o = {.model = "small",
                     .recipe = "diloco",
                     .device = "cpu",
                     .sites = 3,
                     .rounds = 20,
                     .steps = 50};
    int c, seed_given = 0, finetune = 0, given_sites = 0, given_rounds = 0, given_steps = 0;
    optind = 1;
    while ((c = cli_getopt(cmd, argc, argv, "", opts)) != -1) {
        switch (c) {
        case -2:
            return EXIT_USAGE;
        case 's':
            if (cli_int(cmd, "--sites", &o.sites)) return EXIT_USAGE;
            given_sites = 1;
            break;
        case 'r':
            if (cli_int(cmd, "--rounds", &o.rounds)) return EXIT_USAGE;
            given_rounds = 1;
            break;
        case 'm':
            o.model = optarg;
            break;
        case 'H':
            if (cli_int(cmd, "--steps", &o.steps)) return EXIT_USAGE;
            given_steps = 1;
            break;
        case 'c':
            o.codec = optarg;
            break;
        case 'd':
            o.dir = optarg;
            break;
        case 'n':
            o.non_iid = 1;
            break;
        case 'b':
            o.baseline = 1;
            break;
        case 'R':
            o.recipe = optarg;
            break;
        case 'X':
            if (o.n_sets == DEMO_MAX_SETS)
                return cli_usage_error(cmd, "at most %d --set", DEMO_MAX_SETS);
            o.sets[o.n_sets++] = optarg;
            break;
        case 'D':
            o.device = optarg;
            break;
        case 'F':
            finetune = 1;
            break;
        case 'B':
            o.base = optarg;
            break;
        case 'L':
            if (cli_float(cmd, "--lr", &o.lr)) return EXIT_USAGE;
            if (!(o.lr > 0 && o.lr < 1)) return cli_usage_error(cmd, "--lr is between 0 and 1");
            break;
        CLI_LORA_CASES:
            if (cli_lora_opt(cmd, c, optarg, &o.lora) != 0) return EXIT_USAGE;
            break;
        case 'S':
            if (cli_int(cmd, "--seed", &o.seed)) return EXIT_USAGE;
            seed_given = 1;
            break;
        }
    }
    if (optind != argc) return cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
    char err[ERR_LEN], exe[1024], base[1100];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (el <= 0) return cli_fail(cmd, "cannot find this program's path");
    exe[el] = '\0';
    if ((o.base || o.lr > 0) && !finetune)
        return cli_usage_error(cmd, "--base and --lr go with --finetune");
    if (finetune) { /* a real fine-tune's defaults: minutes on 2 cores */
        if (!o.base) {
            snprintf(base, sizeof base, "%.*s/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                     (int)(strrchr(exe, '/') - exe), exe);
            o.base = base;
        }
        if (!given_sites) o.sites = DEMO_FINETUNE_SITES;
        if (!given_rounds) o.rounds = 4;
        if (!given_steps) o.steps = 15;
        if (o.lora.rank == 0) o.lora.rank = 8;
        if (o.lora.targets == 0) o.lora.targets = LORA_ALL; /* every projection: a real fine-tune */
        if (o.lora.alpha == 0) o.lora.alpha = 16;
        if (o.lr == 0) o.lr = 3e-3f;
    }
    if (cli_lora_done(cmd, &o.lora, 1, 1) != 0) return EXIT_USAGE; /* [model] seed */
    if (seed_given && o.seed < 1) return cli_usage_error(cmd, "--seed is a positive integer");
    if (demo_check(&o, err) != 0) return cli_usage_error(cmd, "%s", err);
    o.exe = exe;
    o.version = strait_version;
    return demo_run(&o, stdout, err) == 0 ? EXIT_OK : cli_fail(cmd, "%s", err);
}
