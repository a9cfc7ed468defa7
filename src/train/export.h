/* export.h: a saved model folder (config.json, safetensors, tokenizer files) written as one GGUF file for llama.cpp
 * and Ollama, with what llama.cpp's own converter (convert_hf_to_gguf.py) writes for the family: the architecture's
 * hyperparameters, the tensors under ggml's names (Llama's q/k rows permuted for its rotary layout, GPT-2's Conv1D
 * weights transposed), the vocabulary, merges, special ids and the chat template. */
#ifndef SNUG_TRAIN_EXPORT_H
#define SNUG_TRAIN_EXPORT_H

#include "core/error.h"
#include "model/config.h"
#include "model/gguf.h"

/* Writes model_dir's model as out_path, its matrices stored as type (norms, biases, 1-D tensors and GPT-2's
 * position embedding stay f32; a q8_0 matrix whose rows are not a multiple of 32 is written f16, as the converter
 * does). name: general.name (NULL: model_dir's last path component). Errors name the file and the fix. */
int snug_export_gguf(const char *model_dir, const char *out_path, snug_gguf_type type, const char *name,
                     snug_error *e);

/* export_vocab.c: the tokenizer.* metadata of model_dir (tokenizer.json, tokenizer_config.json, config.json,
 * chat_template.jinja) added to g. spm: the family's converter tries a SentencePiece-style vocabulary first (Llama,
 * Mistral): a BPE with byte_fallback becomes tokenizer model "llama" with scores and types, anything else "gpt2"
 * with merges. */
int snug_export_vocab(snug_gguf *g, const char *model_dir, const snug_model_config *cfg, int spm, snug_error *e);

#endif
