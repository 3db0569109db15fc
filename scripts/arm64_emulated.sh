#!/usr/bin/env bash
# The cpu backend's tests on arm64 (aarch64 Linux), emulated by qemu on an x86-64 Linux host:
# a Debian bookworm arm64 userland (its python3 is 3.11) made once by debootstrap, a venv in
# it with the runtime dependencies from PyPI's aarch64 wheels (at the versions of the lock
# file make installs from, requirements/default.txt), and pytest on a copy of this tree's
# files. Correctness only: under qemu every instruction is emulated, so its timings say
# nothing about speed on an ARM CPU.
#
#   sudo scripts/arm64_emulated.sh [pytest arguments]
#
# Without test paths (none, or options only, e.g. -v) it runs ARM_TESTS below.
#
# ARM64_ROOT (default /var/tmp/inferdesk-arm64) holds the rootfs and its venv, outside the
# repository; both are kept and reused. Needs root (debootstrap, chroot, mounts). The copy of
# the tree is refreshed every run and the numba cache lives in the rootfs, so the repository
# gains nothing. Runs under nice -n 19 (emulation keeps a core busy for tens of minutes).
set -euo pipefail

REPO=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
ROOT=${ARM64_ROOT:-/var/tmp/inferdesk-arm64}
FS=$ROOT/rootfs
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# What must hold on ARM, most telling first: the cpu backend's kernels against NumPy
# (float kernels, the file-byte K-quant kernels, attention, the replayed step),
# target_isa / backend_reason, parity on the tiny fixtures and the bundled models, and the
# integer-dot tests' skips. Left out: Qt/GUI, the server, mlx, and the tiny models on the
# CUDA host emulator (-k "not cuda": not cpu backend code, and hours under qemu).
ARM_TESTS=(-k "not cuda" tests/test_backend_cpu.py tests/test_cpu_attend_rows.py
           tests/test_cpu_step.py tests/test_cpu_kquants.py tests/test_parity_tiny.py
           tests/test_cpu_idot.py tests/test_cpu_kdot.py tests/test_cpu_idot_forms.py
           tests/test_models_decoder.py tests/test_parity.py tests/test_numpy_backend.py
           tests/test_quants.py)
# Runtime dependencies the tests import (pyproject.toml's, less Qt, the server, mlx).
DEPS=(numpy numba llvmlite gguf tokenizers safetensors huggingface_hub jinja2 psutil
      threadpoolctl pytest hypothesis)

fail() { echo "arm64_emulated: $*" >&2; exit 2; }

[ "$(id -u)" = 0 ] || fail "run as root (debootstrap, chroot and the mounts need it)"
# The mounts below go in a mount namespace of this run's own: invisible to the host and to
# other runs, and gone when the run ends, however it ends.
[ -n "${ARM64_OWN_NS:-}" ] || exec env ARM64_OWN_NS=1 unshare --mount --propagation private \
    "$0" "$@"
if ! command -v qemu-aarch64-static >/dev/null || ! command -v debootstrap >/dev/null; then
    fail "qemu or debootstrap missing; install with: sudo apt-get install -y qemu-user-static binfmt-support debootstrap"
fi

# binfmt_misc lets the kernel run aarch64 binaries through qemu, children included (pytest
# starts subprocesses, dpkg runs scripts). Without it only the explicit interpreter is left:
# enough for pytest itself, not for debootstrap's second stage or tests that spawn Python.
BINFMT=/proc/sys/fs/binfmt_misc
if [ ! -e $BINFMT/qemu-aarch64 ]; then
    [ -e $BINFMT/register ] || mount -t binfmt_misc binfmt_misc $BINFMT 2>/dev/null || true
    update-binfmts --enable qemu-aarch64 2>/dev/null || true
fi
INTERP=()
if [ ! -e $BINFMT/qemu-aarch64 ]; then
    echo "arm64_emulated: no binfmt_misc registration for aarch64; running qemu explicitly" \
         "(tests that start a Python subprocess will fail)" >&2
    [ -x "$FS/usr/bin/python3" ] || fail "the rootfs cannot be made without binfmt_misc"
    cp /usr/bin/qemu-aarch64-static "$FS/usr/bin/"
    INTERP=(/usr/bin/qemu-aarch64-static)
fi

if [ ! -x "$FS/usr/bin/python3" ]; then
    mkdir -p "$ROOT"
    nice -n 19 debootstrap --arch=arm64 --variant=minbase \
        --include=python3,python3-venv,python3-pip,ca-certificates bookworm "$FS" "$MIRROR"
fi

# proc, sys, the device nodes and a fresh /dev/shm (Python's semaphores), each one plain
# mount (no recursive bind), unmounted in reverse order on exit.
mounts=()
cleanup() {
    local i
    [ -z "${SRC:-}" ] || rm -rf "$SRC"
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount "${mounts[i]}" || true; done
}
trap cleanup EXIT
mount_in() {  # mount_in DIR MOUNT-ARGS...: mount at $FS/DIR unless something is there
    mountpoint -q "$FS/$1" && return
    mkdir -p "$FS/$1" && mount "${@:2}" "$FS/$1" && mounts+=("$FS/$1")
}
mount_in proc -t proc proc
mount_in sys -t sysfs sysfs
mount_in dev --bind /dev
mount_in dev/shm -t tmpfs tmpfs
cp -L /etc/resolv.conf "$FS/etc/resolv.conf"
# pip in the rootfs trusts what the host trusts (a TLS-inspecting proxy's CA, say).
cp -L /etc/ssl/certs/ca-certificates.crt "$FS/etc/ssl/host-ca-certificates.crt"

# in_arm CMD...: run CMD in the arm64 userland, with a clean environment.
in_arm() {
    chroot "$FS" "${INTERP[@]}" /usr/bin/env -i PATH=/opt/venv/bin:/usr/bin:/bin HOME=/root \
        LANG=C.UTF-8 HF_HUB_OFFLINE=1 NUMBA_CACHE_DIR=/var/cache/numba \
        PYTHONDONTWRITEBYTECODE=1 QT_QPA_PLATFORM=offscreen \
        PIP_CERT=/etc/ssl/host-ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1 "$@"
}

# Versions from the lock file make installs with (its environment markers pick the lines
# for the rootfs's Python and aarch64); the venv is redone when the lock or the list changes.
LOCK=$REPO/requirements/default.txt
want="${DEPS[*]} lock:$(sha256sum <"$LOCK" | cut -c1-16)"
if [ "$(cat "$FS/opt/venv/.inferdesk-reqs" 2>/dev/null)" != "$want" ]; then
    [ -x "$FS/opt/venv/bin/python" ] || in_arm python3 -m venv /opt/venv
    cp "$LOCK" "$FS/opt/venv/constraints.txt"
    in_arm nice -n 19 /opt/venv/bin/pip install -q --only-binary=:all: \
        -c /opt/venv/constraints.txt "${DEPS[@]}"
    echo "$want" >"$FS/opt/venv/.inferdesk-reqs"
fi

# The bundled models are data, the same on every machine: the ones `make` unpacked on the
# host into resources/models/ (git-ignored) go with the tree.
[ -d "$REPO/resources/models" ] || fail "no bundled models in resources/models/: run make first"
# A fresh copy of the tree's files (tracked and new, not ignored ones such as .venv), one
# per run, so runs on different test files can go side by side; removed on exit.
SRC=$(mktemp -d "$FS/tmp/src.XXXXXX")
git -C "$REPO" ls-files -z --cached --others --exclude-standard |
    (cd "$REPO" && tar --null --ignore-failed-read -T - -cf -) | tar -C "$SRC" -xf -
cp -r "$REPO/resources/models" "$SRC/resources/"

paths=0
for a in "$@"; do [[ $a == -* ]] || paths=1; done
[ $paths = 1 ] || set -- "$@" "${ARM_TESTS[@]}"  # options alone: the default tests
echo "arm64_emulated: $(in_arm /opt/venv/bin/python -c 'import platform, sys;
print(platform.machine(), "Python", sys.version.split()[0])'), $(qemu-aarch64-static --version | head -1)"
in_arm /bin/sh -c 'cd "$1" && shift && exec nice -n 19 /opt/venv/bin/python -m pytest -q \
    -p no:cacheprovider "$@"' sh "/tmp/${SRC##*/}" "$@"
