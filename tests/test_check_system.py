"""scripts/check_system.sh: what `make` needs before Python runs, one line per distro."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_system.sh"


def fake_python(tmp: Path, version: str, has_venv: bool) -> Path:
    """A stand-in interpreter answering the script's three questions as a system would."""
    major, minor = version.split(".")
    py = tmp / f"python{version}"
    py.write_text(
        "#!/bin/sh\n"
        'case "$2" in\n'
        f"  *'sys.exit(sys.version_info'*) [ {minor} -ge 10 ] && [ {major} -ge 3 ]; exit $? ;;\n"
        f"  *'import venv, ensurepip'*) exit {0 if has_venv else 1} ;;\n"
        f"  *'print(\"Python'*) echo 'Python {version}' ;;\n"
        f"  *'print(\"%d.%d\"'*) echo '{version}' ;;\n"
        "esac\n")
    py.chmod(0o755)
    return py


def run(tmp: Path, py: str, release: str, *extra: str) -> subprocess.CompletedProcess:
    (tmp / "os-release").write_text(release)
    return subprocess.run(["sh", str(SCRIPT), py, *extra], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "INFERDESK_OS_RELEASE":
                               str(tmp / "os-release")})


@pytest.mark.parametrize(("release", "want"), [
    ("ID=debian\n", "sudo apt-get install -y python3.11-venv"),
    ("ID=ubuntu\nID_LIKE=debian\n", "sudo apt-get install -y python3.11-venv"),
    ("ID=opensuse-leap\nID_LIKE=\"suse opensuse\"\n", "sudo zypper install -y python311-base"),
])
def test_missing_venv_names_the_package(tmp_path, release, want):
    """A fresh Debian/Ubuntu has python3 but not python3-venv."""
    out = run(tmp_path, str(fake_python(tmp_path, "3.11", has_venv=False)), release)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(want), lines


def test_old_python_is_named(tmp_path):
    out = run(tmp_path, str(fake_python(tmp_path, "3.8", has_venv=True)), "ID=fedora\n")
    assert out.returncode == 2
    assert "Python 3.8 is too old" in out.stderr and "sudo dnf install -y python3" in out.stderr


def test_missing_interpreter_is_named(tmp_path):
    out = run(tmp_path, str(tmp_path / "python9"), "ID=arch\n")
    assert out.returncode == 2 and "sudo pacman -S --needed python" in out.stderr


def test_good_python_passes(tmp_path):
    out = run(tmp_path, str(fake_python(tmp_path, "3.12", has_venv=True)), "ID=debian\n")
    assert out.returncode == 0 and out.stderr == ""


def test_compiler_named_only_when_missing(tmp_path):
    (tmp_path / "bin").mkdir()
    for tool in ("sh", "tr", "uname", "cat"):  # a PATH without cc or gcc
        src = Path("/bin") / tool
        if src.exists():
            (tmp_path / "bin" / tool).symlink_to(src)
    (tmp_path / "os-release").write_text("ID=debian\n")
    out = subprocess.run(["/bin/sh", str(SCRIPT), "python3", "--compiler"], capture_output=True,
                         text=True, env={"PATH": str(tmp_path / "bin"),
                                         "INFERDESK_OS_RELEASE": str(tmp_path / "os-release")})
    assert out.returncode == 2 and "sudo apt-get install -y build-essential" in out.stderr


def test_a_full_disk_is_named_before_the_compiler(tmp_path):
    """pip's "No space left on device" is named with the folder and what the install needs."""
    bin_dir, venv = tmp_path / "bin", tmp_path / "venv"
    bin_dir.mkdir()
    (venv / "bin").mkdir(parents=True)
    for tool in ("sh", "awk", "dirname", "cc"):
        for src in (Path("/bin") / tool, Path("/usr/bin") / tool):
            if src.exists():
                (bin_dir / tool).symlink_to(src)
                break
    free_kb = {str(venv): 300 * 1024, str(tmp_path): 50 * 1024 * 1024}  # 300 MB; 50 GB
    (bin_dir / "df").write_text(
        "#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted on'\n"
        + "".join(f'[ "$2" = "{d}" ] && echo "/dev/x 1 1 {kb} 99% /"\n'
                  for d, kb in free_kb.items()))
    (bin_dir / "df").chmod(0o755)

    def named(py: Path) -> subprocess.CompletedProcess:
        return subprocess.run(["/bin/sh", str(SCRIPT), str(py), "--compiler"],
                              capture_output=True, text=True,
                              env={"PATH": str(bin_dir), "TMPDIR": str(tmp_path)})

    out = named(venv / "bin" / "python")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out
    assert f"the disk holding {venv} has 300 MB free" in lines[0] and "1500 MB" in lines[0]
    # room enough everywhere: the generic line, not a disk
    out = named(tmp_path / "bin" / "python")
    assert out.returncode == 2 and "see pip's output above" in out.stderr, out


def accelerator(tmp: Path, nvidia_smi: str | None, system: str, machine: str) -> str:
    """What --accelerator prints on a machine faked by stand-ins for nvidia-smi and uname."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "sed", "head", "cat"):
        for src in (Path("/bin") / tool, Path("/usr/bin") / tool):
            if src.exists():
                (bin_dir / tool).symlink_to(src)
                break
    stand_ins = {"uname": f'[ "$1" = -m ] && echo {machine} || echo {system}\n'}
    if nvidia_smi is not None:
        stand_ins["nvidia-smi"] = f"cat <<'END'\n{nvidia_smi}\nEND\n"
    for name, body in stand_ins.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    out = subprocess.run(["/bin/sh", str(SCRIPT), "python3", "--accelerator"],
                         capture_output=True, text=True, env={"PATH": str(bin_dir)})
    assert out.returncode == 0 and out.stderr == "", out
    return out.stdout.strip()


SMI = "| NVIDIA-SMI 580.95.05    Driver Version: 580.95.05    CUDA Version: {} |"


@pytest.mark.parametrize(("smi", "system", "machine", "want"), [
    (SMI.format("12.4"), "Linux", "x86_64", "cuda12"),
    (SMI.format("13.0"), "Linux", "x86_64", "cuda13"),
    (SMI.format("11.8"), "Linux", "aarch64", "cuda12"),
    (None, "Darwin", "arm64", "mlx"),
    (None, "Darwin", "x86_64", ""),
    (None, "Linux", "x86_64", ""),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
     "Linux", "x86_64", ""),
])
def test_accelerator_extra_follows_the_machine(tmp_path, smi, system, machine, want):
    """make installs [cuda12]/[cuda13] by the driver's CUDA version, [mlx] on Apple silicon,
    and neither on a machine without a GPU."""
    assert accelerator(tmp_path, smi, system, machine) == want


LOCKS = {"default.txt": ("test", "nvrtc", "mlx"), "cuda12.txt": ("test", "cuda12", "mlx"),
         "cuda13.txt": ("test", "cuda13", "mlx")}


@pytest.mark.parametrize(("lock", "extras"), LOCKS.items())
def test_lock_files_pin_what_pyproject_asks_for(lock, extras):
    """make installs with requirements/*.txt as constraints: each of pyproject.toml's
    requirements (its dependencies and the lock's extras) is pinned there to a version its
    range admits, so a range changed without `make lock` fails here, not on a user's install."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    root = SCRIPT.parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    wanted += [Requirement(r) for e in extras for r in project["optional-dependencies"][e]]
    pins: dict[str, list[str]] = {}
    for line in (root / "requirements" / lock).read_text().splitlines():
        if "==" in line and not line.startswith((" ", "#")):
            name, version = line.split(";")[0].strip().split("==")
            pins.setdefault(canonicalize_name(name), []).append(version)
    for req in wanted:
        versions = pins.get(canonicalize_name(req.name))
        assert versions, f"{req.name} is not in requirements/{lock}: run `make lock`"
        assert any(req.specifier.contains(v, prereleases=True) for v in versions), \
            f"requirements/{lock} pins {req.name} at {versions}, outside {req.specifier}"
