/*
 * cli.h — the `strait` command line: the dispatch table and the helpers every
 * subcommand uses. cli/ does nothing but parse arguments, print, and call the
 * modules; a subcommand is one `cmd_*` function and one row in cli_commands.
 *
 * Exit status everywhere: 0 ok, 1 failed, 2 usage error. Errors go to stderr
 * as one line that says what was wrong and what to do.
 */
#ifndef STRAIT_CLI_H
#define STRAIT_CLI_H

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>

enum { EXIT_OK = 0, EXIT_FAILED = 1, EXIT_USAGE = 2 };

typedef struct Command {
    const char *name;    /* words after `strait`: "version", "site enroll" */
    const char *usage;   /* what follows the name: "[--json]" */
    const char *summary; /* one line for `strait --help` */
    const char *help;    /* the flags and what they do, for `strait help NAME` */
    /* argv[0] is the command's name; returns an exit status */
    int (*run)(const struct Command *cmd, int argc, char **argv);
} Command;

extern const Command cli_commands[];

/* Prints "strait NAME: <message>; see 'strait help NAME'" on stderr and
 * returns EXIT_USAGE. */
int cli_usage_error(const Command *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints "strait NAME: <message>" on stderr and returns EXIT_FAILED. */
int cli_fail(const Command *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* getopt_long with the project's conventions: no getopt messages, an unknown
 * flag or a missing value becomes a usage error. Returns the option's value,
 * -1 at the end of the flags, or -2 after printing a usage error. */
int cli_getopt(const Command *cmd, int argc, char **argv, const char *shortopts,
               const struct option *longopts);

/* The value of the flag just read (optarg) as a whole int, a float or an
 * unsigned 64-bit number: 0 on success, or -2 after a usage error that names
 * FLAG, so "--steps 10x" is refused rather than read as 10. Range checks stay
 * with the command, which knows its limits. */
int cli_int(const Command *cmd, const char *flag, int *out);
int cli_float(const Command *cmd, const char *flag, float *out);
int cli_u64(const Command *cmd, const char *flag, unsigned long long *out);
/* --base-blocks on|off: 1 for off (a bf16 copy), 0 for on, -1 after the usage error */
int cli_base_blocks(const Command *cmd, const char *value);
/* --matmul's value: 1 for tf32, 0 for fp32, -2 after a usage error */
int cli_matmul(const Command *cmd, const char *value);
/* --recompute's value: MODEL_RECOMPUTE_* (0, 1 or 2), -2 after a usage error */
int cli_recompute(const Command *cmd, const char *value);

/* The adapters' flags, shared by the commands that take them:
 * --lora-rank N, --lora-alpha A (PEFT's lora_alpha; default the rank, a
 * scaling of 1 as PEFT's defaults), --lora-targets q,v,... (default q and
 * v, PEFT's for the Llama family), --lora-rule, --lora-base-dtype,
 * --lora-dropout P (PEFT's lora_dropout; default 0). CLI_LORA_OPTS are their getopt rows
 * (values CLI_OPT_LORA_*, outside every command's letters); cli_lora_opt
 * takes one (0, or -2 after a usage
 * error), cli_lora_done fills what was left out (-2 for targets or an
 * alpha without a rank). */
enum {
    CLI_OPT_LORA_RANK = 0x1000,
    CLI_OPT_LORA_ALPHA,
    CLI_OPT_LORA_TARGETS,
    CLI_OPT_LORA_RULE,
    CLI_OPT_LORA_BASE_DTYPE,
    CLI_OPT_LORA_DROPOUT
};
// clang-format off
#define CLI_LORA_OPTS \
    {"lora-rank", required_argument, NULL, CLI_OPT_LORA_RANK}, \
    {"lora-alpha", required_argument, NULL, CLI_OPT_LORA_ALPHA}, \
    {"lora-targets", required_argument, NULL, CLI_OPT_LORA_TARGETS}, \
    {"lora-rule", required_argument, NULL, CLI_OPT_LORA_RULE}, \
    {"lora-base-dtype", required_argument, NULL, CLI_OPT_LORA_BASE_DTYPE}, \
    {"lora-dropout", required_argument, NULL, CLI_OPT_LORA_DROPOUT}
/* the case labels of every one of them, for a command's getopt switch */
#define CLI_LORA_CASES \
    case CLI_OPT_LORA_RANK: case CLI_OPT_LORA_ALPHA: case CLI_OPT_LORA_TARGETS: \
    case CLI_OPT_LORA_RULE: case CLI_OPT_LORA_BASE_DTYPE: case CLI_OPT_LORA_DROPOUT
// clang-format on
struct AdapterConfig;
int cli_lora_opt(const Command *cmd, int c, const char *value, struct AdapterConfig *a);
/* federated: a federation's default rule, ffa (A frozen at a draw from
 * seed, exact to average); else A trains too (PEFT's, fedit), unless
 * --lora-rule said otherwise; what a rule freezes is drawn from seed */
int cli_lora_done(const Command *cmd, struct AdapterConfig *a, int federated, uint64_t seed);

/* whether path is a file that starts as a GGUF does ("GGUF") */
int cli_gguf_file(const char *path);

/* A --data operand into data[*n] (at most 64): a file as it is, or a
 * folder's token shards as `strait tokenize --out` writes them
 * (tokens_*.bin, in name order). 0, or -2 after a usage error naming it. */
int cli_data_add(const Command *cmd, const char **data, int *n, const char *path);

/* Flags of a command whose only flag is --json: 1 if given, 0 if not, -2
 * after a usage error; optind is left at the first operand. */
int cli_json_flag(const Command *cmd, int argc, char **argv);

/* Subcommands. */
int cmd_version(const Command *cmd, int argc, char **argv);
int cmd_help(const Command *cmd, int argc, char **argv);
int cmd_db_check(const Command *cmd, int argc, char **argv);
int cmd_db_backup(const Command *cmd, int argc, char **argv);
int cmd_rounds(const Command *cmd, int argc, char **argv);
int cmd_status(const Command *cmd, int argc, char **argv);
int cmd_round_show(const Command *cmd, int argc, char **argv);
int cmd_admin_export(const Command *cmd, int argc, char **argv);
int cmd_events(const Command *cmd, int argc, char **argv);
int cmd_report(const Command *cmd, int argc, char **argv);
int cmd_init(const Command *cmd, int argc, char **argv);
int cmd_coordinator_start(const Command *cmd, int argc, char **argv);
int cmd_site_enroll(const Command *cmd, int argc, char **argv);
int cmd_site_join(const Command *cmd, int argc, char **argv);
int cmd_site_hello(const Command *cmd, int argc, char **argv);
int cmd_site_renew(const Command *cmd, int argc, char **argv);
int cmd_site_list(const Command *cmd, int argc, char **argv);
int cmd_site_revoke(const Command *cmd, int argc, char **argv);
int cmd_site_run(const Command *cmd, int argc, char **argv);
int cmd_demo(const Command *cmd, int argc, char **argv);
int cmd_train(const Command *cmd, int argc, char **argv);
int cmd_sample(const Command *cmd, int argc, char **argv);
int cmd_export(const Command *cmd, int argc, char **argv);
int cmd_tokenize(const Command *cmd, int argc, char **argv);

/* The tokenizer inside a GGUF file (its tokenizer.ggml.* keys). */
struct Tokenizer *cli_tokenizer_gguf(const char *path, char *err);
/* The tokenizer of --tokenizer DIR (DIR/tokenizer.json, or DIR/vocab.json
 * and DIR/merges.txt) or FILE.gguf, or of --vocab and --merges, which win
 * over DIR's files. NULL with err set. */
struct Tokenizer *cli_tokenizer_open(const char *dir, const char *vocab, const char *merges,
                                     char *err);

/* From the generated build/gen/buildinfo.c. */
extern const char strait_version[];
extern const char strait_git_commit[];

#endif /* STRAIT_CLI_H */
