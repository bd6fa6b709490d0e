#!/bin/bash
# test_helm.sh - deploy/helm/outbox-relay: `helm lint --strict` passes, and `helm template`
# renders what the chart promises, read back as YAML: the relay Deployment (2 replicas) with
# /healthz as liveness and readiness on the metrics port, secrets only from a Secret (URLs as
# secretKeyRef, the broker password as a mounted file), a non-root read-only container, a
# 30 s grace period, `outboxctl migrate` as init container, and the ServiceMonitor and Secret
# only when asked. No cluster here: the objects are not applied, so scheduling, probes and the
# Prometheus Operator's reading of the ServiceMonitor are not proven.
# helm is built once from the Go module proxy (go install) into a cache outside the tree.
. "$(dirname "$0")/../deploy/lib.sh"

HELM_VERSION=v3.18.6
HELM=${HELM:-/var/cache/outbox-relay-tests/helm-$HELM_VERSION/helm}
CHART=deploy/helm/outbox-relay
if [ ! -x "$HELM" ]; then
    command -v go >/dev/null || fail "helm $HELM_VERSION is built with go (>= 1.24), and there is none on PATH"
    echo "helm: building $HELM_VERSION with go install (once)"
    GOBIN=$(dirname "$HELM") go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" ||
        fail "go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION failed"
fi
"$HELM" version --short

"$HELM" lint --strict "$CHART" > "$SCRATCH/lint" 2>&1 || { cat "$SCRATCH/lint" >&2; fail "helm lint --strict"; }
pass "helm lint --strict"

# Renders the chart with the arguments into $SCRATCH/NAME.yaml.
render() {
    local name=$1
    shift
    "$HELM" template relay "$CHART" "$@" > "$SCRATCH/$name.yaml" 2> "$SCRATCH/$name.err" ||
        { cat "$SCRATCH/$name.err" >&2; fail "helm template $name"; }
}

# Asserts on the rendered objects: python3 (with PyYAML, which podman-compose brings) gets
# `objects` (kind -> object) and `relay` (the relay container) and runs the checks given.
check() {
    local name=$1 checks=$2
    python3 - "$SCRATCH/$name.yaml" <<PYTHON || fail "helm template $name: the objects are not as promised"
import sys, yaml
objects = {o["kind"]: o for o in yaml.safe_load_all(open(sys.argv[1])) if o}
deployment = objects["Deployment"]
pod = deployment["spec"]["template"]["spec"]
relay = next(c for c in pod["containers"] if c["name"] == "relay")
env = {e["name"]: e for e in relay.get("env", [])}
$checks
PYTHON
}

render defaults
check defaults '
assert deployment["spec"]["replicas"] == 2
for probe in ("livenessProbe", "readinessProbe"):
    assert relay[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, relay[probe]
assert relay["ports"][0]["containerPort"] == 9187
assert env["OUTBOX_METRICS_ADDR"]["value"] == "0.0.0.0:9187"
for name in ("OUTBOX_DATABASE_URL", "OUTBOX_BROKER"):
    assert "secretKeyRef" in env[name]["valueFrom"], env[name]
assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
assert relay["securityContext"]["readOnlyRootFilesystem"] is True
assert relay["securityContext"]["allowPrivilegeEscalation"] is False
assert pod["terminationGracePeriodSeconds"] == 30
assert relay["resources"]["limits"]["memory"] and relay["resources"]["requests"]["memory"]
assert pod["initContainers"][0]["command"] == ["outboxctl", "migrate"]
assert "ServiceMonitor" not in objects and "Secret" not in objects
assert objects["Service"]["spec"]["ports"][0]["name"] == "metrics"
'
pass "defaults: Deployment of 2, /healthz liveness and readiness, URLs from a Secret, non-root, migrate init container"

render everything --set secret.create=true --set secret.databaseUrl=postgresql://relay:pw@db/app \
    --set secret.brokerUrl=amqp://relay@mq:5672/%2f --set secret.brokerPasswordKey=broker-password \
    --set secret.brokerPassword=secret --set metrics.serviceMonitor.enabled=true \
    --set migrate.enabled=false --set env.OUTBOX_EXCHANGE=events
check everything '
secret = objects["Secret"]
assert set(secret["stringData"]) == {"database-url", "broker-url", "broker-password"}
assert env["OUTBOX_BROKER_PASSWORD_FILE"]["value"] == "/run/secrets/outbox/broker-password"
assert relay["volumeMounts"][0]["mountPath"] == "/run/secrets/outbox"
assert pod["volumes"][0]["secret"]["secretName"] == secret["metadata"]["name"]
assert env["OUTBOX_EXCHANGE"]["value"] == "events"
monitor = objects["ServiceMonitor"]
assert monitor["spec"]["endpoints"][0]["port"] == "metrics" and monitor["spec"]["endpoints"][0]["path"] == "/metrics"
assert "initContainers" not in pod
'
pass "a Secret with the broker password as a mounted file, a ServiceMonitor, no init container"

if "$HELM" template relay "$CHART" --set secret.create=true > /dev/null 2> "$SCRATCH/required"; then
    fail "secret.create without the URLs rendered"
fi
grep -q "secret.databaseUrl is required" "$SCRATCH/required" || fail "no clear message: $(cat "$SCRATCH/required")"
pass "secret.create without secret.databaseUrl: one clear error"
