#!/bin/sh
# The apache/kafka image's contract: every KAFKA_<NAME> variable is the broker setting <name>
# (lowercase, _ for .), CLUSTER_ID names the cluster, KAFKA_HEAP_OPTS sizes the JVM; the
# storage is formatted on first start. The jars are the test harness's Kafka (libs/).
set -eu
mkdir -p /var/lib/kafka/data
properties=/var/lib/kafka/server.properties
{
    echo "log.dirs=/var/lib/kafka/data"
    env | grep '^KAFKA_' | grep -v '^KAFKA_HEAP_OPTS=' | while IFS='=' read -r name value; do
        echo "$(echo "${name#KAFKA_}" | tr 'A-Z_' 'a-z.')=$value"
    done
} > "$properties"
java -cp '/opt/server/libs/*' kafka.tools.StorageTool format -t "${CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}" \
    -c "$properties" --ignore-formatted >/dev/null
exec java ${KAFKA_HEAP_OPTS:--Xmx512m} -XX:+UseSerialGC -Djava.awt.headless=true \
    -cp '/opt/server/libs/*' kafka.Kafka "$properties"
