# Convenience targets; each is a thin wrapper over a script or go command that also works alone.
IMAGE ?= prefixmesh:dev
BIN   ?= bin

.PHONY: build test proto image chart-test demo bench

build:
	CGO_ENABLED=0 go build -trimpath -o $(BIN)/prefixmesh-node ./cmd/node
	CGO_ENABLED=0 go build -trimpath -o $(BIN)/prefixmesh-router ./cmd/router

test:
	scripts/test.sh

proto:
	scripts/genproto.sh

image:
	docker build -t $(IMAGE) .

chart-test:
	scripts/checkchart.sh

demo:
	go run ./cmd/router demo

bench:
	go test -run '^$$' -bench . -benchmem ./local/ ./routing/ ./node/
