#!/usr/bin/env bash
# Builds the binaries of gpuwarden's test control plane -- etcd, kube-apiserver,
# kube-controller-manager and kubectl, and the kube-scheduler that
# benchmarks/scheduler_fill.py compares gpuwarden with -- from their released
# Go modules and caches them outside the repository, keyed by version.
#
# Why from Go modules: the tests need a real API server (admission, RBAC,
# subresources, garbage collection), and the Go module proxy is the one source
# of released Kubernetes code that every build machine can reach.  The
# k8s.io/kubernetes module is not meant to be depended on: its go.mod requires
# every k8s.io/* staging module at the placeholder version v0.0.0 and replaces
# them with in-tree paths, and replace lines of a dependency are ignored.  So a
# throwaway module is generated here that requires k8s.io/kubernetes and pins
# each staging module -- the list is read from that go.mod's replace block --
# to the matching published v0.x release.
#
# Idempotent: a binary already in the cache is not rebuilt.  Each binary is
# built into a temporary folder and moved into place only when complete, so an
# interrupted build never leaves a half-written file that looks done.
#
# Environment:
#   GPUWARDEN_CACHE          cache folder (default ~/.cache/gpuwarden)
#   GPUWARDEN_K8S_VERSION    k8s.io/kubernetes release (default in versions.env)
#   GPUWARDEN_ETCD_VERSION   go.etcd.io/etcd release (default in versions.env)
#   KUBE_APISERVER, KUBE_CONTROLLER_MANAGER, KUBECTL, KUBE_SCHEDULER, ETCD
#                            existing binaries to use instead; set ones are
#                            checked and not built.
#   GOTOOLCHAIN              e.g. go1.27.3 when a release needs a newer Go
#                            than the installed one.
set -euo pipefail

# The default releases, shared with gpuwarden/localcluster/processes.py, which finds the binaries.
# shellcheck source=gpuwarden/localcluster/versions.env
source "$(dirname "${BASH_SOURCE[0]}")/../../gpuwarden/localcluster/versions.env"
K8S_VERSION="${GPUWARDEN_K8S_VERSION:-${K8S_VERSION}}"
ETCD_VERSION="${GPUWARDEN_ETCD_VERSION:-${ETCD_VERSION}}"
CACHE="${GPUWARDEN_CACHE:-${HOME}/.cache/gpuwarden}"
K8S_DIR="${CACHE}/kubernetes-${K8S_VERSION}"
ETCD_DIR="${CACHE}/etcd-${ETCD_VERSION}"

log() { printf '[controlplane %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
toolchain_hint="if go says a module requires a newer go, export GOTOOLCHAIN=go1.27.3 (go fetches that toolchain through the module proxy) and run again"

# An override must name a working executable: a typo should fail here, not as
# a confusing fixture error later.
check_override() {
    local var="$1" path="${!1:-}"
    [[ -n "${path}" ]] || return 1
    [[ -x "${path}" ]] || die "${var}=${path} is not an executable file"
    log "${var}=${path}: using it, not building"
    return 0
}

need_build() {
    local var="$1" path="$2"
    if check_override "${var}"; then return 1; fi
    if [[ -x "${path}" ]]; then
        log "${path} is present"
        return 1
    fi
    return 0
}

command -v go >/dev/null || die "Go is not installed (apt-get install golang, or a release from go.dev)"

# Modules are downloaded read-only by default, which makes `rm -rf` of a
# cache fail; writable module files keep cleanup simple.
export GOFLAGS="${GOFLAGS:+${GOFLAGS} }-modcacherw"
export CGO_ENABLED=0

mkdir -p "${CACHE}"
# Two `make test` runs at once (two checkouts, one cache) would compile the
# same binaries twice on a small machine; the second waits, then finds them.
exec 9>"${CACHE}/.build.lock"
if ! flock -n 9; then
    log "another build holds ${CACHE}/.build.lock; waiting for it"
    flock 9
fi
WORK="$(mktemp -d "${CACHE}/build.XXXXXX")"
trap 'rm -rf "${WORK}"' EXIT

# ---------------------------------------------------------------- kubernetes
k8s_targets=()
need_build KUBE_APISERVER "${K8S_DIR}/kube-apiserver" && k8s_targets+=(kube-apiserver)
need_build KUBE_CONTROLLER_MANAGER "${K8S_DIR}/kube-controller-manager" && k8s_targets+=(kube-controller-manager)
need_build KUBECTL "${K8S_DIR}/kubectl" && k8s_targets+=(kubectl)
need_build KUBE_SCHEDULER "${K8S_DIR}/kube-scheduler" && k8s_targets+=(kube-scheduler)

if ((${#k8s_targets[@]})); then
    started=${SECONDS}
    log "building ${k8s_targets[*]} from k8s.io/kubernetes@${K8S_VERSION} (first time: several minutes)"
    mod="${WORK}/k8s"
    mkdir -p "${mod}/bin"

    log "downloading the k8s.io/kubernetes@${K8S_VERSION} go.mod"
    gomod_file="$(cd "${WORK}" && go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" |
        sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    [[ -f "${gomod_file}" ]] || die "could not download the go.mod of k8s.io/kubernetes@${K8S_VERSION}"

    # vX.Y.Z of kubernetes is released together with v0.Y.Z of each staging module.
    staging_version="v0.${K8S_VERSION#v1.}"
    mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\1#p' "${gomod_file}")
    ((${#staging[@]})) || die "found no staging replace lines in ${gomod_file}"
    go_directive="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "${gomod_file}")"

    {
        echo "// Generated by tests/controlplane/build.sh: builds the test control plane."
        echo "module gpuwarden.io/controlplane-build"
        echo
        echo "go ${go_directive}"
        echo
        echo "require k8s.io/kubernetes ${K8S_VERSION}"
        echo
        echo "replace ("
        for m in "${staging[@]}"; do
            echo "	${m} => ${m} ${staging_version}"
        done
        echo ")"
    } >"${mod}/go.mod"
    log "pinned ${#staging[@]} staging modules to ${staging_version}"

    pkgs=()
    for t in "${k8s_targets[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/${t}"); done

    log "resolving dependencies (downloads on the first run)"
    (cd "${mod}" && go get "${pkgs[@]/%/@${K8S_VERSION}}") || die "resolving k8s.io/kubernetes@${K8S_VERSION} failed; ${toolchain_hint}"

    # The same version stamps the release build sets (hack/lib/version.sh), so
    # `kubectl version` and /version report the real release, not v0.0.0-master.
    minor="${K8S_VERSION#v1.}"
    minor="${minor%%.*}"
    ldflags="-s -w"
    for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
        ldflags+=" -X ${pkg}.gitVersion=${K8S_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor}"
        ldflags+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
    done

    log "compiling ${pkgs[*]}"
    (cd "${mod}" && go build -trimpath -ldflags="${ldflags}" -o "${mod}/bin/" "${pkgs[@]}") ||
        die "building ${k8s_targets[*]} failed; ${toolchain_hint}"

    mkdir -p "${K8S_DIR}"
    for t in "${k8s_targets[@]}"; do
        [[ -x "${mod}/bin/${t}" ]] || die "go build produced no ${t}"
        mv -f "${mod}/bin/${t}" "${K8S_DIR}/${t}" # same file system: an atomic rename
        log "installed ${K8S_DIR}/${t}"
    done
    log "kubernetes binaries built in $((SECONDS - started))s"
fi

# ---------------------------------------------------------------------- etcd
if need_build ETCD "${ETCD_DIR}/etcd"; then
    started=${SECONDS}
    log "building etcd from go.etcd.io/etcd/server/v3@${ETCD_VERSION}"
    mod="${WORK}/etcd"
    mkdir -p "${mod}/bin"
    gomod_file="$(cd "${WORK}" && go mod download -json "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" |
        sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    [[ -f "${gomod_file}" ]] || die "could not download the go.mod of go.etcd.io/etcd/server/v3@${ETCD_VERSION}"
    go_directive="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "${gomod_file}")"
    {
        echo "// Generated by tests/controlplane/build.sh: builds etcd for the test control plane."
        echo "module gpuwarden.io/etcd-build"
        echo
        echo "go ${go_directive}"
    } >"${mod}/go.mod"
    (cd "${mod}" && go get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}") ||
        die "resolving go.etcd.io/etcd/server/v3@${ETCD_VERSION} failed; ${toolchain_hint}"
    log "compiling etcd"
    (cd "${mod}" && go build -trimpath -ldflags="-s -w" -o "${mod}/bin/etcd" go.etcd.io/etcd/server/v3) ||
        die "building etcd failed; ${toolchain_hint}"
    mkdir -p "${ETCD_DIR}"
    mv -f "${mod}/bin/etcd" "${ETCD_DIR}/etcd"
    log "installed ${ETCD_DIR}/etcd in $((SECONDS - started))s"
fi

log "control plane binaries ready in ${CACHE}"
