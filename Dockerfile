# syntax=docker/dockerfile:1
#
# The watchgate image: one static binary on distroless, running as the
# nonroot user (65532). Build it with the version stamped in, e.g.
#
#   docker buildx build --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --platform linux/amd64,linux/arm64 -t ghcr.io/watchgate/watchgate:dev .
#
# The builder runs on the build machine's platform and cross-compiles
# (CGO_ENABLED=0), so multi-arch builds need no emulation.

FROM --platform=$BUILDPLATFORM golang:1.26 AS builder
# Set by BuildKit from --platform (linux/amd64 when not given).
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src

# Dependencies first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download

# Then the sources (.dockerignore keeps tests, tooling, charts and docs out).
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/watchgate .

FROM gcr.io/distroless/static:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="watchgate" \
      org.opencontainers.image.description="Watch budgets in front of kube-apiserver" \
      org.opencontainers.image.source="https://github.com/watchgate/watchgate" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=builder /out/watchgate /watchgate
# 65532 is distroless's "nonroot"; numeric so that runAsNonRoot can verify it.
USER 65532:65532
# 8443: proxy (HTTPS); 8080: /metrics; 8081: /healthz, /readyz.
EXPOSE 8443 8080 8081
ENTRYPOINT ["/watchgate"]
