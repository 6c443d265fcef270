#!/usr/bin/env bash
# torchrun: one torchrun per node; each starts DEVICES processes running `python -m project fit "$@"`.
#
#   one node (a local rendezvous, nothing else to set):
#     DEVICES=8 scripts/torchrun.sh --config configs/digits.yaml
#   several nodes: the same command on every node, NODE_RANK 0..NUM_NODES-1, all naming node 0:
#     NUM_NODES=2 DEVICES=8 NODE_RANK=0 MASTER_ADDR=node0 MASTER_PORT=29500 scripts/torchrun.sh --config ...
#
# The trainer's num_nodes/devices are set from the same variables, after "$@" so that they win over the config.
#
# Elastic: MIN_NODES below NUM_NODES (e.g. NUM_NODES=3 MIN_NODES=2, the same command on every node, NODE_RANK=0 on
# the node MASTER_ADDR names, which must stay) lets torchrun's c10d rendezvous go on with the nodes that are left when
# one is lost: their workers restart (MAX_RESTARTS times) and resume from the newest checkpoint (with --ckpt_path auto)
# on the new number of nodes; a node started again joins at the next restart.
#
# Self-healing: when a rank fails (crashes, is killed, or hangs past the process-group timeout), every rank is
# restarted, up to MAX_RESTARTS times (default 3); with `--ckpt_path auto` they resume the run from its newest
# checkpoint. The restarts are warm: each worker process forks its rank after importing torch and Lightning, and forks
# it again after a failure (trainfleet/runtime/warm_restart.py), so torchrun itself restarts nothing (--max-restarts 0).
# A refusal (exit 2), the NaN guard (exit 3), a full disk (exit 4), Ctrl-C (130) and SIGTERM (143) end the job, with
# that code. Each rank records its outcome in PROJECT_EXIT_FILE (the restart's cause, the job's final code).
#
# Periodic checkpoints: last.ckpt every CHECKPOINT_EVERY of training (H:MM:SS, default 0:30:00), beside the per-epoch
# ones, written in the background (the training stalls for a copy only): a crash or a lost node loses at most that
# much work. CHECKPOINT_EVERY= (empty) turns both off; flags after the script's name win over them.
set -euo pipefail
CHECKPOINT_EVERY=${CHECKPOINT_EVERY-0:30:00}
if [[ -n $CHECKPOINT_EVERY && ! $CHECKPOINT_EVERY =~ ^[0-9]+:[0-5][0-9]:[0-5][0-9]$ ]]; then
  echo "error: CHECKPOINT_EVERY must be a duration H:MM:SS (e.g. 0:30:00), or empty for none, got '$CHECKPOINT_EVERY'" >&2
  exit 2
fi
periodic=()
if [[ -n $CHECKPOINT_EVERY ]]; then
  periodic=(--periodic.every "$CHECKPOINT_EVERY" --trainer.plugins trainfleet.checkpoints.files.AsyncAtomicCheckpointIO)
fi
NUM_NODES=${NUM_NODES:-1}
MIN_NODES=${MIN_NODES:-$NUM_NODES}
DEVICES=${DEVICES:-1}
MAX_RESTARTS=${MAX_RESTARTS:-3}
if [[ ! $MAX_RESTARTS =~ ^[0-9]+$ ]]; then
  echo "error: MAX_RESTARTS must be a non-negative integer (restarts of the run), got '$MAX_RESTARTS'" >&2
  exit 2
fi
if [[ ! $MIN_NODES =~ ^[1-9][0-9]*$ ]] || (( MIN_NODES > NUM_NODES )); then
  echo "error: MIN_NODES must be an integer from 1 to NUM_NODES ($NUM_NODES), got '$MIN_NODES'" >&2
  exit 2
fi
if (( MIN_NODES < NUM_NODES )); then
  # Elastic: torchrun's c10d rendezvous admits MIN_NODES to NUM_NODES nodes (no NODE_RANK: it gives them), and
  # restarts the workers of the nodes that are left when one is lost (cold: a new world size, a new rendezvous).
  # The node MASTER_ADDR names serves the rendezvous (NODE_RANK=0 there): torchrun's own guess compares the address
  # with what the hostname resolves to, often 127.0.0.1.
  # Each node tells the others its address on the route to MASTER_ADDR (LOCAL_ADDR), not its name's.
  serves=$([[ ${NODE_RANK:-} == 0 ]] && echo true || echo false)
  : "${MASTER_ADDR:?set MASTER_ADDR: the node serving the rendezvous}"
  master_ip=$(getent ahostsv4 "$MASTER_ADDR" | awk 'NR == 1 { print $1 }')
  LOCAL_ADDR=${LOCAL_ADDR:-$(ip -o route get "${master_ip:-$MASTER_ADDR}" | grep -o 'src [^ ]*' | cut -d' ' -f2)}
  rendezvous=(
    --rdzv-backend c10d --rdzv-id "${RUN_ID:-project}" --rdzv-conf "is_host=$serves" --max-restarts "$MAX_RESTARTS"
    --rdzv-endpoint "$MASTER_ADDR:${MASTER_PORT:-29500}" --local-addr "$LOCAL_ADDR"
  )
  MAX_RESTARTS=0  # no warm restarts: the world would be the lost one
elif [[ $NUM_NODES == 1 ]]; then
  # Static rendezvous on this machine, not --standalone: with --max-restarts, torch 2.14's c10d rendezvous hands
  # restarted workers the gloo addresses of the killed ones.
  rendezvous=(--node-rank 0 --master-addr 127.0.0.1 --master-port "${MASTER_PORT:-29500}")
else
  rendezvous=(
    --node-rank "${NODE_RANK:?set NODE_RANK: 0 on the main node, 1..NUM_NODES-1 on the others}"
    --master-addr "${MASTER_ADDR:?set MASTER_ADDR: the main node (NODE_RANK 0), reachable from every node}"
    --master-port "${MASTER_PORT:-29500}"
  )
fi
PROJECT_EXIT_FILE=${PROJECT_EXIT_FILE:-$(mktemp "${TMPDIR:-/tmp}/rank-exits.XXXXXX")}
export PROJECT_EXIT_FILE PROJECT_WARM_RESTARTS=$MAX_RESTARTS
trap 'rm -f "$PROJECT_EXIT_FILE"' EXIT
code=0
if (( MIN_NODES < NUM_NODES )); then
  # Each worker reads the nodes of its rendezvous round (GROUP_WORLD_SIZE): the Trainer's num_nodes is the round's.
  worker=(--no-python bash -c 'exec python -m project fit "$@" --trainer.num_nodes "$GROUP_WORLD_SIZE"' bash)
  torchrun --nnodes "$MIN_NODES:$NUM_NODES" --nproc-per-node "$DEVICES" "${rendezvous[@]}" \
    "${worker[@]}" ${periodic[@]+"${periodic[@]}"} "$@" --trainer.devices "$DEVICES" || code=$?
else
  torchrun --nnodes "$NUM_NODES" --nproc-per-node "$DEVICES" "${rendezvous[@]}" --max-restarts 0 \
    -m project fit ${periodic[@]+"${periodic[@]}"} "$@" --trainer.num_nodes "$NUM_NODES" --trainer.devices "$DEVICES" \
    || code=$?
fi
# torchrun exits 1 whatever ended a worker: a rank's final code says why (a refusal, the NaN guard, a full disk, ...).
final=$(awk -F '\t' '$1 == 2 || $1 == 3 || $1 == 4 || $1 == 130 || $1 == 143 { print $1; exit }' "$PROJECT_EXIT_FILE" \
  2>/dev/null || true)
exit $((code == 0 ? 0 : ${final:-$code}))
