"""The wheel: py3-none-any, light dependencies, and the doctor runs where torch and vLLM are absent."""

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from helpers.facts import EXAMPLES, ROOT

HEAVY = ("torch", "triton", "vllm", "flashinfer")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = out.glob("*.whl")
    return whl


def test_wheel_is_pure_and_declares_no_heavy_dependency(wheel):
    assert wheel.name.startswith("caovan_vllm_sm75_turbo3-") and wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
        entry = z.read(meta.replace("METADATA", "entry_points.txt")).decode()
    requires = [line.split(":", 1)[1].strip().lower() for line in text.splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert requires, "no runtime dependencies found in METADATA"
    for dep in requires:
        assert not dep.startswith(HEAVY), dep
    assert "Requires-Python: <3.13,>=3.10" in text
    assert "[vllm.general_plugins]" in entry and "caovan_vllm_sm75_turbo3.plugin.register:register" in entry
    assert "caovan-sm75-doctor = caovan_vllm_sm75_turbo3.cli.doctor:entry" in entry


def test_doctor_runs_from_the_wheel_without_torch_or_vllm(wheel, tmp_path):
    env_dir = tmp_path / "bare"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([str(py), "-c", "import importlib.util as u; print([m for m in %r if u.find_spec(m)])" % (HEAVY,)],
                       capture_output=True, text=True)
    assert r.stdout.strip() == "[]", "the bare venv should hold none of torch/triton/vllm/flashinfer"
    doctor = env_dir / "bin" / "caovan-sm75-doctor"
    r = subprocess.run([str(doctor), "--facts", str(EXAMPLES / "2x2080ti-22g.json")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "runtime=PASS" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([str(doctor), "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and '"torch"' in r.stdout and "Traceback" not in r.stderr


def test_the_readmes_install_commands_install_from_a_checkout(tmp_path):
    # The README's own install block, run as written from a checkout, into a fresh environment.
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Install", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].split() for line in block.strip().splitlines()]
    assert commands[0][:2] == ["pip", "install"] and commands[1] == ["caovan-sm75-doctor"]
    env_dir = tmp_path / "fresh"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    r = subprocess.run([str(bin_dir / "python"), "-m", *commands[0], "-q"], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    doctor = subprocess.run([str(bin_dir / commands[1][0])], capture_output=True, text=True, timeout=60)
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    # What the README says the doctor does where vLLM and a GPU are missing: it names them, exit 2.
    assert doctor.returncode == 2 and "runtime=FAIL" in doctor.stdout, doctor.stdout + doctor.stderr
    assert "vLLM is not installed" in doctor.stdout and "no NVIDIA GPU" in doctor.stdout
    assert "Traceback" not in doctor.stderr
