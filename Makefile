# Top-level entry points: deps, build, lint, test, demo, bench.
# Works on a fresh Debian 12 as root (or with sudo) and on developer machines.

SHELL := /bin/sh

# Prefer the system interpreter: the venv must not depend on a user's pyenv shim.
PYTHON ?= $(shell if [ -x /usr/bin/python3 ]; then echo /usr/bin/python3; else command -v python3; fi)
VENV := .venv
VPY := $(VENV)/bin/python
LOCUS := $(VENV)/bin/locus

APT_PACKAGES := build-essential python3-venv python3-pip libunwind-dev clang-format llvm clang \
	binutils pigz zstd sysbench stress-ng libgomp1 nodejs gfortran procps libzydis-dev chromium cmake \
	gcc-12-plugin-dev libomp-14-dev

# The real-NUMA VM tier (tests/vm, scripts/numavm): QEMU (TCG) + busybox initramfs. The
# guest kernel is not an apt install: scripts/numavm setup downloads and unpacks it.
VM_APT_PACKAGES := qemu-system-x86 busybox-static kmod xz-utils

SUDO := $(shell if [ "$$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then echo sudo; fi)

C_SOURCES = $(shell find runtime workloads python bench \( -name '*.[ch]' -o -name '*.cc' \) -not -path '*/build/*' 2>/dev/null)

# In the checkout: a fixed /tmp path was another user's run, which `record -o` cannot replace.
DEMO_DIR ?= build/demo
DEMO_CMD ?= workloads/build/sharequeue 1
DEMO_COMM_CMD ?= workloads/build/comm_falseshare 2 - 0.9 --free
# Serial first touch, then both threads compute: on 2 emulated nodes one of them is remote.
DEMO_NUMA_CMD ?= workloads/build/numa_firsttouch 2 64 --init serial --iters 150

.PHONY: all deps apt-deps vm-setup build lint format test demo bench clean

all: build

deps: apt-deps $(VENV)/.installed

# Installs those of the Debian packages $(1) that are missing (or removed with their
# configuration left); dpkg-query first, so a repeated `make deps` does not touch apt at all.
# sudo resets the environment: DEBIAN_FRONTEND goes through `env`.
apt_install = missing=""; \
	for p in $(1); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || \
	    missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
	    $$missing; \
	fi

apt-deps:
	@$(call apt_install,$(APT_PACKAGES))

# One-off and cached (~/.cache/locus/numavm); a second run is a no-op. LOCUS_SKIP_VM=1 skips
# it (and tests/vm skips its tests).
vm-setup:
	@if [ "$$LOCUS_SKIP_VM" = 1 ]; then echo "LOCUS_SKIP_VM=1: no VM setup"; exit 0; fi; \
	$(call apt_install,$(VM_APT_PACKAGES)) && \
	$(PYTHON) scripts/numavm setup

$(VENV)/.installed: pyproject.toml
	@[ -x $(VPY) ] || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q -e '.[dev]'
	@touch $@

build:
	$(MAKE) -C runtime
	@mkdir -p build
	$(CC) -O2 -std=gnu11 -Wall -Wextra -Werror -shared -fPIC -o build/liblocus_walk.so \
	  python/locus/analysis/_walk.c
	@# `locus cc`'s gcc plugin (python/locus/cc.py): gcc's plugin headers (gcc-12-plugin-dev),
	@# compiled by the g++ of that gcc; without them locus cc instruments as gcc does. Rebuilt
	@# when its source or gcc (cc1) is newer (a new plugin rebuilds the exact workloads).
	@plugin="$$(gcc -print-file-name=plugin 2>/dev/null)"; \
	so=build/locus_late_tsan.so; src=runtime/cc/late_tsan.cc; \
	if [ -f "$$plugin/include/gcc-plugin.h" ] && command -v g++ >/dev/null; then \
	  [ -f $$so ] && [ $$so -nt $$src ] && [ ! "$$(gcc -print-prog-name=cc1)" -nt $$so ] || { \
	  echo "g++ -shared -fPIC -fno-rtti -o $$so $$src"; \
	  g++ -O2 -Wall -Werror -shared -fPIC -fno-rtti -I"$$plugin/include" \
	    -o $$so $$src || exit 1; }; \
	else echo "no gcc plugin headers (gcc-12-plugin-dev): locus cc instruments before the vectoriser"; \
	  rm -f $$so; fi
	@if [ -f workloads/Makefile ]; then $(MAKE) -C workloads; fi
	@# The launcher's modules as bytecode: where PYTHONDONTWRITEBYTECODE is set, Python
	@# compiled them from source at every `locus` command (~12 ms of each `locus record`).
	@if [ -x $(VPY) ]; then $(VPY) -m compileall -q python/locus > /dev/null; fi

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@files="$(C_SOURCES)"; \
	if [ -n "$$files" ]; then clang-format --dry-run --Werror $$files; fi

# Rewrites sources in place; `make lint` only checks.
format: $(VENV)/.installed
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .
	@files="$(C_SOURCES)"; if [ -n "$$files" ]; then clang-format -i $$files; fi

# tests/ includes tests/vm (the NUMA guest tier, one boot for all of it).
test: deps build lint vm-setup
	@if $(MAKE) -s -C runtime -n check >/dev/null 2>&1; then $(MAKE) -C runtime check; fi
	$(VENV)/bin/pytest -q python tests

demo: deps build
	$(LOCUS) record -o $(DEMO_DIR) -- $(DEMO_CMD)
	$(LOCUS) report $(DEMO_DIR)
	$(LOCUS) record --lens comm -o $(DEMO_DIR)-comm -- $(DEMO_COMM_CMD)
	$(LOCUS) report $(DEMO_DIR)-comm
	@if [ "$$(nproc)" -ge 2 ]; then \
	  $(LOCUS) record --lens numa --fake-numa 2 --period 200us -o $(DEMO_DIR)-numa -- $(DEMO_NUMA_CMD) && \
	  $(LOCUS) report $(DEMO_DIR)-numa --lens numa --top 8; \
	else echo "numa demo skipped: --fake-numa 2 needs 2 CPUs"; fi

bench: deps build
	@if [ -x bench/run.sh ]; then bench/run.sh; \
	elif [ -f bench/run.sh ]; then sh bench/run.sh; \
	else echo "bench/run.sh not present yet"; fi

clean:
	@if [ -f runtime/Makefile ]; then $(MAKE) -C runtime clean; fi
	@if [ -f workloads/Makefile ]; then $(MAKE) -C workloads clean; fi
	rm -rf build
