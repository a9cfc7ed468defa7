#!/usr/bin/env bash
# The CUDA backend end to end against the CPU backend: `snug parity` (logits, loss, every parameter gradient, and the
# parameters after 3 AdamW steps) on three models, bf16 training with every lever on both devices, paged optimizers,
# activation offload, optimizer_in_backward, fp16 and QLoRA (its 4-bit base on the device and in host memory,
# offload_params) against the CPU within tolerances from a measured floor, and a
# GPT-2 124M step's tokens/s. Skipped (exit
# 77) when this snug has no CUDA backend or no GPU is visible; scripts/gpu-check.sh runs it on a GPU machine.
#
# `test_cuda_train.sh nccl` (ctest cli_test_cuda_train_nccl, gpu-check's nccl stage) runs only the NCCL communicator's
# part instead: at one rank, `ddp_backend: nccl` sends the step's gradients, loss and stop flag through NCCL's path
# (collectives of one rank, identities), so every run must give the losses and model.safetensors of the same run
# without it, bit for bit: fp32, deterministic with the signature check and a timeout, bf16, and accumulation with
# evaluation; and the header must say the ranks talk through nccl. With two GPUs or more and mpirun it also trains 2
# ranks through NCCL (DDP, deterministic DDP, ZeRO-1 and ZeRO-2: the same bits at 2 ranks; never run yet).
. "$(dirname "$0")/lib.sh"
PART=${1:-all}
. "$(dirname "$0")/losses.sh" # train, compare and worst (losses)
# SNUG_CUDA_EMU_DEVICES: a snug built on the emulated CUDA runtime (tests/cuda_emu), which shows that many devices
# and runs the kernels on the CPU: the same checks at the small models only, and no speed measurement
EMU=0
if [ -n "${SNUG_CUDA_EMU_DEVICES:-}" ]; then
  EMU=1
elif ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  skip "no NVIDIA GPU visible"
fi
python3 - "$W/data.jsonl" "$W/batch.safetensors" <<'PY'
import json, random, struct, sys
random.seed(5)
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jovial bakers".split()
with open(sys.argv[1], "w") as f:
    for i in range(300):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(random.randint(3, 50)))}) + "\n")
# a (2, 37) batch of ids below 2048 (every preset's vocabulary is at least that), labels shifted, some masked
B, T = 2, 37
ids = [random.randrange(2048) for _ in range(B * T)]
labels = [ids[i + 1] if (i + 1) % T and i % 5 else -100 for i in range(B * T)]
blobs = [struct.pack(f"<{B * T}q", *ids), struct.pack(f"<{B * T}q", *labels)]
hdr = {"input_ids": {"dtype": "I64", "shape": [B, T], "data_offsets": [0, len(blobs[0])]},
       "labels": {"dtype": "I64", "shape": [B, T], "data_offsets": [len(blobs[0]), len(blobs[0]) + len(blobs[1])]}}
h = json.dumps(hdr).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + blobs[0] + blobs[1])
PY
common="--dataset $W/data.jsonl --tokenizer $SRC/assets/tokenizer --sample_tokens 0 --val_set_size 0"
# The model and the length of the runs: tiny-llama for 20 steps (12 for NCCL's part) on a GPU; on the emulated
# runtime, whose kernels run as fibers on the CPU under the sanitizers, a Llama of the same kind a tenth of its size
# (width 96, 4 heads of 24 over 2 key-value heads, 2 layers, untied head) for 6 steps of 2 rows of 32 tokens: the
# same levers and comparisons, the tolerances from the same floor measured here at that size.
MODEL="--model_preset tiny-llama" STEPS=20 NCCL_STEPS=12 SEQ=64 MB=4
if [ $EMU = 1 ]; then
  python3 - "$W/micro" <<'PY'
import json, os, random, struct, sys
d = sys.argv[1]; os.makedirs(d, exist_ok=True)
C, I, L, NH, NKV, V = 96, 160, 2, 4, 2, 2048
HD = C // NH
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C, "intermediate_size": I,
           "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV, "vocab_size": V,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
           "tie_word_embeddings": False, "torch_dtype": "float32"}, open(f"{d}/config.json", "w"))
random.seed(3)
shapes = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,), "lm_head.weight": (V, C)}
for l in range(L):
    p = f"model.layers.{l}."
    shapes.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
                   p + "self_attn.q_proj.weight": (C, C), p + "self_attn.k_proj.weight": (NKV * HD, C),
                   p + "self_attn.v_proj.weight": (NKV * HD, C), p + "self_attn.o_proj.weight": (C, C),
                   p + "mlp.gate_proj.weight": (I, C), p + "mlp.up_proj.weight": (I, C),
                   p + "mlp.down_proj.weight": (C, I)})
hdr, blobs, off = {}, [], 0
for name, shape in shapes.items():
    n = 1
    for x in shape: n *= x
    vals = [1.0] * n if name.endswith("norm.weight") else [random.gauss(0.0, 0.02) for _ in range(n)]
    b = struct.pack(f"<{n}f", *vals)
    hdr[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b); off += len(b)
h = json.dumps(hdr).encode(); h += b" " * ((8 - len(h) % 8) % 8)
open(f"{d}/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
  MODEL="--base_model $W/micro" STEPS=6 NCCL_STEPS=6 SEQ=32 MB=2
fi
if ! "$SNUG" train $common $MODEL --max_steps 1 --device cuda --output_dir "$W/probe" > "$W/probe.log" 2>&1; then
  if grep -q "built without CUDA" "$W/probe.log"; then skip "snug built without CUDA"; fi
  if grep -q "no CUDA GPU" "$W/probe.log"; then # e.g. CUDA_VISIBLE_DEVICES= hides the GPUs nvidia-smi lists
    skip "$(grep -o 'no CUDA GPU[^(;]*' "$W/probe.log" | head -1)"; fi
  fatal "training on the GPU failed" "$W/probe.log"
fi

if [ "$PART" = nccl ]; then
  common="$common $MODEL --sequence_len $SEQ --max_steps $NCCL_STEPS --logging_steps 1 --learning_rate 1e-3 --seed 9 --device cuda"
  same() { # NAME REF: NAME's losses and weights are REF's, bit for bit, and NAME ran through NCCL
    compare "$1" "$2" 0
    if cmp -s "$W/$1/model.safetensors" "$W/$2/model.safetensors"; then ok; else bad "$1: model.safetensors differs from $2's"; fi
    if grep -q "data parallel .*(nccl," "$W/$1.log"; then ok; else bad "$1: the header does not say nccl"; fi
  }
  train nccl_base --micro_batch_size $MB
  train nccl_on --micro_batch_size $MB --ddp_backend nccl
  same nccl_on nccl_base
  train nccl_det --micro_batch_size $MB --ddp_backend nccl --ddp_deterministic true --dist_debug true --dist_timeout 60
  same nccl_det nccl_base
  train nccl_bf16_base --micro_batch_size $MB --bf16 true
  train nccl_bf16 --micro_batch_size $MB --bf16 true --ddp_backend nccl
  same nccl_bf16 nccl_bf16_base
  train nccl_ga_base --micro_batch_size 2 --gradient_accumulation_steps 2 --val_set_size 16 --eval_steps 4
  train nccl_ga --micro_batch_size 2 --gradient_accumulation_steps 2 --val_set_size 16 --eval_steps 4 --ddp_backend nccl
  same nccl_ga nccl_ga_base
  # ddp_backend: mpi at one rank needs no MPI (one process): the plain run, and no nccl in its header
  train nccl_mpi1 --micro_batch_size $MB --ddp_backend mpi
  compare nccl_mpi1 nccl_base 0
  # Several GPUs and mpirun (not a one-GPU machine): 2 ranks through NCCL, each on its own GPU. At 2 ranks every sum
  # is a + b whatever the order, so NCCL's all-reduce and the deterministic gather with the rank-order kernel give
  # the same bits, and deterministic ZeRO-1 and ZeRO-2 (no accumulation, no clipping) give DDP's bits, as on CPU ranks.
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  [ $EMU = 1 ] && ngpu=$SNUG_CUDA_EMU_DEVICES
  if [ "$ngpu" -ge 2 ] && command -v mpirun > /dev/null; then
    MPI=(mpirun --oversubscribe -np 2)
    [ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
    # Open MPI's own allocations, which LeakSanitizer reports at exit (as the CPU ranks' tests do: ranks.sh)
    [ "${SNUG_SANITIZED:-0}" = 1 ] && MPI=(env ASAN_OPTIONS=detect_leaks=0 "${MPI[@]}")
    real_snug=$SNUG
    printf '#!/bin/sh\nexec %s %q "$@"\n' "${MPI[*]}" "$real_snug" > "$W/snug2"
    chmod +x "$W/snug2"
    SNUG=$W/snug2 # train() runs "$SNUG" train ...: here under mpirun -np 2
    common="$common --max_grad_norm 0 --micro_batch_size 2"
    if train ddp2 && grep -q "data parallel        2 ranks (nccl," "$W/ddp2.log"; then
      ok
      train ddp2_det --ddp_deterministic true
      train zero1_det --ddp_deterministic true --zero_stage 1
      train zero2_det --ddp_deterministic true --zero_stage 2
      for r in ddp2 zero1_det zero2_det; do
        compare $r ddp2_det 0
        if cmp -s "$W/$r/model.safetensors" "$W/ddp2_det/model.safetensors"; then ok; else bad "$r: weights differ from ddp2_det's"; fi
      done
      # the step inside backward at ZeRO-1 (each layer summed, the rank's shard stepped, the layer gathered) and at
      # ZeRO-3 (each layer reduce-scattered, the rank's part stepped in place)
      train oib2_det --ddp_deterministic true --optimizer_in_backward true
      for z in 1 3; do
        train oib2_z$z --ddp_deterministic true --optimizer_in_backward true --zero_stage $z
        compare oib2_z$z oib2_det 0
        if cmp -s "$W/oib2_z$z/model.safetensors" "$W/oib2_det/model.safetensors"; then ok; else
          bad "oib2_z$z: weights differ from oib2_det's"; fi
      done
      # QLoRA at stage 3: the 4-bit spans all-gathered through NCCL (and, offloaded, copied in from host memory)
      train qlora2_det --ddp_deterministic true --adapter qlora --bf16 true
      train qlora2_z3 --ddp_deterministic true --adapter qlora --bf16 true --zero_stage 3
      train qlora2_z3_off --ddp_deterministic true --adapter qlora --bf16 true --zero_stage 3 --offload_params true
      for r in qlora2_z3 qlora2_z3_off; do
        compare $r qlora2_det 0
        if cmp -s "$W/$r/adapter_model.safetensors" "$W/qlora2_det/adapter_model.safetensors"; then ok; else
          bad "$r: the adapter differs from qlora2_det's"; fi
      done
      # tensor parallelism over the 2 GPUs (each block's sums through NCCL): its losses within 10 times the distance
      # between one process's GPU and CPU runs of the same steps (a rounding-level difference, measured here)
      SNUG=$real_snug train tp1_gpu
      SNUG=$real_snug train tp1_cpu --device cpu
      train tp2 --tensor_parallel_size 2
      if grep -q "tensor parallel      2 ranks (nccl," "$W/tp2.log"; then ok; else bad "tp2: not through NCCL"; fi
      compare tp2 tp1_gpu "$(python3 -c "print(10 * $(worst tp1_cpu tp1_gpu))")"
    else
      bad "2 GPU ranks through NCCL did not train: $(grep error "$W/ddp2.log" | head -2)"
    fi
    # 3 ranks, where the order of a sum matters ((a + b) + c): the deterministic collectives' rank-order sums give
    # deterministic ZeRO-2 and ZeRO-3 the bits of deterministic DDP
    if [ "$ngpu" -ge 3 ]; then
      MPI3=() prev=
      for a in "${MPI[@]}"; do [ "$prev" = -np ] && a=3; MPI3+=("$a"); prev=$a; done
      printf '#!/bin/sh\nexec %s %q "$@"\n' "${MPI3[*]}" "$real_snug" > "$W/snug3"
      chmod +x "$W/snug3"
      SNUG=$W/snug3
      if train ddp3_det --ddp_deterministic true && grep -q "data parallel        3 ranks (nccl," "$W/ddp3_det.log"; then
        ok
        for z in 2 3; do
          train zero${z}_det3 --ddp_deterministic true --zero_stage $z
          compare zero${z}_det3 ddp3_det 0
          if cmp -s "$W/zero${z}_det3/model.safetensors" "$W/ddp3_det/model.safetensors"; then ok; else
            bad "zero${z}_det3: weights differ from ddp3_det's"; fi
        done
      else
        bad "3 GPU ranks through NCCL did not train: $(grep error "$W/ddp3_det.log" | head -2)"
      fi
    fi
    SNUG=$real_snug
  else
    echo "  2 GPU ranks: not run ($ngpu GPU(s) visible$(command -v mpirun > /dev/null || echo ', no mpirun'))"
  fi
  TEST="test_cuda_train nccl"
  finish
fi

compare_tensors() { # A.safetensors B.safetensors TOL NAME: every tensor of A within TOL (max |a-b| / max |b|) of B's
  if python3 - "$@" <<'PY'
import json, struct, sys
def load(p):
    d = open(p, "rb").read(); n = struct.unpack("<Q", d[:8])[0]; h = json.loads(d[8:8 + n])
    return {k: struct.unpack(f"<{(v['data_offsets'][1] - v['data_offsets'][0]) // 4}f",
                             d[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items() if k != "__metadata__"}
a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
worst, where = 0.0, ""
for k in b:
    ref = max(abs(x) for x in b[k]) or 1.0
    err = max(abs(x - y) for x, y in zip(a[k], b[k])) / ref
    if err > worst: worst, where = err, k
print(f"  {sys.argv[4]:<28} {len(b)} tensors, worst {worst:.1e} ({where})")
sys.exit(0 if set(a) == set(b) and worst <= tol else 1)
PY
  then ok; else bad "$4: the GPU differs from the CPU"; fi
}

presets="tiny-llama llama-30m gpt2-124m"
[ $EMU = 1 ] && presets="micro" # $W/micro, written above
for preset in $presets; do
  [ "$preset" = micro ] || "$SNUG" train $common --model_preset $preset --max_steps 1 --device cpu \
    --output_dir "$W/$preset" > /dev/null 2>&1 || { bad "$preset model"; continue; }
  for dev in cpu cuda; do
    "$SNUG" parity "$W/$preset" "$W/batch.safetensors" "$W/$preset.$dev.safetensors" --steps 3 --lr 1e-3 \
      --max_grad_norm 1.0 --adam_epsilon 1e-6 --device $dev > "$W/$preset.$dev.log" 2>&1 \
      || bad "parity on $dev for $preset" "$W/$preset.$dev.log"
  done
  compare_tensors "$W/$preset.cuda.safetensors" "$W/$preset.cpu.safetensors" 1e-4 "parity $preset"
done

common="$common $MODEL --sequence_len $SEQ --max_steps $STEPS --logging_steps 1 --learning_rate 1e-3 --seed 9"
for dev in cpu cuda; do
  train fp32_$dev --device $dev --micro_batch_size $MB
  train bf16_levers_$dev --device $dev --micro_batch_size 2 --gradient_accumulation_steps 2 --sample_packing true \
    --bf16 true --gradient_checkpointing full --chunked_cross_entropy true --optimizer adamw_8bit
  train bf16_nomaster_$dev --device $dev --micro_batch_size $MB --bf16 true --master_weights false
done
compare fp32_cuda fp32_cpu 1e-4
compare bf16_levers_cuda bf16_levers_cpu 1e-2
compare bf16_nomaster_cuda bf16_nomaster_cpu 1e-2

# The levers whose GPU paths run asynchronous copies or steps inside backward: paged optimizer state, activation
# offload, optimizer_in_backward, and fp16 with its loss scaler, each on both devices. Their tolerance comes from a
# floor measured here: how far the CPU's own losses move when only the data order changes (data_seed). The GPU must
# stay 1000 times closer than that to the CPU in fp32, 10 times in 16 bits (every GEMM input rounded to 8 or 11
# bits). On the CPU the floor was 0.16 (tiny-llama, 20 steps), which makes 1.6e-4 and 1.6e-2: about the fixed 1e-4
# and 1e-2 of the runs above.
train fp32_seed2_cpu --device cpu --micro_batch_size $MB --data_seed 21
floor=$(worst fp32_seed2_cpu fp32_cpu)
tol32=$(python3 -c "print($floor / 1000)")
tol16=$(python3 -c "print($floor / 10)")
echo "  floor: another data order moves the CPU's losses by $floor; tolerances $tol32 (fp32), $tol16 (16-bit)"
if python3 -c "import sys; sys.exit(0 if 1e-3 <= $floor < float('inf') else 1)"; then ok; else
  bad "the floor $floor is too small to measure against (or a run failed)"; fi
for dev in cpu cuda; do
  train paged32_$dev --device $dev --micro_batch_size $MB --optimizer paged_adamw_32bit
  train paged8_$dev --device $dev --micro_batch_size $MB --optimizer paged_adamw_8bit
  train offload_$dev --device $dev --micro_batch_size $MB --gradient_checkpointing offload
  train bf16_offload_$dev --device $dev --micro_batch_size $MB --bf16 true --gradient_checkpointing offload
  train noclip_$dev --device $dev --micro_batch_size $MB --max_grad_norm 0
  train in_backward_$dev --device $dev --micro_batch_size $MB --max_grad_norm 0 --optimizer_in_backward true
  train paged32_in_backward_$dev --device $dev --micro_batch_size $MB --max_grad_norm 0 --optimizer paged_adamw_32bit \
    --optimizer_in_backward true
  train fp16_$dev --device $dev --micro_batch_size $MB --fp16 true
  train qlora_$dev --device $dev --micro_batch_size $MB --adapter qlora --bf16 true
  train qlora_offload_$dev --device $dev --micro_batch_size $MB --adapter qlora --bf16 true --offload_params true
  train dora_$dev --device $dev --micro_batch_size $MB --adapter lora --peft_use_dora true --lora_target_linear true \
    --lora_dropout 0.1
  train qdora_$dev --device $dev --micro_batch_size $MB --adapter qlora --peft_use_dora true --bf16 true
  train int8_$dev --device $dev --micro_batch_size $MB --adapter lora --load_in_8bit true
done
for r in paged32 paged8 offload noclip in_backward paged32_in_backward dora; do
  compare ${r}_cuda ${r}_cpu "$tol32"
done
for r in bf16_offload fp16 qlora qlora_offload qdora int8; do compare ${r}_cuda ${r}_cpu "$tol16"; done
# what the CPU holds bit for bit holds on the GPU too (one device, one order): the offloaded layer inputs come back
# as they left (the copies overlap compute, ordered by events), and stepping inside backward is the same step
compare offload_cuda fp32_cuda 0
compare in_backward_cuda noclip_cuda 0
# QLoRA's 4-bit base in pinned host memory, each layer's copied in on the side stream beside the compute
compare qlora_offload_cuda qlora_cuda 0

# GPT-2 124M on the GPU: tokens/s of its steps after the first, printed (a measurement, not a test)
[ $EMU = 1 ] && finish "emulated CUDA: no speed measured"
"$SNUG" train --dataset $W/data.jsonl --tokenizer $SRC/assets/tokenizer --sample_tokens 0 --val_set_size 0 \
  --model_preset gpt2-124m --device cuda --bf16 true --sequence_len 1024 --micro_batch_size $MB --max_steps 6 \
  --logging_steps 1 --sample_packing true --output_dir "$W/gpt2_speed" > "$W/gpt2_speed.log" 2>&1 &&
  python3 -c "
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][1:]
print(f'  GPT-2 124M, bf16, 4 x 1024 tokens: {sum(x[\"tokens_per_s\"] for x in r) / len(r):.0f} tokens/s (steps 2-{len(r) + 1})')
" "$W/gpt2_speed/metrics.jsonl" || echo "  GPT-2 124M speed: the run failed: $(tail -1 "$W/gpt2_speed.log")"
finish
