#!/usr/bin/env bash
# The fast path's kernels on the GPU machine, in two calls of one lease (each under the 10-minute limit):
#   bash scripts/gpu_kernels_on_device.sh check   # kernel tests on CUDA, check_fast_gpu, a typing pass's profile, bench_gpu
#   bash scripts/gpu_kernels_on_device.sh server  # the real server at the 26B shape, and a fill's profile at the engine
#   bash scripts/gpu_kernels_on_device.sh verify  # check_fast_gpu and bench_gpu alone
#   bash scripts/gpu_kernels_on_device.sh all     # all of it, in one call of about 8 minutes
#   bash scripts/gpu_kernels_on_device.sh tune    # kernel tests, the fp32 check, the experts' tile sweep (bf16
#                                                 # and FP8), bench_gpu and a 256-token step's profile (~7 min)
#   bash scripts/gpu_kernels_on_device.sh fp8     # the server with bf16 and FP8 experts, and bench_fp8 (~7 min)
#   bash scripts/gpu_kernels_on_device.sh host    # a typing fill's host work against its passes (bf16, FP8),
#                                                 # the sampler's CUDA tests and the server with FP8 (~6 min)
#   bash scripts/gpu_kernels_on_device.sh kernels # the experts' and sampler's CUDA tests, the fp32 check, the
#                                                 # experts' kernels (bf16 / FP8, tile sweep), bench_fp8 (~6 min)
#   bash scripts/gpu_kernels_on_device.sh fills   # profile_fill bf16 / FP8, the server bf16 / FP8, bench_gpu (~7 min)
#   bash scripts/gpu_kernels_on_device.sh final   # fills' host reads, experts, bench_fp8, the server, bench_gpu (~6 min)
#   bash scripts/gpu_kernels_on_device.sh ar      # experts at 1 / 16 tokens, an AR token's profile, bench_gpu (~5 min)
#   bash scripts/gpu_kernels_on_device.sh confirm # the sampler's and experts' CUDA tests, the server with FP8 and
#                                                 # bf16 experts, bench_gpu (~5 min): a last run after changes
# Carry .whl (pygls and its dependencies; the machine has no registry). Results go to $OUT.
set -uo pipefail
source scripts/device_env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PYTHONPATH
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
OUT=${OUT:-/tmp/out}
run() {  # name, seconds, command...: its output to $OUT/name.log, and a line saying how it ended
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - start)) s"
}
case ${1:-check} in
  check)
    run kernel_tests 240 python3 -m pytest -q -p no:cacheprovider tests/engine/model/test_triton_norm.py \
      tests/engine/model/test_triton_moe.py tests/engine/model/test_triton_attention.py -k "cuda or interval"
    tail -3 "$OUT/kernel_tests.log"
    run check_fast_gpu 180 python3 scripts/check_fast_gpu.py --skip-hf --out "$OUT/check_fast_gpu.txt"
    tail -3 "$OUT/check_fast_gpu.log"
    run profile_gpu 150 python3 scripts/profile_gpu.py --canvas 32 --context 1152 --steps 8 --top 25 \
      --out "$OUT/profile_gpu_canvas32.txt"
    grep -E "kernels per step|summary" "$OUT/profile_gpu_canvas32.txt"
    run bench_gpu 200 python3 scripts/bench_gpu.py --out "$OUT/bench_gpu.txt"
    tail -12 "$OUT/bench_gpu.txt"
    ;;
  verify)  # the correctness check, then the benchmark (which runs it again and exits 1 when it fails)
    run check_fast_gpu 200 python3 scripts/check_fast_gpu.py --skip-hf --out "$OUT/check_fast_gpu.txt"
    tail -3 "$OUT/check_fast_gpu.log"
    run bench_gpu 200 python3 scripts/bench_gpu.py --out "$OUT/bench_gpu.txt"
    tail -12 "$OUT/bench_gpu.txt"
    ;;
  all)  # everything once, in about 8 minutes of one call
    run check_fast_gpu 180 python3 scripts/check_fast_gpu.py --skip-hf --out "$OUT/check_fast_gpu.txt"
    tail -3 "$OUT/check_fast_gpu.log"
    run bench_gpu 130 python3 scripts/bench_gpu.py --out "$OUT/bench_gpu.txt"
    grep -E "^\| ours|^\| transformers|speed-up" "$OUT/bench_gpu.txt"
    run bench_gpu_server 150 python3 scripts/bench_gpu_server.py --requests 16 --blocks 1 \
      --out "$OUT/bench_gpu_server.txt"
    grep -E "^==|round trip|per decoder pass" "$OUT/bench_gpu_server.txt"
    run profile_gpu 70 python3 scripts/profile_gpu.py --canvas 32 --context 1152 --steps 8 --top 25 \
      --out "$OUT/profile_gpu_canvas32.txt"
    grep -E "kernels per step|summary" "$OUT/profile_gpu_canvas32.txt"
    ;;
  tune)
    run kernel_tests 200 python3 -m pytest -q -p no:cacheprovider tests/engine/model/test_triton_norm.py \
      tests/engine/model/test_triton_moe.py tests/engine/model/test_triton_attention.py \
      tests/engine/inference/test_triton_sampler.py -k "cuda or interval"
    tail -3 "$OUT/kernel_tests.log"
    run check_fast_gpu 180 python3 scripts/check_fast_gpu.py --skip-hf --out "$OUT/check_fast_gpu.txt"
    tail -3 "$OUT/check_fast_gpu.log"
    run bench_moe_gpu 150 python3 scripts/bench_moe_gpu.py --sweep --fp8 --tokens 32,64,256 \
      --out "$OUT/bench_moe_gpu.txt"
    grep -E "tokens:|best" "$OUT/bench_moe_gpu.txt"
    run bench_gpu 130 python3 scripts/bench_gpu.py --out "$OUT/bench_gpu.txt"
    grep -E "^\| ours|^\| transformers|speed-up" "$OUT/bench_gpu.txt"
    run profile_gpu 120 python3 scripts/profile_gpu.py --top 30 --out "$OUT/profile_gpu_block.txt"
    grep -E "kernels per step|summary" "$OUT/profile_gpu_block.txt"
    ;;
  fp8)
    run bench_gpu_server 200 python3 scripts/bench_gpu_server.py --requests 16 --blocks 1 \
      --out "$OUT/bench_gpu_server.txt"
    grep -E "^==|round trip|per decoder pass|engine path" "$OUT/bench_gpu_server.txt"
    run bench_gpu_server_fp8 200 python3 scripts/bench_gpu_server.py --requests 16 --blocks 1 --experts fp8 \
      --out "$OUT/bench_gpu_server_fp8.txt"
    grep -E "^==|round trip|per decoder pass|engine path" "$OUT/bench_gpu_server_fp8.txt"
    run bench_fp8 150 python3 scripts/bench_fp8.py --out "$OUT/bench_fp8.txt"
    grep -E "ms/step|summary" "$OUT/bench_fp8.txt"
    ;;
  confirm)
    run kernel_tests 120 python3 -m pytest -q -p no:cacheprovider tests/engine/inference/test_triton_sampler.py \
      tests/engine/model/test_triton_moe.py tests/engine/model/test_triton_compile.py -k "cuda or compile"
    tail -2 "$OUT/kernel_tests.log"
    run bench_gpu_server_fp8 100 python3 scripts/bench_gpu_server.py --requests 16 --blocks 1 --experts fp8 \
      --out "$OUT/bench_gpu_server_fp8.txt"
    grep -E "^==|round trip|engine path" "$OUT/bench_gpu_server_fp8.txt"
    run bench_gpu_server 100 python3 scripts/bench_gpu_server.py --requests 16 --blocks 1 \
      --out "$OUT/bench_gpu_server.txt"
    grep -E "^==|round trip" "$OUT/bench_gpu_server.txt"
    run bench_gpu 130 python3 scripts/bench_gpu.py --out "$OUT/bench_gpu.txt"
    grep -E "^\| ours|^\| transformers|speed-up|PASSED|FAILED" "$OUT/bench_gpu.txt"
    ;;
  host)  # where a typing fill's time goes besides its passes, bf16 and FP8 experts, and the server (~6 min)
    run kernel_tests 120 python3 -m pytest -q -p no:cacheprovider tests/engine/inference/test_triton_sampler.py \
      -k "cuda"
    tail -2 "$OUT/kernel_tests.log"
    run profile_fill 150 python3 scripts/profile_fill_gpu.py --out "$OUT/profile_fill.txt"
    grep -E "^fill|^  " "$OUT/profile_fill.txt" | head -20
    run profile_fill_fp8 150 python3 scripts/profile_fill_gpu.py --experts fp8 --out "$OUT/profile_fill_fp8.txt"
    grep -E "^fill|^  " "$OUT/profile_fill_fp8.txt" | head -20
    run bench_gpu_server_fp8 150 python3 scripts/bench_gpu_server.py --requests 16 --blocks 1 --experts fp8 \
      --out "$OUT/bench_gpu_server_fp8.txt"
    grep -E "^==|round trip|engine  |per decoder pass" "$OUT/bench_gpu_server_fp8.txt"
    ;;
  kernels)  # the experts' and sampler's CUDA tests, the fp32 check (the engine on both backends), the experts'
            # kernels at the 26B shape (bf16 / FP8, tile sweep) and the FP8 256-token step (~6 min)
    run kernel_tests 150 python3 -m pytest -q -p no:cacheprovider tests/engine/inference/test_triton_sampler.py \
      tests/engine/model/test_triton_moe.py -k "cuda"
    tail -2 "$OUT/kernel_tests.log"
    run check_fast_gpu 180 python3 scripts/check_fast_gpu.py --skip-hf --out "$OUT/check_fast_gpu.txt"
    tail -3 "$OUT/check_fast_gpu.log"
    run bench_moe_gpu 150 python3 scripts/bench_moe_gpu.py --sweep --fp8 --tokens 32,64,256 \
      --out "$OUT/bench_moe_gpu.txt"
    grep -E "tokens:|triton_fp8 \(|bf16 products|best" "$OUT/bench_moe_gpu.txt"
    run bench_fp8 120 python3 scripts/bench_fp8.py --out "$OUT/bench_fp8.txt"
    grep -E "ms/step|summary" "$OUT/bench_fp8.txt"
    ;;
  fills)  # a typing fill's host work against its passes, the server with bf16 and FP8 experts, bench_gpu (~7 min)
    run profile_fill 120 python3 scripts/profile_fill_gpu.py --out "$OUT/profile_fill.txt"
    grep -E "^fill|with the|without|alone" "$OUT/profile_fill.txt"
    run profile_fill_fp8 100 python3 scripts/profile_fill_gpu.py --experts fp8 --out "$OUT/profile_fill_fp8.txt"
    grep -E "^fill|with the|without|alone" "$OUT/profile_fill_fp8.txt"
    run bench_gpu_server_fp8 120 python3 scripts/bench_gpu_server.py --requests 16 --blocks 1 --experts fp8 \
      --out "$OUT/bench_gpu_server_fp8.txt"
    grep -E "^==|round trip|engine path" "$OUT/bench_gpu_server_fp8.txt"
    run bench_gpu_server 120 python3 scripts/bench_gpu_server.py --requests 16 --blocks 1 \
      --out "$OUT/bench_gpu_server.txt"
    grep -E "^==|round trip" "$OUT/bench_gpu_server.txt"
    run bench_gpu 130 python3 scripts/bench_gpu.py --out "$OUT/bench_gpu.txt"
    grep -E "^\| ours|^\| transformers|speed-up|PASSED|FAILED" "$OUT/bench_gpu.txt"
    ;;
  final)  # a fill's host reads and time beyond its passes, the experts' kernels, bench_fp8, the server with FP8
          # and bf16 experts, bench_gpu without the compiled run (~6 min)
    run profile_fill 120 python3 scripts/profile_fill_gpu.py --out "$OUT/profile_fill.txt"
    grep -E "^fill|with the|without|alone|host reads" "$OUT/profile_fill.txt"
    run profile_fill_fp8 100 python3 scripts/profile_fill_gpu.py --experts fp8 --out "$OUT/profile_fill_fp8.txt"
    grep -E "^fill|with the|without|alone" "$OUT/profile_fill_fp8.txt"
    run bench_moe_gpu 100 python3 scripts/bench_moe_gpu.py --fp8 --tokens 32,64,256 --out "$OUT/bench_moe_gpu.txt"
    grep -E "tokens:|triton_fp8 \(|bf16 products|best" "$OUT/bench_moe_gpu.txt"
    run bench_fp8 120 python3 scripts/bench_fp8.py --out "$OUT/bench_fp8.txt"
    grep -E "ms/step" "$OUT/bench_fp8.txt"
    run bench_gpu_server_fp8 120 python3 scripts/bench_gpu_server.py --requests 16 --blocks 1 --experts fp8 \
      --out "$OUT/bench_gpu_server_fp8.txt"
    grep -E "^==|round trip|engine  " "$OUT/bench_gpu_server_fp8.txt"
    run bench_gpu_server 120 python3 scripts/bench_gpu_server.py --requests 16 --blocks 1 \
      --out "$OUT/bench_gpu_server.txt"
    grep -E "^==|round trip|engine  " "$OUT/bench_gpu_server.txt"
    run bench_gpu 130 python3 scripts/bench_gpu.py --compile off --out "$OUT/bench_gpu.txt"
    grep -E "^\| ours|^\| transformers|speed-up|PASSED|FAILED" "$OUT/bench_gpu.txt"
    ;;
  ar)  # the experts' compact grid and pair sum (decision 118): kernel tests, one layer at 1 and 16 tokens (tile
       # sweep), an AR token's profile, bench_gpu without transformers (~5 min on a warm machine)
    run kernel_tests 150 python3 -m pytest -q -p no:cacheprovider tests/engine/model/test_triton_moe.py -k "cuda"
    tail -2 "$OUT/kernel_tests.log"
    run bench_moe_gpu 120 python3 scripts/bench_moe_gpu.py --sweep --fp8 --tokens 1,16,64 \
      --out "$OUT/bench_moe_gpu.txt"
    grep -E "tokens:|best" "$OUT/bench_moe_gpu.txt"
    run profile_ar 150 python3 scripts/profile_gpu.py --ar 64 --top 20 --out "$OUT/profile_gpu_ar.txt"
    grep -E "kernels per token|summary" "$OUT/profile_gpu_ar.txt"
    run bench_gpu 240 python3 scripts/bench_gpu.py --skip-hf --compile off --out "$OUT/bench_gpu.txt"
    grep -E "^\| ours|PASSED|FAILED" "$OUT/bench_gpu.txt"
    ;;
  server)
    run bench_gpu_server 420 python3 scripts/bench_gpu_server.py --requests 16 --blocks 1 \
      --out "$OUT/bench_gpu_server.txt"
    tail -20 "$OUT/bench_gpu_server.txt"
    run profile_fill 120 python3 scripts/profile_fill_gpu.py --out "$OUT/profile_fill.txt"
    tail -15 "$OUT/profile_fill.txt"
    ;;
esac
