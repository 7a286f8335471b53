"""benchmarks/engine: what pack.py carries of a vLLM wheel, and the parts of engine_check.py, compare.py and
run_device.sh that make the on/off runs faithful (pure Python; the engine runs in the serve lane and on
the lent GPU)."""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "benchmarks" / "engine"
sys.path.insert(0, str(ENGINE))
import compare  # noqa: E402
import engine_check  # noqa: E402
import pack  # noqa: E402

# vllm_flash_attn/__init__.py as 0.21.0 and 0.24.0 ship it (the lines that matter)
FA_INIT = '''import os
from vllm.vllm_flash_attn.flash_attn_interface import (  # noqa: E402
    FA2_AVAILABLE,
    FA3_AVAILABLE,
    is_fa_version_supported,
)

if not (FA2_AVAILABLE or FA3_AVAILABLE):
    raise ImportError(
        "vllm.vllm_flash_attn requires the CUDA flash attention extensions "
    )

__all__ = ["is_fa_version_supported"]
'''


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def test_flash_attn_python_files_travel_and_its_extensions_and_the_dropped_parts_do_not(tmp_path, monkeypatch):
    monkeypatch.setattr(pack, "prune_file", lambda so, arch: None)
    monkeypatch.setattr(pack, "strip_symbols", lambda so: None)
    rng = random.Random()
    files = {"vllm/__init__.py": b"", "vllm/vllm_flash_attn/__init__.py": FA_INIT.encode(),
             "vllm/vllm_flash_attn/flash_attn_interface.py": b"FA2_AVAILABLE = False\n",
             "vllm/vllm_flash_attn/cute/interface.py": b"x = 1\n",
             "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": rng.randbytes(64),
             "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": rng.randbytes(64),
             "vllm/_moe_C_stable_libtorch.abi3.so": rng.randbytes(32), "vllm/vllm-rs": rng.randbytes(32),
             "vllm/third_party/fmha_sm100/a.hpp": b"", "vllm/third_party/deep_gemm/b.py": b"",
             "vllm/model_executor/__pycache__/x.pyc": b"", "vllm/platforms/cuda.py": b"import torch\n"}
    site = tmp_path / "site"
    pack.unpack_vllm(_wheel(tmp_path / "v.whl", files), site)
    kept = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert kept == ["vllm/__init__.py", "vllm/platforms/cuda.py", "vllm/vllm_flash_attn/__init__.py",
                    "vllm/vllm_flash_attn/cute/interface.py", "vllm/vllm_flash_attn/flash_attn_interface.py"]
    init = (site / "vllm/vllm_flash_attn/__init__.py").read_text()
    assert pack.FLASH_ATTN_GUARD not in init and init.count(pack.FLASH_ATTN_UNGUARDED) == 1
    # the package now imports without its extensions (the interface stands in for the real one)
    pkg = tmp_path / "imp" / "vllm" / "vllm_flash_attn"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(init)
    (pkg / "flash_attn_interface.py").write_text("FA2_AVAILABLE = FA3_AVAILABLE = False\n"
                                                 "def is_fa_version_supported(v): return False\n")
    proc = subprocess.run([sys.executable, "-c", "import vllm.vllm_flash_attn as f; print(f.__all__)"],
                          cwd=tmp_path / "imp", capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "is_fa_version_supported" in proc.stdout, proc.stderr
    # the shipped text, unguarded, raises: the stand-in is what changed it
    (pkg / "__init__.py").write_text(FA_INIT)
    proc = subprocess.run([sys.executable, "-c", "import vllm.vllm_flash_attn"], cwd=tmp_path / "imp",
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "ImportError" in proc.stderr


def test_flashinfer_travels_with_its_sources_and_the_cutlass_headers_its_jit_names_only(tmp_path):
    c = pack.CUTLASS
    files = {"flashinfer/__init__.py": b"", "flashinfer/prefill.py": b"x = 1\n",
             "flashinfer/data/csrc/batch_prefill.cu": b"//", "flashinfer/data/include/flashinfer/mma.cuh": b"//",
             c + "include/cute/tensor.hpp": b"//", c + "tools/util/include/cutlass/util/device_memory.h": b"//",
             c + "examples/00_basic_gemm/basic_gemm.cu": b"//", c + "python/cutlass/__init__.py": b"",
             c + "test/unit/gemm.cu": b"//", c + "tools/profiler/src/main.cpp": b"//",
             "flashinfer/__pycache__/prefill.cpython-312.pyc": b"",
             "flashinfer_python-0.6.8.post1.dist-info/METADATA": b"Name: flashinfer-python\n"}
    cache = tmp_path / "cache"
    cache.mkdir()
    _wheel(cache / "flashinfer_python-0.6.8.post1-py3-none-any.whl", files)
    archive = tmp_path / "out" / pack.FLASHINFER_ARCHIVE
    archive.parent.mkdir()
    pack.pack_flashinfer("0.6.8.post1", cache, archive)   # in the cache: nothing downloaded
    with tarfile.open(archive) as tar:
        kept = sorted(m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile())
    assert kept == sorted(["flashinfer/__init__.py", "flashinfer/prefill.py", "flashinfer/data/csrc/batch_prefill.cu",
                           "flashinfer/data/include/flashinfer/mma.cuh", c + "include/cute/tensor.hpp",
                           c + "tools/util/include/cutlass/util/device_memory.h",
                           "flashinfer_python-0.6.8.post1.dist-info/METADATA"])
    assert sorted(p.name for p in archive.parent.iterdir()) == [pack.FLASHINFER_ARCHIVE]   # no stage left


def test_the_pins_read_from_a_vllm_wheel_name_torch_and_flashinfer(tmp_path):
    wheel = tmp_path / "v.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm-0.21.0.dist-info/METADATA", "Name: vllm\nRequires-Dist: torch==2.11.0\n"
                    "Requires-Dist: flashinfer-python==0.6.8.post1\nRequires-Dist: flashinfer-cubin==0.6.8.post1\n"
                    "Requires-Dist: xformers==0.0.1; platform_system == 'Linux'\n")
    assert pack.pin(wheel, "torch") == "2.11.0" and pack.pin(wheel, "flashinfer-python") == "0.6.8.post1"
    assert pack.pin(wheel, "xformers") == "0.0.1" and pack.pin(wheel, "flashinfer") is None


@pytest.mark.vllm
def test_every_cutlass_folder_flashinfers_jit_names_is_carried(tmp_path):
    """Against the FlashInfer that vLLM 0.21.0 pins (the full lane): the -isystem folders of the build
    file its JIT writes for the Turing prefill module fall inside what pack.py keeps."""
    code = ("import torch, flashinfer, pathlib\n"
            "from flashinfer.jit.attention import gen_batch_prefill_module\n"
            "spec = gen_batch_prefill_module('fa2', torch.float16, torch.float16, torch.float16, torch.int32,"
            " 256, 256, 0, False, False, False)\n"
            "spec.write_ninja()\n"
            "print(pathlib.Path(flashinfer.__file__).parent)\n"
            "print(spec.ninja_path.read_text())\n")
    env = {**os.environ, "FLASHINFER_CUDA_ARCH_LIST": "7.5", "FLASHINFER_WORKSPACE_BASE": str(tmp_path),
           "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    root, ninja = proc.stdout.split("\n", 1)
    folders = [w for line in ninja.splitlines() for w in line.split() if w.startswith(root + "/data/")]
    assert folders and any("cutlass" in f for f in folders)
    for folder in folders:
        name = "flashinfer/" + folder[len(root) + 1:].rstrip("/") + "/"
        assert pack.flashinfer_carried(name + "x.h"), name
    assert "code=sm_75" in ninja   # what nvcc_ptx.sh turns into PTX


def test_nvcc_ptx_makes_turing_machine_code_ptx_and_passes_every_other_argument_as_it_was(tmp_path):
    record = tmp_path / "nvcc"
    record.write_text('#!/usr/bin/env bash\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    record.chmod(0o755)
    args = ["-gencode=arch=compute_75,code=sm_75", "-gencode=arch=compute_90a,code=sm_90a", "-I", "/a dir/with space",
            "-DNAME=code=sm_75x", "-c", "k.cu", "-o", "k.o"]
    proc = subprocess.run(["bash", str(ENGINE / "nvcc_ptx.sh"), *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "NVCC": str(record)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["-gencode=arch=compute_75,code=compute_75", args[1], "-I", "/a dir/with space",
                                        "-DNAME=code=compute_75x", "-c", "k.cu", "-o", "k.o"]
    failing = tmp_path / "bad"
    failing.write_text("#!/usr/bin/env bash\nexit 7\n")
    failing.chmod(0o755)
    assert subprocess.run(["bash", str(ENGINE / "nvcc_ptx.sh")], env={**os.environ, "NVCC": str(failing)},
                          timeout=30).returncode == 7   # the compiler's failure is the build's


def test_a_flash_attn_init_without_the_known_guard_stops_the_pack(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text(FA_INIT.replace(pack.FLASH_ATTN_GUARD, "if not FA2_AVAILABLE:"))
    with pytest.raises(SystemExit) as err:
        pack.unguard_flash_attn(init)
    assert "FLASH_ATTN_GUARD" in str(err.value)
    init.write_text(FA_INIT + "\n" + FA_INIT)   # twice: which one?
    with pytest.raises(SystemExit):
        pack.unguard_flash_attn(init)


def test_each_release_has_its_own_list_of_wheels_and_the_later_one_adds_what_it_imports():
    lists = {p.name: [ln for ln in p.read_text().splitlines() if ln and not ln.startswith("#")]
             for p in ENGINE.glob("carry_wheels_*.txt")}
    assert {"carry_wheels_0.21.0.txt", "carry_wheels_0.24.0.txt"} <= set(lists)
    for name, pins in lists.items():
        names = [p.split("==")[0].lower().replace("_", "-") for p in pins]
        assert all("==" in p for p in pins) and len(names) == len(set(names)), name   # one version of each
    assert {"compressed-tensors==0.17.0", "loguru==0.7.3"} <= set(lists["carry_wheels_0.24.0.txt"])


def test_pack_refuses_a_release_without_a_list_before_downloading(tmp_path, monkeypatch):
    monkeypatch.setattr(pack, "vllm_wheel", lambda *a: pytest.fail("downloaded"))
    with pytest.raises(SystemExit) as err:
        pack.main(["--vllm", "9.9.9", "--out", str(tmp_path / "c"), "--cache", str(tmp_path / "cache")])
    assert "carry_wheels_9.9.9.txt" in str(err.value)


def test_turing_limits_replace_the_real_ones_and_keep_the_rest():
    h100 = {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536, "warpSize": 32}
    asked = []
    utils = SimpleNamespace(get_device_properties=lambda device: asked.append(device) or dict(h100))
    engine_check.report_turing_limits(utils)
    device = random.randrange(8)
    props = utils.get_device_properties(device)
    assert asked == [device]
    assert props == {**h100, "max_shared_mem": 65536, "multiprocessor_count": 68}


def test_both_runs_get_the_same_environment_and_the_sampler_guard(monkeypatch, tmp_path):
    # FlashInfer's sampler JIT-builds for the reported 7.5 and dies: off must not differ by it
    assert engine_check.ENGINE_ENV["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    script = (ROOT / "benchmarks/engine/run_device.sh").read_text()
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in script   # set in one place, for every mode


@pytest.mark.parametrize("n", [1, 3, 5])
def test_a_speed_row_reports_the_median_rate_and_its_spread(n):
    rng = random.Random()
    work = rng.uniform(100, 10000)
    seconds = [rng.uniform(0.1, 2.0) for _ in range(n)]
    row = engine_check.rates(work, seconds)
    rates = sorted(work / s for s in seconds)
    assert row["tok_s"] == pytest.approx(statistics.median(rates))
    assert row["tok_s_min"] == pytest.approx(rates[0]) and row["tok_s_max"] == pytest.approx(rates[-1])
    assert row["spread"] == pytest.approx((rates[-1] - rates[0]) / statistics.median(rates))
    assert row["seconds"] == seconds


def _run(plugin: bool, ours: int, speed: dict, long: list | None = None) -> dict:
    steps = [{"chosen": 5, "chosen_logprob": -1.0, "top": [[5, -1.0], [6, -2.0]]}]
    completion = {"tokens": [5], "steps": steps, "num_cached_tokens": 2048}
    return {"plugin_loaded": plugin, "engine_start_s": random.uniform(10, 400),
            "census": {"gdn_ops": 6, "ours": ours}, "gdn_calls_after_greedy": [5] * ours,
            "completions": [completion] * 4, "speed": speed, "long_context": long or [],
            "kv_capacity": {"tokens": 100}}


def _row(tok_s: float, spread: float) -> dict:
    return {"tok_s": tok_s, "spread": spread}


def _long(n: int, late: float, decode: float) -> dict:
    return {"tokens": n, "prefill_tok_s": late * 2, "late_chunk_tok_s": late, "decode_tok_s": decode,
            "late_chunk": _row(late, 0.01), "decode": _row(decode, 0.02)}


def test_any_two_runs_compare_and_a_second_plugin_on_run_must_be_ours_too(tmp_path):
    rng = random.Random()
    a, b = rng.uniform(1e3, 1e5), rng.uniform(1e3, 1e5)
    custom = _run(True, 6, {"prefill_32768": _row(a, 0.01)}, [_long(131072, a, 300.0)])
    stock = _run(True, 6, {"prefill_32768": _row(b, 0.02)}, [_long(131072, b, 100.0)])
    for name, run in (("on-custom", custom), ("on", stock)):
        (tmp_path / f"sm75-{name}-full.json").write_text(json.dumps(run))
    s = compare.summarize(tmp_path, "sm75", "on-custom", "on", "-full")
    assert s["problems"] == []
    assert s["speed"]["prefill_32768"]["ratio"] == pytest.approx(a / b)
    assert s["speed"]["prefill_32768"]["on_spread"] == 0.01 and s["speed"]["prefill_32768"]["off_spread"] == 0.02
    assert s["speed"]["decode_at_131072"]["ratio"] == pytest.approx(3.0)
    assert s["speed"]["prefill_whole_131072"]["ratio"] == pytest.approx(a / b)
    assert s["engine_start_s"] == {"on": custom["engine_start_s"], "off": stock["engine_start_s"]}
    # the stock-attention run left a GDN layer to FLA: that is a problem when its plugin is on
    (tmp_path / "sm75-on-full.json").write_text(json.dumps(_run(True, 5, stock["speed"])))
    assert compare.summarize(tmp_path, "sm75", "on-custom", "on", "-full")["problems"] == [
        "not every GDN layer ran our prefill in on"]
    # and none may be ours when it is off
    (tmp_path / "sm75-off-full.json").write_text(json.dumps(_run(False, 1, stock["speed"])))
    assert compare.summarize(tmp_path, "sm75", "on-custom", "off", "-full")["problems"] == [
        "our prefill ran with the plugin off (off)"]


def test_an_older_single_long_context_row_still_compares(tmp_path):
    old = {"tokens": 32768, "late_chunk_tok_s": 10.0, "decode_tok_s": 2.0}
    rows = compare._tok_s({"long_context": old})
    assert rows == {"late_chunk_32768": (10.0, None), "decode_at_32768": (2.0, None)}


def test_run_device_names_every_mode_it_runs_and_refuses_an_unknown_one(tmp_path):
    script = ROOT / "benchmarks/engine/run_device.sh"
    src = script.read_text()
    body = src[src.index("mode_args()"):src.index("\nEND=")]
    for mode, plugin in (("on", "on"), ("off", "off"), ("on-ngram", "on"), ("on-custom", "on"), ("on-custom-fp8", "on"),
                         ("on-flashinfer", "on"), ("on-flashinfer-fp8", "on"), ("on-flashinfer-mtp", "on")):
        proc = subprocess.run(["bash", "-c", body + f'\nmode_args "{mode}"'], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0 and proc.stdout.split()[0] == plugin, (mode, proc.stdout, proc.stderr)
    assert "CUSTOM" in subprocess.run(["bash", "-c", body + "\nmode_args on-custom-fp8"], capture_output=True,
                                      text=True, timeout=30).stdout
    fp8 = subprocess.run(["bash", "-c", body + "\nmode_args on-flashinfer-fp8"], capture_output=True, text=True,
                         timeout=30).stdout
    assert "--attention-backend FLASHINFER" in fp8 and "--kv-cache-dtype fp8" in fp8
    proc = subprocess.run(["bash", "-c", body + "\nmode_args sideways"], capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and "unknown mode 'sideways'" in proc.stderr


def test_each_save_leaves_a_whole_json_of_the_stages_so_far_and_no_part_file(tmp_path):
    out = tmp_path / "sm75-off-profile.json"
    result = {"completions": [random.random() for _ in range(random.randint(1, 9))]}
    engine_check.save(out, result, "greedy")
    first = json.loads(out.read_text())
    assert first["stages"] == ["greedy"] and first["finished"] is False and first["completions"] == result["completions"]
    result["speed"] = {"decode_1024": {"tok_s": random.uniform(1, 1e3)}}
    engine_check.save(out, result, "end", finished=True)
    last = json.loads(out.read_text())
    assert last["stages"] == ["greedy", "end"] and last["finished"] is True and last["speed"] == result["speed"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]


@pytest.mark.parametrize("block", [784, 800, 1568, 1600])
def test_the_whole_long_prompt_repeated_keeps_a_hit_after_mtp_gives_one_block_back(block):
    """The hybrid's attention block sizes seen on the 8-layer stand-in (fp16/fp8 KV, with and without
    MTP): the first prompt holds two whole blocks, and every prompt fits the CPU's default length."""
    prompts = engine_check.greedy_prompts((10, 1000))
    long, repeat = prompts[0], prompts[4]
    assert repeat[:len(long)] == long and len(repeat) > len(long)
    cached = (len(long) // block) * block               # whole blocks the first prompt leaves cached
    assert min(cached, (len(repeat) - 1) // block * block) - block >= block   # after MTP's one-block drop
    assert prompts[2][:engine_check.SHARED_PREFIX] == long[:engine_check.SHARED_PREFIX]
    assert len(long) > engine_check.CHUNK   # chunked
    assert max(map(len, prompts)) + engine_check.GEN_TOKENS <= engine_check.CPU_MODEL_LEN
