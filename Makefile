# weir: build, test, benchmark. `make help` lists the targets.
GO        ?= go
# FUZZTIME: per fuzz target in `make fuzz`; SHORTFUZZ: per target inside `make test`.
# Both are execution counts (`Nx`), not durations: Go 1.26's fuzz coordinator can
# fail a clean run with "context deadline exceeded" when a duration runs out
# while a worker is mid-input (golang/go#75804, fixed in Go 1.27). A count never
# races a deadline. About 40k execs/s per target on 2 cores: 200000x is ~5 s,
# 12000000x is ~5 min. A duration (FUZZTIME=5m) still works, with that risk.
FUZZTIME  ?= 12000000x
SHORTFUZZ ?= 200000x
RESULTS   ?= bench/results
# package:target for every fuzzer in the tree (ring ABI decoding, the
# request protocol's bodies, the metadata WAL and checkpoints, the staging log,
# the journal service's session with io).
FUZZ_TARGETS := ./ring:FuzzDecodeHeader ./ring:FuzzValidateDescriptor ./ring:FuzzServerSlot \
	./proto:FuzzBodies ./proto/cache:FuzzAttach \
	./services/metadata/ns:FuzzDecodeRecord ./services/metadata/ns:FuzzDecodeCheckpoint \
	./internal/wal:FuzzScanSegment ./internal/staging:FuzzDecode \
	./internal/journalproto:FuzzDecodeBatch ./internal/journalproto:FuzzDecodeReport \
	./internal/grantcap:FuzzCheck
# Only in `make fuzz`: FuzzServiceRequest builds a whole stack with fuzzing
# instrumentation (about a minute before the first input; make test runs
# its seeds, and TestHostileRequests sends 3000 hostile requests);
# FuzzOpen recovers a whole staging log per input (about 3k execs/s; make
# test runs its seeds, TestPowerCutAtEveryWrite the crash images).
FUZZ_LONG := ./stack:FuzzServiceRequest ./internal/staging:FuzzOpen

.PHONY: help demo up build libweir spdk spdk-check test-spdk test test-unit fuzz-short fuzz crash-loop crash lint bench bench-transport bench-fileops bench-backend bench-fsync bench-shim bench-trees bench-quick clean

help:
	@echo "demo             weir up (embedded NATS, file backend) + a workload + restart check, in a temp dir"
	@echo "up               run weir in the foreground on DATA (default ./weir-data) until Ctrl-C"
	@echo "build            compile every package and command, and libweir (bin/libweir.so, bin/libweir-preload.so)"
	@echo "spdk             build everything with the SPDK backend (needs an installed SPDK)"
	@echo "test-spdk        backend suite, conformance suite (3 runs in one process), load faults, identity and kill -9 restart on SPDK Blobstore"
	@echo "test             go test -race on everything, then a short run of each fuzzer"
	@echo "fuzz             each fuzzer for FUZZTIME (default 12000000x, about 5 min each)"
	@echo "crash-loop       CRASH_ROUNDS (500) power cuts under both services, then 20 runs of the WAL kill -9 test"
	@echo "crash            CRASH_ITERATIONS (300) SIGKILLs of io, metadata or both under client processes, model checked, weir check"
	@echo "lint             gofmt and go vet"
	@echo "bench            every benchmark in bench/, one report: $(RESULTS)/report.md (about 4 min)"
	@echo "bench-transport  ring vs Unix socket vs pipe, two processes"
	@echo "bench-fileops    weir client vs os (buffered, O_DIRECT): 4 KiB random, metadata, sequential"
	@echo "bench-backend    backends at the interface: raw O_DIRECT, file, SPDK aio and malloc (spdk tag if SPDK is found)"
	@echo "bench-fsync      weir's fsync (client processes, with and without the staging log) against write + fdatasync on root, journaled ext4 and XFS: 1/4/8 writers, flushes, write amplification, CPU (about 4 min)"
	@echo "bench-shim       unmodified programs through the LD_PRELOAD shim against the kernel: fio 4 KiB random and 128 KiB sequential, buffered and O_DIRECT; pgbench TPS; one call's cost (about 6 min; needs fio, PostgreSQL for pgbench)"
	@echo "bench-trees      the Go source tree through the shim against the kernel and a loop ext4: untar, find, du, grep, ls -lR, cp -r, tar, rm; 1M files through the Go client (BENCH_TREES_ARGS)"
	@echo "bench-quick      every benchmark with small sizes and short windows, and the report (about 1.5 min)"

DATA ?= ./weir-data

demo:
	$(GO) run ./cmd/weir demo

up:
	$(GO) run ./cmd/weir up --data $(DATA)

build: libweir
	$(GO) build ./...
	$(GO) build -o bin/weir ./cmd/weir

# libweir (client/c): the C client library and the LD_PRELOAD shim, built
# with the system compiler. `go test ./client/c/ctest` (in make test)
# builds them again and runs the C tests and the shim's real programs.
CC      ?= cc
# The shim's calls to its own entry points (rename calls renameat2) bind
# inside it: a program that defines one of those names itself (GNU patch
# exports gnulib's renameat2) would otherwise get the shim's call.
LDFLAGS_PRELOAD := -Wl,-Bsymbolic-functions
CFLAGS_WEIR := -std=gnu11 -O2 -g -Wall -Wextra -Werror -fPIC -pthread -Iclient/c -Iproto/include -Iring/include
libweir:
	@mkdir -p bin
	$(CC) $(CFLAGS_WEIR) -shared client/c/weir.c -o bin/libweir.so
	$(CC) $(CFLAGS_WEIR) -shared client/c/weir.c client/c/preload.c -o bin/libweir-preload.so -ldl $(LDFLAGS_PRELOAD)

# The SPDK backend builds only with the spdk tag, against an SPDK found by
# pkg-config: in SPDK_PREFIX (default /opt/spdk) or on PKG_CONFIG_PATH.
SPDK_PREFIX ?= /opt/spdk
SPDK_PC     := spdk_blob spdk_blob_bdev spdk_bdev spdk_env_dpdk spdk_init spdk_thread spdk_event_bdev spdk_bdev_malloc spdk_bdev_aio spdk_bdev_error spdk_bdev_nvme spdk_syslibs
SPDK_ENV     = PKG_CONFIG_PATH="$(SPDK_PREFIX)/lib/pkgconfig:$$PKG_CONFIG_PATH" CGO_LDFLAGS="-Wl,-rpath,$(SPDK_PREFIX)/lib"

spdk-check:
	@$(SPDK_ENV) pkg-config --exists $(SPDK_PC) || { \
		echo "SPDK not found: pkg-config does not find all of $(SPDK_PC) in $(SPDK_PREFIX)/lib/pkgconfig or PKG_CONFIG_PATH."; \
		echo "Install SPDK (README: supported releases) and set SPDK_PREFIX; 'go run ./cmd/weir doctor' checks the host."; \
		exit 1; }

spdk: spdk-check
	$(SPDK_ENV) $(GO) build -tags spdk ./...

test-spdk: spdk-check
	$(SPDK_ENV) $(GO) vet -tags spdk ./...
	$(SPDK_ENV) $(GO) test -tags spdk -count=1 ./services/io/backend/spdk
	$(SPDK_ENV) $(GO) test -tags spdk -count=3 -run SPDK ./stack/conformance
	$(SPDK_ENV) $(GO) test -tags spdk -count=1 -run SPDK ./stack ./internal/doctor

test: test-unit fuzz-short

test-unit:
	$(GO) test -race -count=1 ./...

fuzz-short:
	@for pt in $(FUZZ_TARGETS); do \
		p=$${pt%%:*}; t=$${pt#*:}; \
		echo "fuzz $$p $$t for $(SHORTFUZZ)"; \
		$(GO) test -run='^$$' -fuzz="^$$t\$$" -fuzztime=$(SHORTFUZZ) $$p || exit 1; \
	done

# crash-loop: CRASH_ROUNDS power cuts under both services at random moments
# (stack TestPowerCut; make test runs 4), then kill -9 restarts.
CRASH_ROUNDS ?= 500
crash-loop:
	WEIR_POWERCUT_ROUNDS=$(CRASH_ROUNDS) $(GO) test -count=1 -run '^TestPowerCut$$' ./stack
	$(GO) test -count=20 -run '^TestSIGKILL$$' ./services/metadata/ns

# crash: the process crash harness (stack TestCrash): client processes run
# a mixed workload while a random service (io, metadata, the journal or all
# three) is SIGKILLed, CRASH_ITERATIONS times (make test runs 3), every
# acknowledged fsync and directory fsync checked after each restart, weir
# check every 25 rounds; then the staging power-cut models 20 times over.
CRASH_ITERATIONS ?= 300
crash:
	bash -o pipefail -c "WEIR_CRASH_ROUNDS=$(CRASH_ITERATIONS) $(GO) test -count=1 -timeout 60m -v -run '^TestCrash$$' ./stack | grep -E '^(---|ok|FAIL|panic)|crash_test.go'"
	$(GO) test -count=20 -run '^TestStaged' ./services/io

fuzz:
	@for pt in $(FUZZ_TARGETS) $(FUZZ_LONG); do \
		p=$${pt%%:*}; t=$${pt#*:}; \
		echo "fuzz $$p $$t for $(FUZZTIME)"; \
		$(GO) test -run='^$$' -fuzz="^$$t\$$" -fuzztime=$(FUZZTIME) $$p || exit 1; \
	done

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# The benchmarks run one after another (never in parallel: they measure);
# bench/report joins their results into $(RESULTS)/report.md.
# bench/backend builds with -tags spdk when SPDK is found; without SPDK its
# spdk rows read "n/a" and the file, raw and weir-file rows still run.
BENCH_TRANSPORT = $(GO) run ./bench/transport -out $(RESULTS)
BENCH_FILEOPS   = $(GO) run ./bench/fileops -out $(RESULTS)
BENCH_BACKEND   = if $(MAKE) -s spdk-check >/dev/null 2>&1; then \
		echo "bench-backend: SPDK found, building with -tags spdk"; \
		$(SPDK_ENV) $(GO) run -tags spdk ./bench/backend -out $(RESULTS) $(BENCH_BACKEND_ARGS) $(1); \
	else \
		echo "bench-backend: SPDK not found (make spdk-check), spdk rows will be n/a"; \
		$(GO) run ./bench/backend -out $(RESULTS) $(BENCH_BACKEND_ARGS) $(1); \
	fi
BENCH_REPORT    = $(GO) run ./bench/report -out $(RESULTS) -benchmarks transport,fileops,backend

bench:
	$(BENCH_TRANSPORT)
	$(BENCH_FILEOPS)
	@$(call BENCH_BACKEND)
	$(BENCH_REPORT)

bench-transport:
	$(BENCH_TRANSPORT)

bench-fileops:
	$(BENCH_FILEOPS)

bench-backend:
	@$(call BENCH_BACKEND)

bench-fsync:
	$(GO) run ./bench/fsync -out $(RESULTS)

bench-shim:
	$(GO) run ./bench/shim -out $(RESULTS)

# bench-trees: whole trees through the shim (tar, find, grep, cp, rm ...),
# against a kernel directory and, as root with e2fsprogs, a journaled ext4
# on a loop device; then 1M files through the Go client. Results in
# $(RESULTS)/trees. BENCH_TREES_ARGS=-quick for a smoke run.
bench-trees: libweir
	$(GO) run ./bench/trees -shim $(CURDIR)/bin/libweir-preload.so -out $(RESULTS)/trees $(BENCH_TREES_ARGS)

bench-quick:
	$(BENCH_TRANSPORT) -quick
	$(BENCH_FILEOPS) -quick
	@$(call BENCH_BACKEND,-quick)
	$(BENCH_REPORT)

clean:
	rm -rf bin $(RESULTS)
