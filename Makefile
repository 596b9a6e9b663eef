# The two commands: `make demo` and `make test`. Both set up everything they need on a fresh
# Debian machine (system packages through apt-get when missing, a venv, the CPU build of torch).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# dpkg-dev, meson and ninja build libfuse 3.17 (FUSE passthrough) from Debian's source package.
SYSPKGS := fuse3 libfuse3-dev pkg-config dpkg-dev meson ninja-build patch
FUSE_STAMP := $(VENV)/fuse/.built
# The NFS tests: NFS-Ganesha with its VFS backend, rpcbind for NFSv3, and libnfs (a user-space
# NFS client the tests compile against); iproute2 and util-linux give the network namespace.
TESTPKGS := shellcheck nfs-ganesha nfs-ganesha-vfs rpcbind libnfs-dev gcc iproute2 cmake
# libnfs >= 5 (NFSv4 writes; Debian 12 has 4.0), built from Debian's source package by `make test`
NFS_STAMP := $(VENV)/nfs/.built
PYTEST_ARGS ?=
# Test processes for `make test`: 3 on 2 cores, since most tests wait (settle timers, fsync,
# the S3 server) rather than compute; every test has its own temp dirs, ports and mounts.
PYTEST_WORKERS ?= 3

.PHONY: demo test test-fast lint bench floor-tools sysdeps testdeps apt venv clean

sysdeps:
	@$(MAKE) --no-print-directory apt PKGS="$(SYSPKGS)"

testdeps:
	@$(MAKE) --no-print-directory apt PKGS="$(TESTPKGS)"

apt:
	@missing=""; for p in $(PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing system packages:$$missing"; \
		if [ "$$(id -u)" != 0 ]; then echo "need root to apt-get install$$missing" >&2; exit 1; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

# libfuse >= 3.17 and pyfuse3 with passthrough, built into the venv (deploy/passthrough/).
# FUSE_PASSTHROUGH=0 skips it: pyfuse3 from PyPI, every byte through the daemon.
FUSE_PASSTHROUGH ?= 1
ifeq ($(FUSE_PASSTHROUGH),0)
FUSE_DEP :=
else
FUSE_DEP := $(FUSE_STAMP)
endif

$(FUSE_STAMP): deploy/passthrough/fuse-passthrough.sh deploy/passthrough/pyfuse3-passthrough.patch \
		deploy/debian-source.sh | sysdeps
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	deploy/passthrough/fuse-passthrough.sh $(VENV) \
		|| { echo "building FUSE passthrough failed; FUSE_PASSTHROUGH=0 builds without it" >&2; exit 1; }

# torch is installed first and pinned exactly so that nothing resolves a CUDA build.
$(STAMP): pyproject.toml $(FUSE_DEP) | sysdeps
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -e '.[torch,test,bench]'
	touch $(STAMP)

venv: sysdeps $(STAMP)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The NFS tests' client: libnfs 5 with nfs-cp into the venv (deploy/nfs-client/libnfs.sh).
$(NFS_STAMP): deploy/nfs-client/libnfs.sh deploy/nfs-client/libnfs-fixes.patch \
		deploy/debian-source.sh | sysdeps testdeps
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	deploy/nfs-client/libnfs.sh $(VENV)

test: venv testdeps $(NFS_STAMP) lint
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The tests that need no FUSE mount, no S3 server and no torch (seconds; no lint). mount and
# s3 are set by tests/conftest.py from the fixtures a test uses.
FAST_MARKERS := not mount and not s3 and not torch
test-fast: venv
	$(BIN)/python -m pytest -q -m "$(FAST_MARKERS)" $(PYTEST_ARGS)

# STORE=s3://BUCKET[/PREFIX] (and ENDPOINT=URL for an S3-compatible server) runs it on S3.
demo: venv
	$(BIN)/python -m bench.demo $(if $(STORE),--store $(STORE)) $(if $(ENDPOINT),--endpoint-url $(ENDPOINT))

# BENCH_ARGS="--sizes 1024 --runs 5 --only save" narrows it (python -m bench.suite --help).
bench: venv
	$(BIN)/python -m bench.suite $(BENCH_ARGS)

# libfuse's own C example passthrough_hp, for the benchmark's floor section only (what a FUSE
# daemon in C costs a sharded save here): libfuse and pyfuse3 again, with the examples (~1.5
# min). On a venv made with FUSE_PASSTHROUGH=0 this installs the passthrough pyfuse3 too.
floor-tools: venv
	@$(MAKE) --no-print-directory apt PKGS="g++"
	FUSE_EXAMPLES=1 deploy/passthrough/fuse-passthrough.sh $(VENV)

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
