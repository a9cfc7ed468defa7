"""Causal attention in PyTorch on a CUDA GPU: torch.nn.functional.scaled_dot_product_attention (is_causal=True) in
bf16 and fp32, forward and forward + backward, on the shapes of bench/gpu/bench_attention_gpu.c, printed in its
format so that scripts/gpu-check.sh can put the two side by side.

FLOPs count the causal half: forward 4*B*NH*T*T*HD/2, backward 2.5 times that (forward + backward 3.5 times).
PyTorch picks its own kernel (FlashAttention-2 or cuDNN for bf16; memory-efficient or math for fp32). TF32 is off,
so fp32 is fp32 as in snug.

    python3 bench/gpu/bench_attention_torch.py [--max_T 8192] [--dtypes bf16,fp32]
"""
import argparse
import sys

HEADS = [(32, 64), (16, 128)]          # (NH, HD) of a 2048-wide model
SHAPES = [(1024, 4), (2048, 4), (4096, 2), (8192, 1)]  # (T, B)


def time_ms(fn, reps):
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max_T", type=int, default=8192)
    ap.add_argument("--dtypes", default="bf16,fp32")
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"bench_attention_torch: PyTorch is not importable: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_attention_torch: torch sees no CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, as in snug
    torch.backends.cudnn.allow_tf32 = False
    print(f"# torch {torch.__version__} SDPA on {torch.cuda.get_device_name(0)}; causal; TFLOP/s count the causal half")
    for name in a.dtypes.split(","):
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[name]
        for NH, HD in HEADS:
            for T, B in SHAPES:
                if T > a.max_T:
                    continue
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v = (torch.rand(B, NH, T, HD, device="cuda", dtype=dtype, generator=g).mul_(2).sub_(1)
                           .requires_grad_(True) for _ in range(3))
                dout = torch.rand(B, NH, T, HD, device="cuda", dtype=dtype, generator=g)

                def fwd():
                    with torch.no_grad():
                        F.scaled_dot_product_attention(q, k, v, is_causal=True)

                def fwdbwd():
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    torch.autograd.grad(o, (q, k, v), dout)

                try:
                    fwd(), fwdbwd()  # warm-up: kernel selection and loading
                    torch.cuda.synchronize()
                    reps = 10 if T <= 2048 else 3
                    f_ms, fb_ms = time_ms(fwd, reps), time_ms(fwdbwd, reps)
                except torch.cuda.OutOfMemoryError:
                    print(f"# torch-sdpa-{name} B={B} T={T} NH={NH} HD={HD}: out of memory")
                    torch.cuda.empty_cache()
                    continue
                flops = 4.0 * B * NH * T * T * HD / 2
                print(f"attn impl=torch-sdpa-{name} B={B} T={T} NH={NH} HD={HD} fwd_ms={f_ms:.3f} "
                      f"fwd_tflops={flops / f_ms * 1e-9:.2f} fwdbwd_ms={fb_ms:.3f} "
                      f"fwdbwd_tflops={3.5 * flops / fb_ms * 1e-9:.2f}", flush=True)
                del q, k, v, dout
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
