#!/usr/bin/env bash
# Generate the operator's derived files with controller-gen (pinned in lib.sh, installed by
# hack/k8s-tools.sh), or check that the committed ones are current.
#
# usage: hack/operator-gen.sh generate [ROOT]   deepcopy: operator/api/v1alpha1/zz_generated.deepcopy.go
#        hack/operator-gen.sh manifests [ROOT]  CRDs and RBAC into config/crd/bases and config/rbac,
#                                               and the chart's copies (charts/revault/templates/crds,
#                                               charts/revault/files/role.yaml)
#        hack/operator-gen.sh verify            regenerate both into a scratch copy and diff with the
#                                               repository; fails (listing the stale files) when they differ
# ROOT defaults to the repository; it must hold operator/, config/ and charts/.
set -Eeuo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REPO=$(cd "$HACK_DIR/.." && pwd)
need_cmd controller-gen hack/k8s-tools.sh
have=$(go version -m "$(command -v controller-gen)" | awk '$1 == "mod" {print $3; exit}')
[ "$have" = "$CONTROLLER_GEN_VERSION" ] ||
  die "controller-gen is $have, want $CONTROLLER_GEN_VERSION: run hack/k8s-tools.sh"

gen_deepcopy() {
  (cd "$1/operator" && controller-gen object paths=./api/...)
}

# The chart ships the same CRDs, wrapped so `crd.enabled=false` leaves them out and annotated so
# `helm uninstall` keeps them (deleting a CRD deletes every BackupSeries with it).
chart_crd() {
  local src=$1
  if grep -q '{{' "$src"; then die "$src contains '{{', which Helm would take for a template"; fi
  printf '{{- if .Values.crd.enabled }}\n'
  awk '
    /^  annotations:$/ && !done { print; print "    helm.sh/resource-policy: keep"; done = 1; next }
    { print }
    END { if (!done) { print "operator-gen: no metadata.annotations in CRD" > "/dev/stderr"; exit 1 } }
  ' "$src"
  printf '{{- end }}\n'
}

gen_manifests() {
  local root=$1
  mkdir -p "$root/config/crd/bases" "$root/config/rbac" "$root/charts/revault/templates/crds" "$root/charts/revault/files"
  rm -f "$root"/config/crd/bases/*.yaml
  # The operator's role from every package but internal/rbac/datamover, whose markers make a
  # role of their own: the chart grants it only with the Velero data mover on.
  (cd "$root/operator" && controller-gen rbac:roleName=manager-role crd \
    paths="{./api/...,./cmd/...,./internal/controller/...,./internal/config/...,./internal/plan/...,./internal/tokens/...,./internal/metrics/...}" \
    output:crd:artifacts:config="$root/config/crd/bases" \
    output:rbac:artifacts:config="$root/config/rbac")
  mkdir -p "$root/config/rbac/datamover"
  (cd "$root/operator" && controller-gen rbac:roleName=datamover-role paths=./internal/rbac/datamover/... \
    output:rbac:artifacts:config="$root/config/rbac/datamover")
  rm -f "$root"/charts/revault/templates/crds/*.yaml
  local f
  for f in "$root"/config/crd/bases/*.yaml; do
    chart_crd "$f" > "$root/charts/revault/templates/crds/$(basename "$f")"
  done
  # The chart's RBAC templates read the generated rules from here, so they cannot drift.
  cp "$root/config/rbac/role.yaml" "$root/charts/revault/files/role.yaml"
  cp "$root/config/rbac/datamover/role.yaml" "$root/charts/revault/files/datamover-role.yaml"
}

case "${1:-}" in
  generate)  gen_deepcopy "${2:-$REPO}" ;;
  manifests) gen_manifests "${2:-$REPO}" ;;
  verify)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    cp -a "$REPO/operator" "$REPO/config" "$REPO/charts" "$tmp/"
    rm -rf "$tmp/operator/bin"
    gen_deepcopy "$tmp"
    gen_manifests "$tmp"
    stale=0
    for d in operator/api config charts/revault/templates/crds charts/revault/files; do
      diff -ru "$REPO/$d" "$tmp/$d" >&2 || stale=1
    done
    [ $stale = 0 ] || die "generated files are stale: run 'make manifests generate' and commit the result"
    log "generated files are current (deepcopy, CRDs, RBAC, chart CRDs)"
    ;;
  *) sed -n '2,12p' "$0" >&2; exit 2 ;;
esac
