#!/usr/bin/env bash
# cluster.sh builds, starts and stops a one-node Kubernetes cluster on this
# machine, for the end-to-end tests (test/cluster) and for trying the chart:
# etcd and kube-apiserver from the test bed (hack/testbin.sh), and kubelet,
# kube-controller-manager, kube-scheduler, kube-proxy (iptables mode) and
# CoreDNS from the pinned module in hack/cluster, with Debian's containerd,
# runc and CNI plugins (bridge, host-local, loopback). No registry: images
# are imported into containerd (`ctr -n k8s.io images import`).
#
#   hack/cluster.sh            build once (cached by version outside the
#                              clone); print the folder of the binaries
#   hack/cluster.sh up [--stale-versions] DIR
#                              start a cluster whose every file is under DIR;
#                              DIR/kubeconfig is its admin's kubeconfig.
#                              --stale-versions starts kube-apiserver as the
#                              test bed's StaleVersions does: no watch cache
#                              and etcd compacted every 5 s, so a version
#                              goes "too old" within seconds of churn
#                              (with the cache it takes minutes)
#   hack/cluster.sh down DIR   stop it and undo every change to the host
#   hack/cluster.sh run        `make cluster`: build, start in a new folder,
#                              wait for Ctrl-C, stop
#
# It needs root (a node runs containers, a bridge and iptables rules) and
# installs the Debian packages it needs with apt-get when they are missing.
# The node takes machine-wide things: an address on lo (the node's IP, where
# every component listens), the bridge wgc0, iptables chains, cgroups under
# /watchgate-cluster, /var/log/containers links. So one cluster runs per
# machine at a time, behind the lock /run/lock/watchgate-cluster.lock, held
# by the cluster's own processes; `down` stops only the processes its `up`
# started (by the PIDs it recorded) and restores what it changed.
# Progress goes to stderr; stdout carries only what the command prints.
set -euo pipefail

KUBE_VERSION=v1.37.2
COREDNS_VERSION=v1.15.0
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${WATCHGATE_CLUSTER_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/watchgate/cluster}
bindir=$cache/$KUBE_VERSION

# The node's addresses. NODE_IP is added to lo; pods reach it (and through
# it the API server, kubelet and CoreDNS) over the bridge's gateway.
NODE_IP=10.245.0.1
NODE_NAME=watchgate-node
POD_CIDR=10.244.0.0/24
CLUSTER_CIDR=10.244.0.0/16
SERVICE_CIDR=10.96.0.0/16
KUBERNETES_SERVICE_IP=10.96.0.1
BRIDGE=wgc0
CGROUP_ROOT=watchgate-cluster
CNI_NETWORK=watchgate-cluster
PAUSE_IMAGE=localhost/watchgate/pause:$KUBE_VERSION
LOCK=/run/lock/watchgate-cluster.lock
OWNER=/run/lock/watchgate-cluster.owner
PACKAGES=(containerd runc containernetworking-plugins iptables)
CNI_BIN_DIR=/usr/lib/cni
# Sysctls the node's components may set (kubelet's kernel defaults,
# kube-proxy, the bridge plugin); `down` puts back what `up` found.
SYSCTLS=(net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
  net.ipv4.conf.all.route_localnet kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.netfilter.nf_conntrack_max)
# apiserver_args are kube-apiserver's flags beyond the node's own (up's
# --stale-versions).
apiserver_args=()

log() { echo ">> $*" >&2; }
# elapsed MS: seconds since MS (date +%s%3N), to a tenth.
elapsed() { local d=$(( $(date +%s%3N) - $1 )); printf '%d.%ds' $((d / 1000)) $((d % 1000 / 100)); }
die() { echo "cluster.sh: $*" >&2; exit 1; }

need_root() {
  [[ $(id -u) == 0 ]] || die "a node needs root (containers, a bridge, iptables); run as root, or install nothing and skip the cluster"
}

# packages installs the Debian packages when one of them is missing.
packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [[ -x $CNI_BIN_DIR/bridge && -x $CNI_BIN_DIR/host-local && -x $CNI_BIN_DIR/loopback ]] || missing+=(containernetworking-plugins)
  command -v iptables-save >/dev/null || missing+=(iptables)
  ((${#missing[@]} == 0)) && return 0
  if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
    die "missing Debian packages ${missing[*]}: install them (apt-get install ${PACKAGES[*]}) as root"
  fi
  log "installing ${missing[*]} with apt-get (once)"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${PACKAGES[@]}" >&2
}

# build builds the node's binaries and the pause image into $bindir once.
build() {
  if [[ -f $bindir/.complete ]]; then
    return 0
  fi
  mkdir -p "$bindir"
  local tmp start
  tmp=$(mktemp -d "$cache/.build.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  local minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
  local ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  log "building the node ($KUBE_VERSION: kubelet, kube-controller-manager, kube-scheduler, kube-proxy; CoreDNS $COREDNS_VERSION) into $bindir"
  log "a cold build takes ~7 minutes on 2 cores; later runs reuse it"
  start=$(date +%s)
  cd "$here/cluster"
  for target in k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy github.com/coredns/coredns ./pause ./imagetar; do
    local name
    name=$(basename "$target")
    log "  go build $name ($(( $(date +%s) - start ))s elapsed)"
    CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/$name" "$target"
  done
  "$tmp/imagetar" -binary "$tmp/pause" -ref "$PAUSE_IMAGE" -out "$tmp/pause.tar"
  rm "$tmp/pause"
  mv "$tmp"/* "$bindir"/
  touch "$bindir/.complete"
  log "node binaries ready in $(( $(date +%s) - start ))s: $bindir"
}

testbin() { "$here/testbin.sh"; }

# --- certificates and configuration --------------------------------------

# cert NAME CN O SANS USAGE: a key and a certificate signed by the cluster's CA.
cert() {
  local name=$1 cn=$2 o=$3 sans=$4 usage=$5 subj
  subj="/CN=$cn"
  [[ -n $o ]] && subj="/O=$o$subj"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$pki/$name.key" \
    -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
  {
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$usage"
    [[ -n $sans ]] && echo "subjectAltName=$sans"
  } >"$pki/$name.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 7 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
  rm "$pki/$name.csr" "$pki/$name.ext"
}

# kubeconfig NAME: a kubeconfig for the client certificate NAME.
kubeconfig() {
  cat >"$dir/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: watchgate-cluster
  cluster:
    server: https://$NODE_IP:6443
    certificate-authority: $pki/ca.crt
users:
- name: $1
  user:
    client-certificate: $pki/$1.crt
    client-key: $pki/$1.key
contexts:
- name: watchgate-cluster
  context: {cluster: watchgate-cluster, user: $1}
current-context: watchgate-cluster
EOF
}

configure() {
  pki=$dir/pki
  mkdir -p "$pki" "$dir/logs" "$dir/pids" "$dir/cni/net.d" "$dir/cni/ipam" "$dir/pod-logs"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$pki/ca.key" \
    -subj "/CN=watchgate-cluster-ca" -days 7 -out "$pki/ca.crt" 2>/dev/null
  cert apiserver kube-apiserver "" \
    "IP:$NODE_IP,IP:$KUBERNETES_SERVICE_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost" serverAuth
  cert admin admin system:masters "" clientAuth
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters "" clientAuth
  cert node "system:node:$NODE_NAME" system:nodes "" clientAuth
  cert controller-manager system:kube-controller-manager "" "" clientAuth
  cert scheduler system:kube-scheduler "" "" clientAuth
  cert kube-proxy system:kube-proxy "" "" clientAuth
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  for n in admin node controller-manager scheduler kube-proxy; do kubeconfig "$n"; done
  cp "$dir/admin.kubeconfig" "$dir/kubeconfig"

  cat >"$dir/containerd.toml" <<EOF
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "$dir/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # runc cannot set oom_score_adj without CAP_SYS_RESOURCE on these machines.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$dir/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
      Root = "$dir/runc"
EOF

  cat >"$dir/cni/net.d/10-watchgate.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$CNI_NETWORK",
  "plugins": [{
    "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
      "dataDir": "$dir/cni/ipam"}
  }]
}
EOF

  cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: $NODE_IP
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$dir/containerd.sock
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
podLogsDir: $dir/pod-logs
protectKernelDefaults: false
serializeImagePulls: false
maxPods: 250
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
EOF

  cat >"$dir/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $dir/kube-proxy.kubeconfig}
mode: iptables
hostnameOverride: $NODE_NAME
clusterCIDR: $CLUSTER_CIDR
bindAddress: $NODE_IP
healthzBindAddress: $NODE_IP:10256
metricsBindAddress: $NODE_IP:10249
nodePortAddresses: ["$NODE_IP/32"]
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF

  # Only the cluster's names are answered (no forward plugin): nothing a
  # test pod looks up leaves the machine.
  cat >"$dir/Corefile" <<EOF
.:53 {
    bind $NODE_IP
    errors
    ready $NODE_IP:8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $dir/admin.kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
}
EOF
}

# --- host state ------------------------------------------------------------

# record keeps what up changes on the host, for down to restore.
record() {
  local h=$dir/host
  mkdir -p "$h"
  iptables-save >"$h/iptables"
  ip6tables-save >"$h/ip6tables" 2>/dev/null || true
  for s in "${SYSCTLS[@]}"; do
    local v
    v=$(sysctl -n "$s" 2>/dev/null) && echo "$s=$v" >>"$h/sysctl"
  done
  ls /run/netns 2>/dev/null >"$h/netns" || true
  ls /run/containerd/s 2>/dev/null >"$h/shim-sockets" || true
  for d in /run/netns /run/containerd /var/log/containers /var/lib/cni; do
    [[ -e $d ]] || echo "$d" >>"$h/created-dirs"
  done
  touch "$h/created-dirs"
}

# --- processes ---------------------------------------------------------------

# start NAME CMD...: runs CMD in a session of its own, its output in
# logs/NAME.log, its PID in pids/NAME. It keeps fd 9, the lock.
start() {
  local name=$1; shift
  setsid "$@" >"$dir/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/pids/$name"
}

# wait_for WHAT SECONDS CMD...: polls CMD until it succeeds.
wait_for() {
  local what=$1 limit=$2 i; shift 2
  for ((i = 0; i < limit * 5; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  die "$what not ready after ${limit}s; logs in $dir/logs"
}

alive() { [[ -f $dir/pids/$1 ]] && kill -0 "$(cat "$dir/pids/$1")" 2>/dev/null; }

# stop NAME: SIGTERM, then SIGKILL after 10 s, the PID up recorded.
stop() {
  local f=$dir/pids/$1 pid i
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  if kill -TERM "$pid" 2>/dev/null; then
    for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 25; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  fi
  rm -f "$f"
}

lock() {
  exec 9>>"$LOCK"
  if ! flock -n 9; then
    local owner pid rundir
    owner=$(cat "$OWNER" 2>/dev/null || true)
    pid=${owner%% *} rundir=${owner#* }
    if [[ -n $owner && -n $pid ]] && ! kill -0 "$pid" 2>/dev/null && [[ -d $rundir ]]; then
      log "the cluster in $rundir outlived its owner (PID $pid): stopping it"
      "$here/cluster.sh" down "$rundir"
    else
      log "another cluster runs on this machine (${owner:-owner unknown}); waiting for it to stop (up to 15 min)"
    fi
    flock -w 900 9 || die "the lock $LOCK is still held by: $(cat "$OWNER" 2>/dev/null)"
  fi
  # The owner is the process that asked for the cluster (the test binary,
  # or this script for `run`); a cluster whose owner died is stale.
  echo "${WATCHGATE_CLUSTER_OWNER:-$PPID} $dir" >"$OWNER"
}

up() {
  need_root
  packages
  local tb start
  tb=$(testbin)
  build
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  lock
  start=$(date +%s%3N)
  # From here on, a failure undoes what was done.
  trap 'rc=$?; if ((rc != 0)); then log "up failed; stopping what started"; exec 9>&-; "$here/cluster.sh" down "$dir" || true; fi' EXIT
  record
  configure

  ip addr add "$NODE_IP/32" dev lo
  echo "$NODE_IP" >"$dir/host/lo-address"
  for c in /sys/fs/cgroup/*/; do
    [[ -d $c && $c != /sys/fs/cgroup/unified/ ]] && mkdir -p "$c$CGROUP_ROOT"
  done
  # A new cpuset (v1) has no CPUs or memory nodes until given its parent's.
  if [[ -f /sys/fs/cgroup/cpuset/cpuset.cpus ]]; then
    cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset/$CGROUP_ROOT/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/$CGROUP_ROOT/cpuset.mems"
  fi
  mkdir -p /var/log/containers

  start etcd "$tb/etcd" --name default --data-dir "$dir/etcd" --unsafe-no-fsync \
    --listen-client-urls "http://$NODE_IP:2379" --advertise-client-urls "http://$NODE_IP:2379" \
    --listen-peer-urls "http://$NODE_IP:2380" --initial-advertise-peer-urls "http://$NODE_IP:2380" \
    --initial-cluster "default=http://$NODE_IP:2380" --log-level warn
  start containerd containerd --config "$dir/containerd.toml"
  start kube-apiserver "$tb/kube-apiserver" --etcd-servers "http://$NODE_IP:2379" \
    --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port 6443 \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" --client-ca-file "$pki/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" --authorization-mode Node,RBAC --allow-privileged \
    --kubelet-preferred-address-types InternalIP,Hostname \
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
    "${apiserver_args[@]}"
  local curl_admin=(curl -sfk --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key")
  wait_for kube-apiserver 60 "${curl_admin[@]}" "https://$NODE_IP:6443/readyz"
  start kube-controller-manager "$bindir/kube-controller-manager" --kubeconfig "$dir/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$dir/controller-manager.kubeconfig" --authorization-kubeconfig "$dir/controller-manager.kubeconfig" \
    --bind-address "$NODE_IP" --leader-elect=false --use-service-account-credentials \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key"
  start kube-scheduler "$bindir/kube-scheduler" --kubeconfig "$dir/scheduler.kubeconfig" \
    --authentication-kubeconfig "$dir/scheduler.kubeconfig" --authorization-kubeconfig "$dir/scheduler.kubeconfig" \
    --bind-address "$NODE_IP" --leader-elect=false
  wait_for containerd 30 ctr -a "$dir/containerd.sock" version
  ctr -a "$dir/containerd.sock" -n k8s.io images import "$bindir/pause.tar" >/dev/null
  start kubelet "$bindir/kubelet" --config "$dir/kubelet.yaml" --kubeconfig "$dir/node.kubeconfig" \
    --root-dir "$dir/kubelet" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP"
  start kube-proxy "$bindir/kube-proxy" --config "$dir/kube-proxy.yaml"
  start coredns "$bindir/coredns" -conf "$dir/Corefile"
  local kubectl=("$tb/kubectl" --kubeconfig "$dir/kubeconfig")
  wait_for "node $NODE_NAME" 90 "${kubectl[@]}" wait --for=condition=Ready "node/$NODE_NAME" --timeout=1s
  wait_for kube-proxy 30 curl -sf "http://$NODE_IP:10256/healthz"
  wait_for CoreDNS 30 curl -sf "http://$NODE_IP:8181/ready"
  wait_for "the default ServiceAccount" 30 "${kubectl[@]}" get serviceaccount default
  trap - EXIT
  log "cluster up in $(elapsed "$start"): KUBECONFIG=$dir/kubeconfig"
}

# unmount_under PREFIX: unmounts every mount point under PREFIX, deepest first.
unmount_under() {
  local m
  awk -v p="$1" 'index($2, p) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
}

# remove_cgroups: the cgroups under /$CGROUP_ROOT, deepest first, once empty.
remove_cgroups() {
  local c i
  for ((i = 0; i < 50; i++)); do
    local left=0
    for c in /sys/fs/cgroup/*/"$CGROUP_ROOT"; do
      [[ -d $c ]] || continue
      find "$c" -depth -type d -exec rmdir {} + 2>/dev/null || true
      [[ -d $c ]] && left=1
    done
    ((left == 0)) && return 0
    sleep 0.2
  done
  log "cgroups under /$CGROUP_ROOT still in use"
}

# restore_tables CMD SNAPSHOT: puts back the rules of CMD (iptables or
# ip6tables) that CMD-save wrote into SNAPSHOT. A table that was not in the
# snapshot (nothing had used it) is emptied: its chains flushed, the ones
# the node created deleted.
restore_tables() {
  local cmd=$1 snapshot=$2 t
  {
    cat "$snapshot"
    for t in $("$cmd-save" 2>/dev/null | sed -n 's/^\*//p'); do
      grep -qx "\*$t" "$snapshot" || printf '*%s\nCOMMIT\n' "$t"
    done
  } | "$cmd-restore"
}

down() {
  need_root
  [[ -d $dir ]] || die "$dir: no such cluster folder"
  dir=$(cd "$dir" && pwd)
  local start h=$dir/host
  start=$(date +%s%3N)
  for p in kubelet kube-proxy coredns kube-scheduler kube-controller-manager; do stop "$p"; done
  # The pods' processes: every task's init and shim, by the PIDs containerd
  # wrote in its own state folder (shims outlive containerd by design).
  # Both are read before anything is killed: containerd deletes a task's
  # folder when its process exits. A shim is also known by the socket of
  # this cluster's containerd on its command line.
  local tasks=$dir/containerd/state/io.containerd.runtime.v2.task inits=() shims=() f p
  for f in "$tasks"/*/*/init.pid; do [[ -f $f ]] && inits+=("$(cat "$f")"); done
  for f in "$tasks"/*/*/shim.pid; do [[ -f $f ]] && shims+=("$(cat "$f")"); done
  for p in /proc/[0-9]*; do
    if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -q "^/usr/bin/containerd-shim.* -address $dir/containerd.sock"; then
      shims+=("${p#/proc/}")
    fi
  done
  ((${#inits[@]} == 0)) || kill -KILL "${inits[@]}" 2>/dev/null || true
  ((${#shims[@]} == 0)) || kill -KILL "${shims[@]}" 2>/dev/null || true
  stop containerd
  stop kube-apiserver
  stop etcd
  # The processes held the lock; hold it until the host is restored, so
  # that the next `up` records the host as it was before this cluster.
  exec 9>>"$LOCK"
  flock -w 60 9 || log "a process of $dir still holds $LOCK; restoring the host anyway"
  unmount_under "$dir/"
  if [[ -f $h/netns ]]; then
    for n in $(ls /run/netns 2>/dev/null); do
      grep -qx "$n" "$h/netns" && continue
      [[ $n == cni-* ]] || continue
      umount "/run/netns/$n" 2>/dev/null || true
      rm -f "/run/netns/$n"
    done
  fi
  if [[ -f $h/shim-sockets ]]; then
    for s in $(ls /run/containerd/s 2>/dev/null); do
      grep -qx "$s" "$h/shim-sockets" || rm -f "/run/containerd/s/$s"
    done
  fi
  remove_cgroups
  ip link del "$BRIDGE" 2>/dev/null || true
  if [[ -f $h/lo-address ]]; then
    ip addr del "$(cat "$h/lo-address")/32" dev lo 2>/dev/null || true
  fi
  [[ -f $h/iptables ]] && restore_tables iptables "$h/iptables"
  [[ -f $h/ip6tables ]] && restore_tables ip6tables "$h/ip6tables"
  if [[ -f $h/sysctl ]]; then
    while IFS= read -r kv; do sysctl -qw "$kv" >/dev/null 2>&1 || true; done <"$h/sysctl"
  fi
  for l in /var/log/containers/*; do
    [[ -L $l && $(readlink "$l") == "$dir"/* ]] && rm -f "$l"
  done
  rm -rf /var/lib/cni/results/"$CNI_NETWORK"-* 2>/dev/null || true
  if [[ -f $h/created-dirs ]]; then
    while IFS= read -r d; do
      [[ $d == /run/containerd ]] && rm -rf /run/containerd/s /run/containerd/runc 2>/dev/null
      [[ $d == /var/lib/cni ]] && rm -rf /var/lib/cni/results /var/lib/cni/networks 2>/dev/null
      rmdir "$d" 2>/dev/null || true
    done <"$h/created-dirs"
  fi
  rm -rf "$dir/containerd" "$dir/kubelet" "$dir/etcd" "$dir/runc"
  if [[ $(cat "$OWNER" 2>/dev/null) == *" $dir" ]]; then rm -f "$OWNER"; fi
  log "cluster down in $(elapsed "$start"); logs in $dir/logs"
}

run() {
  dir=$(mktemp -d /tmp/watchgate-cluster.XXXXXX)
  WATCHGATE_CLUSTER_OWNER=$$ up
  exec 9>&-
  trap 'down' EXIT
  trap 'exit 0' INT TERM
  echo "export KUBECONFIG=$dir/kubeconfig"
  log "kubectl: $(testbin)/kubectl; images: ctr -a $dir/containerd.sock -n k8s.io images import <tar>"
  log "the cluster runs until Ctrl-C"
  sleep infinity 9>&- &
  sleeper=$!
  trap 'kill "$sleeper" 2>/dev/null; down' EXIT
  wait "$sleeper"
}

case ${1:-build} in
  build)
    packages
    testbin >/dev/null
    build
    echo "$bindir"
    ;;
  up)
    if [[ ${2:-} == --stale-versions ]]; then
      apiserver_args=(--watch-cache=false --etcd-compaction-interval=5s)
      shift
    fi
    dir=${2:?usage: cluster.sh up [--stale-versions] DIR}
    up
    ;;
  down) dir=${2:?usage: cluster.sh down DIR}; down ;;
  run) run ;;
  *) die "usage: cluster.sh [build | up [--stale-versions] DIR | down DIR | run]" ;;
esac
