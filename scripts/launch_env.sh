#!/usr/bin/env bash
# Lightning's own launcher, no torchrun or scheduler: run this once per node; Lightning starts DEVICES
# processes on it. Every node names node 0 and the same fixed MASTER_PORT (without one, each node
# would pick its own random port).
#
#   NUM_NODES=2 DEVICES=8 NODE_RANK=0 MASTER_ADDR=node0 MASTER_PORT=29500 scripts/launch_env.sh --config ...
#   NUM_NODES=2 DEVICES=8 NODE_RANK=1 MASTER_ADDR=node0 MASTER_PORT=29500 scripts/launch_env.sh --config ...
#
# The trainer's num_nodes/devices are set from the same variables, after "$@" so that they win over the config.
set -euo pipefail
NUM_NODES=${NUM_NODES:-1}
DEVICES=${DEVICES:-1}
if [[ $NUM_NODES != 1 ]]; then
  export NODE_RANK=${NODE_RANK:?set NODE_RANK: 0 on the main node, 1..NUM_NODES-1 on the others}
  export MASTER_ADDR=${MASTER_ADDR:?set MASTER_ADDR: the main node (NODE_RANK 0), reachable from every node}
  export MASTER_PORT=${MASTER_PORT:?set MASTER_PORT: the same free port on every node}
fi
exec python -m project fit "$@" --trainer.num_nodes "$NUM_NODES" --trainer.devices "$DEVICES"
