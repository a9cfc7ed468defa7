/* peft_io.h: LoRA adapters in PEFT's format (adapter_config.json + adapter_model.safetensors), and the names of the
 * modules they target. */
#ifndef SNUG_PEFT_IO_H
#define SNUG_PEFT_IO_H

#include <stddef.h>

#include "core/error.h"
#include "model/model.h"

/* Target module names ("q_proj,v_proj", "c_attn", "all-linear"; separated by commas or spaces) to the bit set of
 * snug_lora_module_name, by PEFT's rule (a module matches an entry equal to its name or to a suffix after a dot).
 * -1 with the first name that matches no module copied to unknown. */
int snug_lora_targets_parse(snug_arch arch, const char *list, unsigned *out, char *unknown, size_t n);
/* The bit set as target_modules entries ("q_proj, v_proj"). */
void snug_lora_targets_list(snug_arch arch, unsigned targets, char *buf, size_t n);

/* lora_modules_to_save's names ("embed_tokens, lm_head") to SNUG_SAVE_* bits; -1 with the first other name copied
 * to unknown. And the bits as names. */
int snug_lora_save_parse(const char *list, unsigned *out, char *unknown, size_t n);
void snug_lora_save_list(unsigned save, char *buf, size_t n);

/* Writes m's adapters into dir as PEFT saves them; host: the adapter table's values in host memory, or NULL to read
 * them from the model. base_name: base_model_name_or_path. adapter_config.json is written last. */
int snug_peft_save(const snug_model *m, const char *dir, const char *base_name, const float *host, snug_error *e);
/* Reads dir's adapter_config.json: r, alpha, dropout, rsLoRA, DoRA, the targets and layers (less exclude_modules),
 * resolved against arch and its n_layer layers, and init_lora_weights; refuses by name what snug does not compute
 * (per-module ranks, trained biases, saved modules other than embed_tokens and lm_head, LoRA variants, bases that
 * PiSSA's randomized SVD, CorDA or LoftQ changed: the table in peft_io.c). */
int snug_peft_read_config(const char *dir, snug_arch arch, int n_layer, snug_lora_cfg *out, snug_error *e);
/* rows: the row count of the whole embedding dir's adapter holds (PEFT saves it beside the adapters when the base's
 * vocabulary was grown for added tokens, or trained it in modules_to_save), 0 when it holds none. */
int snug_peft_vocab(const char *dir, int *rows, snug_error *e);
/* Whether dir holds an adapter (adapter_config.json) and no model of its own (config.json). */
int snug_peft_is_adapter(const char *dir);
/* base_model_name_or_path of dir's adapter_config.json into buf: the base the adapter was trained on. */
int snug_peft_base_path(const char *dir, char *buf, size_t n, snug_error *e);
/* PiSSA, OLoRA (init, snug_lora_init_kind): m's base weights under its adapted modules made the residual PEFT's
 * initialisation leaves (peft_init.c), and m->lv.lora.init set so the adapters are saved as relative to it; nothing
 * for SNUG_LORA_INIT_PLAIN. path names the adapter in errors. */
int snug_peft_residual(snug_model *m, int init, const char *path, snug_error *e);
/* Loads dir's adapter into m's adapters (laid out from the same r and targets): every tensor present with its
 * shape, and no other but the whole embedding and lm_head PEFT saves beside an adapter on a grown vocabulary, which
 * replace m's (of the same shape: m grown to their rows); then the base under a PiSSA or OLoRA adapter
 * (snug_peft_residual). snug_peft_save writes those tables when m's vocabulary was grown and modules_to_save is
 * empty. */
int snug_peft_load(snug_model *m, const char *dir, snug_error *e);

#endif
