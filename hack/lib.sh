# shellcheck shell=bash
# Shared helpers for the hack/*.sh Kubernetes tooling. Source it, don't run it:
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Everything heavy (Go module/build caches, built binaries, images, dockerd state we own)
# lives under $REVAULT_CACHE, never inside the clone, so a fresh clone on a warm machine is
# fast and `git clean` never throws away 20 minutes of builds.

# shellcheck disable=SC2034  # the pins and paths below are used by the scripts that source this
# ---- version pins (single source of truth) -------------------------------------------------
# The Go module proxy reachable here is a filtered mirror: some versions answer 403 and
# `@latest` listing is unreliable, so every version below is exact and known to resolve.
K8S_VERSION=v1.33.13          # k8s.io/kubernetes; staging modules are v0.33.13
ETCD_VERSION=v3.5.21          # what k8s 1.33 is tested with
COREDNS_VERSION=v1.12.0       # what kubeadm v1.33 deploys
KIND_VERSION=v0.33.0
HELM_VERSION=v3.22.0          # v3.22.1 answers 403 on the proxy
CONTROLLER_GEN_VERSION=v0.18.0  # controller-tools release built against k8s 1.33
GINKGO_VERSION=v2.28.3        # keep equal to github.com/onsi/ginkgo/v2 in operator/go.mod
GOLANGCI_LINT_VERSION=v2.15.0 # hack/go-lint.sh; built with the local Go (see there)
OAPI_CODEGEN_VERSION=v2.8.2   # hack/worker-client.sh; its runtime is pinned in operator/go.mod
VERSITYGW_VERSION=v1.8.0      # hack/s3-server.sh: the S3-compatible server of the remote tier's tests

REVAULT_CACHE=${REVAULT_CACHE:-$HOME/.cache/revault}
HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOOLS_BIN=$REVAULT_CACHE/bin                       # kind, helm, controller-gen, ginkgo, golangci-lint, oapi-codegen, kubectl link
K8S_BIN=$REVAULT_CACHE/k8s/$K8S_VERSION/bin        # kube-*, kubectl, etcd (also KUBEBUILDER_ASSETS)
KIND_CACHE=$REVAULT_CACHE/kind                     # node image archive, kubeconfigs, rootfs
DOCKER_STATE=$REVAULT_CACHE/docker                 # pid/log of a dockerd *we* started

# Go: keep module + build caches under REVAULT_CACHE unless the caller chose others, never
# download a toolchain (the local one is new enough), and don't stamp VCS info (the throwaway
# build modules are not repositories).
export GOMODCACHE=${GOMODCACHE:-$REVAULT_CACHE/go/mod}
export GOCACHE=${GOCACHE:-$REVAULT_CACHE/go/build}
export GOTOOLCHAIN=local
export GOFLAGS=${GOFLAGS:--buildvcs=false}
export PATH=$TOOLS_BIN:$K8S_BIN:/usr/local/go/bin:$PATH:/usr/sbin:/sbin

SCRIPT_NAME=${SCRIPT_NAME:-$(basename "$0" .sh)}
# Logs go to stderr so that stdout carries only the machine-readable result (a path, an image).
log() { printf '%s: %s\n' "$SCRIPT_NAME" "$*" >&2; }
die() { printf '%s: ERROR: %s\n' "$SCRIPT_NAME" "$*" >&2; exit 1; }
# shellcheck disable=SC2154  # rc is assigned inside the trap string
trap 'rc=$?; [ $rc -eq 0 ] || printf "%s: ERROR: failed (exit %s) at line %s: %s\n" "$SCRIPT_NAME" "$rc" "$LINENO" "$BASH_COMMAND" >&2' ERR

[ "$(id -u)" -eq 0 ] || die "must run as root (apt, dockerd, debootstrap)"
command -v go >/dev/null || die "go not found (expected /usr/local/go/bin/go)"

now() { date +%s; }

# need_cmd CMD HINT: fail with a pointer to the script that provides CMD.
need_cmd() { command -v "$1" >/dev/null 2>&1 || die "$1 not found; run $2 first"; }

# ---- dockerd --------------------------------------------------------------------------------
# kind needs a Docker engine. We use a running one if there is one, otherwise start Debian's
# dockerd ourselves (there is no systemd here) and remember that we did, so kind-down.sh can
# stop exactly that daemon and leave a pre-existing one alone.
DOCKERD_PIDFILE=$DOCKER_STATE/dockerd.pid

docker_ok() { timeout 10 docker info >/dev/null 2>&1; }

# This VM's capability bounding set lacks CAP_SYS_RESOURCE (bit 24): runc then fails every
# `--privileged` container ("unable to apply caps"), and kind nodes are always privileged.
lacks_sys_resource() {
  local bnd; bnd=$(awk '/^CapBnd/{print $2}' /proc/self/status)
  (( (16#$bnd >> 24 & 1) == 0 ))
}

ensure_dockerd() {
  if docker_ok; then
    if lacks_sys_resource && ! docker info --format '{{.DefaultRuntime}}' 2>/dev/null | grep -q nosysres; then
      log "WARNING: using an already running dockerd whose default runtime is not the runc-nosysres"
      log "         wrapper; privileged containers (kind nodes) may fail on this VM"
    fi
    return 0
  fi
  need_cmd dockerd hack/k8s-tools.sh
  mkdir -p "$DOCKER_STATE"
  local args=(--storage-driver overlay2)
  if lacks_sys_resource; then
    # dockerd needs an absolute, stable path: copy the wrapper out of the clone.
    install -m 0755 "$HACK_DIR/kind/runc-nosysres" "$TOOLS_BIN/runc-nosysres"
    args+=(--add-runtime "nosysres=$TOOLS_BIN/runc-nosysres" --default-runtime nosysres)
  fi
  # dockerd rewrites host networking (ip_forward=1, iptables FORWARD policy DROP, DOCKER chains,
  # bridges). Remember the two settings it flips so stop_dockerd can hand the host back as found.
  printf 'ip_forward=%s\nforward_policy=%s\n' "$(cat /proc/sys/net/ipv4/ip_forward)" \
    "$(iptables -S FORWARD 2>/dev/null | awk '$1 == "-P" {print $3}')" > "$DOCKER_STATE/host-net.before"
  log "starting dockerd (log: $DOCKER_STATE/dockerd.log)"
  # setsid: the daemon must outlive this script and its process group. 9>&-: it must not
  # inherit the caller's with_lock descriptor, or it (and every container it starts) would hold
  # that lock for as long as it runs, and the next run of the caller would wait for it forever.
  setsid nohup dockerd "${args[@]}" >"$DOCKER_STATE/dockerd.log" 2>&1 </dev/null 9>&- &
  echo $! >"$DOCKERD_PIDFILE"
  local _
  for _ in $(seq 60); do
    docker_ok && { log "dockerd ready (pid $(cat "$DOCKERD_PIDFILE"))"; return 0; }
    kill -0 "$(cat "$DOCKERD_PIDFILE")" 2>/dev/null || break
    sleep 1
  done
  tail -20 "$DOCKER_STATE/dockerd.log" >&2 || true
  rm -f "$DOCKERD_PIDFILE"
  die "dockerd did not come up (see $DOCKER_STATE/dockerd.log)"
}

# with_lock NAME: serialize concurrent runs of the same step (e.g. parallel make targets)
# for the rest of the calling script. The lock is released when the script exits.
with_lock() {
  mkdir -p "$REVAULT_CACHE/locks"
  exec 9>"$REVAULT_CACHE/locks/$1.lock"
  flock -n 9 || { log "waiting for another $1 run to finish"; flock 9; }
}

# stop_dockerd: stop the dockerd that ensure_dockerd started (never another one: the pid file
# must name a live process called dockerd), then undo its host network changes: its iptables
# rules/chains, the FORWARD policy and ip_forward as they were before, and its bridges.
# Returns 1 (and does nothing) if containers still run on it.
stop_dockerd() {
  [ -f "$DOCKERD_PIDFILE" ] || return 0
  local pid; pid=$(cat "$DOCKERD_PIDFILE")
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != dockerd ]; then
    rm -f "$DOCKERD_PIDFILE"; return 0
  fi
  if [ -n "$(timeout 10 docker ps -q 2>/dev/null)" ]; then
    log "leaving dockerd (pid $pid) running: containers still run on it"; return 1
  fi
  log "stopping dockerd (pid $pid), which hack/ scripts started"
  kill "$pid"
  local _
  for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  if kill -0 "$pid" 2>/dev/null; then log "dockerd did not stop in 30 s: SIGKILL"; kill -9 "$pid" || true; sleep 1; fi
  rm -f "$DOCKERD_PIDFILE"

  local before=$DOCKER_STATE/host-net.before ipf="" pol=""
  [ -f "$before" ] || return 0
  ipf=$(sed -n 's/^ip_forward=//p' "$before"); pol=$(sed -n 's/^forward_policy=//p' "$before")
  # Drop exactly dockerd's rules (DOCKER* chains, rules on docker0 / br-<network id>), keep the rest.
  local t
  for t in filter nat; do
    iptables-save -t "$t" | grep -vE 'DOCKER|docker0|br-[0-9a-f]{12}' | iptables-restore -T "$t" ||
      log "WARNING: could not remove dockerd's iptables rules from table $t"
  done
  iptables -P FORWARD "${pol:-ACCEPT}" || true
  [ -z "$ipf" ] || echo "$ipf" > /proc/sys/net/ipv4/ip_forward
  local l
  for l in $(ip -o link show type bridge | awk -F': ' '{print $2}' | grep -E '^(docker0|br-[0-9a-f]{12})$'); do
    ip link delete "$l" || true
  done
  rm -f "$before"
  log "restored host networking (ip_forward=${ipf:-?}, FORWARD policy ${pol:-ACCEPT})"
}
