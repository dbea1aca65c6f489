# Crescent build. `make bench` and `make test` install what they need
# (make deps) on a fresh Debian machine.
SHELL := /bin/bash
GO ?= go
export GOFLAGS ?= -buildvcs=false
# Native transports (cgo) are opt-in build tags, on when deps installed
# their headers; see scripts/native-tags.
TAGS ?= $(shell scripts/native-tags)
# Debian packages the build, tests and benchmarks use.
DEB_PACKAGES := ca-certificates gcc python3 python3-zmq python3-msgpack python3-grpcio nghttp2-client \
	redis-server file libibverbs-dev rdma-core ibverbs-providers libfabric-dev protobuf-compiler \
	chromium
BENCH_FLAGS ?= --table --duration 5 --threads 2 --buffer_size 256MiB
TEST_TIMEOUT ?= 14m

.PHONY: all deps build test race nocgo bench lint fmt invariants clean proto proto-check msgp msgp-check lib ctest

# Generated gRPC code is committed; these pinned generators make it.
PROTOC_GEN_GO := google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_GO_GRPC := google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
PROTOC_GEN_VTPROTO := github.com/planetscale/vtprotobuf/cmd/protoc-gen-go-vtproto@v0.6.0
PROTO_GENS = $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc $(TOOLS)/protoc-gen-go-vtproto $(TOOLS)/protoc-gen-decodehelp
TOOLS := $(CURDIR)/bin/tools
PROTOS := store/storepb/master.proto
MSGP := github.com/tinylib/msgp@v1.6.5
# Packages whose msgp code is generated (go:generate msgp).
MSGP_PKGS := ha/oplog ha/snapshot

all: build

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "make deps: installing$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@$(GO) mod download

# GOFLAGS above (or the environment's) may turn VCS stamping off; the
# binaries get it back where git can read the checkout (not, say, a
# checkout owned by another user without safe.directory), so --version
# shows the revision.
VCS_FLAG := $(shell git status --porcelain >/dev/null 2>&1 && echo -buildvcs=true)

build:
	@mkdir -p bin
	$(GO) build $(VCS_FLAG) -tags "$(TAGS)" -o bin/ ./cmd/...

# The test command of the README and of CI: lint, stale generated code,
# the no-cgo build, every test under the race detector, with external
# services required, and the C and Python tests of the C ABI.
# The second pass runs with the invariants checks compiled in, over the
# packages those checks change (every package that depends on
# internal/invariants) under engine/, internal/ and the store's allocator
# and hot cache; for any other package the tag changes nothing.
INVARIANT_PKGS = $(GO) list -tags "invariants $(TAGS)" -f '{{.ImportPath}} {{join .Deps " "}}' \
	./engine/... ./internal/... ./store/alloc ./store/local | awk '/crescent\/internal\/invariants( |$$)/ {print $$1}'

test: deps lint proto-check msgp-check nocgo
	CRESCENT_REQUIRE_DEPS=1 $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -tags "$(TAGS)" ./...
	CRESCENT_REQUIRE_DEPS=1 $(GO) test -count=1 -tags "invariants $(TAGS)" $$($(INVARIANT_PKGS))
	$(MAKE) ctest

# The C ABI: build/libcrescent.so for include/crescent.h (the cgo header
# it generates, build/libcrescent.h, is for reference only).
lib:
	@mkdir -p build
	$(GO) build -tags "$(TAGS)" -buildmode=c-shared -o build/libcrescent.so ./capi

# C tests, the C example and the Python tests (python/tests) against a
# master started on a free loopback port.
ctest: lib build
	csrc/run_tests.sh

race:
	$(GO) test -race -count=1 -tags "$(TAGS)" ./...

invariants:
	$(GO) test -count=1 -tags "invariants $(TAGS)" ./...

nocgo:
	CGO_ENABLED=0 $(GO) build ./...
	CGO_ENABLED=0 $(GO) vet ./...

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet -tags "$(TAGS)" ./...
	@$(GO) mod tidy -diff >/dev/null || { echo "go mod tidy would change go.mod/go.sum: run it and commit"; exit 1; }
	@elf=$$(git ls-files -z 2>/dev/null | xargs -0 -r file 2>/dev/null | grep -E ': +ELF' | cut -d: -f1); \
	if [ -n "$$elf" ]; then echo "built binaries are tracked: $$elf"; exit 1; fi

fmt:
	gofmt -w $$(git ls-files '*.go')

# The main job: a loopback transfer benchmark (shm and tcp, write and
# read, 64 KiB and 1 MiB) beside the same run's memcpy and raw-TCP
# baselines.
bench: deps build
	bin/crescent-bench transfer $(BENCH_FLAGS)

$(TOOLS)/protoc-gen-go:
	GOBIN=$(TOOLS) $(GO) install $(PROTOC_GEN_GO)

$(TOOLS)/protoc-gen-go-grpc:
	GOBIN=$(TOOLS) $(GO) install $(PROTOC_GEN_GO_GRPC)

$(TOOLS)/protoc-gen-go-vtproto:
	GOBIN=$(TOOLS) $(GO) install $(PROTOC_GEN_VTPROTO)

# Ours (internal/protoc-gen-decodehelp): rebuilt whenever its source changes.
$(TOOLS)/protoc-gen-decodehelp: internal/protoc-gen-decodehelp/main.go
	$(GO) build -o $@ ./internal/protoc-gen-decodehelp

define protoc
	PATH=$(TOOLS):$$PATH protoc -I store/storepb \
		--go_out=$(1) --go_opt=paths=source_relative \
		--go-grpc_out=$(1) --go-grpc_opt=paths=source_relative \
		--go-vtproto_out=$(1) --go-vtproto_opt=paths=source_relative,features=marshal+unmarshal+size \
		--decodehelp_out=$(1) --decodehelp_opt=paths=source_relative $(PROTOS)
endef

proto: $(PROTO_GENS)
	$(call protoc,store/storepb)

# Fails when the committed generated code is not what the generators make.
proto-check: $(PROTO_GENS)
	@tmp=$$(mktemp -d); $(call protoc,$$tmp); \
	for f in $$tmp/*.go; do \
		cmp -s $$f store/storepb/$$(basename $$f) || { echo "stale: store/storepb/$$(basename $$f) (run make proto)"; rm -rf $$tmp; exit 1; }; \
	done; rm -rf $$tmp; echo "generated code up to date"

$(TOOLS)/msgp:
	GOBIN=$(TOOLS) $(GO) install $(MSGP)

msgp: $(TOOLS)/msgp
	PATH=$(TOOLS):$$PATH $(GO) generate $(addprefix ./,$(MSGP_PKGS))

# Fails when committed msgp code is not what the pinned generator makes.
msgp-check: $(TOOLS)/msgp
	@tmp=$$(mktemp -d); cp go.mod go.sum $$tmp/; for p in $(MSGP_PKGS); do mkdir -p $$tmp/$$p; cp $$p/*.go $$tmp/$$p/; done; \
	(cd $$tmp && for p in $(MSGP_PKGS); do (cd $$p && PATH=$(TOOLS):$$PATH $(GO) generate . >/dev/null) || exit 1; done) || { rm -rf $$tmp; exit 1; }; \
	for p in $(MSGP_PKGS); do for f in $$p/*_gen.go; do \
		cmp -s $$f $$tmp/$$f || { echo "stale: $$f (run make msgp)"; rm -rf $$tmp; exit 1; }; \
	done; done; rm -rf $$tmp; echo "msgp code up to date"

clean:
	rm -rf bin build
