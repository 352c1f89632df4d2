#!/usr/bin/env bash
# Speculative decoding through the whole stack, beside vLLM's CPU build, in one sitting: Conveyor
# --speculate 0 and 4, vLLM without and with n-gram speculation, all four live at once, legs
# interleaved (Conveyor off, on, vLLM off, on) x ROUNDS, `conveyor bench --workload copy` on
# /v1/chat/completions. vLLM from PEERS/serve-vllm.sh (setup-vllm.sh installs it; default
# ../shared/peers). Figures: docs/engine.md, "Speculative decoding".
#     ROUNDS=3 NUM=3 bash benchmarks/speculative_sitting.sh
set -u
cd "$(dirname "$0")/.."
MODEL=$(.venv/bin/python -c "from conveyor.engine.loader import resolve_model; print(resolve_model(None).path)")
ROUNDS=${ROUNDS:-3}; CONC=${CONC:-1}; NUM=${NUM:-4}; OUT=${OUT:-128}
LOG=${LOG:-/tmp/speculative_sitting}; rm -rf $LOG; mkdir -p $LOG
export OMP_NUM_THREADS=2
for k in 0 4; do
  port=$((8080 + k))
  CONVEYOR_KV_CACHE_MEMORY=1GiB CONVEYOR_WORKER_METRICS_PORT=91${k}0 CONVEYOR_WEBHOOK_METRICS_PORT=92${k}0 \
    .venv/bin/conveyor serve --port $port --data-dir $LOG/c$k --allow-unauthenticated \
    --speculate $k --no-enable-prefix-caching > $LOG/c$k.log 2>&1 &
done
KV_GIB=1 MODEL=$MODEL PORT=8100 bash ${PEERS:-../shared/peers}/serve-vllm.sh --no-enable-prefix-caching > $LOG/v0.log 2>&1 &
KV_GIB=1 MODEL=$MODEL PORT=8101 bash ${PEERS:-../shared/peers}/serve-vllm.sh --no-enable-prefix-caching \
  --speculative-config '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3,"prompt_lookup_min":1}' \
  > $LOG/v4.log 2>&1 &
for url in http://127.0.0.1:8080/health http://127.0.0.1:8084/health http://127.0.0.1:8100/health http://127.0.0.1:8101/health; do
  for i in $(seq 600); do curl -sf $url > /dev/null && break; sleep 1; done
  echo "ready: $url $(date +%T)"
done
leg() {  # name url model round
  .venv/bin/conveyor bench --base-url $2 --model $3 --backend chat --workload copy --num-prompts $NUM \
    --max-concurrency $CONC --input-len 192 --output-len $OUT --ignore-eos --seed $4 --no-progress \
    --result-json $LOG/$1-$4.json > $LOG/$1-$4.txt 2>&1
  echo "$1 round $4: $(grep -E 'output token throughput|^TPOT' $LOG/$1-$4.txt | tr -s ' ' | paste -sd ';')"
}
for r in $(seq $ROUNDS); do
  leg c-off http://127.0.0.1:8080 default $r
  leg c-on http://127.0.0.1:8084 default $r
  leg v-off http://127.0.0.1:8100 smollm2-135m $r
  leg v-on http://127.0.0.1:8101 smollm2-135m $r
done
curl -s http://127.0.0.1:8101/metrics | grep -E "^vllm:spec_decode_num_(draft|accepted)_tokens_total" 
curl -s http://127.0.0.1:9140/metrics | grep -E "^conveyor_spec_decode_num_(draft|accepted)_tokens_total"
pkill -f "conveyor serve"; pkill -f "vllm serve"
