"""Wheels for `bench/gpu_check.sh --offline`: what the project needs beyond a GPU node's
site packages, small enough to travel beside the repository (64 MiB in all).

A GPU node's site Python (3.12) has JAX with its CUDA plugin, flax, optax, chex, numpy 2,
absl-py, rich and matplotlib, and whatever those need. `OFFLINE_WHEELS` lists the rest, at
the versions requirements.txt pins. Two of them are cut down to what a Pong-v5 run needs:
envpool keeps its own modules and only the Atari and classic-control families, and its
`entry.py` registers those alone (its wheel is 61 MiB, nearly all of it MuJoCo, ViZDoom,
Box2D and Qt); envpool-assets keeps only Pong's ROM (the wheel is 92 MB of models and
ROMs).

  # a machine with internet, Python 3.12: download, cut down, write DIR
  python bench/gpu_wheels.py --out=DIR
  # offline, from the packages installed in this Python (what the CI's smoke test does)
  python bench/gpu_wheels.py --out=DIR --from_installed

Each wheel is written anew with its RECORD (hashes of what it holds), so
`pip install --no-index --no-deps --target` installs it like any other. Last line: JSON
with each wheel's size.
"""

import argparse
import base64
import csv
import hashlib
import importlib.metadata
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from typing import Callable, Iterator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Beyond the site packages: the envs, and what a local run imports (the metrics file,
# the config flags, the replay's memory check and port). Versions: requirements.txt.
OFFLINE_WHEELS = (
    "envpool",
    "envpool-assets",
    "gymnasium",
    "cloudpickle",
    "farama-notifications",
    "tensorboardx",
    "protobuf",
    "ml-collections",
    "psutil",
    "portpicker",
)
# The rest of the repository and DIR together must stay under this (the device tool's).
LIMIT_BYTES = 64 * 2**20
PONG_ROM = "envpool_assets/atari/roms/pong.bin"


# The envpool families a Pong-v5 run and the CartPole smoke need; the rest are dropped
# whole, and `envpool/entry.py`, which imports every family's registration (whose package
# loads its engine), is rewritten to import these alone.
ENVPOOL_FAMILIES = ("atari", "classic_control")


def _keep_envpool(path: str) -> bool:
    if path.startswith("envpool.libs/"):  # Qt, for Procgen
        return False
    parts = path.split("/")
    if parts[0] != "envpool" or len(parts) < 3 or parts[1] in ("python",):
        return True  # the package's own modules (registration, protocol, ...)
    return parts[1] in ENVPOOL_FAMILIES


def _envpool_entry(text: str) -> str:
    keep = tuple(f"import envpool.{family}.registration" for family in ENVPOOL_FAMILIES)
    lines = text.splitlines(keepends=True)
    return "".join(
        line for line in lines if not line.startswith("import envpool.") or line.startswith(keep)
    )


# What each cut-down wheel keeps (a path inside the wheel -> keep it); dist-info always.
KEEP: dict[str, Callable[[str], bool]] = {
    "envpool": _keep_envpool,
    "envpool-assets": lambda path: path == PONG_ROM or path == "envpool_assets/__init__.py",
}
# Files a cut-down wheel holds changed: (package, path) -> new content from the old.
REWRITE: dict[tuple[str, str], Callable[[str], str]] = {
    ("envpool", "envpool/entry.py"): _envpool_entry,
}


def requirement_pins() -> dict[str, str]:
    """{package: version} of requirements.txt."""
    pins = {}
    with open(os.path.join(REPO, "requirements.txt")) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if "==" in line:
                name, version = line.split("==")
                pins[_normal(name)] = version
    return pins


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def write_wheel(out_dir: str, filename: str, files: Iterator[tuple[str, bytes]]) -> str:
    """Writes `files` (path in the wheel, content) as the wheel `filename`, with a RECORD
    of them; returns its path."""
    path = os.path.join(out_dir, filename)
    rows, record_path = [], None
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files:
            if name.endswith(".dist-info/RECORD"):
                record_path = name
                continue
            wheel.writestr(name, data)
            rows.append((name, _record_hash(data), str(len(data))))
        if record_path is None:
            raise ValueError(f"{filename}: no RECORD in its dist-info")
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows([*rows, (record_path, "", "")])
        wheel.writestr(record_path, text.getvalue())
    return path


def _kept(name: str, path: str) -> bool:
    keep = KEEP.get(name)
    return keep is None or ".dist-info/" in path or keep(path)


def _content(name: str, path: str, data: bytes) -> bytes:
    rewrite = REWRITE.get((name, path))
    return data if rewrite is None else rewrite(data.decode()).encode()


def from_wheel(wheel_path: str, out_dir: str) -> str:
    """A downloaded wheel, cut down (`KEEP`) or as it is, written to `out_dir`."""
    filename = os.path.basename(wheel_path)
    name = _normal(filename.split("-")[0])
    with zipfile.ZipFile(wheel_path) as wheel:
        files = ((p, _content(name, p, wheel.read(p))) for p in wheel.namelist() if _kept(name, p))
        return write_wheel(out_dir, filename, files)


def from_installed(name: str, out_dir: str) -> str:
    """The installed distribution `name`, cut down (`KEEP`), written to `out_dir` as a
    wheel with the tag its own WHEEL file names."""
    dist = importlib.metadata.distribution(name)
    paths = [
        str(f) for f in dist.files if "__pycache__" not in str(f) and not str(f).startswith("..")
    ]
    info = next(p for p in paths if p.endswith(".dist-info/WHEEL"))
    tag = re.search(r"^Tag: (\S+)$", dist.locate_file(info).read_text(), re.M).group(1)
    project = dist.metadata["Name"].replace("-", "_")
    filename = f"{project}-{dist.version}-{tag}.whl"

    def files() -> Iterator[tuple[str, bytes]]:
        for path in paths:
            if _kept(_normal(name), path) and os.path.isfile(dist.locate_file(path)):
                yield path, _content(_normal(name), path, dist.locate_file(path).read_bytes())

    return write_wheel(out_dir, filename, files())


def download(out_dir: str) -> list[str]:
    """Downloads `OFFLINE_WHEELS` at requirements.txt's pins for CPython 3.12 on x86_64 Linux."""
    pins = requirement_pins()
    wanted = [f"{name}=={pins[_normal(name)]}" for name in OFFLINE_WHEELS]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--platform",
            "manylinux_2_28_x86_64",
            "--dest",
            out_dir,
            *wanted,
        ],
        check=True,
    )
    return sorted(os.path.join(out_dir, f) for f in os.listdir(out_dir) if f.endswith(".whl"))


def repository_bytes() -> int:
    """Bytes of the files git tracks here (what travels beside DIR)."""
    tracked = subprocess.run(
        ["git", "-C", REPO, "ls-files", "-z"], check=True, capture_output=True
    ).stdout.split(b"\0")
    return sum(os.path.getsize(os.path.join(REPO, p.decode())) for p in tracked if p)


def main() -> None:
    # argparse, not absl: the machine that downloads the wheels needs only Python and pip.
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="The directory to write the wheels to.")
    parser.add_argument(
        "--from_installed",
        action="store_true",
        help="Build them from the distributions installed in this Python (no network).",
    )
    args = parser.parse_args()
    out = args.out
    os.makedirs(out, exist_ok=True)
    if args.from_installed:
        written = [from_installed(name, out) for name in OFFLINE_WHEELS]
    else:
        with tempfile.TemporaryDirectory() as downloaded:
            written = [from_wheel(path, out) for path in download(downloaded)]
    sizes = {os.path.basename(path): os.path.getsize(path) for path in written}
    total = sum(sizes.values()) + repository_bytes()
    for name, size in sorted(sizes.items()):
        print(f"{size / 2**20:7.2f} MiB  {name}")
    print(f"with the repository: {total / 2**20:.1f} MiB of {LIMIT_BYTES / 2**20:.0f} MiB")
    print(
        json.dumps(
            {
                "bench": "gpu_wheels",
                "wheels": sizes,
                "total_bytes": total,
                "fits": total <= LIMIT_BYTES,
            }
        )
    )
    if total > LIMIT_BYTES:
        sys.exit(1)


if __name__ == "__main__":
    main()
