#!/bin/sh
# One-shot: make the six redis-node-N containers of the compose "scale" profile one Redis
# Cluster (3 masters, 3 replicas). Idempotent: a cluster that already exists (its nodes.conf on
# the volumes) is left as it is.
set -eu

NODES="redis-node-1 redis-node-2 redis-node-3 redis-node-4 redis-node-5 redis-node-6"

for node in $NODES; do  # wait until every node answers
    until redis-cli -h "$node" -p 6379 ping >/dev/null 2>&1; do sleep 1; done
done

if redis-cli -h redis-node-1 -p 6379 cluster info | grep -q '^cluster_state:ok'; then
    echo "the Redis Cluster exists already"
    exit 0
fi

# CLUSTER MEET takes addresses, not names: resolve each node on the compose network.
addresses=""
for node in $NODES; do
    ip=$(getent hosts "$node" | awk '{ print $1; exit }')
    addresses="$addresses $ip:6379"
done

# shellcheck disable=SC2086  # one argument per node
redis-cli --cluster create $addresses --cluster-replicas 1 --cluster-yes
