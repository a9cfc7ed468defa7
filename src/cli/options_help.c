/* options_help.c: the `snug train --help` listing and the flags' lines of `snug plan --help`, printed from the key
 * table, so help and parser cannot disagree. */
#include "cli/options_impl.h"


static const char *const group_titles[NGROUPS] = {
    "model", "data", "each datasets entry", "batch & schedule", "optimizer", "output & logging", "generation",
    "memory", "flags of snug plan",
};

/* ---- help ---- */

void opt_print_key(FILE *f, const key_spec *k) {
    char type[320], choices[256];
    if (k->type == KT_ENUM) {
        opt_enum_choices(k->values, "|", 1, choices, sizeof choices);
        snprintf(type, sizeof type, "%s", choices);
    } else {
        static const char *const names[] = {"int",  "float", "bool",    "string",
                                            "",     "size",  "list",    "list",
                                            "mapping", "list of names", "mapping or file"}; /* by key_type */
        _Static_assert(sizeof names / sizeof *names == KT_FSDP + 1, "a name for every key type");
        snprintf(type, sizeof type, "%s", names[k->type]);
    }
    fprintf(f, "  %s: %s", k->name, type);
    if (k->def)
        fprintf(f, k->type == KT_STRING || k->type == KT_NAMES ? " = \"%s\"" : " = %s", k->def);
    else if (k->group == G_DATASET)
        fprintf(f, " (required)");
    if (k->aliases)
        fprintf(f, "  (also: %s)", k->aliases);
    fprintf(f, "\n      %s\n", k->help);
}

/* The environment variables that choose a kernel or a library. They are switches for debugging and for comparing
 * paths, not configuration: a run's results never depend on them beyond the rounding each path documents, the
 * checkpoint does not record them, and nothing new should read the environment (a choice a user makes is a key). */
static const struct {
    const char *name, *what;
} environment[] = {
    {"SNUG_CUDA_ATTN", "plain, tiled, tiled32, tiled16 or tc: forces the CUDA attention kernel's rung or caps its "
                       "tile (the tests run the small tiles on a large GPU so)"},
    {"SNUG_CPU_GEMM", "auto, openblas, bf16 or f32: forces the CPU GEMM path that the `gemm` line reports"},
    {"SNUG_BLAS", "a file: the OpenBLAS library to open instead of the one found when building"},
    {"SNUG_DNNL", "a file: the oneDNN library to open instead of the one found when building"},
    {"SNUG_NCCL", "a file: the NCCL library to open instead of libnccl.so.2"},
    {"SNUG_MPI_SHM", "0: MPI's own collectives between the ranks of one host instead of snug's shared-memory ones"},
};

static void print_environment(FILE *f) {
    fprintf(f, "\nenvironment variables, switches for debugging and for comparing kernels only (not configuration; "
               "results do not depend on them beyond each path's rounding):\n");
    for (size_t i = 0; i < sizeof environment / sizeof environment[0]; i++)
        fprintf(f, "  %s: %s\n", environment[i].name, environment[i].what);
}

void snug_options_print_help(FILE *f) {
    fprintf(f, "Keys of the YAML config; on the command line --key value or --key=value, which win over the "
               "config:\n");
    for (int g = 0; g < NGROUPS; g++) {
        if (g == G_PLAN)
            continue;
        fprintf(f, "\n%s:\n", group_titles[g]);
        for (int i = 0; i < opt_nkeys; i++)
            if (opt_keys[i].group == g && !opt_keys[i].later && !opt_keys[i].noop)
                opt_print_key(f, &opt_keys[i]);
    }
    fprintf(f, "\naccepted with any value, changing nothing in snug (other trainers' knobs for what snug does its own "
               "way):\n");
    for (int i = 0; i < opt_nkeys; i++)
        if (opt_keys[i].noop)
            fprintf(f, "  %s: %s\n", opt_keys[i].name, opt_keys[i].noop);
    fprintf(f, "\nrecognised but not supported yet (refused unless the value asks for nothing: false, empty):\n");
    for (int i = 0; i < opt_nkeys; i++) {
        const key_spec *k = &opt_keys[i];
        if (!k->later)
            continue;
        fprintf(f, "  %s%s", k->group == G_DATASET ? "datasets[]." : "", k->name);
        if (k->off)
            fprintf(f, " (%s accepted)", k->off);
        fprintf(f, ": %s\n", k->later);
    }
    fprintf(f, "  optimizer values other than adamw, adamw_8bit, paged_adamw_8bit, paged_adamw_32bit and their other "
               "spellings (adafactor, sgd, lion_8bit, ...)\n");
    fprintf(f, "  lr_scheduler values other than cosine, linear, constant, constant_with_warmup\n");
    fprintf(f, "  datasets[].type values other than completion, alpaca, chat (chat_template), pretokenized, "
               "input_output (sharegpt, ...)\n");
    print_environment(f);
}

void snug_generate_flags_help(FILE *f) {
    for (int i = 0; i < opt_nkeys; i++)
        if (opt_keys[i].group == G_GEN || !strcmp(opt_keys[i].name, "seed") || !strcmp(opt_keys[i].name, "threads"))
            opt_print_key(f, &opt_keys[i]);
}

void snug_plan_flags_help(FILE *f) {
    for (int i = 0; i < opt_nkeys; i++)
        if (opt_keys[i].group == G_PLAN)
            opt_print_key(f, &opt_keys[i]);
}
