#!/usr/bin/env bash
# End-to-end check of the kind tooling: build a tiny static HTTP server, package it with
# hack/mkimage.py, bring the cluster up with hack/kind-up.sh loading that archive, then run it
# (hack/testdata/kind-smoke.yaml) on the revault.io/storage=ssd worker with a PVC bound to a
# revault-local PV, and check: the pod runs from the loaded image (imagePullPolicy: Never),
# wrote into its volume (read back from the node's directory), answers through a Service via
# the API server proxy (cross-node pod networking) and resolves a name via CoreDNS.
# Leaves the cluster up (hack/kind-down.sh removes it); removes its own namespace.
# usage: hack/kind-smoke.sh
set -Eeuo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NS=revault-smoke
W=$REVAULT_CACHE/smoke
mkdir -p "$W"
start=$(now)

log "building testdata/hello and its image"
(cd "$HACK_DIR/testdata/hello" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$W/hello" main.go)
python3 "$HACK_DIR/mkimage.py" --dir /data revault.local/hello:smoke "$W/hello.tar" /hello "$W/hello:/hello" >/dev/null

KCFG=$("$HACK_DIR/kind-up.sh" "$W/hello.tar" | tail -1)
kc() { "$K8S_BIN/kubectl" --kubeconfig "$KCFG" "$@"; }
k() { kc -n "$NS" "$@"; }

kc delete namespace "$NS" --ignore-not-found --wait=true >/dev/null
kc create namespace "$NS" >/dev/null
k apply -f "$HACK_DIR/testdata/kind-smoke.yaml" >/dev/null
k wait --for=condition=Ready pod/hello --timeout=180s >/dev/null ||
  { k describe pod hello >&2; die "pod hello did not become Ready"; }

node=$(k get pod hello -o jsonpath='{.spec.nodeName}')
tier=$(kc get node "$node" -o jsonpath='{.metadata.labels.revault\.io/storage}')
pv=$(k get pvc hello-data -o jsonpath='{.spec.volumeName}')
path=$(kc get pv "$pv" -o jsonpath='{.spec.local.path}')
log "pod hello on $node (storage=$tier), PVC bound to $pv ($path)"
[ "$tier" = ssd ] || die "pod landed on storage=$tier, wanted ssd"
[[ $pv == revault-local-ssd-* ]] || die "PVC bound to $pv, wanted a revault-local-ssd PV"

written=$(docker exec "$node" cat "$path/hello.log") || die "no hello.log in $path on $node"
log "volume content on the node: $written"
served=$(k get --raw "/api/v1/namespaces/$NS/services/hello:80/proxy/")
[ "$served" = "$written" ] || die "service returned '$served', expected '$written'"
dns=$(k get --raw "/api/v1/namespaces/$NS/services/hello:80/proxy/dns")
log "DNS from the pod: kubernetes.default -> $dns"
[[ $dns == *10.96.0.1* ]] || die "cluster DNS lookup from the pod failed: $dns"

kc delete namespace "$NS" --wait=true >/dev/null
log "PASS in $(( $(now) - start ))s"
