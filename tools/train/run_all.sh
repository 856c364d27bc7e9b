#!/usr/bin/env bash
# Rebuild models/velox-ref from the corpus: tokenizer, training, evaluation, statistics.
# Environment (all optional):
#   DATA         folder with train.txt.xz and val.txt.xz (default: .data at the repository root)
#   MODEL        output model folder (default: models/velox-ref)
#   RUN          folder for checkpoints, logs, eval output (default: runs/velox-ref)
#   STEPS        training steps (default 1600, the shipped recipe); 0 fits them to TIME_BUDGET
#   TIME_BUDGET  seconds of training when STEPS=0 (default 440); DEADLINE hard stop in seconds (default 0: none)
#   SEED         (default 1234); RESUME=1 continues from RUN/ckpt.pt
#   RETRAIN_TOKENIZER=1 trains the tokenizer even if MODEL/tokenizer.json exists
#   POST_TRAIN   a shell command run right after the model is saved
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
DATA=${DATA:-$ROOT/.data}
MODEL=${MODEL:-$ROOT/models/velox-ref}
RUN=${RUN:-$ROOT/runs/velox-ref}
STEPS=${STEPS:-1600}
TIME_BUDGET=${TIME_BUDGET:-440}
DEADLINE=${DEADLINE:-0}
SEED=${SEED:-1234}
T=tools/train
mkdir -p "$MODEL" "$RUN"
t0=$(date +%s)

if [ ! -f "$MODEL/tokenizer.json" ] || [ -n "${RETRAIN_TOKENIZER:-}" ]; then
  python3 $T/tokenizer.py train --data "$DATA" --out "$MODEL/tokenizer.json"
fi
if [ ! -f "$DATA/train.u16" ] || [ ! -f "$DATA/val.u16" ]; then
  python3 $T/tokenizer.py encode --data "$DATA" --tokenizer "$MODEL/tokenizer.json"
fi

args=(--data "$DATA" --out "$MODEL" --ckpt-dir "$RUN" --seed "$SEED" --steps "$STEPS"
      --time-budget "$TIME_BUDGET" --deadline "$DEADLINE")
[ -n "${RESUME:-}" ] && args+=(--resume)
python3 $T/train.py "${args[@]}"
cp "$RUN/train_log.txt" "$MODEL/train_log.txt"
if [ -n "${POST_TRAIN:-}" ]; then bash -c "$POST_TRAIN"; fi

python3 $T/eval.py --model "$MODEL" --data "$DATA" --seed "$SEED" --out "$MODEL/eval.json" --samples-md "$MODEL/SAMPLES.md"
python3 $T/stats.py --model "$MODEL" --data "$DATA" --out-json "$MODEL/stats.json" --out-md "$MODEL/STATS.md"
echo "run_all: done in $(( $(date +%s) - t0 )) s"
