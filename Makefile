# watchgate — the two commands that matter are `make demo` and `make test`.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
# Tools are pinned in their own modules under hack/ so go.mod stays lean.
CONTROLLER_GEN := go tool -modfile=hack/tools/go.mod controller-gen
HELM := go tool -modfile=hack/tools/go.mod helm
GOLANGCI_LINT := go tool -modfile=$(CURDIR)/hack/tools/go.mod golangci-lint
# The modules under hack/ with code of their own, vetted, linted and tested
# one by one (each has its own go.mod). hack/testbin (etcd's main, one line)
# and hack/tools (no code) only have to be tidy.
HACK_MODULES := hack/bench hack/cluster hack/demo hack/image
TIDY_MODULES := . $(HACK_MODULES) hack/testbin hack/tools

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: plugin ## Build bin/watchgate and the kubectl plugin bin/kubectl-watchgate.
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o bin/watchgate .

.PHONY: plugin
plugin: ## Build the kubectl plugin bin/kubectl-watchgate (`kubectl watchgate top` with it on the PATH).
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o bin/kubectl-watchgate ./cmd/kubectl-watchgate

PLUGIN_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
.PHONY: plugin-dist
plugin-dist: ## Build the plugin's release archives for krew (.krew.yaml): bin/plugin/kubectl-watchgate_<version>_<os>_<arch>.tar.gz.
	@mkdir -p bin/plugin
	for p in $(PLUGIN_PLATFORMS); do \
	  os=$${p%/*} arch=$${p#*/} dir=bin/plugin/$${p%/*}_$${p#*/}; mkdir -p $$dir; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch go build -trimpath -ldflags "$(LDFLAGS)" -o $$dir/kubectl-watchgate ./cmd/kubectl-watchgate && \
	  cp LICENSE $$dir/ && tar -C $$dir -czf bin/plugin/kubectl-watchgate_$(VERSION)_$${os}_$${arch}.tar.gz kubectl-watchgate LICENSE || exit 1; \
	done

.PHONY: testbin
testbin: ## Build (once, cached by version) the test bed's kube-apiserver, etcd and kubectl; prints where.
	@hack/testbin.sh

.PHONY: cluster
cluster: ## Start a one-node cluster (kubelet + containerd, kube-proxy, CoreDNS; root, Linux) until Ctrl-C; builds its binaries once, cached by version.
	@hack/cluster.sh run

.PHONY: manifests
manifests: ## Render CRD and RBAC from the API types' markers into config/ and the chart.
	$(CONTROLLER_GEN) rbac:roleName=watchgate-manager crd paths=. paths=./api/... paths=./controllers paths=./proxy/... \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	@# Injection's permissions (ConfigMaps, pods, namespaces cluster-wide)
	@# are their own ClusterRole, granted only when injection is on.
	$(CONTROLLER_GEN) rbac:roleName=watchgate-injector paths=./inject/... \
		output:rbac:artifacts:config=config/webhook/rbac
	charts/watchgate/hack/sync-generated.sh

.PHONY: generate
generate: ## Generate deepcopy code and server-side apply configurations (api/v1alpha1/applyconfiguration) for the API types.
	$(CONTROLLER_GEN) object applyconfiguration paths=./api/v1alpha1

.PHONY: vet
vet: ## go vet every package.
	go vet ./...

.PHONY: lint
lint: ## Lint the root module and each module under hack/ with golangci-lint (.golangci.yml; pinned in hack/tools).
	@failed=; for m in . $(HACK_MODULES); do \
	  echo ">> golangci-lint run ./... in $$m"; (cd $$m && $(GOLANGCI_LINT) run ./...) || failed="$$failed $$m"; \
	done; \
	if [ -n "$$failed" ]; then echo "golangci-lint found issues in:$$failed" >&2; exit 1; fi

.PHONY: verify
verify: verify-generated verify-tidy lint ## Check generated files are fresh, every go.mod is tidy, and lint passes.

.PHONY: verify-generated
verify-generated: ## Fail when `make manifests generate` would change a file (the tree is left as it is).
	@echo ">> hack/verify-generated.sh" && hack/verify-generated.sh

.PHONY: verify-tidy
verify-tidy: ## Fail when `go mod tidy` would change the go.mod or go.sum of the root module or a module under hack/.
	@for m in $(TIDY_MODULES); do \
	  echo ">> go mod tidy -diff in $$m" && (cd $$m && go mod tidy -diff) || { echo "run go mod tidy in $$m" >&2; exit 1; }; \
	done

.PHONY: test
test: verify ## Run make verify, then every test (unit, integration, end to end) against a real kube-apiserver + etcd and, as root on Linux, a one-node cluster (test/cluster), with -race.
	@assets=$$(hack/testbin.sh) && \
	if [[ $$(uname) == Linux && $$(id -u) == 0 ]]; then hack/cluster.sh >/dev/null; \
	else echo "!!! not root on Linux: the cluster tests (test/cluster) will SKIP"; fi && \
	echo ">> go vet ./..." && go vet ./... && \
	echo ">> go test -race -count=1 ./... (KUBEBUILDER_ASSETS=$$assets)" && \
	KUBEBUILDER_ASSETS=$$assets go test -race -count=1 -timeout 40m ./... && \
	for m in $(HACK_MODULES); do \
	  echo ">> go vet + go test -race ./... in $$m (its own module)" && \
	  (cd $$m && go vet ./... && go test -race -count=1 ./...) || exit 1; \
	done

.PHONY: bench
bench: build ## Measure direct vs a bare reverse proxy vs watchgate on a real API server (~3 min); writes BENCHMARKS.md. BENCH_FLAGS="-write=false -cpuprofile /tmp/wg.cpu" profiles watchgate.
	@assets=$$(hack/testbin.sh) && echo ">> go run ./hack/bench (compiles on the first run)" && cd hack/bench && KUBEBUILDER_ASSETS=$$assets go run . -watchgate ../../bin/watchgate $(BENCH_FLAGS)

.PHONY: bench-go
bench-go: ## Run the Go benchmarks of the engine and the proxy (ratelimit/, proxy/).
	@assets=$$(hack/testbin.sh) && KUBEBUILDER_ASSETS=$$assets go test -run '^$$' -bench . -benchmem ./ratelimit/ ./proxy/...

LOAD_WATCHES ?= 10000
LOAD_HOLD ?= 2m
LOAD_HOLD_WATCHES ?= 30000
LOAD_EVENTS ?= 1000
LOAD_EVENT_TIME ?= 60s
LOAD_EVENT_ROUNDS ?= 20
LOAD_PROFILE_DIR ?=
LOAD_CLIENT_WATCHES ?= 12500
.PHONY: load
load: build ## Load run (~10 min at 10,000 watches, ~15 at LOAD_WATCHES=50000; not in `make test`): watchgate vs a bare proxy side by side, opening, idle and event delivery; a 1 GiB replica held at LOAD_HOLD_WATCHES; profiles into LOAD_PROFILE_DIR; writes BENCHMARKS.md. LOAD_CLIENT_WATCHES: watches per client process (12,500; a few hundred runs several processes at a small LOAD_WATCHES).
	@assets=$$(hack/testbin.sh) && KUBEBUILDER_ASSETS=$$assets LOAD_WATCHES=$(LOAD_WATCHES) LOAD_HOLD=$(LOAD_HOLD) LOAD_CLIENT_WATCHES=$(LOAD_CLIENT_WATCHES) \
		LOAD_HOLD_WATCHES=$(LOAD_HOLD_WATCHES) LOAD_EVENTS=$(LOAD_EVENTS) LOAD_EVENT_TIME=$(LOAD_EVENT_TIME) LOAD_EVENT_ROUNDS=$(LOAD_EVENT_ROUNDS) LOAD_PROFILE_DIR=$(if $(LOAD_PROFILE_DIR),$(abspath $(LOAD_PROFILE_DIR))) \
		LOAD_WRITE=$(CURDIR)/BENCHMARKS.md go test -tags load -count=1 -timeout 90m -run '^TestLoad$$' -v ./test/e2e/

HOSTILE_ATTACK ?= 60s
HOSTILE_LOOPS ?=
# own: the attacker on CPU 1, everything under test on CPU 0;
# shared: nothing pinned.
HOSTILE_CPU ?= own
# DryRun (the chart's budgets as shipped) or Enforce; empty runs both.
HOSTILE_ENFORCEMENT ?=
.PHONY: load-hostile
load-hostile: build ## Hostile tenant (~6 min, not in `make test`): one identity attacks a charted replica while a routed agent with 70 informers restarts, with the chart's budgets as shipped (DryRun) and enforcing (writes BENCHMARKS.md); then an agent reopens 10,000 watches and a 12-account swarm attacks, and a tenant leaves 260 watches and 420 lists unread beside another tenant (figures logged).
	@assets=$$(hack/testbin.sh) && KUBEBUILDER_ASSETS=$$assets HOSTILE_ATTACK=$(HOSTILE_ATTACK) HOSTILE_LOOPS=$(HOSTILE_LOOPS) HOSTILE_CPU=$(HOSTILE_CPU) HOSTILE_ENFORCEMENT=$(HOSTILE_ENFORCEMENT) \
		LOAD_WRITE=$(CURDIR)/BENCHMARKS.md go test -tags load -count=1 -timeout 30m -run '^TestLoadHostile' -v ./test/e2e/

# The image: its name, platforms, and what stamps it. SOURCE_DATE_EPOCH (the
# commit's time) is every time in it, so one commit gives one digest.
IMAGE ?= ghcr.io/watchgate/watchgate
PLATFORMS ?= linux/amd64,linux/arm64
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

.PHONY: image
image: ## Build the image without a container engine for linux/amd64 and linux/arm64: bin/image/oci (OCI layout), a docker-load/crane-push tarball and an SPDX SBOM per platform.
	cd hack/image && SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) go run . -src $(CURDIR) -out $(CURDIR)/bin/image -repository $(IMAGE) -version $(VERSION) -revision $(REVISION) -platforms $(PLATFORMS)

.PHONY: docker-build
docker-build: ## Build the same image with a Docker engine (buildx), for the engine's platform.
	docker buildx build --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) \
		--build-arg CREATED=$$(date -u -d @$(SOURCE_DATE_EPOCH) +%Y-%m-%dT%H:%M:%SZ) -t $(IMAGE):$(VERSION) .

DEMO_CLIENTS ?= 20
DEMO_STORM ?= 10s
DEMO_FLAGS ?=
.PHONY: demo
demo: ## Build everything, start a local control plane, put watchgate in front, show a storm being stopped. DEMO_CLIENTS=1000 storms with 1,000 clients (1-2000, default 20), DEMO_STORM each storm's length (1s-1m, default 10s); DEMO_FLAGS=--cpuprofile=/tmp/wg.cpu profiles watchgate over its storm.
	@hack/demo.sh --clients $(DEMO_CLIENTS) --storm $(DEMO_STORM) $(DEMO_FLAGS)
