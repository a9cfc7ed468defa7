#!/usr/bin/env bash
# The same few training steps with the activation levers off and on: the logged losses agree (bitwise for
# checkpointing, to fp32 rounding for the attention path, the chunked loss and the loss over blocks of the head's
# rows), and gradient accumulation over
# N micro-batches logs the loss of the whole batch.
. "$(dirname "$0")/lib.sh"
python3 - "$W/data.jsonl" <<'PY'
import json, random, sys
random.seed(1)
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jovial bakers".split()
with open(sys.argv[1], "w") as f:
    for i in range(400):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(random.randint(3, 40)))}) + "\n")
PY
common="--dataset $W/data.jsonl --tokenizer $SRC/assets/tokenizer --sequence_len 48 --max_steps 4 --sample_tokens 0
        --logging_steps 1 --learning_rate 1e-3 --lr_scheduler constant --seed 5"

. "$(dirname "$0")/losses.sh"

train base --micro_batch_size 4
train ckpt_full --micro_batch_size 4 --gradient_checkpointing full
train ckpt_selective --micro_batch_size 4 --gradient_checkpointing selective
train ckpt_every2 --micro_batch_size 4 --gradient_checkpointing full --gradient_checkpointing_every_n_layers 2
train ckpt_offload --micro_batch_size 4 --gradient_checkpointing offload
train naive_attention --micro_batch_size 4 --flash_attention false
train chunked_ce --micro_batch_size 4 --chunked_cross_entropy true --cross_entropy_chunk_tokens 37
train all_levers --micro_batch_size 4 --gradient_checkpointing full --flash_attention false --chunked_cross_entropy true
# the loss over blocks of the head's rows: 300 rows (7 blocks of the 2048, the last partial), and 7 rows with the
# token chunks of 37
train vocab_block --micro_batch_size 4 --loss_vocab_block 300
train vocab_block_chunked --micro_batch_size 4 --loss_vocab_block 7 --chunked_cross_entropy true \
  --cross_entropy_chunk_tokens 37
train accumulate --micro_batch_size 1 --gradient_accumulation_steps 4
# the optimizer step inside backward, where the two are defined to agree: no clipping, no accumulation
train noclip --micro_batch_size 4 --max_grad_norm 0
train in_backward --micro_batch_size 4 --max_grad_norm 0 --optimizer_in_backward true
train in_backward_8bit_ckpt --micro_batch_size 4 --max_grad_norm 0 --optimizer_in_backward true --optimizer adamw_8bit --gradient_checkpointing full
train noclip_8bit --micro_batch_size 4 --max_grad_norm 0 --optimizer adamw_8bit
# mixed precision: checkpointing still gives the same bits, and so does the step inside backward, with and without
# the fp32 master weights; all the levers together (packing, accumulation, checkpointing, chunked loss) in bf16 and
# fp16 stay close to the fp32 run without them
train bf16 --micro_batch_size 4 --bf16 true
train bf16_ckpt_full --micro_batch_size 4 --bf16 true --gradient_checkpointing full
train bf16_ckpt_selective --micro_batch_size 4 --bf16 true --gradient_checkpointing selective
train bf16_ckpt_every2 --micro_batch_size 4 --bf16 true --gradient_checkpointing full --gradient_checkpointing_every_n_layers 2
train bf16_ckpt_offload_every2 --micro_batch_size 4 --bf16 true --gradient_checkpointing offload \
  --gradient_checkpointing_every_n_layers 2
train bf16_noclip --micro_batch_size 4 --bf16 true --max_grad_norm 0
train bf16_in_backward --micro_batch_size 4 --bf16 true --max_grad_norm 0 --optimizer_in_backward true
train bf16_paged32_noclip --micro_batch_size 4 --bf16 true --max_grad_norm 0 --optimizer paged_adamw_32bit
train bf16_paged32_in_backward --micro_batch_size 4 --bf16 true --max_grad_norm 0 --optimizer paged_adamw_32bit \
  --optimizer_in_backward true
train paged8_in_backward --micro_batch_size 4 --max_grad_norm 0 --optimizer paged_adamw_8bit --optimizer_in_backward true
train bf16_nomaster_noclip --micro_batch_size 4 --bf16 true --master_weights false --max_grad_norm 0
train bf16_nomaster_in_backward --micro_batch_size 4 --bf16 true --master_weights false --max_grad_norm 0 \
  --optimizer_in_backward true --gradient_checkpointing selective
train packed_ga2 --micro_batch_size 2 --gradient_accumulation_steps 2 --sample_packing true
train bf16_vocab_block --micro_batch_size 4 --bf16 true --loss_vocab_block 300
train bf16_all_levers --micro_batch_size 2 --gradient_accumulation_steps 2 --sample_packing true --bf16 true \
  --gradient_checkpointing full --chunked_cross_entropy true --cross_entropy_chunk_tokens 37
train fp16_all_levers --micro_batch_size 2 --gradient_accumulation_steps 2 --sample_packing true --fp16 true \
  --gradient_checkpointing selective --chunked_cross_entropy true --cross_entropy_chunk_tokens 37
compare bf16_ckpt_full bf16 0
compare bf16_ckpt_selective bf16 0
compare bf16_ckpt_every2 bf16 0
compare bf16_ckpt_offload_every2 bf16 0
compare bf16_in_backward bf16_noclip 0
compare bf16_nomaster_in_backward bf16_nomaster_noclip 0
compare bf16_paged32_in_backward bf16_paged32_noclip 0
compare paged8_in_backward noclip_8bit 0
compare bf16 base 5e-3
compare bf16_all_levers packed_ga2 5e-3
compare fp16_all_levers packed_ga2 5e-3
compare ckpt_full base 0
compare ckpt_selective base 0
compare ckpt_every2 base 0
compare ckpt_offload base 0
compare naive_attention base 1e-5
compare chunked_ce base 1e-5
compare vocab_block base 1e-5
compare vocab_block_chunked base 1e-5
compare bf16_vocab_block bf16 5e-3
compare all_levers base 1e-5
compare accumulate base 1e-5
compare in_backward noclip 0
compare in_backward_8bit_ckpt noclip_8bit 0
# the gradient buffer shrinks to the global tensors plus one layer
if python3 - "$W/noclip/memory.json" "$W/in_backward/memory.json" <<'PY'
import json, sys
def grads(p):
    return json.load(open(p))["measured"]["gradients"]
a, b = grads(sys.argv[1]), grads(sys.argv[2])
print(f"  gradients: {a} B without, {b} B with optimizer_in_backward ({a / b:.1f}x smaller)")
sys.exit(0 if b * 2 < a else 1)
PY
then ok; else bad "optimizer_in_backward did not shrink the gradients"; fi
finish
