# SPDX-License-Identifier: Apache-2.0
# The front door: `make` builds, `make test` runs every test, `make bench` runs the main job.
# Each first installs whatever is missing (deps/), idempotently.
BUILD ?= build
MESON ?= meson
BENCH_ARGS ?=

.PHONY: all build deps test test-c test-install test-sanitize bench clean

all: build

deps:
	@./deps/install.sh

$(BUILD)/build.ninja: | deps
	$(MESON) setup $(BUILD) >/dev/null

build: deps $(BUILD)/build.ninja
	@$(MESON) compile -C $(BUILD) >/dev/null || $(MESON) compile -C $(BUILD)

test-c: build
	$(BUILD)/tests/ckptio-tests

test-install: build
	./tests/install-check.sh $(BUILD)

# The C suite under ASan+UBSan, then under TSan, each in its own build directory.
test-sanitize: deps
	@[ -f $(BUILD)-asan/build.ninja ] || $(MESON) setup $(BUILD)-asan -Db_sanitize=address,undefined -Db_lundef=false >/dev/null
	@$(MESON) compile -C $(BUILD)-asan >/dev/null
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 $(BUILD)-asan/tests/ckptio-tests
	@[ -f $(BUILD)-tsan/build.ninja ] || $(MESON) setup $(BUILD)-tsan -Db_sanitize=thread -Db_lundef=false >/dev/null
	@$(MESON) compile -C $(BUILD)-tsan >/dev/null
	TSAN_OPTIONS=halt_on_error=1 $(BUILD)-tsan/tests/ckptio-tests

test: test-c test-install

bench: build
	$(BUILD)/tools/ckptio bench $(BENCH_ARGS)

clean:
	rm -rf $(BUILD)
