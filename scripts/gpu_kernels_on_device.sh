#!/usr/bin/env bash
# The fast path's kernels, the engine and the real server on the GPU machine: each mode is a list of jobs
# (below), one call under the 10-minute limit. Carry .whl (pygls and its dependencies: the machine has no
# registry). Each job writes NAME.log and its report to $OUT, and prints how it ended and its key lines.
#   bash scripts/gpu_kernels_on_device.sh MODE
#
# mode      jobs                                                                   about
# check     kernel_tests check profile_pass bench_gpu                              7 min
# verify    check bench_gpu                                                        5 min
# all       check bench_gpu server profile_pass                                    8 min
# tune      kernel_tests check moe_sweep bench_gpu profile_step                    7 min
# fp8       server server_fp8 bench_fp8                                            7 min
# host      sampler_tests profile_fill profile_fill_fp8 server_fp8                 6 min
# kernels   kernel_tests check moe_sweep bench_fp8                                 6 min
# fills     profile_fill profile_fill_fp8 server_fp8 server bench_gpu              7 min
# final     profile_fill profile_fill_fp8 moe bench_fp8 server_fp8 server bench_gpu_nocompile 6 min
# ar        kernel_tests moe_small profile_ar bench_gpu_nohf                       5 min
# dense     gemv_tests gemv profile_ar bench_gpu_nohf                              5 min: one-row products
# gemv      gemv_sweep                                                             2 min
# attention attention_sweep                                                        2 min
# step      kernel_tests attention_sweep dense_products bench_gpu_nohf profile_step  9 min: the step's next levers
# w8a8     moe_attention_tests moe_sweep bench_fp8_triton attention_sweep check  9 min: FP8 products, attention
# confirm_step moe_attention_tests bench_gpu server_fp8 server                 8 min: after the step's work
# fp8mma    moe_tests moe_sweep bench_fp8_triton attention_sweep                8 min: W8A8 on FP8 tensor cores
# explore   moe_tests moe_sweep profile_step_fp8                                 5 min: the down product's tiles
# confirm_fp8 moe_sweep bench_fp8_triton server_fp8 server                      5 min: then confirm_bf16
# confirm_bf16 bench_gpu profile_step_fp8                                        5 min
# verify_fp8 moe_tests server_fp8                                                2 min: the FP8 checks
# w8a8_tiles moe_tests moe_w8a8 bench_fp8_variants                               3 min: unpromoted, row scales
# confirm_rows moe_tests moe_w8a8 bench_fp8_triton server_fp8 profile_step_fp8  6 min: after w8a8_tiles
# verify_rows moe_tests check bench_fp8_triton server_fp8                     5 min: the session's last code
# dense_fp8 dense_products_fp8                                                   1 min: FP8 dense products?
# confirm_ar gemv_tests profile_ar server_fp8 bench_gpu                         8 min: after the AR work
# confirm   kernel_tests server_fp8 server bench_gpu                               5 min: a last run after changes
# bf16_first kernel_tests moe_bf16                                                5 min: bf16 experts, weights first
# glue_step bench_fp8_triton profile_step_fp8                                    5 min: then confirm_glue
# confirm_glue check bench_gpu server_fp8                                        8 min
# down_tiles moe_w8a8                                                            2 min: W8A8 tiles, wider down ones
# flex      attention_flex                                                       3 min: FlexAttention beside ours
# repeat_fp8 bench_fp8_variants                                  4 min: W8A8_VARIANTS='promote=0;promote=0': 3 runs
# server    server profile_fill                                                    4 min
set -uo pipefail
source scripts/device_env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
OUT=${OUT:-/tmp/out}

run() {  # name, seconds, command...: its output to $OUT/name.log, and a line saying how it ended
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - start)) s"
}

server_run() {  # name, extra arguments: the real server at the 26B shape
  local name=$1; shift
  run "$name" 150 python3 scripts/bench_gpu_server.py --requests 16 --blocks 1 "$@" --out "$OUT/$name.txt"
  grep -E "^==|round trip|engine  |engine path" "$OUT/$name.txt"
}

job() {
  case $1 in
    kernel_tests)  # every kernel's CUDA test against its reference
      run kernel_tests 240 python3 -m pytest -q -p no:cacheprovider tests/engine/model/test_triton_norm.py \
        tests/engine/model/test_triton_moe.py tests/engine/model/test_triton_attention.py \
        tests/engine/model/test_triton_gemv.py tests/engine/inference/test_triton_sampler.py -k "cuda or interval"
      tail -2 "$OUT/kernel_tests.log" ;;
    moe_attention_tests)  # the experts' (W8A8 included) and attention's CUDA tests
      run moe_attention_tests 420 python3 -m pytest -q -p no:cacheprovider tests/engine/model/test_triton_moe.py \
        tests/engine/model/test_triton_attention.py -k "cuda"
      tail -2 "$OUT/moe_attention_tests.log" ;;
    moe_tests)  # the experts' CUDA tests (W8A8 included)
      run moe_tests 240 python3 -m pytest -q -p no:cacheprovider tests/engine/model/test_triton_moe.py -k "cuda"
      tail -2 "$OUT/moe_tests.log" ;;
    gemv_tests)
      run gemv_tests 120 python3 -m pytest -q -p no:cacheprovider tests/engine/model/test_triton_gemv.py -k "cuda"
      tail -2 "$OUT/gemv_tests.log" ;;
    sampler_tests)
      run sampler_tests 120 python3 -m pytest -q -p no:cacheprovider tests/engine/inference/test_triton_sampler.py \
        -k "cuda"
      tail -2 "$OUT/sampler_tests.log" ;;
    check)  # the fp32 check: layer by layer against PyTorch's ops, the engine on both backends
      run check_fast_gpu 420 python3 scripts/check_fast_gpu.py --skip-hf --out "$OUT/check_fast_gpu.txt"
      tail -3 "$OUT/check_fast_gpu.log" ;;
    bench_gpu|bench_gpu_nocompile|bench_gpu_nohf)  # a 256-token step, AR decode, transformers' generate
      local extra=()
      [[ $1 == bench_gpu_nocompile ]] && extra=(--compile off)
      [[ $1 == bench_gpu_nohf ]] && extra=(--compile off --skip-hf)
      run "$1" 300 python3 scripts/bench_gpu.py "${extra[@]}" --out "$OUT/$1.txt"
      grep -E "^\| ours|^\| transformers|speed-up|PASSED|FAILED" "$OUT/$1.txt" ;;
    bench_fp8|bench_fp8_triton)  # the 256-token step with bf16 and FP8 experts (grouped, Triton W8A16 and W8A8)
      local extra=()
      [[ $1 == bench_fp8_triton ]] && extra=(--kernels triton_fp8,triton_w8a8)
      run "$1" 200 python3 scripts/bench_fp8.py "${extra[@]}" --out "$OUT/$1.txt"
      grep -E "ms/step|argmax" "$OUT/$1.txt" ;;
    bench_fp8_variants)  # the 256-token step with W8A8 experts on each tile variant of $W8A8_VARIANTS (';')
      local i=0 spec
      IFS=';' read -ra specs <<<"${W8A8_VARIANTS:-}"
      for spec in "" "${specs[@]}"; do
        run "bench_fp8_v$i" 150 python3 scripts/bench_fp8.py --kernels triton_w8a8 --w8a8-tiles "$spec" \
          --out "$OUT/bench_fp8_v$i.txt"
        echo "variant $i '$spec': $(grep -E "^triton_w8a8 \(" "$OUT/bench_fp8_v$i.txt")"
        i=$((i + 1))
      done ;;
    bench_bf16_variants)  # the 256-token step with bf16 experts on each tile variant of $BF16_VARIANTS (';')
      local i=0 spec
      IFS=';' read -ra specs <<<"${BF16_VARIANTS:-}"
      for spec in "" "${specs[@]}"; do
        run "bench_bf16_v$i" 150 python3 scripts/bench_fp8.py --kernels '' --bf16-tiles "$spec" \
          --out "$OUT/bench_bf16_v$i.txt"
        echo "variant $i '$spec': $(grep -E "^bf16 \(" "$OUT/bench_bf16_v$i.txt")"
        i=$((i + 1))
      done ;;
    moe_bf16)  # one layer's bf16 experts: the tile sweep, weights-first tiles included
      run moe_bf16 240 python3 scripts/bench_moe_gpu.py --sweep --tokens 32,256 --out "$OUT/moe_bf16.txt"
      grep -E "tokens:|best|wf" "$OUT/moe_bf16.txt" ;;
    moe|moe_sweep|moe_small|moe_w8a8)  # one layer's experts at the 26B shape, every kernel, against the floor
      local extra=(--tokens 32,64,256)
      [[ $1 == moe_w8a8 ]] && extra=(--sweep --w8a8-only --tokens 32,256)
      [[ $1 == moe_sweep ]] && extra=(--sweep --tokens 32,64,256)
      [[ $1 == moe_small ]] && extra=(--sweep --tokens 1,16,64)
      run "$1" 240 python3 scripts/bench_moe_gpu.py --fp8 "${extra[@]}" --out "$OUT/$1.txt"
      grep -E "tokens:|triton_fp8 \(|w8a8|W8A8's|best" "$OUT/$1.txt" ;;
    gemv|gemv_sweep)  # an AR token's dense products: the one-row kernel's tiles against cuBLAS
      local extra=()
      [[ $1 == gemv_sweep ]] && extra=(--sweep)
      run "$1" 300 python3 scripts/bench_gemv_gpu.py "${extra[@]}" --out "$OUT/$1.txt"
      grep -E "^[0-9]|cublas|default|best|shapes" "$OUT/$1.txt" ;;
    attention_flex)  # one layer's attention: the kernel's default tiles against FlexAttention (compiled)
      run attention_flex 300 python3 scripts/bench_attention_gpu.py --flex --out "$OUT/attention_flex.txt"
      grep -E "layer|default|flex|best" "$OUT/attention_flex.txt" ;;
    attention_sweep)  # one layer's attention in a pass, both layer kinds: the kernel's tiles against the floor
      run attention_sweep 150 python3 scripts/bench_attention_gpu.py --sweep --out "$OUT/attention_sweep.txt"
      grep -E "layer|default|best" "$OUT/attention_sweep.txt" ;;
    dense_products)  # a pass's dense products at 256 rows: cuBLAS against Triton's tuned GEMM templates
      run dense_products 300 python3 scripts/bench_dense_gpu.py --out "$OUT/bench_dense_gpu.txt"
      grep -E "rows|->" "$OUT/bench_dense_gpu.txt" ;;
    dense_products_fp8)  # the same products in FP8 (W8A8: quantize + cuBLASLt's row-scaled FP8 GEMM)
      run dense_products_fp8 200 python3 scripts/bench_dense_gpu.py --fp8 --rows 64,256 \
        --out "$OUT/bench_dense_gpu_fp8.txt"
      grep -E "rows|->" "$OUT/bench_dense_gpu_fp8.txt" ;;
    server) server_run bench_gpu_server ;;
    server_fp8) server_run bench_gpu_server_fp8 --experts fp8 ;;
    profile_fill|profile_fill_fp8)  # a typing fill at the engine against its passes alone; its host reads
      local extra=()
      [[ $1 == profile_fill_fp8 ]] && extra=(--experts fp8)
      run "$1" 150 python3 scripts/profile_fill_gpu.py "${extra[@]}" --out "$OUT/$1.txt"
      grep -E "^fill|with the|without|alone|host reads" "$OUT/$1.txt" ;;
    profile_pass)  # a single-line pass's kernels from graphs
      run profile_pass 150 python3 scripts/profile_gpu.py --canvas 32 --context 1152 --steps 8 --top 25 \
        --out "$OUT/profile_gpu_canvas32.txt"
      grep -E "kernels per step|summary" "$OUT/profile_gpu_canvas32.txt" ;;
    profile_step)  # a 256-token step's kernels
      run profile_step 150 python3 scripts/profile_gpu.py --top 30 --out "$OUT/profile_gpu_block.txt"
      grep -E "kernels per step|summary" "$OUT/profile_gpu_block.txt" ;;
    profile_step_fp8)  # a 256-token step's kernels with FP8 experts (the engine's FP8 kernel)
      run profile_step_fp8 150 python3 scripts/profile_gpu.py --fp8 --top 30 --out "$OUT/profile_gpu_block_fp8.txt"
      grep -E "kernels per step|summary" "$OUT/profile_gpu_block_fp8.txt" ;;
    profile_ar)  # an autoregressive token's kernels from graphs
      run profile_ar 150 python3 scripts/profile_gpu.py --ar 64 --top 20 --out "$OUT/profile_gpu_ar.txt"
      grep -E "kernels per token|summary" "$OUT/profile_gpu_ar.txt" ;;
    *) echo "unknown job $1"; return 2 ;;
  esac
}

case ${1:-check} in
  check) jobs=(kernel_tests check profile_pass bench_gpu) ;;
  verify) jobs=(check bench_gpu) ;;
  all) jobs=(check bench_gpu server profile_pass) ;;
  tune) jobs=(kernel_tests check moe_sweep bench_gpu profile_step) ;;
  fp8) jobs=(server server_fp8 bench_fp8) ;;
  host) jobs=(sampler_tests profile_fill profile_fill_fp8 server_fp8) ;;
  kernels) jobs=(kernel_tests check moe_sweep bench_fp8) ;;
  fills) jobs=(profile_fill profile_fill_fp8 server_fp8 server bench_gpu) ;;
  final) jobs=(profile_fill profile_fill_fp8 moe bench_fp8 server_fp8 server bench_gpu_nocompile) ;;
  ar) jobs=(kernel_tests moe_small profile_ar bench_gpu_nohf) ;;
  dense) jobs=(gemv_tests gemv profile_ar bench_gpu_nohf) ;;
  gemv) jobs=(gemv_sweep) ;;
  attention) jobs=(attention_sweep) ;;
  step) jobs=(kernel_tests attention_sweep dense_products bench_gpu_nohf profile_step) ;;
  w8a8) jobs=(moe_attention_tests moe_sweep bench_fp8_triton attention_sweep check) ;;
  confirm_step) jobs=(moe_attention_tests bench_gpu server_fp8 server) ;;
  fp8mma) jobs=(moe_tests moe_sweep bench_fp8_triton attention_sweep) ;;
  explore) jobs=(moe_tests moe_sweep profile_step_fp8) ;;
  confirm_fp8) jobs=(moe_sweep bench_fp8_triton server_fp8 server) ;;
  confirm_bf16) jobs=(bench_gpu profile_step_fp8) ;;
  verify_fp8) jobs=(moe_tests server_fp8) ;;
  w8a8_tiles) jobs=(moe_tests moe_w8a8 bench_fp8_variants) ;;
  confirm_rows) jobs=(moe_tests moe_w8a8 bench_fp8_triton server_fp8 profile_step_fp8) ;;
  verify_rows) jobs=(moe_tests check bench_fp8_triton server_fp8) ;;
  dense_fp8) jobs=(dense_products_fp8) ;;
  confirm_ar) jobs=(gemv_tests profile_ar server_fp8 bench_gpu) ;;
  confirm) jobs=(kernel_tests server_fp8 server bench_gpu) ;;
  bf16_first) jobs=(kernel_tests moe_bf16) ;;
  glue_step) jobs=(bench_fp8_triton profile_step_fp8) ;;
  confirm_glue) jobs=(check bench_gpu server_fp8) ;;
  down_tiles) jobs=(moe_w8a8) ;;
  flex) jobs=(attention_flex) ;;
  repeat_fp8) jobs=(bench_fp8_variants) ;;
  server) jobs=(server profile_fill) ;;
  *) echo "unknown mode ${1}: see the table at the top of $0"; exit 2 ;;
esac
for name in "${jobs[@]}"; do job "$name"; done
