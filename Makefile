# watchgate — the two commands that matter are `make demo` and `make test`.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
# Tools are pinned in their own modules under hack/ so go.mod stays lean.
CONTROLLER_GEN := go tool -modfile=hack/tools/go.mod controller-gen
HELM := go tool -modfile=hack/tools/go.mod helm

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build bin/watchgate.
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o bin/watchgate .

.PHONY: testbin
testbin: ## Build (once, cached by version) the test bed's kube-apiserver, etcd and kubectl; prints where.
	@hack/testbin.sh

.PHONY: manifests
manifests: ## Render CRD and RBAC from the API types' markers into config/ and the chart.
	$(CONTROLLER_GEN) rbac:roleName=watchgate-manager crd paths=./api/... paths=./controllers/... paths=./proxy/... \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	charts/watchgate/hack/sync-generated.sh

.PHONY: generate
generate: ## Generate deepcopy code for the API types.
	$(CONTROLLER_GEN) object paths=./api/...

.PHONY: vet
vet: ## go vet every package.
	go vet ./...

.PHONY: test
test: ## Run every test (unit, integration, end to end) against a real kube-apiserver + etcd, with -race.
	@assets=$$(hack/testbin.sh) && \
	echo ">> go vet ./..." && go vet ./... && \
	echo ">> go test -race -count=1 ./... (KUBEBUILDER_ASSETS=$$assets)" && \
	KUBEBUILDER_ASSETS=$$assets go test -race -count=1 -timeout 40m ./...

.PHONY: bench
bench: ## Run the engine and proxy benchmarks (results go in BENCHMARKS.md).
	@assets=$$(hack/testbin.sh) && KUBEBUILDER_ASSETS=$$assets go test -run '^$$' -bench . -benchmem ./ratelimit/ ./proxy/

LOAD_WATCHES ?= 10000
LOAD_HOLD ?= 2m
.PHONY: load
load: build ## Load run (~15 min, not in `make test`): 10,000 idle watches vs a bare proxy, a held replica, the memory guard; writes BENCHMARKS.md.
	@assets=$$(hack/testbin.sh) && KUBEBUILDER_ASSETS=$$assets LOAD_WATCHES=$(LOAD_WATCHES) LOAD_HOLD=$(LOAD_HOLD) \
		LOAD_WRITE=$(CURDIR)/BENCHMARKS.md go test -tags load -count=1 -timeout 60m -run '^TestLoad$$' -v ./test/e2e/

.PHONY: docker-build
docker-build: ## Build the container image (needs a Docker engine).
	docker buildx build --build-arg VERSION=$(VERSION) -t ghcr.io/watchgate/watchgate:$(VERSION) .

.PHONY: demo
demo: ## Build everything, start a local control plane, put watchgate in front, show a storm being stopped.
	@hack/demo.sh
