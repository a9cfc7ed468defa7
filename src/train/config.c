/* config.c: validating a run configuration and deriving its levers (see config.h). */
#include "train/config.h"

#include "plan/plan_json.h"

#include <math.h>
#include <stdlib.h>

#define REQUIRE(cond, ...)                                   \
    do {                                                     \
        if (!(cond))                                         \
            return snug_fail(e, SNUG_EINPUT, __VA_ARGS__);   \
    } while (0)

/* The model, the data, the batch and the activation levers. */
static int validate_model_data(const snug_run_config *o, const char *src, snug_error *e) {
    REQUIRE(o->base_model[0] || o->model_preset[0], "%s: model_preset is empty and so is base_model; set one", src);
    REQUIRE(o->sequence_len >= 2, "%s: sequence_len is %d; it must be at least 2", src, o->sequence_len);
    REQUIRE(o->long_examples == SNUG_LONG_TRUNCATE || o->long_examples == SNUG_LONG_DROP,
            "%s: long_examples is %d; use truncate or drop", src, (int)o->long_examples);
    REQUIRE(o->dataset_prepared_path[0], "%s: dataset_prepared_path is empty; name a folder for the tokenized data",
            src);
    REQUIRE(o->val_set_size >= 0, "%s: val_set_size is %g; use 0 (none), a fraction below 1, or a count", src,
            o->val_set_size);
    REQUIRE(o->val_set_size < 1 || o->val_set_size == floor(o->val_set_size),
            "%s: val_set_size is %g; a count (>= 1) must be a whole number, a fraction must be below 1", src,
            o->val_set_size);
    for (int i = 0; i < o->ndatasets + o->ntest_datasets; i++) {
        const char *key;
        const snug_dataset_spec *d = snug_run_dataset(o, i, &key);
        int k = i < o->ndatasets ? i : i - o->ndatasets;
        REQUIRE(d->path[0], "%s: %s[%d] has no path; add 'path: data.jsonl'", src, key, k);
        REQUIRE(d->type >= SNUG_DATA_COMPLETION && d->type <= SNUG_DATA_INPUT_OUTPUT,
                "%s: %s[%d] type %d is unknown; use completion, alpaca, chat, pretokenized or input_output", src, key,
                k, (int)d->type);
        REQUIRE(d->field[0] || d->type != SNUG_DATA_COMPLETION,
                "%s: %s[%d] field is empty; name the JSON field that holds the text", src, key, k);
        REQUIRE(d->chat_template >= SNUG_CHAT_CHATML && d->chat_template <= SNUG_CHAT_TOKENIZER_OR_LLAMA3,
                "%s: %s[%d] chat_template %d is unknown; use tokenizer_default, tokenizer_default_fallback_chatml, "
                "tokenizer_default_fallback_llama3, chatml, llama3 or jinja", src, key, k, (int)d->chat_template);
        REQUIRE(d->chat_template != SNUG_CHAT_JINJA || o->chat_template_jinja[0],
                "%s: %s[%d] chat_template is jinja but chat_template_jinja is empty; set chat_template_jinja to the "
                "template's text or file", src, key, k);
    }
    REQUIRE(!o->ntest_datasets || o->val_set_size == 0,
            "%s: test_datasets and val_set_size %g both give a validation set; keep one", src, o->val_set_size);
    REQUIRE(o->micro_batch_size >= 1, "%s: micro_batch_size is %d; it must be at least 1", src, o->micro_batch_size);
    REQUIRE(o->pad_to_multiple_of >= 0, "%s: pad_to_multiple_of is %d; use 0 (no rounding) or a positive length",
            src, o->pad_to_multiple_of);
    REQUIRE(!o->concatenate || (!o->sample_packing && !o->group_by_length),
            "%s: concatenate is true with %s; the stream has no examples to pack or group, keep one", src,
            o->sample_packing ? "sample_packing" : "group_by_length");
    REQUIRE(!o->sample_packing || !o->group_by_length,
            "%s: sample_packing and group_by_length are both true; packing already places examples by length, "
            "keep one", src);
    REQUIRE(o->gradient_checkpointing_every_n_layers >= 1,
            "%s: gradient_checkpointing_every_n_layers is %d; it must be at least 1", src,
            o->gradient_checkpointing_every_n_layers);
    REQUIRE(!o->offload_embedding || o->adapter != SNUG_ADAPTER_NONE,
            "%s: offload_embedding keeps a frozen embedding in host memory, but a full fine-tune trains it; use "
            "adapter: lora or qlora, or set offload_embedding: false", src);
    REQUIRE(o->loss_vocab_block >= -1,
            "%s: loss_vocab_block is %d; use a number of rows of at least 1, 0 for auto or -1 for off", src,
            o->loss_vocab_block);
    REQUIRE(o->tiled_mlp_num_shards >= 0,
            "%s: tiled_mlp_num_shards is %d; use a number of shards of at least 1, or 0 for auto", src,
            o->tiled_mlp_num_shards);
    REQUIRE(o->cross_entropy_chunk_tokens >= 1, "%s: cross_entropy_chunk_tokens is %d; it must be at least 1", src,
            o->cross_entropy_chunk_tokens);
    return 0;
}

/* What trains and how the model is split: the step inside backward, precision, ZeRO, tensor and pipeline
 * parallelism, unfrozen_parameters, offloading. */
static int validate_splits(const snug_run_config *o, const char *src, snug_error *e) {
    /* the step inside backward updates the last layers before the first layers' gradients exist, and frees each
     * layer's gradients once used: no global norm to clip by, nothing kept to accumulate into */
    REQUIRE(!o->optimizer_in_backward || o->max_grad_norm == 0,
            "%s: optimizer_in_backward cannot clip by the global gradient norm (layers are stepped before the norm "
            "is known); set max_grad_norm: 0", src);
    REQUIRE(!o->optimizer_in_backward || o->gradient_accumulation_steps == 1,
            "%s: optimizer_in_backward steps after every micro-batch, so gradients cannot accumulate; set "
            "gradient_accumulation_steps: 1 (raise micro_batch_size instead)", src);
    REQUIRE(!(o->bf16 && o->fp16), "%s: bf16 and fp16 are both true; choose one", src);
    /* ZeRO: stages 1 to 3 on a full fine-tune whose optimizer steps after backward */
    REQUIRE(o->zero_stage <= 3,
            "%s: zero_stage %d does not exist; use 3 (parameters, gradients and optimizer state sharded), 2 "
            "(gradients and optimizer state), 1 (optimizer state) or 0", src, o->zero_stage);
    REQUIRE(!o->zero_stage || o->adapter == SNUG_ADAPTER_NONE || o->zero_stage == 3,
            "%s: zero_stage %d with adapter %s is not supported: the adapters' state is small and stays whole on every "
            "rank, so with an adapter only stage 3 (which shards the frozen base) means something; set zero_stage: 3 "
            "or 0", src, o->zero_stage, o->adapter == SNUG_ADAPTER_QLORA ? "qlora" : "lora");
    /* tensor parallelism: a full fine-tune */
    REQUIRE(o->tensor_parallel_size >= 1 && o->tensor_parallel_size <= 4096,
            "%s: tensor_parallel_size is %d; use 1 (none) to 4096 ranks", src, o->tensor_parallel_size);
    REQUIRE(o->tensor_parallel_size == 1 || o->adapter == SNUG_ADAPTER_NONE,
            "%s: tensor_parallel_size %d with adapter %s is not supported yet: tensor parallelism splits a full "
            "fine-tune's blocks; set tensor_parallel_size: 1 (data parallelism, with zero_stage: 3 to shard the base, "
            "suits adapters)", src, o->tensor_parallel_size, o->adapter == SNUG_ADAPTER_QLORA ? "qlora" : "lora");
    REQUIRE(o->tensor_parallel_size == 1 || o->zero_stage < 3 || !o->optimizer_in_backward,
            "%s: tensor_parallel_size %d with zero_stage 3 and optimizer_in_backward is not supported yet (the "
            "step inside stage 3's reduce-scatters does not tell the slices' gradient norm from the whole tensors'); "
            "set optimizer_in_backward: false, or zero_stage: 2", src, o->tensor_parallel_size);
    /* pipeline parallelism: a full fine-tune, alone among the model splits, with the optimizer after backward */
    REQUIRE(o->pipeline_parallel_size >= 1 && o->pipeline_parallel_size <= 4096,
            "%s: pipeline_parallel_size is %d; use 1 (none) to 4096 stages", src, o->pipeline_parallel_size);
    if (o->pipeline_parallel_size > 1) {
        int pp = o->pipeline_parallel_size;
        REQUIRE(o->tensor_parallel_size == 1,
                "%s: pipeline_parallel_size %d with tensor_parallel_size %d is not supported yet; choose one of them "
                "(data parallelism goes beside either)", src, pp, o->tensor_parallel_size);
        REQUIRE(o->zero_stage < 3,
                "%s: pipeline_parallel_size %d with zero_stage 3 is not supported yet (stages 1 and 2 shard each "
                "stage's optimizer state and gradients over its data-parallel group); set zero_stage: 2 or lower",
                src, pp);
        /* pipeline_layers: N counts, each at least 1 (the command line's reading; their sum is checked against the
         * model) */
        REQUIRE(!o->pipeline_nstage_layers || o->pipeline_nstage_layers == pp,
                "%s: pipeline_layers is '%s'; list %d counts of layers, each at least 1 (one per stage of "
                "pipeline_parallel_size %d), e.g. [2, 3, 3, 2] for 10 layers over 4", src, o->pipeline_layers, pp,
                pp);
        REQUIRE(!o->optimizer_in_backward,
                "%s: pipeline_parallel_size %d with optimizer_in_backward is not supported: a stage's layers finish "
                "backward once per micro-batch, and the step waits for every stage's gradient norm; set "
                "optimizer_in_backward: false", src, pp);
    }
    /* unfrozen_parameters: some tensors of a full fine-tune */
    REQUIRE(!o->unfrozen.n || o->adapter == SNUG_ADAPTER_NONE,
            "%s: unfrozen_parameters picks the tensors a full fine-tune trains; with adapter %s the base is frozen "
            "and only the adapters train (lora_modules_to_save trains embed_tokens or lm_head beside them); remove "
            "unfrozen_parameters or the adapter", src, o->adapter == SNUG_ADAPTER_QLORA ? "qlora" : "lora");
    REQUIRE(!o->unfrozen.n || o->tensor_parallel_size == 1,
            "%s: unfrozen_parameters with tensor_parallel_size %d is not supported yet (a rank holds slices of the "
            "tensors the patterns name); set tensor_parallel_size: 1 (data and pipeline parallelism go beside it)",
            src, o->tensor_parallel_size);
    /* QLoRA's stage 3 shards the 4-bit matrices only: the dense tensors a trained copy starts from stay whole */
    REQUIRE(!o->lora_modules_to_save[0] || (o->zero_stage < 3 && !o->offload_params) ||
                o->adapter != SNUG_ADAPTER_LORA || o->base_model[0],
            "%s: lora_modules_to_save with %s needs base_model: the trained copies start from the base's tensors, "
            "read from its file since the base is kept %s; set base_model, or remove lora_modules_to_save", src,
            o->zero_stage >= 3 ? "zero_stage 3" : "offload_params",
            o->zero_stage >= 3 ? "in shards" : "in host memory");
    REQUIRE(!o->offload_params || o->adapter != SNUG_ADAPTER_NONE,
            "%s: offload_params (FSDP's offload_params, DeepSpeed's offload_param) keeps a frozen base in host "
            "memory, which a full fine-tune does not have (its parameters are updated every step); set adapter: lora "
            "or qlora, or offload_params: false (a paged optimizer, optimizer: paged_adamw_8bit, keeps the "
            "optimizer state in host memory)", src);
    REQUIRE(!o->offload_embedding || o->zero_stage < 3 || o->adapter == SNUG_ADAPTER_QLORA,
            "%s: offload_embedding with zero_stage 3 is not supported under LoRA: the embedding is sharded with the "
            "rest of the base (QLoRA's stage 3 keeps it whole); set offload_embedding: false", src);
    return 0;
}

/* Precision, the length of the run, the schedule, the optimizer, the device and the ranks' backend. */
static int validate_optim(const snug_run_config *o, const char *src, snug_error *e) {
    REQUIRE(!o->fp16 || o->master_weights,
            "%s: fp16 without master_weights is not supported (fp16's 10-bit mantissa loses most updates); use bf16 "
            "with master_weights: false, or keep master_weights: true", src);
    REQUIRE(!o->fp16 || !o->optimizer_in_backward,
            "%s: fp16 with optimizer_in_backward is not supported: the loss scaler must see every gradient before any "
            "layer is stepped; use bf16", src);
    REQUIRE(o->gradient_accumulation_steps >= 1 && o->gradient_accumulation_steps <= 1 << 20,
            "%s: gradient_accumulation_steps is %d; use 1 to 1048576 micro-batches per step", src,
            o->gradient_accumulation_steps);
    REQUIRE(o->max_steps == -1 || o->max_steps >= 1,
            "%s: max_steps is %d; use -1 (train for num_epochs) or a number of steps >= 1", src, o->max_steps);
    REQUIRE(o->max_steps >= 1 || o->num_epochs >= 1,
            "%s: num_epochs is %d; it must be at least 1 (or set max_steps)", src, o->num_epochs);
    REQUIRE(o->learning_rate > 0, "%s: learning_rate is %g; it must be above 0 (e.g. 3e-4)", src, o->learning_rate);
    REQUIRE(o->lr_scheduler >= SNUG_SCHED_CONSTANT && o->lr_scheduler <= SNUG_SCHED_REX,
            "%s: lr_scheduler %d is unknown; use cosine, linear, constant or another of transformers' (snug train "
            "--help lists them)", src, (int)o->lr_scheduler);
    REQUIRE(o->warmup_steps >= 0, "%s: warmup_steps is %d; it must be 0 or more", src, o->warmup_steps);
    REQUIRE(o->warmup_ratio >= 0 && o->warmup_ratio < 1, "%s: warmup_ratio is %g; it must be in [0, 1)", src,
            o->warmup_ratio);
    REQUIRE(o->warmup_steps == 0 || o->warmup_ratio == 0,
            "%s: both warmup_steps (%d) and warmup_ratio (%g) are set; keep one", src, o->warmup_steps,
            o->warmup_ratio);
    REQUIRE(o->optimizer >= SNUG_OPTIMIZER_ADAMW && o->optimizer <= SNUG_OPTIMIZER_PAGED_ADAMW_32BIT,
            "%s: optimizer %d is unknown; use adamw, adamw_8bit, paged_adamw_8bit or paged_adamw_32bit", src,
            (int)o->optimizer);
    REQUIRE(o->gradient_checkpointing >= SNUG_CKPT_CHOICE_NONE && o->gradient_checkpointing <= SNUG_CKPT_CHOICE_OFFLOAD,
            "%s: gradient_checkpointing %d is unknown; use false, selective, full or offload", src,
            (int)o->gradient_checkpointing);
    REQUIRE(o->device >= SNUG_BACKEND_AUTO && o->device <= SNUG_BACKEND_CUDA,
            "%s: device %d is unknown; use auto, cpu or cuda", src, (int)o->device);
    REQUIRE(o->ddp_backend >= SNUG_DDP_BACKEND_AUTO && o->ddp_backend <= SNUG_DDP_BACKEND_MPI,
            "%s: ddp_backend %d is unknown; use nccl, mpi or auto", src, (int)o->ddp_backend);
    REQUIRE(o->zero_overlap_comm >= SNUG_OVERLAP_AUTO && o->zero_overlap_comm <= SNUG_OVERLAP_OFF,
            "%s: zero_overlap_comm %d is unknown; use true, false or auto", src, (int)o->zero_overlap_comm);
    REQUIRE(o->ddp_backend != SNUG_DDP_BACKEND_NCCL || o->device != SNUG_BACKEND_CPU,
            "%s: ddp_backend is nccl but device is cpu: NCCL moves GPU buffers; use ddp_backend: mpi (or leave it "
            "unset) for CPU ranks, or device: cuda", src);
    REQUIRE(o->weight_decay >= 0, "%s: weight_decay is %g; it must be 0 or more", src, o->weight_decay);
    REQUIRE(o->adam_beta1 >= 0 && o->adam_beta1 < 1, "%s: adam_beta1 is %g; it must be in [0, 1), e.g. 0.9", src,
            o->adam_beta1);
    REQUIRE(o->adam_beta2 >= 0 && o->adam_beta2 < 1, "%s: adam_beta2 is %g; it must be in [0, 1), e.g. 0.999", src,
            o->adam_beta2);
    REQUIRE(o->adam_epsilon > 0, "%s: adam_epsilon is %g; it must be above 0, e.g. 1e-8", src, o->adam_epsilon);
    REQUIRE(o->max_grad_norm >= 0, "%s: max_grad_norm is %g; use 0 (no clipping) or a positive norm", src,
            o->max_grad_norm);
    return 0;
}

/* Output and logging, and the adapter. */
static int validate_output_adapter(const snug_run_config *o, const char *src, snug_error *e) {
    REQUIRE(o->output_dir[0], "%s: output_dir is empty; name a folder", src);
    REQUIRE(o->logging_steps >= 1, "%s: logging_steps is %d; it must be at least 1", src, o->logging_steps);
    REQUIRE(o->eval_steps >= 0, "%s: eval_steps is %d; use 0 (end of each epoch) or a positive step count", src,
            o->eval_steps);
    REQUIRE(o->adapter >= SNUG_ADAPTER_NONE && o->adapter <= SNUG_ADAPTER_QLORA,
            "%s: adapter %d is unknown; use none, lora or qlora", src, (int)o->adapter);
    REQUIRE(!o->load_in_4bit || o->adapter,
            "%s: load_in_4bit stores a frozen base in 4 bits, which only adapters can train; set adapter: qlora", src);
    REQUIRE(!o->load_in_8bit || o->adapter,
            "%s: load_in_8bit stores a frozen base in 8 bits, which only adapters can train; set adapter: lora", src);
    REQUIRE(!o->load_in_8bit || !o->load_in_4bit,
            "%s: load_in_8bit and load_in_4bit are both true; the base is stored one way: set one of them false", src);
    REQUIRE(!o->load_in_8bit || o->adapter != SNUG_ADAPTER_QLORA,
            "%s: load_in_8bit with adapter: qlora; QLoRA's base is 4-bit: set adapter: lora for an 8-bit base (or "
            "load_in_8bit: false)", src);
    REQUIRE(o->lora_r >= 1 && o->lora_r <= 65536, "%s: lora_r is %d; it must be from 1 to 65536", src, o->lora_r);
    REQUIRE(o->lora_alpha >= 0, "%s: lora_alpha is %g; use a positive scale numerator (or 0 for lora_r)", src,
            o->lora_alpha);
    REQUIRE(o->lora_dropout >= 0 && o->lora_dropout < 1, "%s: lora_dropout is %g; it must be in [0, 1)", src,
            o->lora_dropout);
    REQUIRE(o->loraplus_lr_ratio >= 0 && o->loraplus_lr_ratio <= 1e6,
            "%s: loraplus_lr_ratio is %g; use a ratio above 0 (16 is usual) or 0 for none", src, o->loraplus_lr_ratio);
    REQUIRE(!o->loraplus_lr_ratio || o->adapter, "%s: loraplus_lr_ratio is set but adapter is none; LoRA+ steps an "
            "adapter's B faster than its A: add adapter: lora (or qlora)", src);
    REQUIRE(!o->lora_dora || o->adapter, "%s: peft_use_dora is true but adapter is none; DoRA is a kind of adapter: "
            "add adapter: lora (or qlora)", src);
    REQUIRE(o->adapter || !o->lora_model_dir[0],
            "%s: lora_model_dir is set but adapter is none; add adapter: lora to train the adapter", src);
    REQUIRE(!o->merge_lora || (o->adapter && o->base_model[0]),
            "%s: merge_lora needs adapter: lora and a base_model folder to merge into", src);
    return 0;
}

/* When to save and evaluate, and what evaluations drive: the plateau schedule, early stopping, the best
 * model; the variants of cosine. */
static int validate_save_eval(const snug_run_config *o, const char *src, snug_error *e) {
    REQUIRE(o->save_steps >= 0, "%s: save_steps is %d; use 0 (only at the end) or a positive step count", src,
            o->save_steps);
    static const char *const strategy[] = {"no", "steps", "epoch"};
    REQUIRE(o->save_strategy < 0 || o->save_strategy == 1 || (!o->save_steps && !o->saves_per_epoch),
            "%s: save_strategy %s and %s both say when to save; keep one", src,
            strategy[o->save_strategy < 0 ? 0 : o->save_strategy], o->save_steps ? "save_steps" : "saves_per_epoch");
    REQUIRE(o->eval_strategy < 0 || o->eval_strategy == 1 || (!o->eval_steps && !o->evals_per_epoch),
            "%s: eval_strategy %s and %s both say when to evaluate; keep one", src,
            strategy[o->eval_strategy < 0 ? 0 : o->eval_strategy], o->eval_steps ? "eval_steps" : "evals_per_epoch");
    /* reduce_lr_on_plateau is stepped by the evaluations (transformers requires an eval strategy for it) */
    REQUIRE(o->lr_scheduler != SNUG_SCHED_PLATEAU || (o->eval_strategy != 0 && (o->val_set_size > 0 ||
                                                                                 o->ntest_datasets > 0)),
            "%s: lr_scheduler reduce_lr_on_plateau lowers the learning rate when the validation loss stops improving, "
            "and the run %s; %s", src, o->eval_strategy == 0 ? "does not evaluate (eval_strategy: no)"
                                                              : "has no validation set",
            o->eval_strategy == 0 ? "remove eval_strategy: no" : "set val_set_size (e.g. 0.05) or test_datasets");
    REQUIRE(o->eval_strategy != 0 || (!o->early_stopping_patience && o->load_best_model_at_end != 1),
            "%s: eval_strategy no, and %s compares the validation losses of evaluations; remove one", src,
            o->early_stopping_patience ? "early_stopping_patience" : "load_best_model_at_end");
    REQUIRE(o->neftune_noise_alpha >= 0 && o->neftune_noise_alpha <= 1e6,
            "%s: neftune_noise_alpha is %g; use 0 (off) or a positive scale such as 5", src, o->neftune_noise_alpha);
    /* Axolotl's variants of cosine take effect with it alone (Axolotl ignores them otherwise: here they are refused) */
    REQUIRE(!o->sched.quadratic_warmup || (o->lr_scheduler == SNUG_SCHED_COSINE && !o->sched_min_lr &&
                                           o->cosine_min_lr_ratio == 0),
            "%s: lr_quadratic_warmup shapes lr_scheduler cosine's warmup, then decays to 0 (Axolotl ignores a floor "
            "beside it); set lr_scheduler: cosine without cosine_min_lr_ratio, or remove it", src);
    REQUIRE(o->sched.constant_ratio >= 0 && o->sched.constant_ratio <= 1,
            "%s: cosine_constant_lr_ratio is %g; use a fraction of the steps from 0 to 1", src,
            o->sched.constant_ratio);
    REQUIRE(!o->sched.constant_ratio || (o->lr_scheduler == SNUG_SCHED_COSINE && o->cosine_min_lr_ratio > 0 &&
                                         !o->sched.quadratic_warmup),
            "%s: cosine_constant_lr_ratio holds lr_scheduler cosine at its floor (cosine_min_lr_ratio) from that share "
            "of the steps on; set lr_scheduler: cosine and cosine_min_lr_ratio, without lr_quadratic_warmup", src);
    REQUIRE(o->cosine_min_lr_ratio >= 0 && o->cosine_min_lr_ratio <= 1,
            "%s: cosine_min_lr_ratio is %g; use a fraction of learning_rate from 0 to 1", src, o->cosine_min_lr_ratio);
    REQUIRE(o->evals_per_epoch >= 0 && !(o->evals_per_epoch && o->eval_steps),
            "%s: evals_per_epoch %d and eval_steps %d both say when to evaluate; keep one", src, o->evals_per_epoch,
            o->eval_steps);
    REQUIRE(o->saves_per_epoch >= 0 && !(o->saves_per_epoch && o->save_steps),
            "%s: saves_per_epoch %d and save_steps %d both say when to save; keep one", src, o->saves_per_epoch,
            o->save_steps);
    REQUIRE(o->early_stopping_patience >= 0 && o->early_stopping_threshold >= 0,
            "%s: early_stopping_patience is %d and early_stopping_threshold %g; use a patience of 0 (off) or more and "
            "a threshold of 0 or more", src, o->early_stopping_patience, o->early_stopping_threshold);
    REQUIRE(o->val_set_size > 0 || o->ntest_datasets > 0 ||
                (!o->early_stopping_patience && o->load_best_model_at_end != 1),
            "%s: %s compares validation losses, and the run has no validation set; set val_set_size (e.g. 0.05) or "
            "test_datasets", src,
            o->early_stopping_patience ? "early_stopping_patience" : "load_best_model_at_end");
    REQUIRE(o->load_best_model_at_end != 1 || snug_run_saves(o),
            "%s: load_best_model_at_end keeps the checkpoint with the lowest validation loss, and the run saves none "
            "before its end; set save_steps (or saves_per_epoch)", src);
    /* load_best_model_at_end takes the best checkpoint's model files: there must be some, as the end would save them
     * (ZeRO-1/2 checkpoints hold the whole model, but under 16-bit storage with the master copy sharded only the
     * 16-bit copy, where the end saves the fp32 master) */
    int sharded16 = o->zero_stage && (o->bf16 || o->fp16) && o->master_weights;
    REQUIRE(!snug_load_best(o) || (o->zero_stage < 3 && !sharded16 && o->tensor_parallel_size == 1 &&
                                   o->pipeline_parallel_size == 1),
            "%s: load_best_model_at_end with %s is not supported yet (%s); set load_best_model_at_end: false", src,
            o->zero_stage >= 3 ? "zero_stage 3" : sharded16 ? "ZeRO and a 16-bit run's master copy"
            : o->tensor_parallel_size > 1 ? "tensor_parallel_size" : "pipeline_parallel_size",
            sharded16 ? "the checkpoints keep the 16-bit copy of the model, and each rank its part of the fp32 master "
                        "copy the end saves" : "those checkpoints keep each rank's part, not the model");
    return 0;
}

/* The watchdog, threads, seeds, the sample, the memory budget, save_only_model and auto_fit. */
static int validate_run(const snug_run_config *o, const char *src, snug_error *e) {
    REQUIRE(o->loss_watchdog_threshold >= 0 && o->loss_watchdog_patience >= 1,
            "%s: loss_watchdog_threshold is %g and loss_watchdog_patience %d; use a threshold above 0 (0 = off) and "
            "a patience of at least 1 step", src, o->loss_watchdog_threshold, o->loss_watchdog_patience);
    REQUIRE(o->threads >= 0 && o->threads <= 1024, "%s: threads is %d; use 0 (all cores) or a count up to 1024", src,
            o->threads);
    REQUIRE(o->data_seed >= -1, "%s: data_seed is %d; use -1 (the same as seed) or a seed of 0 or more", src,
            o->data_seed);
    REQUIRE(o->sample_tokens >= 0, "%s: sample_tokens is %d; it must be 0 or more", src, o->sample_tokens);
    REQUIRE(o->temperature >= 0, "%s: temperature is %g; use 0 (greedy) or a positive value", src, o->temperature);
    REQUIRE(o->top_k >= 0, "%s: top_k is %d; use 0 (all tokens) or a positive count", src, o->top_k);
    REQUIRE(o->top_p > 0 && o->top_p <= 1, "%s: top_p is %g; it must be in (0, 1]", src, o->top_p);
    REQUIRE(o->memory_budget >= 0, "%s: memory_budget is negative; use a size such as 40GB, or 0 for no limit", src);
    REQUIRE(!o->save_only_model || (o->tensor_parallel_size <= 1 && o->pipeline_parallel_size <= 1 &&
                                     (o->zero_stage < 3 || o->adapter)),
            "%s: save_only_model with %s: each rank holds only its part of the weights, which only a full checkpoint "
            "keeps; set save_only_model: false", src, o->tensor_parallel_size > 1 ? "tensor_parallel_size"
                                                      : o->pipeline_parallel_size > 1 ? "pipeline_parallel_size"
                                                                                      : "zero_stage 3");
    REQUIRE(!o->auto_fit || !o->auto_find_batch_size,
            "%s: auto_fit and auto_find_batch_size are both true; auto_fit already chooses micro_batch_size (keeping "
            "the batch through accumulation) with the other levers: set one of them", src);
    REQUIRE(!o->auto_fit || o->memory_budget > 0,
            "%s: auto_fit is true but memory_budget is not set; add memory_budget: 40GB, the memory to fit", src);
    return 0;
}

int snug_run_config_validate(const snug_run_config *o, snug_error *e) {
    const char *src = o->config_path[0] ? o->config_path : "options";
    SNUG_TRY(validate_model_data(o, src, e));
    SNUG_TRY(validate_splits(o, src, e));
    SNUG_TRY(validate_optim(o, src, e));
    SNUG_TRY(validate_output_adapter(o, src, e));
    SNUG_TRY(validate_save_eval(o, src, e));
    SNUG_TRY(validate_run(o, src, e));
    return 0;
}

int snug_run_config_validate_train(const snug_run_config *o, snug_error *e) {
    SNUG_TRY(snug_run_config_validate(o, e));
    REQUIRE(o->fixed && o->nfixed > 0, "%s: the configuration lists no settings a resume must keep (fixed); start it "
            "from snug_options_defaults", o->config_path[0] ? o->config_path : "options");
    REQUIRE(o->ndatasets > 0, "%s: no training data; add 'datasets: [{path: data.jsonl}]' or --dataset data.jsonl",
            o->config_path[0] ? o->config_path : "options");
    return 0;
}


snug_levers snug_run_levers(const snug_run_config *c) {
    snug_levers lv = {.ckpt = SNUG_CKPT_NONE, .ckpt_every = c->gradient_checkpointing_every_n_layers,
                      .naive_attention = !c->flash_attention,
                      .xent_chunk = c->chunked_cross_entropy ? c->cross_entropy_chunk_tokens : 0,
                      .offload_embedding = c->offload_embedding,
                      .offload_params = c->offload_params,
                      .mlp_shards = !c->tiled_mlp ? 0 : c->tiled_mlp_num_shards > 0 ? c->tiled_mlp_num_shards : -1,
                      .optimizer_in_backward = c->optimizer_in_backward,
                      .dt = c->bf16 ? SNUG_DT_BF16 : c->fp16 ? SNUG_DT_F16 : SNUG_DT_F32,
                      .master_weights = c->master_weights, .ckpt_model_only = c->save_only_model};
    switch (c->gradient_checkpointing) {
    case SNUG_CKPT_CHOICE_SELECTIVE: lv.ckpt = SNUG_CKPT_SELECTIVE; break;
    case SNUG_CKPT_CHOICE_FULL: lv.ckpt = SNUG_CKPT_FULL; break;
    case SNUG_CKPT_CHOICE_OFFLOAD: lv.ckpt = SNUG_CKPT_FULL, lv.ckpt_offload = 1; break;
    case SNUG_CKPT_CHOICE_NONE: break;
    }
    return lv;
}

void snug_run_optimizer(snug_optimizer_choice o, snug_optim_kind *kind, int *paged) {
    *kind = o == SNUG_OPTIMIZER_ADAMW_8BIT || o == SNUG_OPTIMIZER_PAGED_ADAMW_8BIT ? SNUG_OPTIM_ADAMW_8BIT
                                                                                   : SNUG_OPTIM_ADAMW;
    *paged = o == SNUG_OPTIMIZER_PAGED_ADAMW_8BIT || o == SNUG_OPTIMIZER_PAGED_ADAMW_32BIT;
}

snug_optimizer_choice snug_run_optimizer_choice(snug_optim_kind kind, int paged) {
    if (kind == SNUG_OPTIM_ADAMW_8BIT)
        return paged ? SNUG_OPTIMIZER_PAGED_ADAMW_8BIT : SNUG_OPTIMIZER_ADAMW_8BIT;
    return paged ? SNUG_OPTIMIZER_PAGED_ADAMW_32BIT : SNUG_OPTIMIZER_ADAMW;
}

const char *const snug_sched_names[] = {"constant", "linear", "cosine", "constant_with_warmup",
                                        "cosine_with_restarts", "polynomial", "inverse_sqrt", "warmup_stable_decay",
                                        "reduce_lr_on_plateau", "cosine_warmup_with_min_lr", "rex", NULL};
_Static_assert(sizeof snug_sched_names / sizeof *snug_sched_names == SNUG_SCHED_REX + 2, "a name per snug_sched");

const char *snug_sched_name(snug_sched s) { return (unsigned)s <= SNUG_SCHED_REX ? snug_sched_names[s] : "?"; }

_Static_assert(SNUG_CKPT_CHOICE_NONE == 0 && SNUG_CKPT_CHOICE_SELECTIVE == 1 && SNUG_CKPT_CHOICE_FULL == 2 &&
                   SNUG_CKPT_CHOICE_OFFLOAD == 3, "snug_ckpt_names (plan_json.h) is indexed by snug_ckpt_choice");

const snug_dataset_spec *snug_run_dataset(const snug_run_config *c, int i, const char **key) {
    if (key)
        *key = i < c->ndatasets ? "datasets" : "test_datasets";
    return i < c->ndatasets ? &c->datasets[i] : &c->test_datasets[i - c->ndatasets];
}

int snug_run_saves(const snug_run_config *c) {
    return c->save_steps > 0 || c->saves_per_epoch > 0 || c->save_strategy == 2 || c->save_first_step;
}

int snug_load_best(const snug_run_config *c) {
    return c->load_best_model_at_end == 1 ||
           (c->load_best_model_at_end < 0 && c->early_stopping_patience > 0 && snug_run_saves(c));
}

int snug_warmup_steps(const snug_run_config *c, int total) {
    if (c->lr_scheduler == SNUG_SCHED_CONSTANT || c->lr_scheduler == SNUG_SCHED_PLATEAU) /* as transformers builds
                                                                                            * them: no warmup */
        return 0;
    return c->warmup_steps ? c->warmup_steps : (int)ceil(c->warmup_ratio * total);
}
