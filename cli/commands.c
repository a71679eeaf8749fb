/*
 * commands.c — the dispatch table of `strait`. A new subcommand is one row
 * here and one cmd_* function in its own file; main.c never changes.
 * Multi-word names ("site enroll") are matched word by word, longest first.
 */
#include <stddef.h>

#include "cli.h"

const Command cli_commands[] = {
    {"version", "[--json]",
     "print the version, the git commit, the build's capabilities and the GPUs",
     "flags:\n  --json    one JSON object instead of text\n", cmd_version},
    {"db check", "DIR [--json]",
     "check the federation's store: SQLite integrity and every committed checkpoint's SHA-256",
     "Read-only; safe to run beside a running coordinator. Exit status 1 when the\n"
     "database is damaged or a committed checkpoint is missing or altered.\n\n"
     "flags:\n  --json    one JSON object, with the bad checkpoints listed\n",
     cmd_db_check},
    {"help", "[COMMAND...]", "explain a command", "", cmd_help},
    {NULL, NULL, NULL, NULL, NULL},
};
