#!/usr/bin/env bash
# The GPU paths, checked and measured in one short run on a node with a GPU:
#
#     OUT=<dir> [PY=.venv/bin/python] [PARTS="env learning"] bash scripts/gpu_checks.sh [seconds, default 540]
#
# PARTS names the parts to run (default: all of them): a lease that already has the other parts'
# figures can give the learning loop nearly all of its time. SCORE_DEVICE=cpu tries the script
# on a machine without a GPU.
#
# Parts, in order, each bounded by `timeout`:
#   env       torch, CUDA and the GPU as torch sees them
#   train     bench_train.py --device cuda on the GPU profile's net (96x8, batch 1024): the
#             trainer's step loop (DDP on NCCL) against a bare loop, and the real trainer under
#             the launcher's torchrun, one rank per GPU
#   grpo      bench_grpo.py --device cuda --backend fsdp: the language-model GRPO loop with FSDP2
#             on NCCL (one rank per GPU)
#   selfplay  bench_selfplay.py on the 96x8 net, its leaves evaluated on the GPU by the array search
#             (app/games/search/search_forest.py), then 12 search processes sharing one network server on the
#             GPU (selfplay.shared_network: its evaluations/s over the GPU's ceiling at its batch),
#             then the search on one core
#   gauntlet  bench_gauntlet.py on the GPU: a 20-game match of two 96x8 nets at 64 simulations,
#             one game at a time against one lock-step wave (the GPU profile's gauntlet)
#   learning  bench_learning.py --config configs/gpu.yaml --daemons configs/gpu_daemons.yaml for
#             what is left of the budget, every promoted model scored on the GPU (raw network and
#             MCTS-400, one scoring process a model, all at once after the loop)
# Each part's JSON goes to $OUT/results.jsonl as one line {"part", "rc", "seconds", "result"};
# everything printed goes to $OUT/run.log; the learning curve and the last model beside them.
#
# A node without this project's venv (such as a lent machine with its own python3 and torch)
# may carry the missing packages as wheels in .whl: they are installed to /tmp/site first.
# The search needs numba (and its llvmlite): `pip download numba --only-binary :all: -d .whl` here
# brings both; its kernel compiles on the first search there (~15 s, then cached).
set -u
budget=${1:-540}
start=$(date +%s)
: "${OUT:?set OUT to the folder that receives the results}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
PY=${PY:-python3}
if [ -d .whl ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
positions=${POSITIONS:-}
[ -z "$positions" ] && [ -f .devdata/move_scores.txt ] && positions=.devdata/move_scores.txt

elapsed() { echo $(( $(date +%s) - start )); }
PARTS=${PARTS:-env train grpo selfplay_cuda selfplay_cpu gauntlet learning}
wanted() { [[ " $PARTS " == *" $1 "* ]]; }

part() {  # part NAME LIMIT_S COMMAND...: run it, keep its last stdout line (its JSON) in results.jsonl
  local name=$1 limit=$2; shift 2
  if ! wanted "$name"; then echo "== $name: not in PARTS"; return; fi
  echo "== $name: limit ${limit}s, at $(elapsed)s: $*"
  local t0 rc
  t0=$(date +%s)
  timeout -k 15 "$limit" "$@" > "/tmp/gpu_checks_$name.out"
  rc=$?
  tail -c 4000 "/tmp/gpu_checks_$name.out"
  $PY - "$name" "$rc" "$(( $(date +%s) - t0 ))" "/tmp/gpu_checks_$name.out" >> "$OUT/results.jsonl" <<'EOF'
import json, sys
name, rc, seconds, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lines = [l for l in open(path, errors="replace").read().splitlines() if l.strip()]
try:
    result = json.loads(lines[-1])
except (IndexError, ValueError):
    result = None
print(json.dumps({"part": name, "rc": rc, "seconds": seconds, "result": result}))
EOF
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
part env 60 $PY -c 'import json, sys, torch; print(json.dumps({"python": sys.version.split()[0], "torch": torch.__version__,
  "cuda": torch.version.cuda, "gpus": torch.cuda.device_count(),
  "name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "nccl": torch.cuda.is_available()
  and ".".join(map(str, torch.cuda.nccl.version()))}))'
part train 150 $PY scripts/bench_train.py --device cuda --channels 96 --blocks 8 --batch 1024 --steps 20 --rounds 3 \
  --games 400 --torchrun-steps 40
part grpo 90 $PY scripts/bench_grpo.py --device cuda --backend fsdp --ranks 1 --engines "" --steps 10 --warmup 2
part selfplay_cuda 170 $PY scripts/bench_selfplay.py --device cuda --channels 96 --blocks 8 --concurrent 128 --sims 96 \
  --moves 3 --batches 2 --playout-batch 5000 --server-workers 12 --server-seconds 30
part selfplay_cpu 80 $PY scripts/bench_selfplay.py --device cpu --channels 96 --blocks 8 --concurrent 128 --sims 8 \
  --moves 1 --batches 1 --playout-batch 5000 --server-workers 0
part gauntlet 120 $PY scripts/bench_gauntlet.py --device cuda --channels 96 --blocks 8 --sims 64 --games 20 --rounds 1

left=$(( budget - $(elapsed) - 100 ))  # the loop's stop and the scoring took 30-40 s after it (4.4 min run)
if wanted learning && [ "$left" -ge 90 ]; then
  minutes=$($PY -c "print(round($left / 60, 2))")
  rm -rf /tmp/gpu_checks_learn && mkdir -p /tmp/gpu_checks_learn
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -l 2 \
    > /tmp/gpu_checks_learn/gpu.csv 2>/dev/null &
  sampler=$!
  part learning $(( left + 140 )) $PY scripts/bench_learning.py --minutes "$minutes" --config configs/gpu.yaml \
    --daemons configs/gpu_daemons.yaml --score-device "${SCORE_DEVICE:-cuda}" --mcts-sims 400 --mcts-models all --final-games 0 \
    --scorers 12 ${positions:+--positions "$positions"} --out "$OUT/learn" --data-dir /tmp/gpu_checks_learn/data
  kill "$sampler" 2>/dev/null
  $PY - /tmp/gpu_checks_learn/gpu.csv >> "$OUT/results.jsonl" <<'EOF'
import json, sys
rows = [[float(x) for x in line.split(",")] for line in open(sys.argv[1]) if line.count(",") == 1]
util = [r[0] for r in rows]
print(json.dumps({"part": "learning_gpu", "samples_every_s": 2, "samples": len(rows),
                  "util_mean_pct": round(sum(util) / len(util), 1) if util else None,
                  "util_max_pct": max(util, default=None), "memory_max_mib": max((r[1] for r in rows), default=None)}))
EOF
  echo "== the loop's log, errors and last lines"
  grep -iE "error|traceback|exception" /tmp/gpu_checks_learn/data.log | head -20
  tail -n 25 /tmp/gpu_checks_learn/data.log
  # the last two models (at most 8 files come back: results, log, the curve's two and these four)
  for model in $(ls -t /tmp/gpu_checks_learn/data/models/*.safetensors 2>/dev/null | head -2); do
    cp "$model" "${model%.safetensors}.json" "$OUT/"
  done
  ls /tmp/gpu_checks_learn/data/models 2>/dev/null | tail -5
elif wanted learning; then
  echo "== learning: skipped, only ${left}s left of the budget"
fi
echo "== done at $(elapsed)s"
