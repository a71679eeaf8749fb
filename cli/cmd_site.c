/*
 * cmd_site.c — `strait site …`: enroll, join, hello, renew, list, revoke.
 * enroll and revoke write the federation folder's store (the coordinator
 * sees the change on its next call), or go through the Admin API when DIR is
 * an admin kit; list reads through the Admin API; join, hello and renew run
 * at the site.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "client/client.h"
#include "coordinator/coordinator.h"
#include "util/util.h"

int cmd_site_enroll(const Command *cmd, int argc, char **argv) {
    static const struct option opts[] = {{"ttl", required_argument, NULL, 't'}, {NULL, 0, NULL, 0}};
    const char *ttl = NULL;
    int c;
    optind = 1;
    while ((c = cli_getopt(cmd, argc, argv, "", opts)) != -1) {
        if (c == -2) return EXIT_USAGE;
        ttl = optarg;
    }
    if (optind != argc - 2) return cli_usage_error(cmd, "expected DIR and the site's NAME");
    const char *dir = argv[optind], *name = argv[optind + 1];
    char err[ERR_LEN], token[65], fp[65], adv[256];
    int64_t ttl_ms = 0; /* 0: the federation's [security] token_ttl */
    if (ttl && time_parse_duration_ms(ttl, &ttl_ms, err) != 0)
        return cli_usage_error(cmd, "--ttl: %s", err);
    if (ttl && ttl_ms <= 0) return cli_usage_error(cmd, "--ttl must be positive");
    if (admin_is_kit(dir)) {
        char join[800];
        Admin *a = admin_open(dir, err);
        if (a == NULL) return cli_fail(cmd, "%s", err);
        int rc = admin_enroll(a, name, ttl_ms, token, join, sizeof join, err);
        admin_close(a);
        if (rc != 0) return cli_fail(cmd, "%s", err);
        printf("token for site %s (single use, valid for %s):\n%s\n\n", name,
               ttl ? ttl : "the federation's token_ttl", token);
        printf("run at the site:\n  %s\n", join);
        return EXIT_OK;
    }
    if (ttl_ms == 0 && coordinator_token_ttl(dir, &ttl_ms, err) != 0)
        return cli_fail(cmd, "%s", err);
    char join[300];
    if (coordinator_home_info(dir, fp, adv, sizeof adv, err) != 0 ||
        coordinator_join_address(dir, join, sizeof join, err) != 0)
        return cli_fail(cmd, "%s", err);
    if (coordinator_enroll(dir, name, ttl_ms, token, err) != 0) return cli_fail(cmd, "%s", err);
    char until[40];
    time_format_iso8601(time_wall_ms() + ttl_ms, until, sizeof until);
    printf("token for site %s (single use, valid until %s):\n%s\n\n", name, until, token);
    printf("run at the site:\n  strait site join SITEDIR --name %s --coordinator %s --join %s "
           "--token %s --ca-sha256 %s\n",
           name, adv, join, token, fp);
    return EXIT_OK;
}

int cmd_site_join(const Command *cmd, int argc, char **argv) {
    static const struct option opts[] = {
        {"name", required_argument, NULL, 'n'},  {"coordinator", required_argument, NULL, 'c'},
        {"token", required_argument, NULL, 't'}, {"ca-sha256", required_argument, NULL, 'p'},
        {"join", required_argument, NULL, 'j'},  {NULL, 0, NULL, 0}};
    SiteJoinOptions o = {NULL, NULL, NULL, NULL, NULL, NULL};
    int c;
    optind = 1;
    while ((c = cli_getopt(cmd, argc, argv, "", opts)) != -1) {
        switch (c) {
        case -2:
            return EXIT_USAGE;
        case 'n':
            o.name = optarg;
            break;
        case 'c':
            o.coordinator = optarg;
            break;
        case 't':
            o.token = optarg;
            break;
        case 'p':
            o.ca_sha256 = optarg;
            break;
        case 'j':
            o.join = optarg;
            break;
        }
    }
    if (optind != argc - 1) return cli_usage_error(cmd, "expected one site folder SITEDIR");
    if (!o.name || !o.coordinator || !o.token || !o.ca_sha256)
        return cli_usage_error(cmd, "--name, --coordinator, --token and --ca-sha256 are all "
                                    "needed (strait site enroll prints them)");
    o.site_dir = argv[optind];
    char err[ERR_LEN];
    if (client_join(&o, err) != 0) return cli_fail(cmd, "%s", err);
    SiteHello h;
    if (client_hello(o.site_dir, &h, err) != 0)
        return cli_fail(cmd, "joined, but the first hello failed: %s", err);
    printf("site %s joined federation %s; its key and certificate are in %s\n", h.site_name,
           h.federation, o.site_dir);
    return EXIT_OK;
}

int cmd_site_hello(const Command *cmd, int argc, char **argv) {
    int json = cli_json_flag(cmd, argc, argv);
    if (json < 0) return EXIT_USAGE;
    if (optind != argc - 1) return cli_usage_error(cmd, "expected one site folder SITEDIR");
    SiteHello h;
    char err[ERR_LEN];
    if (client_hello(argv[optind], &h, err) != 0) return cli_fail(cmd, "%s", err);
    if (json) {
        json_t *o = json_object();
        json_object_set_new(o, "federation", json_string(h.federation));
        json_object_set_new(o, "site", json_string(h.site_name));
        json_object_set_new(o, "model", json_string(h.model));
        return json_emit_line(stdout, o) == 0 ? EXIT_OK : EXIT_FAILED;
    }
    printf("federation %s knows this site as %s (model %s)\n", h.federation, h.site_name, h.model);
    return EXIT_OK;
}

int cmd_site_renew(const Command *cmd, int argc, char **argv) {
    if (cli_json_flag(cmd, argc, argv) < 0) return EXIT_USAGE;
    if (optind != argc - 1) return cli_usage_error(cmd, "expected one site folder SITEDIR");
    char err[ERR_LEN];
    if (client_renew(argv[optind], err) != 0) return cli_fail(cmd, "%s", err);
    printf("renewed the certificate in %s\n", argv[optind]);
    return EXIT_OK;
}

int cmd_site_list(const Command *cmd, int argc, char **argv) {
    int json = cli_json_flag(cmd, argc, argv);
    if (json < 0) return EXIT_USAGE;
    if (optind != argc - 1)
        return cli_usage_error(cmd, "expected one federation folder or admin kit DIR");
    char err[ERR_LEN];
    Admin *a = admin_open(argv[optind], err);
    if (a == NULL) return cli_fail(cmd, "%s", err);
    AdminSite *sites;
    size_t n;
    int rc = admin_sites(a, &sites, &n, err);
    admin_close(a);
    if (rc != 0) return cli_fail(cmd, "%s", err);
    if (!json)
        printf("%-24s %-8s %-7s %-24s %-24s %s\n", "SITE", "STATE", "ONLINE", "ENROLLED",
               "LAST SEEN", "CERT EXPIRES");
    for (size_t i = 0; i < n; i++) {
        const StoreSite *s = &sites[i].s;
        char enrolled[32], seen[32] = "never", expires[32] = "-";
        time_format_iso8601(s->enrolled_at, enrolled, sizeof enrolled);
        if (s->last_seen) time_format_iso8601(s->last_seen, seen, sizeof seen);
        if (sites[i].cert_not_after)
            time_format_iso8601(sites[i].cert_not_after, expires, sizeof expires);
        if (json) {
            json_t *o = json_object();
            json_object_set_new(o, "site", json_string(s->name));
            json_object_set_new(o, "state", json_string(s->state));
            json_object_set_new(o, "online", json_boolean(sites[i].online));
            json_object_set_new(o, "enrolled_at", json_string(enrolled));
            json_object_set_new(o, "last_seen", s->last_seen ? json_string(seen) : json_null());
            json_object_set_new(o, "cert_expires",
                                sites[i].cert_not_after ? json_string(expires) : json_null());
            json_object_set_new(o, "cert_serial", json_string(s->cert_serial));
            json_emit_line(stdout, o);
        } else {
            printf("%-24s %-8s %-7s %-24s %-24s %s\n", s->name, s->state,
                   sites[i].online ? "yes" : "no", enrolled, seen, expires);
        }
    }
    free(sites);
    return EXIT_OK;
}

int cmd_site_revoke(const Command *cmd, int argc, char **argv) {
    if (cli_json_flag(cmd, argc, argv) < 0) return EXIT_USAGE;
    if (optind != argc - 2) return cli_usage_error(cmd, "expected DIR and the site's NAME");
    char err[ERR_LEN];
    const char *dir = argv[optind], *name = argv[optind + 1];
    if (admin_is_kit(dir)) {
        Admin *a = admin_open(dir, err);
        if (a == NULL) return cli_fail(cmd, "%s", err);
        int rc = admin_revoke(a, name, err);
        admin_close(a);
        if (rc != 0) return cli_fail(cmd, "%s", err);
    } else if (coordinator_revoke(dir, name, "strait site revoke", err) != 0) {
        return cli_fail(cmd, "%s", err);
    }
    printf("site %s revoked; its certificates are refused from now on\n", name);
    return EXIT_OK;
}

int cmd_site_run(const Command *cmd, int argc, char **argv) {
    static const struct option opts[] = {{"data", required_argument, NULL, 'd'},
                                         {"threads", required_argument, NULL, 'j'},
                                         {"batch", required_argument, NULL, 'b'},
                                         {"seq", required_argument, NULL, 't'},
                                         {"lr", required_argument, NULL, 'l'},
                                         {"device", required_argument, NULL, 'D'},
                                         {"gpus", required_argument, NULL, 'g'},
                                         {"seed", required_argument, NULL, 's'},
                                         {"init-from", required_argument, NULL, 'I'},
                                         {"max-memory", required_argument, NULL, 'M'},
                                         {"moments", required_argument, NULL, 'o'},
                                         {"matmul", required_argument, NULL, 'x'},
                                         {"base-blocks", required_argument, NULL, 'K'},
                                         {"zero", required_argument, NULL, 'Z'},
                                         {"precision", required_argument, NULL, 'Q'},
                                         {"recompute", required_argument, NULL, 'R'},
                                         {"tensorboard", required_argument, NULL, 'E'},
                                         {"min-noise", required_argument, NULL, 'N'},
                                         {NULL, 0, NULL, 0}};
    const char *data[64];
    SiteRunOptions o = {.data = data, .recompute = MODEL_RECOMPUTE_DEFAULT};
    int c, tf32 = -1;
    optind = 1;
    while ((c = cli_getopt(cmd, argc, argv, "", opts)) != -1) {
        if (c == -2) return EXIT_USAGE;
        if (c == 'd') {
            if (cli_data_add(cmd, data, &o.n_data, optarg) != 0) return EXIT_USAGE;
        } else if (c == 'j') {
            if (cli_int(cmd, "--threads", &o.threads)) return EXIT_USAGE;
        } else if (c == 'b') {
            if (cli_int(cmd, "--batch", &o.batch)) return EXIT_USAGE;
        } else if (c == 't') {
            if (cli_int(cmd, "--seq", &o.seq)) return EXIT_USAGE;
        } else if (c == 'l') {
            if (cli_float(cmd, "--lr", &o.lr)) return EXIT_USAGE;
        } else if (c == 'D') {
            if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "cuda") != 0)
                return cli_usage_error(cmd, "--device is cpu or cuda, not '%s'", optarg);
            o.cuda = strcmp(optarg, "cuda") == 0;
        } else if (c == 'g') {
            if (cli_int(cmd, "--gpus", &o.gpus)) return EXIT_USAGE;
        } else if (c == 's') {
            int seed;
            if (cli_int(cmd, "--seed", &seed)) return EXIT_USAGE;
            if (seed < 1) return cli_usage_error(cmd, "--seed is a positive integer");
            o.seed = (uint64_t)seed;
        } else if (c == 'I') {
            o.init_from = optarg;
        } else if (c == 'o') {
            if (strcmp(optarg, "fp32") != 0 && strcmp(optarg, "bf16") != 0)
                return cli_usage_error(cmd, "--moments is fp32 or bf16, not '%s'", optarg);
            o.moments_bf16 = strcmp(optarg, "bf16") == 0;
        } else if (c == 'Z') {
            if (strcmp(optarg, "0") != 0 && strcmp(optarg, "1") != 0)
                return cli_usage_error(
                    cmd,
                    "--zero is 1 (each CPU rank or GPU keeps its share of AdamW's "
                    "state, the default) or 0 (each keeps all of it), not '%s'",
                    optarg);
            o.unsharded = optarg[0] == '0';
        } else if (c == 'Q') {
            if (strcmp(optarg, "fp32") != 0 && strcmp(optarg, "bf16") != 0)
                return cli_usage_error(cmd, "--precision is fp32 or bf16, not '%s'", optarg);
            o.precision_bf16 = optarg[0] == 'b';
        } else if (c == 'R') {
            if ((o.recompute = cli_recompute(cmd, optarg)) < 0) return EXIT_USAGE;
        } else if (c == 'E') {
            o.tensorboard = optarg;
        } else if (c == 'N') { /* a double: the coordinator's is compared with it */
            char *end;
            double z = strtod(optarg, &end);
            if (end == optarg || *end || !(z > 0 && z <= 1000))
                return cli_usage_error(cmd,
                                       "--min-noise is a noise multiplier above 0 (at most "
                                       "1000), not '%s'",
                                       optarg);
            o.min_noise = z;
        } else if (c == 'K') {
            if ((o.blocks_off = cli_base_blocks(cmd, optarg)) < 0) return EXIT_USAGE;
        } else if (c == 'x') {
            if ((tf32 = cli_matmul(cmd, optarg)) < 0) return EXIT_USAGE;
        } else if (c == 'M') {
            char *end;
            double v = strtod(optarg, &end);
            double unit = *end == 'G' ? 1e9 : *end == 'M' ? 1e6 : *end == '\0' ? 1 : 0;
            if (!(v > 0) || unit == 0 || (*end && end[1]))
                return cli_usage_error(cmd,
                                       "--max-memory is bytes, or a number with M or G "
                                       "(16G), not '%s'",
                                       optarg);
            o.max_memory = (uint64_t)(v * unit);
        }
    }
    if (optind != argc - 1) return cli_usage_error(cmd, "expected one site folder SITEDIR");
    if (o.n_data == 0)
        return cli_usage_error(cmd, "give the site's training data with --data PATH");
    if (o.threads < 0 || o.batch < 0 || o.seq < 0 || !(o.lr >= 0) || o.gpus < 0)
        return cli_usage_error(cmd, "--threads, --batch, --seq, --lr and --gpus must not be "
                                    "negative (0 or no flag takes the default)");
    if (o.gpus > 0 && !o.cuda) return cli_usage_error(cmd, "--gpus needs --device cuda");
    if (tf32 == 1 && !o.cuda) return cli_usage_error(cmd, "--matmul tf32 needs --device cuda");
    o.tf32 = o.cuda && tf32 != 0;
    o.site_dir = argv[optind];
    char err[ERR_LEN];
    if (client_run(&o, err) != 0) return cli_fail(cmd, "%s", err);
    return EXIT_OK;
}
