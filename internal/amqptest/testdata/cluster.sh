#!/bin/bash
# cluster.sh start|stop DIR
#
# A throwaway 3-node RabbitMQ cluster, c1..c3@localhost on 127.0.0.1:5673-5675
# (distribution ports 25673-25675), beside the machine's own node, for the
# cluster test (OUTBOX_CLUSTER_TEST=1). Each node has its own config file
# (the system one pins port 5672), data directory and no plugins, and runs
# as the rabbitmq user so that the Erlang cookie matches. Needs root.
set -euo pipefail
cmd=$1 dir=$2
as_rabbit() { runuser -u rabbitmq -- env HOME=/var/lib/rabbitmq RABBITMQ_CONF_ENV_FILE="$dir/env.conf" "$@"; }
ctl() { as_rabbit rabbitmqctl "$@"; }
case $cmd in
start)
  mkdir -p "$dir"
  : > "$dir/env.conf"; : > "$dir/plugins"
  for i in 1 2 3; do
    mkdir -p "$dir/c$i"
    printf 'listeners.tcp.local = 127.0.0.1:%d\nloopback_users = none\n' $((5672 + i)) > "$dir/c$i/rabbitmq.conf"
  done
  chown -R rabbitmq:rabbitmq "$dir"
  for i in 1 2 3; do
    as_rabbit RABBITMQ_NODENAME="c$i@localhost" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$((5672 + i)) \
      RABBITMQ_DIST_PORT=$((25672 + i)) ERL_EPMD_ADDRESS=127.0.0.1 \
      RABBITMQ_CONFIG_FILE="$dir/c$i/rabbitmq" RABBITMQ_MNESIA_BASE="$dir/c$i/mnesia" RABBITMQ_LOG_BASE="$dir/c$i/log" \
      RABBITMQ_ENABLED_PLUGINS_FILE="$dir/plugins" \
      rabbitmq-server -detached
  done
  for i in 1 2 3; do
    for _ in $(seq 120); do
      if ctl -n "c$i@localhost" await_startup --timeout 5 >/dev/null 2>&1; then break; fi
      sleep 1
    done
    ctl -n "c$i@localhost" eval 'list_to_integer(os:getpid()).' > "$dir/c$i/pid"
  done
  for i in 2 3; do
    ctl -n "c$i@localhost" stop_app >/dev/null
    ctl -n "c$i@localhost" join_cluster c1@localhost >/dev/null
    ctl -n "c$i@localhost" start_app >/dev/null
  done
  ;;
stop)
  for i in 1 2 3; do
    if [ -s "$dir/c$i/pid" ]; then kill -9 "$(cat "$dir/c$i/pid")" 2>/dev/null || true; fi
  done
  rm -rf "$dir"
  ;;
ctl) # ctl DIR ARGS...: rabbitmqctl as the rabbitmq user
  shift 2
  ctl "$@"
  ;;
esac
