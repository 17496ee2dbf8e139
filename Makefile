# k3pack: the two commands of the README are `make demo` and `make test`.
# Both install missing Debian packages first (scripts/install-deps.sh, idempotent).

JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 30
CMAKE_FLAGS ?=
# Clones and worktrees share one ccache: paths are hashed relative to the tree.
export CCACHE_BASEDIR ?= $(CURDIR)
export CCACHE_NOHASHDIR ?= 1

.PHONY: all deps build build-asan build-tsan test test-fast test-tsan demo bench fuzz python clean

all: build

deps:
	@./scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DK3_SANITIZE=ON -DK3_PYTHON=OFF -DK3_BENCH=OFF >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

build-tsan: deps
	@cmake -S . -B $(TSAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DK3_TSAN=ON -DK3_PYTHON=OFF -DK3_BENCH=OFF >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target test_store

# Everything: unit + integration + Python tests, the same under ASan/UBSan,
# the concurrency tests under TSan, and a fuzz smoke run.
test: build build-asan
	@./scripts/run-tests.sh

test-tsan: build-tsan
	@cd $(TSAN_BUILD) && TSAN_OPTIONS=halt_on_error=1 ./test_store --gtest_filter='StoreConcurrency.*'

# Quick loop for development: the normal build only.
test-fast: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: build
	@./scripts/demo.sh

bench: build
	@./scripts/bench.sh

fuzz: deps
	@./scripts/fuzz.sh $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD) demo-out
