/* merge.h: a LoRA adapter merged into its base model, written as a full Hugging Face folder. */
#ifndef SNUG_TRAIN_MERGE_H
#define SNUG_TRAIN_MERGE_H

#include "core/error.h"
#include "model/model.h"

/* out_dir = base_dir's model with adapter_dir's PEFT LoRA adapter merged: W' = W + s B A for every adapted module
 * (GPT-2's Conv1D weights in their file orientation), computed in fp32 on the fp32 weights and rounded once to the
 * base's dtype (config.json torch_dtype), as PEFT's merge_and_unload. The tokenizer files come from the adapter
 * folder when it has them, else from the base; config.json is written last. threads: CPU threads (0: all). */
/* q4: NULL merges into the base as it is; else (a QLoRA adapter) into the base's 4-bit round trip
 * dequantize(quantize_4bit(W)) under that type, block size and double quantization: the weights the adapter was
 * trained on (Axolotl's simulate_nf4). */
int snug_merge_lora(const char *base_dir, const char *adapter_dir, const char *out_dir, const snug_lora_cfg *q4,
                    int threads, snug_error *e);

#endif
