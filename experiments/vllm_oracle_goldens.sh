#!/usr/bin/env bash
# Regenerate tests/data/vllm_oracle: each scenario (hand-written YAML or a trace slice) exported
# with kvsim's environment, then replayed through vLLM's KVCacheManager in VLLM_PY's (a scratch
# virtual environment outside the repository: experiments/vllm_oracle.py says how to make it),
# at block sizes 16 and 32, in a pool that never evicts and one that thrashes.
# Usage: VLLM_PY=/tmp/vllm-venv/bin/python bash experiments/vllm_oracle_goldens.sh
set -euo pipefail
cd "$(dirname "$0")/.."
KV=${KVSIM_PY:-.venv/bin/python}
VLLM_PY=${VLLM_PY:-/tmp/vllm-venv/bin/python}
D=tests/data/vllm_oracle
ORACLE=experiments/vllm_oracle.py
for s in chat_turns partial_block_front fully_cached thrash; do
  "$KV" "$ORACLE" export --requests "$D/$s.yaml" --out "$D/$s.scen.json"
done
"$KV" "$ORACLE" export --trace mooncake_conversation_10min --max-requests 300 --out "$D/mooncake300.scen.json"
"$KV" "$ORACLE" export --trace synthetic_multiturn --override trace.num_sessions=8 --out "$D/multiturn8.scen.json"
"$KV" "$ORACLE" export --trace weka_agentic_slice --max-requests 12 --out "$D/weka12.scen.json"
# scenario  block_size  pool that never evicts  pool that thrashes  (extra replay flags)
while read -r s b big small flags; do
  for n in "$big" "$small"; do
    "$VLLM_PY" "$ORACLE" replay "$D/$s.scen.json" --block-size "$b" --num-blocks "$n" $flags \
      --out "$D/${s}_b${b}_n${n}.json"
  done
done <<'LIST'
chat_turns 16 1000 20
chat_turns 32 1000 10
partial_block_front 16 1000 5
partial_block_front 32 1000 3
fully_cached 16 1000 5
fully_cached 32 1000 3
thrash 16 1000 9
thrash 32 1000 5
mooncake300 16 300000 20000 --no-blocks
mooncake300 32 150000 10000 --no-blocks
multiturn8 16 13000 1000 --no-blocks
multiturn8 32 7000 500 --no-blocks
weka12 16 24000 3000 --no-blocks
weka12 32 12000 1500 --no-blocks
LIST
# the whole Mooncake conversation trace (shared traces), 20,000 usable 16-token blocks: hits only
MC=${KVSIM_TRACES_DIR:-../shared/traces}/mooncake/conversation_trace.jsonl
if [ -f "$MC" ]; then
  T=$(mktemp -d)
  "$KV" "$ORACLE" export --trace mooncake_conversation --out "$T/mc.scen.json"
  "$VLLM_PY" "$ORACLE" replay "$T/mc.scen.json" --block-size 16 --num-blocks 20000 --no-blocks \
    --out "$T/mc.json"
  "$KV" "$ORACLE" hits "$T/mc.json" --out "$D/mooncake_conversation_b16_n20000.hits.json"
  rm -r "$T"
fi
