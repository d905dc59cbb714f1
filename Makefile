# SPDX-License-Identifier: Apache-2.0
# The front door: `make` builds, `make test` runs every test, `make bench` runs the main job.
# Each first installs whatever is missing (deps/), idempotently.
BUILD ?= build
MESON ?= meson
BENCH_ARGS ?=

.PHONY: all build deps test test-c bench clean

all: build

deps:
	@./deps/install.sh

$(BUILD)/build.ninja: | deps
	$(MESON) setup $(BUILD) >/dev/null

build: deps $(BUILD)/build.ninja
	@$(MESON) compile -C $(BUILD) >/dev/null || $(MESON) compile -C $(BUILD)

test-c: build
	$(BUILD)/tests/ckptio-tests

test: test-c

bench: build
	$(BUILD)/tools/ckptio bench $(BENCH_ARGS)

clean:
	rm -rf $(BUILD)
