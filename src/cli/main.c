/* main.c: the snug command line: train, plan, generate, merge, export, and the parity harness the tests drive.
 *
 * The only place that prints errors and chooses exit statuses: 0 success, 2 bad input (config, data, model files),
 * 1 anything else. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/options.h"
#include "cli/parity.h"
#include "core/error.h"
#include "core/version.h"
#include "dist/comm.h"
#include "cli/plan_cmd.h"
#include "train/trainer.h"
#include "cli/generate_cmd.h"
#include "cli/preprocess_cmd.h"
#include "cli/export_cmd.h"
#include "train/merge.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: snug <command> [CONFIG.yaml] [--key value ...]\n"
            "\n"
            "commands:\n"
            "  train [CONFIG]        train (no CONFIG: the built-in default job, a small Llama on fortunes)\n"
            "  plan [CONFIG]         the memory of a training run per category, whether it fits common GPUs (or\n"
            "                        --gpu NAME, --memory_budget 40GB), the levers that make it fit and what the run\n"
            "                        costs; --json, --svg FILE; `snug plan --help` for all flags\n"
            "  preprocess [CONFIG]   tokenize the datasets into the cache (dataset_prepared_path) and print counts;\n"
            "                        --debug shows the first 3 examples token by token with their mask,\n"
            "                        --dump FILE.jsonl writes every example as input_ids + labels\n"
            "  generate MODEL_DIR    sample from a saved model (--adapter DIR: with a PEFT LoRA adapter; an adapter\n"
            "                        folder alone uses the base it names): --prompt TEXT --max_new_tokens N --temperature T\n"
            "                        --top_k K --top_p P --seed S --threads N\n"
            "  merge BASE ADAPTER OUT  merge a PEFT LoRA adapter into its base and write a full model folder (fp32\n"
            "                        arithmetic, rounded once to the base's dtype); --base_as nf4: into the base's\n"
            "                        4-bit round trip, the weights a QLoRA adapter was trained on (int8: the 8-bit\n"
            "                        one of load_in_8bit)\n"
            "  export --gguf OUT.gguf MODEL_DIR  write a model (--adapter DIR: merged with a LoRA adapter first) as\n"
            "                        one GGUF file for llama.cpp and Ollama, with its tokenizer and chat template;\n"
            "                        --type f32|f16|bf16|q8_0 (default f16); `snug export --help`\n"
            "  help                  this text; `snug train --help` lists every configuration key, `snug generate\n"
            "                        --help` the flags of generate\n"
            "  --version             snug's version\n"
            "\n"
            "Every configuration key can be given in the YAML file or on the command line (--learning_rate 1e-4).\n");
}

/* SIGTERM (a preempted machine) and SIGINT (Ctrl-C): the run finishes its step, writes a checkpoint and exits 0; a
 * second signal stops at once. */
static void on_stop_signal(int sig) {
    snug_train_request_stop();
    signal(sig, SIG_DFL);
}

static void catch_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

static int exit_status(int code) { return code == SNUG_EINPUT ? 2 : 1; }

static int report(const snug_error *e) {
    fprintf(stderr, "snug: error: %s\n", e->msg);
    return exit_status(e->code);
}

static int has_help(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return 1;
    return 0;
}

/* `snug train` (or `snug plan`) with no arguments at all runs the built-in default job (configs/default.yaml);
 * with arguments, the defaults of every key apply unless a config file is named. */
static int load_options(snug_run_config *o, int argc, char **argv, int train, snug_error *e) {
    snug_options_defaults(o);
    if (argc == 0) {
        char def[4096];
        snprintf(def, sizeof def, "%s/configs/default.yaml", SNUG_SOURCE_DIR);
        SNUG_TRY(snug_options_load_yaml(o, def, e));
    } else {
        SNUG_TRY(snug_options_parse_args(o, argc, argv, e));
    }
    return train ? snug_run_config_validate_train(o, e) : snug_run_config_validate(o, e);
}

/* torchrun on one node (LOCAL_WORLD_SIZE = WORLD_SIZE): snug's ranks talk through MPI, which torchrun's processes
 * cannot join, so its local rank 0 runs the same command again as `mpirun -np WORLD_SIZE` (whose processes take
 * the GPUs by their local rank, as torchrun's would) and the others end here. 0: no such launch (or no MPI in this
 * build: snug_train refuses it, naming mpirun); 1: handled, *status is this process's exit status (rank 0 gets
 * here only when mpirun could not be started). */
static int torchrun_handover(int argc, char **argv, int *status, snug_error *e) {
    snug_launch l;
    snug_error ignored = {0}; /* a malformed launch is snug_train's to report */
    if (snug_launch_detect(&l, &ignored) || strcmp(l.launcher, "torchrun") || l.size <= 1 || l.local_size != l.size ||
        !snug_comm_mpi_available())
        return 0;
    *status = 0;
    if (l.local_rank != 0)
        return 1;
    char exe[4096], np[16];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0)
        exe[n] = '\0';
    else
        snprintf(exe, sizeof exe, "%s", argv[0]);
    snprintf(np, sizeof np, "%d", l.size);
    char **args = calloc((size_t)argc + 8, sizeof *args);
    if (!args)
        return *status = 1, 1;
    int k = 0;
    args[k++] = "mpirun", args[k++] = "-np", args[k++] = np;
    if (geteuid() == 0) /* Open MPI will not start as root without it (containers often run as root) */
        args[k++] = "--allow-run-as-root";
    if (sysconf(_SC_NPROCESSORS_ONLN) < l.size)
        args[k++] = "--oversubscribe";
    args[k++] = exe;
    for (int i = 1; i < argc; i++)
        args[k++] = argv[i];
    static const char *const torchrun_vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
    for (size_t i = 0; i < sizeof torchrun_vars / sizeof *torchrun_vars; i++)
        unsetenv(torchrun_vars[i]);
    printf("torchrun: %d processes on one node; snug's ranks talk through MPI, so local rank 0 runs them as mpirun "
           "-np %d and torchrun's others end here\n", l.size, l.size);
    fflush(stdout);
    execvp("mpirun", args);
    snug_fail(e, SNUG_EINPUT, "torchrun's %d processes: snug's ranks talk through MPI and mpirun could not be started "
              "(%s); install Open MPI (scripts/setup.sh installs openmpi-bin) or launch with mpirun -np %d", l.size,
              strerror(errno), l.size);
    free(args);
    *status = 2;
    return 1;
}

int main(int argc, char **argv) {
    /* every line as it is printed, also into a file or a pipe: `snug train > log` shows each logged step at once, and
     * a killed run keeps every line it printed */
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        if (argc >= 2) {
            printf("\nconfiguration keys:\n");
            snug_options_print_help(stdout);
        }
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("snug %s\n", SNUG_VERSION);
        return 0;
    }
    const char *cmd = argv[1];
    snug_error e = {0};
    snug_run_config *o = calloc(1, sizeof *o);
    if (!o)
        return 1;
    int rc;
    if (!strcmp(cmd, "train") || !strcmp(cmd, "plan")) {
        int plan = !strcmp(cmd, "plan"), nargs = argc - 2;
        if (has_help(argc - 2, argv + 2)) {
            printf("usage: snug %s [CONFIG.yaml] [--key value ...]%s\n", cmd, plan ? " [--gpu NAME] [--json] ..." : "");
            if (plan)
                snug_plan_usage(stdout);
            printf("\nconfiguration keys:\n");
            snug_options_print_help(stdout);
            free(o);
            return 0;
        }
        snug_plan_args pa; /* plan's own flags (--gpu, --json, --svg, ...) leave argv before the options parser */
        rc = plan ? snug_plan_args_take(&pa, &nargs, argv + 2, &e) : 0;
        if (!rc)
            rc = load_options(o, nargs, argv + 2, !plan, &e);
        int status = 0;
        if (!rc && !plan && torchrun_handover(argc, argv, &status, &e)) {
            if (status == 2)
                report(&e);
            free(o);
            return status;
        }
        if (!rc && !plan)
            catch_stop_signals();
        if (!rc)
            rc = plan ? snug_plan_cmd(o, &pa, stdout, &e) : snug_train(o, stdout, &e);
    } else if (!strcmp(cmd, "preprocess")) {
        if (has_help(argc - 2, argv + 2)) {
            printf("usage: snug preprocess [CONFIG.yaml] [--key value ...] [--debug] [--dump FILE.jsonl]\n\n"
                   "configuration keys:\n");
            snug_options_print_help(stdout);
            free(o);
            return 0;
        }
        rc = snug_preprocess_cmd(argc - 2, argv + 2, stdout, &e);
    } else if (!strcmp(cmd, "generate")) {
        if (has_help(argc - 2, argv + 2)) {
            snug_generate_usage(stdout);
            free(o);
            return 0;
        }
        rc = snug_generate_cmd(argc - 2, argv + 2, stdout, &e);
    } else if (!strcmp(cmd, "merge")) {
        /* --base_as nf4|fp4|int8: merge into the base's 4-bit round trip (what a QLoRA adapter was trained on), or
         * its 8-bit one (load_in_8bit) */
        snug_lora_cfg q = {.q4_nested = 1, .q4_blocksize = 64};
        int quant = argc == 7 && !strcmp(argv[5], "--base_as") &&
                    (!strcmp(argv[6], "nf4") || !strcmp(argv[6], "fp4") || !strcmp(argv[6], "int8"));
        q.q4_type = !quant ? SNUG_Q4_NF4 : !strcmp(argv[6], "fp4") ? SNUG_Q4_FP4
                                         : !strcmp(argv[6], "int8") ? SNUG_Q4_INT8 : SNUG_Q4_NF4;
        if (argc < 5 || argv[2][0] == '-')
            rc = snug_fail(&e, SNUG_EINPUT, "usage: snug merge BASE_DIR ADAPTER_DIR OUT_DIR [--base_as nf4|fp4|int8]");
        else if (argc > 5 && !quant)
            rc = snug_fail(&e, SNUG_EINPUT, "snug merge takes BASE_DIR ADAPTER_DIR OUT_DIR and optionally --base_as "
                           "nf4 (or fp4, or int8); got '%s'", argv[5]);
        else if (!(rc = snug_merge_lora(argv[2], argv[3], argv[4], quant ? &q : NULL, 0, &e)))
            printf("merged %s into %s%s%s%s: %s (fp32, rounded once to the base's dtype)\n", argv[3], argv[2],
                   quant ? " (its " : "", quant ? snug_q4_width(q.q4_type) : "", quant ? " round trip)" : "",
                   argv[4]);
    } else if (!strcmp(cmd, "export")) {
        if (has_help(argc - 2, argv + 2)) {
            snug_export_usage(stdout);
            free(o);
            return 0;
        }
        rc = snug_export_cmd(argc - 2, argv + 2, stdout, &e);
    } else if (!strcmp(cmd, "parity")) {
        rc = snug_parity_cmd(argc - 2, argv + 2, &e);
    } else {
        snug_fail(&e, SNUG_EINPUT, "unknown command '%s'; run `snug help`", cmd);
        rc = SNUG_EINPUT;
    }
    free(o);
    fflush(stdout);
    return rc ? report(&e) : 0;
}
