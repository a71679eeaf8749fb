/*
 * cmd_report.c — `strait report DIR --out report.html`: the federation's
 * run as one self-contained HTML page with its charts (coordinator/report.c),
 * read as strait rounds reads: from the running coordinator through the
 * Admin API, or from a stopped one's store, or through an admin kit.
 */
#include <stdio.h>

#include "cli.h"
#include "coordinator/coordinator.h"
#include "util/util.h"

int cmd_report(const Command *cmd, int argc, char **argv) {
    static const struct option opts[] = {{"out", required_argument, NULL, 'o'},
                                         {"last", required_argument, NULL, 'n'},
                                         {NULL, 0, NULL, 0}};
    const char *out = NULL;
    int last = 0, c;
    optind = 1;
    while ((c = cli_getopt(cmd, argc, argv, "", opts)) != -1) {
        if (c == -2) return EXIT_USAGE;
        if (c == 'o') out = optarg;
        if (c == 'n' && cli_int(cmd, "--last", &last)) return EXIT_USAGE;
    }
    if (optind != argc - 1)
        return cli_usage_error(cmd, "expected one federation folder or admin kit DIR");
    if (out == NULL) return cli_usage_error(cmd, "give the page's path with --out FILE.html");
    if (last < 0) return cli_usage_error(cmd, "--last is a number of round attempts (0: all)");
    const char *dir = argv[optind];
    char err[ERR_LEN];
    Admin *a = admin_open(dir, err);
    if (a == NULL) return cli_fail(cmd, "%s", err);
    if (admin_unreachable(a))
        fprintf(stderr, "strait report: cannot reach the coordinator: %s; read from %s\n",
                admin_unreachable(a), admin_where(a));
    int rc = report_write(a, admin_is_kit(dir) ? NULL : dir, out, strait_version, last, err);
    admin_close(a);
    if (rc != 0) return cli_fail(cmd, "%s", err);
    printf("report written to %s (one file: open it in a browser, offline)\n", out);
    return EXIT_OK;
}
