#!/usr/bin/env bash
# What a new user meets: clone the repository into an empty folder and run the README's two
# commands there. First what `make run` installs (.venv with the app's dependencies and the
# bundled models in resources/models/, timed, with both sizes), then `make test` (it adds the test extras and runs the suite), then
# `make run` opens the app on a virtual X screen (Xvfb) for 20 s and a screenshot is taken.
# Each step's exit code and time is printed (paths as <repo>, <tmp> and <outdir>); logs and
# the screenshot go to OUTDIR.
#
#   scripts/fresh_machine_check.sh [REPO] [OUTDIR]
#
# Needs git, make and Python from the README, plus Xvfb, xwininfo and ImageMagick for the
# app step (Debian/Ubuntu: sudo apt-get install -y xvfb x11-utils imagemagick); without
# them that step is reported as not run. Nothing is installed system-wide by this script.
# SKIP_TEST=1 skips the suite.
set -u
REPO=${1:-$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)}
OUT=${2:-$(mktemp -d -t inferdesk-fresh-out.XXXXXX)}
WORK=$(mktemp -d -t inferdesk-fresh.XXXXXX)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
APP_SECONDS=20

say() { echo "$*" | tee -a "$OUT/report.txt"; }

# The report names no folder of the machine it ran on.
anonymous() { sed -e "s|$REPO|<repo>|g" -e "s|$WORK|<tmp>|g" -e "s|$OUT|<outdir>|g"; }

# step NAME CMD...: run, log to OUTDIR/NAME.log, report exit code and wall time.
step() {
    local name=$1; shift
    local t0=$SECONDS
    "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    say "$(printf '%-10s exit %-3s %5d s   %s' "$name" "$rc" $((SECONDS - t0)) "$*" | anonymous)"
    return $rc
}

: >"$OUT/report.txt"
say "fresh-machine check, $(date -u '+%Y-%m-%d %H:%M UTC')"
say "cpu:    $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ //') ($(nproc) cores)"
say "os:     $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME") $(uname -m)"
say "python: $(python3 --version 2>&1)"
say "load:   $(cut -d' ' -f1-3 /proc/loadavg)"
say "repo:   $(basename "$REPO") @ $(git -C "$REPO" rev-parse --short HEAD)"
say ""

step clone git clone -q "$REPO" "$WORK/inferdesk" || exit 1
cd "$WORK/inferdesk" || exit 1
step install make .venv/.kernels
say "$(printf '%-10s %s MB' venv "$(du -sm .venv | cut -f1)")   .venv after make run's install"
say "$(printf '%-10s %s MB' models "$(du -sm resources/models | cut -f1)")   resources/models (the bundled models, unpacked beside the app)"
say "$(printf '%-10s %s' largest "$(du -sm .venv/lib/python*/site-packages/* \
    | sort -rn | head -n 10 | awk '{n = split($2, p, "/"); printf "%s%s %s", s, p[n], $1; s = ", "}')") (MB)"
say "$(printf '%-10s %s MB' bytecode "$(find .venv -name __pycache__ -type d -prune -exec du -sk {} + \
    | awk '{k += $1} END {printf "%d", k / 1024}')")   in __pycache__ folders of .venv"
if [ "${SKIP_TEST:-0}" = 1 ]; then
    say "make-test  skipped (SKIP_TEST=1)"
else
    step make-test make test
    say "$(printf '%-10s %s MB' venv "$(du -sm .venv | cut -f1)")   .venv with the test extras"
    tail -n 3 "$OUT/make-test.log" | sed 's/^/           /' | anonymous | tee -a "$OUT/report.txt"
fi

if ! command -v Xvfb >/dev/null || ! command -v xwininfo >/dev/null \
        || ! command -v import >/dev/null; then
    say "make-run   not run: needs Xvfb, xwininfo and ImageMagick's import"
    exit 0
fi
DISP=:$((90 + RANDOM % 100))
Xvfb "$DISP" -screen 0 1280x800x24 -nolisten tcp >"$OUT/xvfb.log" 2>&1 &
XVFB=$!
sleep 1
t0=$SECONDS
( unset WAYLAND_DISPLAY QT_QPA_PLATFORM; DISPLAY=$DISP exec make run ) >"$OUT/make-run.log" 2>&1 &
APP=$!
shown=no
# Wait for the window, then 20 s more.
for _ in $(seq 1 1200); do
    kill -0 "$APP" 2>/dev/null || break
    DISPLAY=$DISP xwininfo -root -tree 2>/dev/null | grep -q '"Inferdesk' && break
    sleep 0.5
done
for _ in $(seq 1 $((APP_SECONDS * 2))); do
    kill -0 "$APP" 2>/dev/null || break
    if DISPLAY=$DISP xwininfo -root -tree 2>/dev/null | grep -q '"Inferdesk'; then shown=yes; fi
    sleep 0.5
done
if kill -0 "$APP" 2>/dev/null; then
    DISPLAY=$DISP import -window root "$OUT/app.png" 2>>"$OUT/xvfb.log"
    pkill -TERM -P "$APP" 2>/dev/null; kill -TERM "$APP" 2>/dev/null
    wait "$APP" 2>/dev/null
    say "$(printf '%-10s %-8s %5d s   %s' make-run "running" $((SECONDS - t0)) \
        "make run (window shown: $shown; screenshot: <outdir>/app.png)")"
else
    wait "$APP"; rc=$?
    say "$(printf '%-10s exit %-3s %5d s   %s' make-run "$rc" $((SECONDS - t0)) "make run")"
    grep -m1 'inferdesk: error' "$OUT/make-run.log" | sed 's/^/           /' | anonymous \
        | tee -a "$OUT/report.txt"
fi
kill "$XVFB" 2>/dev/null
say ""
say "logs: <outdir>"
echo "(<outdir> is $OUT)"
