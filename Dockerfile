# Multi-stage build: static binaries (CGO off) on a distroless, non-root base.
#   docker build -t prefixmesh:dev .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ENV CGO_ENABLED=0
RUN go build -trimpath -ldflags="-s -w" -o /out/prefixmesh-node ./cmd/node && \
    go build -trimpath -ldflags="-s -w" -o /out/prefixmesh-router ./cmd/router

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/prefixmesh-node /out/prefixmesh-router /
USER 65532:65532
EXPOSE 7070 8000 8080 7946/tcp 7946/udp 7000
ENTRYPOINT ["/prefixmesh-router"]
