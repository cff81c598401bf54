#!/usr/bin/env bash
# The GSM8K search study on a GPU (studies/search_gsm8k/README.md, "The same study on a GPU"): the CPU study's design, with the policy
# sampled by transformers `generate` on the GPU, and both PRMs trained and scored there.
#   studies/search_gsm8k/study_gpu.sh
# A machine without the data folder trains on the trajectories that another one wrote
# (studies/search_gsm8k/prms.py --save-train FILE): set TRAIN=FILE. Rerun to go on: trained PRMs are kept, and the
# search resumes at its first unfinished question.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3} RUN=${RUN:-runs/search/gsm8k-study-gpu} PRM=${PRM:-runs/prm-gpu}

[ -f $PRM/bi/config.json ] || $PY -m studies.search_gsm8k.prms --out $PRM ${TRAIN:+--train $TRAIN}
mkdir -p $RUN; hashes=$(cd $PRM && sha256sum l2r/model.safetensors bi/model.safetensors)
if [ -f $RUN/prm.sha256 ] && [ "$hashes" != "$(cat $RUN/prm.sha256)" ]; then  # keep the record of who scored the first rows
  echo "WARNING: these PRMs differ from those in $RUN/prm.sha256" >&2; echo "$hashes" > $RUN/prm.sha256.differs
else
  echo "$hashes" > $RUN/prm.sha256
fi
$PY -m biprm.cli search --out $RUN --data gsm8k --limit 200 --policy hf --policy-model smollm2-135m --policy-batch-size 512 \
  --prm $PRM/l2r $PRM/bi --algorithms bon --n 4 8 16 --strategies fused l2r --max-depth 10 --max-step-tokens 128 \
  --pool-draw whole --batch-questions 32 --show-progress false -v
