/* export_cmd.c: `snug export`: a saved model folder (or a base with a PEFT LoRA adapter, merged first as `snug
 * merge` merges it) written as one GGUF file for llama.cpp and Ollama (train/export.c). */
#define _XOPEN_SOURCE 700
#include "cli/export_cmd.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/export.h"
#include "train/merge.h"

void snug_export_usage(FILE *f) {
    fprintf(f, "usage: snug export --gguf OUT.gguf [--type f32|f16|bf16|q8_0] MODEL_DIR [--adapter DIR] [--name NAME]\n"
               "\n"
               "Writes MODEL_DIR (a folder with config.json, safetensors weights and tokenizer.json, as snug train,\n"
               "snug merge or save_pretrained write it) as one GGUF file that llama.cpp and Ollama load: the weights\n"
               "under llama.cpp's names, the vocabulary, merges, special tokens and chat template in its metadata,\n"
               "as llama.cpp's convert_hf_to_gguf.py writes them (families llama, mistral, qwen2, gpt2).\n"
               "  --gguf OUT.gguf   the file to write\n"
               "  --type T          how the matrices are stored: f32, f16 (default), bf16 or q8_0 (8-bit blocks of 32);\n"
               "                    norms, biases and 1-D tensors stay f32\n"
               "  --adapter DIR     a PEFT LoRA adapter of MODEL_DIR, merged first as `snug merge` merges it\n"
               "  --name NAME       general.name in the file (default: the folder's name)\n");
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

int snug_export_cmd(int argc, char **argv, FILE *out, snug_error *e) {
    const char *gguf = NULL, *type_s = "f16", *dir = NULL, *adapter = NULL, *name = NULL;
    for (int i = 0; i < argc; i++) {
        const char **dst = !strcmp(argv[i], "--gguf") ? &gguf : !strcmp(argv[i], "--type") ? &type_s
                           : !strcmp(argv[i], "--adapter") ? &adapter : !strcmp(argv[i], "--name") ? &name : NULL;
        if (dst) {
            if (i + 1 >= argc)
                return snug_fail(e, SNUG_EINPUT, "snug export: %s needs a value; see `snug export --help`", argv[i]);
            *dst = argv[++i];
        } else if (argv[i][0] == '-' || dir) {
            return snug_fail(e, SNUG_EINPUT, "snug export: unexpected argument '%s'; usage: snug export --gguf OUT.gguf "
                             "[--type f32|f16|bf16|q8_0] MODEL_DIR [--adapter DIR]", argv[i]);
        } else {
            dir = argv[i];
        }
    }
    if (!gguf || !dir)
        return snug_fail(e, SNUG_EINPUT, "snug export needs %s; usage: snug export --gguf OUT.gguf "
                         "[--type f32|f16|bf16|q8_0] MODEL_DIR [--adapter DIR]", !gguf ? "--gguf OUT.gguf" : "MODEL_DIR");
    snug_gguf_type type;
    if (!strcmp(type_s, "f32"))
        type = SNUG_GGUF_F32;
    else if (!strcmp(type_s, "f16"))
        type = SNUG_GGUF_F16;
    else if (!strcmp(type_s, "bf16"))
        type = SNUG_GGUF_BF16;
    else if (!strcmp(type_s, "q8_0"))
        type = SNUG_GGUF_Q8_0;
    else
        return snug_fail(e, SNUG_EINPUT, "snug export: --type %s is not one of f32, f16, bf16, q8_0", type_s);
    char tmp[4096] = "";
    int rc = 0;
    const char *src = dir;
    if (adapter) { /* merged into a folder beside the output, removed afterwards */
        snprintf(tmp, sizeof tmp, "%s.merge.XXXXXX", gguf);
        if (!mkdtemp(tmp))
            return snug_fail(e, SNUG_EIO, "snug export: cannot make the folder %s to merge the adapter into", tmp);
        rc = snug_merge_lora(dir, adapter, tmp, NULL, 0, e);
        src = tmp;
    }
    char base[256];
    if (!name) { /* the folder's name, also when the adapter was merged into a temporary one */
        size_t n = strlen(dir), s;
        while (n > 1 && dir[n - 1] == '/')
            n--;
        for (s = n; s > 0 && dir[s - 1] != '/'; s--)
            ;
        snprintf(base, sizeof base, "%.*s", (int)(n - s), dir + s);
        name = base;
    }
    if (!rc)
        rc = snug_export_gguf(src, gguf, type, name, e);
    if (adapter)
        nftw(tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (!rc)
        fprintf(out, "exported %s%s%s to %s (%s)\n", dir, adapter ? " with " : "", adapter ? adapter : "", gguf,
                type_s);
    return rc;
}
