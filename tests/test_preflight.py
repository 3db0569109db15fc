"""The start-up check names a missing system library or display in one line, per distro."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gui import preflight

DEBIAN = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n'
UBUNTU = 'NAME="Ubuntu"\nID=ubuntu\nID_LIKE=debian\n'
FEDORA = 'NAME="Fedora Linux"\nID=fedora\n'
ARCH = 'NAME="Arch Linux"\nID=arch\n'
TUMBLEWEED = 'NAME="openSUSE Tumbleweed"\nID="opensuse-tumbleweed"\nID_LIKE="opensuse suse"\n'
MINT = 'NAME="Linux Mint"\nID=linuxmint\nID_LIKE="ubuntu debian"\n'

XCB_MISSING = ["libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-keysyms.so.1"]


@pytest.mark.parametrize(("release", "manager"), [
    (DEBIAN, "apt"), (UBUNTU, "apt"), (MINT, "apt"), (FEDORA, "dnf"), (ARCH, "pacman"),
    (TUMBLEWEED, "zypper"), ("ID=plan9\n", None), ("", None),
])
def test_package_manager_from_os_release(release, manager):
    assert preflight.package_manager(release) == manager


@pytest.mark.parametrize(("release", "command"), [
    (DEBIAN, "sudo apt-get install -y libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1"),
    (FEDORA, "sudo dnf install -y xcb-util-cursor xcb-util-keysyms xcb-util-wm"),
    (ARCH, "sudo pacman -S --needed xcb-util-cursor xcb-util-keysyms xcb-util-wm"),
    (TUMBLEWEED, "sudo zypper install -y libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1"),
])
def test_missing_xcb_libraries_name_the_install_command(monkeypatch, release, command):
    """A fresh desktop without three of the xcb libraries Qt's plugin needs."""
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(preflight, "missing_libraries", lambda lib: list(XCB_MISSING))
    problem = preflight.check({"DISPLAY": ":0"}, os_release=release)
    assert problem is not None
    assert "\n" not in problem.message
    assert "'xcb'" in problem.message and "libxcb-icccm.so.4" in problem.message
    assert problem.message.endswith(command)


def test_unknown_library_and_unknown_distro_still_say_what_is_missing(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(preflight, "missing_libraries", lambda lib: ["libweird.so.9"])
    msg = preflight.check({"DISPLAY": ":0"}, os_release="ID=plan9\n").message
    assert "libweird.so.9" in msg and "package manager" in msg
    msg = preflight.check({"DISPLAY": ":0"}, os_release=DEBIAN).message
    assert "the package that provides libweird.so.9" in msg


def test_no_display_gets_its_own_line(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    problem = preflight.check({}, os_release=DEBIAN)
    assert problem is not None and "No display" in problem.message
    assert "\n" not in problem.message


@pytest.mark.parametrize("platform", ["offscreen", "minimal", "vnc"])
def test_headless_platforms_need_no_display(monkeypatch, platform):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(preflight, "missing_libraries", lambda lib: pytest.fail("not checked"))
    assert preflight.check({"QT_QPA_PLATFORM": platform}, os_release=DEBIAN) is None


def test_wayland_session_prefers_wayland_and_falls_back_to_xcb(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    env = {"XDG_SESSION_TYPE": "wayland", "WAYLAND_DISPLAY": "wayland-0", "DISPLAY": ":0"}
    assert preflight.requested_platforms(env) == ["wayland", "xcb"]
    assert preflight.requested_platforms({"QT_QPA_PLATFORM": "xcb;offscreen"}) == \
        ["xcb", "offscreen"]
    checked = []

    def missing(lib: Path) -> list[str]:
        checked.append(lib.name)
        return ["libwayland-cursor.so.0"] if "wayland" in lib.name else []

    monkeypatch.setattr(preflight, "missing_libraries", missing)
    assert preflight.check(env, os_release=DEBIAN) is None  # xcb works: Qt falls back to it
    assert checked == ["libqwayland.so", "libqxcb.so"]
    monkeypatch.setattr(preflight, "missing_libraries", lambda lib: ["libwayland-cursor.so.0"])
    msg = preflight.check(env, os_release=DEBIAN).message
    assert "'wayland'" in msg and "libwayland-cursor0" in msg  # the preferred plugin is named


def test_missing_libraries_reads_ldd_for_real(tmp_path):
    """A real shared object whose dependency was removed: ldd reports it, we list it."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or shutil.which("ldd") is None or not sys.platform.startswith("linux"):
        pytest.skip("needs a C compiler and ldd (Linux)")
    (tmp_path / "dep.c").write_text("int dep(void) { return 1; }\n")
    (tmp_path / "top.c").write_text("int dep(void);\nint top(void) { return dep(); }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", tmp_path / "libinferdeskdep.so.1",
                    "-Wl,-soname,libinferdeskdep.so.1", tmp_path / "dep.c"], check=True)
    subprocess.run([cc, "-shared", "-fPIC", "-o", tmp_path / "libtop.so", tmp_path / "top.c",
                    f"-L{tmp_path}", "-l:libinferdeskdep.so.1", f"-Wl,-rpath,{tmp_path}"],
                   check=True)
    assert preflight.missing_libraries(tmp_path / "libtop.so") == []
    (tmp_path / "libinferdeskdep.so.1").unlink()
    assert preflight.missing_libraries(tmp_path / "libtop.so") == ["libinferdeskdep.so.1"]


def test_the_command_exits_2_with_one_line_instead_of_aborting(tmp_path):
    """`inferdesk` with no display: one line on stderr, exit 2, no Qt abort."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM", "XDG_SESSION_TYPE")}
    proc = subprocess.run([sys.executable, "-m", "gui.launcher"], env=env, capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    if not sys.platform.startswith("linux"):
        pytest.skip("the display check is for Linux")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("inferdesk: error: No display"), lines
