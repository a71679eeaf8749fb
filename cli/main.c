/*
 * main.c — `strait`: finds the subcommand in cli_commands (the longest run of
 * words that names one), answers --help for any of them, and runs it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "compress/compress.h"
#include "coordinator/coordinator.h"
#include "kernels/model.h"
#include "util/util.h"

/* How many words of argv (from argv[0]) the command's name covers, or 0. */
static int command_match(const Command *c, int argc, char **argv) {
    const char *p = c->name;
    int words = 0;
    while (*p) {
        if (words >= argc) return 0;
        size_t len = strcspn(p, " ");
        if (strlen(argv[words]) != len || strncmp(argv[words], p, len) != 0) return 0;
        words++;
        p += len;
        while (*p == ' ') p++;
    }
    return words;
}

static const Command *command_find(int argc, char **argv, int *words) {
    const Command *best = NULL;
    *words = 0;
    for (const Command *c = cli_commands; c->name; c++) {
        int w = command_match(c, argc, argv);
        if (w > *words) {
            best = c;
            *words = w;
        }
    }
    return best;
}

static void print_overview(FILE *out) {
    fprintf(out,
            "strait %s — federated training of one language model across sites\n\n"
            "usage: strait COMMAND [ARGS...]\n\ncommands:\n",
            strait_version);
    for (const Command *c = cli_commands; c->name; c++)
        fprintf(out, "  %-24s %s\n", c->name, c->summary);
    fprintf(out, "\n'strait help COMMAND' or 'strait COMMAND --help' explains one command.\n"
                 "exit status: 0 ok, 1 failed, 2 usage error.\n");
}

/* The choices a help text names, from the tables the code reads them by,
 * so the help cannot drift from them: {presets}, {byte-presets},
 * {recipes}, {codecs}, {lora-targets}. */
static const char *help_list(const char *name, size_t len) {
    static char targets[96];
    if (targets[0] == '\0') model_lora_targets_names(LORA_ALL, targets, sizeof targets);
    if (len == 14 && strncmp(name, "{lora-targets}", len) == 0) return targets;
    if (len == 9 && strncmp(name, "{presets}", len) == 0) return model_preset_names();
    if (len == 9 && strncmp(name, "{recipes}", len) == 0) return coordinator_recipe_names();
    if (len == 8 && strncmp(name, "{codecs}", len) == 0) return codec_names();
    if (len == 14 && strncmp(name, "{byte-presets}", len) == 0) return model_byte_preset_names();
    return NULL;
}

/* text with each {list} put in, its words wrapped at 88 columns under the
 * column the list started at */
static void print_help_text(const char *text, FILE *out) {
    int col = 0;
    for (const char *p = text; *p;) {
        const char *end = *p == '{' ? strchr(p, '}') : NULL;
        const char *list = end ? help_list(p, (size_t)(end - p + 1)) : NULL;
        if (list == NULL) {
            col = *p == '\n' ? 0 : col + 1;
            fputc(*p++, out);
            continue;
        }
        int indent = col;
        for (const char *w = list; *w;) {
            size_t len = strcspn(w, " ");
            if (col > indent && col + (int)len + 1 > 88) {
                fprintf(out, "\n%*s", indent, "");
                col = indent;
            } else if (col > indent) {
                fputc(' ', out);
                col++;
            }
            fprintf(out, "%.*s", (int)len, w);
            col += (int)len;
            w += len;
            while (*w == ' ') w++;
        }
        p = end + 1;
    }
}

static void print_command_help(const Command *c, FILE *out) {
    fprintf(out, "usage: strait %s %s\n\n%s\n", c->name, c->usage, c->summary);
    if (c->help && *c->help) {
        fputc('\n', out);
        print_help_text(c->help, out);
    }
}

int cmd_help(const Command *cmd, int argc, char **argv) {
    (void)cmd;
    if (argc <= 1) {
        print_overview(stdout);
        return EXIT_OK;
    }
    int words;
    const Command *c = command_find(argc - 1, argv + 1, &words);
    if (c == NULL || words != argc - 1) {
        fprintf(stderr, "strait help: no command '%s'; 'strait --help' lists them\n", argv[1]);
        return EXIT_USAGE;
    }
    print_command_help(c, stdout);
    return EXIT_OK;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_overview(stderr);
        return EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        print_overview(stdout);
        return EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) argv[1] = "version";
    int words;
    const Command *c = command_find(argc - 1, argv + 1, &words);
    if (c == NULL) {
        /* "strait db" names a group: say which subcommands it has */
        char subs[256] = "";
        size_t len = strlen(argv[1]);
        for (const Command *g = cli_commands; g->name; g++)
            if (strncmp(g->name, argv[1], len) == 0 && g->name[len] == ' ')
                snprintf(subs + strlen(subs), sizeof subs - strlen(subs), "%s'%s'",
                         subs[0] ? ", " : "", g->name + len + 1);
        if (subs[0])
            fprintf(stderr, "strait %s: needs a subcommand: %s; see 'strait --help'\n", argv[1],
                    subs);
        else
            fprintf(stderr, "strait: unknown command '%s'; 'strait --help' lists the commands\n",
                    argv[1]);
        return EXIT_USAGE;
    }
    for (int i = 1 + words; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) break;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            print_command_help(c, stdout);
            return EXIT_OK;
        }
    }
    /* The command sees argv[0] = its last name word, then its own arguments. */
    return c->run(c, argc - words, argv + words);
}
