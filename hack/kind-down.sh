#!/usr/bin/env bash
# Tear down what hack/kind-up.sh created: the kind cluster (its node containers take the local PV
# directories and loaded images with them), its kubeconfig and generated manifests. Stops dockerd
# only if one of our scripts started it (pid file under $REVAULT_CACHE/docker/) and no other
# container is still running on it. Caches (binaries, node image archive, rootfs) are kept.
# usage: hack/kind-down.sh          env: KIND_CLUSTER (default revault-e2e)
set -Eeuo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CLUSTER=${KIND_CLUSTER:-revault-e2e}
start=$(now)

if docker_ok; then
  if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "kind delete cluster --name $CLUSTER"
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || die "kind delete cluster --name $CLUSTER failed"
  else
    log "no kind cluster named $CLUSTER"
  fi
else
  log "dockerd is not running: no cluster containers to delete"
fi
rm -f "$KIND_CACHE/$CLUSTER".{kubeconfig,kind-config.yaml,local-pvs.yaml,create.log}

# dockerd: only the one our scripts started (see lib.sh), and only if nothing else runs on it.
stop_dockerd || true
log "done in $(( $(now) - start ))s"
