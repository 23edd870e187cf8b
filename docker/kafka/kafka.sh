#!/bin/sh
# Start one KRaft node. Every KAFKA_<NAME> variable becomes the server property <name>
# (lower case, `_` -> `.`, `__` -> `_`, `___` -> `-`), as in the official apache/kafka image;
# the defaults below make a single node that listens on :9092 (clients) and :9093 (controller).
# KAFKA_CLUSTER_ID fixes the cluster id (default: a random one at the first start);
# KAFKA_HEAP_OPTS (default -Xms256m -Xmx768m) and KAFKA_OPTS are JVM options, not properties.
# The storage is formatted once, on the first start with an empty data volume.
set -eu
LIBS="/opt/kafka/libs/*"
CONFIG="${KAFKA_CONFIG_DIR:-/var/lib/kafka}/server.properties"
DATA=/var/lib/kafka/data

{
  echo "process.roles=broker,controller"
  echo "node.id=1"
  echo "controller.quorum.voters=1@localhost:9093"
  echo "listeners=PLAINTEXT://:9092,CONTROLLER://:9093"
  echo "advertised.listeners=PLAINTEXT://localhost:9092"
  echo "controller.listener.names=CONTROLLER"
  echo "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
  echo "log.dirs=$DATA"
  echo "offsets.topic.replication.factor=1"
  echo "transaction.state.log.replication.factor=1"
  echo "transaction.state.log.min.isr=1"
  echo "share.coordinator.state.topic.replication.factor=1"
  echo "share.coordinator.state.topic.min.isr=1"
  env | grep '^KAFKA_' | grep -v -e '^KAFKA_CLUSTER_ID=' -e '^KAFKA_HEAP_OPTS=' \
      -e '^KAFKA_OPTS=' -e '^KAFKA_CONFIG_DIR=' | while IFS='=' read -r name value; do
    key=$(printf '%s' "${name#KAFKA_}" | tr 'A-Z' 'a-z' \
          | sed -e 's/___/-/g' -e 's/__/@/g' -e 's/_/./g' -e 's/@/_/g')
    echo "$key=$value"
  done
} > "$CONFIG"  # later lines win: the environment overrides the defaults

if [ ! -f "$DATA/meta.properties" ]; then
  cluster="${KAFKA_CLUSTER_ID:-$(java -cp "$LIBS" kafka.tools.StorageTool random-uuid)}"
  java -cp "$LIBS" kafka.tools.StorageTool format "--cluster-id=$cluster" "--config=$CONFIG"
fi
# shellcheck disable=SC2086  # the *_OPTS are lists of options
exec java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx768m} -XX:+UseG1GC -Djava.awt.headless=true ${KAFKA_OPTS:-} \
  -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties \
  -cp "$LIBS" kafka.Kafka "$CONFIG"
