"""Start-up checks that run before Qt is touched: a missing system library or display must
end in one line naming the fix, never in Qt's abort (SIGABRT, "could not load the Qt
platform plugin").

Qt loads one platform plugin (``QT_QPA_PLATFORM``, else ``wayland`` in a Wayland session
with ``xcb`` behind it, else ``xcb``). On Linux each plugin is a shared library whose
dependencies the dynamic loader must find; ``ldd`` lists the ones it cannot. Nothing here
imports Qt.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# soname -> package per package manager (apt, dnf, pacman, zypper): Qt's documented
# requirements for the xcb and wayland plugins, as Debian, Fedora, Arch and openSUSE name them.
PACKAGES: dict[str, tuple[str, str, str, str]] = {
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor", "xcb-util-cursor",
                           "libxcb-cursor0"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm", "xcb-util-wm", "libxcb-icccm4"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms", "xcb-util-keysyms",
                            "libxcb-keysyms1"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image", "xcb-util-image", "libxcb-image0"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil",
                                "xcb-util-renderutil", "libxcb-render-util0"),
    "libxcb-xinerama.so.0": ("libxcb-xinerama0", "libxcb", "libxcb", "libxcb-xinerama0"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb", "libxcb", "libxcb-randr0"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb", "libxcb", "libxcb-shape0"),
    "libxcb-xfixes.so.0": ("libxcb-xfixes0", "libxcb", "libxcb", "libxcb-xfixes0"),
    "libxcb-sync.so.1": ("libxcb-sync1", "libxcb", "libxcb", "libxcb-sync1"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb", "libxcb", "libxcb-xkb1"),
    "libxcb-shm.so.0": ("libxcb-shm0", "libxcb", "libxcb", "libxcb-shm0"),
    "libxcb-render.so.0": ("libxcb-render0", "libxcb", "libxcb", "libxcb-render0"),
    "libxcb.so.1": ("libxcb1", "libxcb", "libxcb", "libxcb1"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb", "libx11", "libX11-xcb1"),
    "libX11.so.6": ("libx11-6", "libX11", "libx11", "libX11-6"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon", "libxkbcommon", "libxkbcommon0"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11", "libxkbcommon-x11",
                              "libxkbcommon-x11-0"),
    "libwayland-client.so.0": ("libwayland-client0", "libwayland-client", "wayland",
                               "libwayland-client0"),
    "libwayland-cursor.so.0": ("libwayland-cursor0", "libwayland-cursor", "wayland",
                               "libwayland-cursor0"),
    "libwayland-egl.so.1": ("libwayland-egl1", "libwayland-egl", "wayland", "libwayland-egl1"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl", "libglvnd", "libEGL1"),
    "libGL.so.1": ("libgl1", "libglvnd-glx", "libglvnd", "libGL1"),
    "libOpenGL.so.0": ("libopengl0", "libglvnd-opengl", "libglvnd", "libOpenGL0"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig", "fontconfig", "fontconfig"),
    "libfreetype.so.6": ("libfreetype6", "freetype", "freetype2", "libfreetype6"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs", "dbus", "libdbus-1-3"),
    "libglib-2.0.so.0": ("libglib2.0-0", "glib2", "glib2", "libglib-2_0-0"),
}

# package manager -> (column in PACKAGES, install command)
MANAGERS: dict[str, tuple[int, str]] = {
    "apt": (0, "sudo apt-get install -y"),
    "dnf": (1, "sudo dnf install -y"),
    "pacman": (2, "sudo pacman -S --needed"),
    "zypper": (3, "sudo zypper install -y"),
}

# /etc/os-release ID or ID_LIKE word -> package manager
DISTROS: dict[str, str] = {
    "debian": "apt", "ubuntu": "apt", "linuxmint": "apt", "pop": "apt", "raspbian": "apt",
    "fedora": "dnf", "rhel": "dnf", "centos": "dnf", "rocky": "dnf", "almalinux": "dnf",
    "arch": "pacman", "manjaro": "pacman", "endeavouros": "pacman",
    "opensuse": "zypper", "suse": "zypper", "sles": "zypper", "opensuse-leap": "zypper",
    "opensuse-tumbleweed": "zypper",
}

# Plugins that need no display server (tests, screenshots, VNC).
HEADLESS = {"offscreen", "minimal", "vnc", "linuxfb", "eglfs", "minimalegl", "vkkhrdisplay"}


@dataclass
class Problem:
    """Why the app cannot start here, as the one line the user sees."""

    message: str


def package_manager(os_release: str | None = None) -> str | None:
    """The distribution's package manager, from /etc/os-release (ID, then ID_LIKE)."""
    if os_release is None:
        try:
            os_release = Path("/etc/os-release").read_text()
        except OSError:
            return None
    fields = dict(
        line.split("=", 1) for line in os_release.splitlines() if "=" in line
    )
    words = [fields.get("ID", "")] + fields.get("ID_LIKE", "").split()
    for word in (w.strip().strip('"').lower() for w in words):
        if word in DISTROS:
            return DISTROS[word]
        if word.startswith("opensuse"):
            return "zypper"
    return None


def install_hint(sonames: list[str], manager: str | None) -> str:
    """The command that installs ``sonames`` with ``manager`` (or what to look for)."""
    if manager in MANAGERS:
        col, cmd = MANAGERS[manager]
        known = sorted({PACKAGES[s][col] for s in sonames if s in PACKAGES})
        unknown = [s for s in sonames if s not in PACKAGES]
        parts = []
        if known:
            parts.append(f"{cmd} {' '.join(known)}")
        if unknown:
            parts.append(f"and the package that provides {', '.join(unknown)}")
        return "install them with: " + " ".join(parts)
    return "install the packages that provide them with your system's package manager"


def requested_platforms(env: Mapping[str, str]) -> list[str]:
    """The plugins Qt will try, in order (as Qt 6 decides on Linux)."""
    explicit = env.get("QT_QPA_PLATFORM", "").strip()
    if explicit:
        return [p.split(":", 1)[0].strip() for p in explicit.split(";") if p.strip()]
    if env.get("XDG_SESSION_TYPE") == "wayland" or env.get("WAYLAND_DISPLAY"):
        return ["wayland", "xcb"]
    return ["xcb"]


def plugin_path(platform: str) -> Path | None:
    """The platform plugin's shared library inside the installed PySide6, if any."""
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    for plugins in (root / "Qt" / "plugins", root / "plugins"):
        lib = plugins / "platforms" / f"libq{platform}.so"
        if lib.exists():
            return lib
    return None


def missing_libraries(lib: Path) -> list[str]:
    """Sonames the dynamic loader cannot find for ``lib`` (transitively), via ldd."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return []  # cannot tell; let Qt try
    try:
        out = subprocess.run([ldd, str(lib)], capture_output=True, text=True, timeout=20,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    missing = []
    for line in out.splitlines():
        name, _, rest = line.strip().partition("=>")
        if "not found" in rest and name.strip() not in missing:
            missing.append(name.strip())
    return missing


def _has_display(platform: str, env: Mapping[str, str]) -> bool:
    if platform == "xcb":
        return bool(env.get("DISPLAY"))
    if platform == "wayland":
        return bool(env.get("WAYLAND_DISPLAY"))
    return True


def check(env: Mapping[str, str] | None = None, os_release: str | None = None) -> Problem | None:
    """None if Qt can start one of the requested platforms here, else the reason."""
    if not sys.platform.startswith("linux"):
        return None  # macOS and Windows ship what Qt needs
    env = os.environ if env is None else env
    platforms = requested_platforms(env)
    first_missing: tuple[str, list[str]] | None = None
    displayless = []
    for platform in platforms:
        if platform in HEADLESS:
            return None
        if not _has_display(platform, env):
            displayless.append(platform)
            continue
        lib = plugin_path(platform)
        if lib is None:
            return None  # an unknown or custom plugin: Qt reports it best
        missing = missing_libraries(lib)
        if not missing:
            return None
        first_missing = first_missing or (platform, missing)
    if first_missing is not None:
        platform, missing = first_missing
        hint = install_hint(missing, package_manager(os_release))
        return Problem(
            f"Qt's '{platform}' display plugin needs system libraries that are missing "
            f"({', '.join(missing)}); {hint}")
    return Problem(
        "No display found (DISPLAY and WAYLAND_DISPLAY are unset): start Inferdesk from a "
        "desktop session, or use the command line (`inferdesk --help`); for a virtual screen "
        "run `xvfb-run -a inferdesk`.")
