# syntax=docker/dockerfile:1
#
# The watchgate image, for those who build with Docker. `make image` builds
# the same image without a container engine (hack/image); this file gives it
# the same content: one static binary on scratch, with the base files
# hack/image writes (the nonroot user 65532 in /etc/passwd and /etc/group,
# /etc/nsswitch.conf, the CA bundle, the licence, /tmp), the same config and
# the same labels. A test in test/packaging keeps the two in agreement.
# Build it with the version, commit and commit time stamped in (`make
# docker-build` does), e.g.
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg CREATED=$(date -u -d @$(git log -1 --format=%ct) +%Y-%m-%dT%H:%M:%SZ) \
#     -t ghcr.io/watchgate/watchgate:dev .
#
# The builder runs on the build machine's platform and cross-compiles
# (CGO_ENABLED=0), so multi-arch builds need no emulation.

FROM --platform=$BUILDPLATFORM golang:1.26 AS builder
# Set by BuildKit from --platform (linux/amd64 when not given).
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src

# Dependencies first: this layer is reused until a go.mod or go.sum changes.
COPY go.mod go.sum ./
COPY hack/image/go.mod hack/image/go.sum hack/image/
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download && cd hack/image && go mod download

# Then the sources (.dockerignore keeps tests, other tooling, charts and
# docs out).
COPY . .
# The base files, written by the program `make image` takes them from.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    cd hack/image && go run . -src /src -rootfs /out/rootfs
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOFLAGS= GOAMD64=v1 GOARM64=v8.0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false -ldflags "-s -w -X main.version=${VERSION}" -o /out/watchgate .

FROM scratch
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=1970-01-01T00:00:00Z
LABEL org.opencontainers.image.title="watchgate" \
      org.opencontainers.image.description="Watch budgets in front of kube-apiserver" \
      org.opencontainers.image.source="https://github.com/watchgate/watchgate" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
COPY --from=builder /out/rootfs/ /
COPY --from=builder /out/watchgate /watchgate
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# distroless's "nonroot"; numeric so that runAsNonRoot can verify it.
USER 65532:65532
# 8443: proxy (HTTPS); 8080: /metrics; 8081: /healthz, /readyz.
EXPOSE 8443/tcp 8080/tcp 8081/tcp
ENTRYPOINT ["/watchgate"]
