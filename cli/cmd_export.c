/*
 * cmd_export.c — `strait export CKPT --format hf|llmc OUT`: a Strait
 * checkpoint (a federation's round, or `strait train --out`) in Hugging
 * Face's or llm.c's format (kernels/export.c).
 */
#include <string.h>

#include "cli.h"
#include "kernels/model.h"
#include "kernels/formats.h"
#include "util/util.h"

int cmd_export(const Command *cmd, int argc, char **argv) {
    static const struct option opts[] = {{"format", required_argument, NULL, 'f'},
                                         {NULL, 0, NULL, 0}};
    const char *format = NULL;
    int c;
    optind = 1;
    while ((c = cli_getopt(cmd, argc, argv, "", opts)) != -1) {
        if (c == -2) return EXIT_USAGE;
        if (c == 'f') format = optarg;
    }
    if (format == NULL || (strcmp(format, "hf") != 0 && strcmp(format, "llmc") != 0))
        return cli_usage_error(cmd, "give --format hf (a folder) or --format llmc (a file)");
    if (optind != argc - 2) return cli_usage_error(cmd, "expected CKPT and OUT");
    const char *ckpt = argv[optind], *out = argv[optind + 1];
    char err[ERR_LEN];
    GPTConfig cfg;
    GPT m;
    memset(&m, 0, sizeof m);
    if (gpt_read_config(ckpt, &cfg, NULL, err) != 0 || gpt_build(&m, &cfg, 0, err) != 0 ||
        gpt_load(&m, ckpt, NULL, err) != 0) {
        gpt_free(&m);
        return cli_fail(cmd, "%s", err);
    }
    int rc =
        strcmp(format, "hf") == 0 ? gpt_export_hf(&m, out, err) : gpt_export_llmc(&m, out, err);
    int arch = m.cfg.arch;
    gpt_free(&m);
    if (rc != 0) return cli_fail(cmd, "%s", err);
    if (strcmp(format, "hf") == 0)
        printf("exported %s to %s (config.json, model.safetensors: transformers' "
               "%s.from_pretrained reads it)\n",
               ckpt, out, model_hf_class(arch));
    else
        printf("exported %s to %s (llm.c's checkpoint format, version 3, fp32)\n", ckpt, out);
    return EXIT_OK;
}
