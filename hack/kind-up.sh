#!/usr/bin/env bash
# Bring up (or reuse) the 4-node kind cluster Revault's e2e tests run on, without a registry.
#
# usage: hack/kind-up.sh [IMAGE.tar ...]
#   IMAGE.tar   image archives to load into every node (`kind load image-archive`), e.g. made by
#               hack/mkimage.py or `docker save`; pods use them with imagePullPolicy: Never or
#               IfNotPresent.
# env: KIND_CLUSTER     cluster name (default revault-e2e)
#      KIND_LOCAL_PVS   number of 1Gi local PersistentVolumes (default 12, half per worker)
#      REVAULT_KIND_IMAGE, REVAULT_KIND_OFFLINE   see hack/kind-node-image.sh
# Result: 1 control plane + 3 workers, labelled revault.io/storage=ssd (<name>-worker) and
#   revault.io/storage=hdd (<name>-worker2), and <name>-worker3 unlabelled and tainted
#   revault.io/spare=true:NoExecute (only workers run there): the spare node the
#   failover scenario labels, then loses (e2e/remote_test.go); StorageClass revault-local (no provisioner,
#   WaitForFirstConsumer, the default class offline) with static local PVs
#   revault-local-{ssd,hdd}-NN (1Gi, Retain, half on each worker); all nodes Ready and
#   CoreDNS running. The kubeconfig path is the last line of stdout:
#       export KUBECONFIG=$(hack/kind-up.sh img.tar | tail -1)
# If the cluster already exists and is healthy, only reloads the images, recycles Released local
# PVs (wipes their directory, makes them Available again) and exits (seconds).
set -Eeuo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CLUSTER=${KIND_CLUSTER:-revault-e2e}
NPV=${KIND_LOCAL_PVS:-12}
KCFG=$KIND_CACHE/$CLUSTER.kubeconfig
PV_ROOT=/mnt/revault-local          # inside the worker node containers
WORKERS=("$CLUSTER-worker" "$CLUSTER-worker2")
TIERS=(ssd hdd)                     # revault.io/storage label of WORKERS[i]
SPARE=$CLUSTER-worker3              # unlabelled, tainted; e2e/remote_test.go labels it, then stops it
NODES=4
SERVICE_CIDR=10.96.0.0/16           # kind's default serviceSubnet

for a in "$@"; do [ -f "$a" ] || die "image archive not found: $a"; done
[[ $NPV =~ ^[0-9]+$ ]] || die "KIND_LOCAL_PVS must be a number, got '$NPV'"
start=$(now)
mkdir -p "$KIND_CACHE"

"$HACK_DIR/k8s-tools.sh"
"$HACK_DIR/k8s-binaries.sh" kubectl >/dev/null
KUBECTL=("$K8S_BIN/kubectl" --kubeconfig "$KCFG")
ensure_dockerd
with_lock "kind-up-$CLUSTER"

healthy() {
  # Node containers must run (after a dockerd restart they don't, while the API server's view
  # of the nodes lags by ~40 s), the API server must answer and all nodes must be Ready.
  local n
  for n in "$CLUSTER-control-plane" "${WORKERS[@]}" "$SPARE"; do
    [ "$(docker inspect -f '{{.State.Running}}' "$n" 2>/dev/null)" = true ] || return 1
  done
  [ -s "$KCFG" ] || kind export kubeconfig --name "$CLUSTER" --kubeconfig "$KCFG" >/dev/null 2>&1 || return 1
  timeout 15 "${KUBECTL[@]}" get --raw /readyz >/dev/null 2>&1 || return 1
  local ready
  ready=$("${KUBECTL[@]}" get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null | grep -c True)
  [ "$ready" -eq $NODES ]
}

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  if healthy; then
    log "cluster $CLUSTER exists and is healthy: reusing it"
    created=0
  else
    log "cluster $CLUSTER exists but is not healthy: recreating it"
    kind delete cluster --name "$CLUSTER" >&2
    created=1
  fi
else
  created=1
fi

if [ $created = 1 ]; then
  image=$("$HACK_DIR/kind-node-image.sh" | tail -1)
  [ -n "$image" ] || die "hack/kind-node-image.sh returned no image"
  # Our offline image has neither kindnet's nor local-path-provisioner's images: disable the
  # default CNI and install our own below. kind's default image keeps kindnet.
  offline=$(docker image inspect -f '{{index .Config.Labels "io.revault.kind-node"}}' "$image" 2>/dev/null || true)
  cfg=$KIND_CACHE/$CLUSTER.kind-config.yaml
  {
    echo "kind: Cluster"
    echo "apiVersion: kind.x-k8s.io/v1alpha4"
    [ "$offline" = offline ] && printf 'networking:\n  disableDefaultCNI: true\n'
    # The kubelet refreshes Secret volumes when it resyncs a pod, every syncFrequency (1m by
    # default). Revault's workers learn a new namespace's token from such a volume, so every
    # first backup in a new namespace would wait up to a minute; tests make many namespaces.
    printf 'kubeadmConfigPatches:\n- |\n  kind: KubeletConfiguration\n  syncFrequency: 10s\n'
    echo "nodes:"
    echo "- role: control-plane"
    for i in 0 1; do printf -- '- role: worker\n  labels:\n    revault.io/storage: %s\n' "${TIERS[$i]}"; done
    echo "- role: worker"
  } > "$cfg"
  log "kind create cluster --name $CLUSTER --image $image ($NODES nodes, ~1 min)"
  kind create cluster --name "$CLUSTER" --image "$image" --config "$cfg" --kubeconfig "$KCFG" \
    >"$KIND_CACHE/$CLUSTER.create.log" 2>&1 ||
    { tail -30 "$KIND_CACHE/$CLUSTER.create.log" >&2; die "kind create cluster failed (log: $KIND_CACHE/$CLUSTER.create.log)"; }

  if [ "$offline" = offline ]; then
    # Minimal kindnet replacement: every node gets a bridge CNI config for the podCIDR the
    # controller-manager allocated to it, plus routes to the other nodes' podCIDRs via their
    # node IPs (all nodes share docker's "kind" network), and pod-to-pod traffic is exempt from
    # the bridge plugin's masquerading. The firewall plugin opens FORWARD for pod traffic.
    log "installing the bridge CNI on every node"
    nodes=""
    complete() { [ "$(wc -l <<<"$nodes")" -eq $NODES ] && ! grep -qE ',,|,$' <<<"$nodes"; }
    for _ in $(seq 60); do
      nodes=$("${KUBECTL[@]}" get nodes -o jsonpath='{range .items[*]}{.metadata.name},{.spec.podCIDR},{.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}')
      complete && break
      sleep 1
    done
    complete || die "nodes did not get podCIDRs/IPs: $nodes"
    while IFS=, read -r name cidr _; do
      sed "s|@POD_CIDR@|$cidr|" "$HACK_DIR/kind/cni-bridge.conflist.tmpl" |
        docker exec -i "$name" sh -c 'cat > /etc/cni/net.d/10-revault-bridge.conflist'
      while IFS=, read -r other ocidr oip; do
        [ "$other" = "$name" ] || docker exec "$name" ip route replace "$ocidr" via "$oip"
      done <<<"$nodes"
      docker exec "$name" sh -c "iptables -t nat -C POSTROUTING -s $cidr -d 10.244.0.0/16 -j RETURN 2>/dev/null ||
                                 iptables -t nat -I POSTROUTING -s $cidr -d 10.244.0.0/16 -j RETURN"
      # The firewall plugin's ACCEPT for pod traffic comes before kube-proxy's REJECT of
      # Services without endpoints, so a connection to such a ClusterIP (e.g. a worker's Service
      # while its pod restarts) would leave the node un-DNATed, masqueraded, towards the docker
      # host, where whatever answers it keeps a pooled keep-alive connection "working" forever.
      # A forwarded packet still addressed to the Service range was not DNATed: reject it as
      # kube-proxy would. CNI-ADMIN is the chain the plugin runs first and leaves to admins.
      docker exec "$name" sh -c "iptables -N CNI-ADMIN 2>/dev/null || true
        iptables -C CNI-ADMIN -d $SERVICE_CIDR -j REJECT --reject-with icmp-port-unreachable 2>/dev/null ||
        iptables -A CNI-ADMIN -d $SERVICE_CIDR -j REJECT --reject-with icmp-port-unreachable"
    done <<<"$nodes"
  fi

  log "waiting for nodes Ready and CoreDNS"
  "${KUBECTL[@]}" wait --for=condition=Ready node --all --timeout=300s >/dev/null ||
    die "nodes not Ready: $("${KUBECTL[@]}" get nodes 2>&1)"
  "${KUBECTL[@]}" -n kube-system rollout status deployment/coredns --timeout=300s >/dev/null ||
    die "CoreDNS not running: $("${KUBECTL[@]}" -n kube-system get pods -o wide 2>&1)"
fi

# Labels are in the kind config; re-applying them is cheap and also fixes an older cluster.
for i in 0 1; do
  "${KUBECTL[@]}" label node "${WORKERS[$i]}" --overwrite "revault.io/storage=${TIERS[$i]}" >/dev/null
done
# The spare node starts every run unlabelled and without stores (a kept cluster's last run may
# have labelled it, and left a store on it).
"${KUBECTL[@]}" label node "$SPARE" revault.io/storage- >/dev/null 2>&1 || true
docker exec "$SPARE" rm -rf /var/lib/revault
# Only workers (the e2e's ssd pool tolerates it) run on the spare: the scenario that stops it
# must not take CoreDNS, the operator or the S3 server down with it. NoExecute moves what
# kind placed there before (CoreDNS).
"${KUBECTL[@]}" taint node "$SPARE" revault.io/spare=true:NoExecute --overwrite >/dev/null
"${KUBECTL[@]}" -n kube-system rollout status deployment/coredns --timeout=300s >/dev/null ||
  die "CoreDNS not running after tainting the spare: $("${KUBECTL[@]}" -n kube-system get pods -o wide 2>&1)"

# Static local PVs: kind's local-path-provisioner image is not available offline, and static
# PVs with nodeAffinity are what a real cluster with local disks looks like anyway.
# Reclaim policy Retain + recycling here (instead of a provisioner) keeps this dependency-free.
# kind installs a default StorageClass "standard"; without kind's local-path-provisioner image
# (offline) it falls back to provisioner kubernetes.io/host-path, which nothing serves: a PVC
# without storageClassName would hang Pending. Replace it: revault-local becomes the default
# unless a working default (kind's own image with local-path-provisioner) is there.
if [ "$("${KUBECTL[@]}" get sc standard -o jsonpath='{.provisioner}' 2>/dev/null || true)" = kubernetes.io/host-path ]; then
  "${KUBECTL[@]}" delete sc standard >/dev/null
fi
other_default=$("${KUBECTL[@]}" get sc -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.annotations.storageclass\.kubernetes\.io/is-default-class}{"\n"}{end}' |
  grep -v '^revault-local=' | grep -c '=true$' || true)
is_default=$([ "$other_default" = 0 ] && echo true || echo false)

pv_name() { printf 'revault-local-%s-%02d' "${TIERS[$1]}" "$2"; }
manifest=$KIND_CACHE/$CLUSTER.local-pvs.yaml
{
  cat <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: revault-local
  annotations: {storageclass.kubernetes.io/is-default-class: "$is_default"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
EOF
  for n in $(seq "$NPV"); do
    w=$(( (n - 1) % 2 )); k=$(( (n + 1) / 2 )); name=$(pv_name "$w" "$k")
    cat <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: $name
  labels: {revault.io/local-pv: "true", revault.io/storage: ${TIERS[$w]}}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: revault-local
  local: {path: $PV_ROOT/$name}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [${WORKERS[$w]}]}]
EOF
  done
} > "$manifest"
for w in 0 1; do
  dirs=(); for n in $(seq "$NPV"); do
    [ $(( (n - 1) % 2 )) = "$w" ] && dirs+=("$PV_ROOT/$(pv_name "$w" $(( (n + 1) / 2 )))")
  done
  [ ${#dirs[@]} -eq 0 ] || docker exec "${WORKERS[$w]}" mkdir -p "${dirs[@]}"
done
"${KUBECTL[@]}" apply -f "$manifest" >/dev/null || die "applying local PVs failed ($manifest)"

# Recycle: a Released PV (its claim was deleted) gets an empty directory and loses its claimRef,
# so repeated e2e runs on a reused cluster always find Available volumes.
released=$("${KUBECTL[@]}" get pv -l revault.io/local-pv=true \
  -o jsonpath='{range .items[?(@.status.phase=="Released")]}{.metadata.name},{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]},{.spec.local.path}{"\n"}{end}')
while IFS=, read -r pv node path; do
  [ -n "$pv" ] || continue
  docker exec "$node" sh -c "rm -rf '$path' && mkdir -p '$path'"
  "${KUBECTL[@]}" patch pv "$pv" --type json -p '[{"op":"remove","path":"/spec/claimRef"}]' >/dev/null
  log "recycled PV $pv"
done <<<"$released"

for a in "$@"; do
  log "kind load image-archive $a"
  kind load image-archive "$a" --name "$CLUSTER" >&2 || die "kind load image-archive $a failed"
done

log "cluster $CLUSTER ready in $(( $(now) - start ))s: $("${KUBECTL[@]}" get nodes --no-headers | awk '{printf "%s(%s) ", $1, $2}')"
echo "$KCFG"
