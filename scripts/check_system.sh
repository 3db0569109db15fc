#!/bin/sh
# What `make` needs before Python runs: a Python >= 3.10 with venv and ensurepip.
# Each missing piece is one line naming the command that installs it on this distribution;
# exit 2. Usage: scripts/check_system.sh [python] [--compiler | --accelerator]
# --compiler: called by make after a failed install. Names a disk too full to hold the
# environment (the test environment is ~1.0 GB; pip unpacks wheels in its temporary folder
# first), else the C compiler if there is none (a package had no wheel for the user's
# machine and pip had to build it).
# --accelerator: print the pyproject extra for the accelerator present (make's ACCEL):
# cuda12 or cuda13 by the CUDA version the NVIDIA driver reports, mlx on Apple silicon,
# nothing otherwise.
PY="${1:-python3}"

manager() {
    ids=$( (. "${INFERDESK_OS_RELEASE:-/etc/os-release}" 2>/dev/null && echo "$ID $ID_LIKE") | tr 'A-Z' 'a-z')
    for id in $ids; do
        case "$id" in
            debian|ubuntu|linuxmint|pop|raspbian) echo apt; return ;;
            fedora|rhel|centos|rocky|almalinux) echo dnf; return ;;
            arch|manjaro|endeavouros) echo pacman; return ;;
            opensuse*|suse|sles) echo zypper; return ;;
        esac
    done
    [ "$(uname -s)" = Darwin ] && echo brew
}

# install_cmd APT DNF PACMAN ZYPPER BREW: the command for the system's package manager
install_cmd() {
    case "$(manager)" in
        apt) echo "sudo apt-get install -y $1" ;;
        dnf) echo "sudo dnf install -y $2" ;;
        pacman) echo "sudo pacman -S --needed $3" ;;
        zypper) echo "sudo zypper install -y $4" ;;
        brew) echo "brew install $5" ;;
        *) echo "your system's package manager (a package named like '$1')" ;;
    esac
}

fail() { echo "inferdesk: error: $*" >&2; exit 2; }

if [ "$2" = "--accelerator" ]; then
    # nvidia-smi's header says "CUDA Version: 12.4": the newest CUDA the driver runs.
    cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\)\..*/\1/p' | head -n 1)
    if [ -n "$cuda" ]; then
        if [ "$cuda" -ge 13 ]; then echo cuda13; else echo cuda12; fi
    elif [ "$(uname -s)" = Darwin ] && [ "$(uname -m)" = arm64 ]; then
        echo mlx
    fi
    exit 0
fi

# free_mb DIR: megabytes free on the filesystem holding DIR (nothing if df cannot tell)
free_mb() { df -Pk "$1" 2>/dev/null | awk 'NR == 2 { print int($4 / 1024) }'; }

# The free space a test environment's install needs: its ~1.0 GB plus pip's unpacking.
NEED_MB=1500

if [ "$2" = "--compiler" ]; then
    venv=$(dirname "$(dirname "$PY")")
    for dir in "$venv" "${TMPDIR:-/tmp}"; do
        [ -d "$dir" ] || continue
        free=$(free_mb "$dir")
        if [ -n "$free" ] && [ "$free" -lt "$NEED_MB" ]; then
            fail "the disk holding $dir has ${free} MB free and installing needs about $NEED_MB MB: free some space, then run make again"
        fi
    done
    if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
        fail "a package had no prebuilt wheel for your machine and needs a C compiler; install one with: $(install_cmd build-essential gcc gcc gcc 'xcode-select --install')"
    fi
    fail "installing the Python packages failed (see pip's output above)"
fi

command -v "$PY" >/dev/null 2>&1 || \
    fail "no '$PY' found; Inferdesk needs Python 3.10 or newer: $(install_cmd python3 python3 python python3 python@3.12)"

"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || \
    fail "$("$PY" -c 'import sys; print("Python %d.%d" % sys.version_info[:2])' 2>/dev/null || echo "$PY") is too old; Inferdesk needs 3.10 or newer: $(install_cmd python3 python3 python python3 python@3.12), then run make with PYTHON=python3.X"

if ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    v=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    fail "$PY cannot create virtual environments (venv or ensurepip is missing); install it with: $(install_cmd "python$v-venv" python3-libs python "python${v%%.*}${v#*.}-base" python)"
fi
exit 0
