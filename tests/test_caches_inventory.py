"""`caovan-sm75-cache list`: every cache we know, with size, files, last used, current or stale."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from helpers.cache_trees import EXAMPLE, cenv, fill, restore_modes, run, run_json, run_unprivileged  # noqa: F401

from caovan_vllm_sm75_turbo3.caches.inventory import tree_stats
from caovan_vllm_sm75_turbo3.caches.key import env_key
from caovan_vllm_sm75_turbo3.caches.layout import hold_in_use, prepare
from caovan_vllm_sm75_turbo3.runtime.facts import Facts


def _by(report: dict, kind: str, name: str) -> dict:
    found = [e for e in report["entries"] if e["kind"] == kind and e["name"] == name]
    assert len(found) == 1, (kind, name, report["entries"])
    return found[0]


def test_list_reports_current_and_stale_keys_with_their_sizes(cenv, capsys, monkeypatch):
    cur, old = cenv.keydir(), cenv.keydir(cenv.stale_key())
    cur_bytes, old_bytes = fill(cur), fill(old, {"CUDA_CACHE_PATH/a": os.urandom(777),
                                                 "TRITON_CACHE_DIR/b/c": os.urandom(5)})
    t_old = datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone.utc)
    prepare(old, now=t_old)
    (cenv.root / "envs" / "myenv").mkdir()  # not ours: listed as unknown
    code, report = run_json(["list"], capsys, monkeypatch)
    assert code == 0
    assert report["root"] == str(cenv.root) and report["current_key"] == cenv.current.name
    c, s = _by(report, "key", cur.key.name), _by(report, "key", old.key.name)
    assert c["status"] == "current" and c["current"] and s["status"] == "stale" and not s["current"]
    manifest = lambda kd: kd.manifest_path.stat().st_size  # noqa: E731
    # the files written, manifest.json and the (empty) .manifest.lock
    assert c["size_bytes"] == cur_bytes + manifest(cur) and c["files"] == 4
    assert s["size_bytes"] == old_bytes + manifest(old) and s["files"] == 4
    assert s["last_used"] == t_old.isoformat()
    assert _by(report, "unknown", "myenv")["status"] == "unknown"
    assert (c["cleaned_by"], s["cleaned_by"], _by(report, "unknown", "myenv")["cleaned_by"]) == \
        ("clean --all", "clean", "never")
    assert report["entries"][0]["name"] == cur.key.name  # current first
    assert report["total_bytes"] == sum(e["size_bytes"] for e in report["entries"])


def test_list_names_the_shared_defaults_where_the_tools_put_them(cenv, capsys, monkeypatch):
    (cenv.home / ".triton" / "cache").mkdir(parents=True)
    (cenv.home / ".triton" / "cache" / "k").write_bytes(b"12345")
    code, report = run_json(["list"], capsys, monkeypatch)
    shared = {e["name"]: e for e in report["entries"] if e["kind"] == "shared"}
    assert {n: e["path"] for n, e in shared.items()} == {
        "vllm": str(cenv.home / ".cache" / "vllm"), "triton": str(cenv.home / ".triton" / "cache"),
        "flashinfer": str(cenv.home / ".cache" / "flashinfer"),
        "torch_extensions": str(cenv.home / ".cache" / "torch_extensions"),
        "inductor": str(cenv.tmp / "torchinductor_tester"), "cuda": str(cenv.home / ".nv" / "ComputeCache")}
    assert shared["triton"]["exists"] and shared["triton"]["size_bytes"] == 5
    assert not shared["vllm"]["exists"]
    assert not any(e["current"] for e in shared.values())  # isolation on: this environment uses its key

    assert shared["vllm"]["cleaned_by"] == "clean --all"
    monkeypatch.setenv("TRITON_HOME", str(cenv.base / "th"))
    assert _by(run_json(["list"], capsys, monkeypatch)[1], "shared", "triton")["path"] == \
        str(cenv.base / "th" / ".triton" / "cache")
    monkeypatch.delenv("TRITON_HOME")

    xdg = cenv.base / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    code, report = run_json(["list"], capsys, monkeypatch)
    assert report["root"] == str(xdg / "caovan-sm75-turbo3")
    assert _by(report, "shared", "vllm")["path"] == str(xdg / "vllm")
    assert _by(report, "shared", "torch_extensions")["path"] == str(xdg / "torch_extensions")

    # A relative XDG_CACHE_HOME is ignored (XDG spec), by our root and the shared defaults alike.
    monkeypatch.setenv("XDG_CACHE_HOME", "relative-xdg")
    code, report = run_json(["list"], capsys, monkeypatch)
    assert report["root"] == str(cenv.home / ".cache" / "caovan-sm75-turbo3")
    assert _by(report, "shared", "vllm")["path"] == str(cenv.home / ".cache" / "vllm")
    assert _by(report, "shared", "torch_extensions")["path"] == str(cenv.home / ".cache" / "torch_extensions")


def test_user_set_cache_dirs_are_listed_as_current_and_never_cleanable(cenv, capsys, monkeypatch):
    mine = cenv.base / "my-vllm-cache"
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(mine))
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(cenv.base / "fi"))
    code, report = run_json(["list"], capsys, monkeypatch)
    user = _by(report, "user-set", "vllm")
    assert user["path"] == str(mine) and user["current"] and user["variable"] == "VLLM_CACHE_ROOT"
    assert "never cleaned" in user["note"] and user["cleaned_by"] == "never"
    assert _by(report, "user-set", "flashinfer")["path"] == str(cenv.base / "fi" / ".cache" / "flashinfer")
    assert _by(report, "shared", "vllm")["path"] == str(cenv.home / ".cache" / "vllm")  # still listed


def test_isolation_off_makes_the_shared_defaults_current(cenv, capsys, monkeypatch):
    monkeypatch.setenv("CAOVAN_CACHE_ISOLATION", "0")
    code, report = run_json(["list"], capsys, monkeypatch)
    assert all(e["current"] for e in report["entries"] if e["kind"] == "shared")


def test_facts_flag_decides_the_current_key(cenv, capsys, monkeypatch):
    other = json.loads(EXAMPLE.read_text())
    other["versions"]["vllm"] = "0.22.0"
    path = cenv.base / "facts.json"
    path.write_text(json.dumps(other))
    new_key = env_key(Facts.load(path))
    fill(cenv.keydir()), fill(cenv.keydir(new_key))
    code, report = run_json(["list", "--facts", str(path)], capsys, monkeypatch)
    assert report["current_key"] == new_key.name != cenv.current.name
    assert _by(report, "key", new_key.name)["status"] == "current"
    assert _by(report, "key", cenv.current.name)["status"] == "stale"
    monkeypatch.setenv("CAOVAN_FACTS", str(path))  # the variable works too
    code, out, _ = run(["list", "--json"], capsys, monkeypatch, facts=False)
    assert json.loads(out)["current_key"] == new_key.name


def test_cache_dir_flag_and_variable_move_our_root(cenv, capsys, monkeypatch):
    elsewhere = cenv.base / "big-disk" / "caovan"
    fill(cenv.keydir().__class__(elsewhere, cenv.stale_key()))
    code, report = run_json(["list", "--cache-dir", str(elsewhere)], capsys, monkeypatch)
    assert report["root"] == str(elsewhere)
    assert _by(report, "key", cenv.stale_key().name)["status"] == "stale"
    monkeypatch.setenv("CAOVAN_CACHE_DIR", str(elsewhere))
    assert run_json(["list"], capsys, monkeypatch)[1]["root"] == str(elsewhere)


def test_in_use_key_shows_the_process(cenv, capsys, monkeypatch):
    kd = cenv.keydir(cenv.stale_key())
    fill(kd)
    fd = hold_in_use(kd)
    try:
        code, report = run_json(["list"], capsys, monkeypatch)
        e = _by(report, "key", kd.key.name)
        assert e["in_use"] and e["users"] == [os.getpid()]
        code, out, _ = run(["list"], capsys, monkeypatch)
        assert f"in use: {os.getpid()}" in out
    finally:
        os.close(fd)
    assert not _by(run_json(["list"], capsys, monkeypatch)[1], "key", kd.key.name)["in_use"]


def test_symlinks_are_counted_not_followed(cenv, capsys, monkeypatch):
    kd = cenv.keydir(cenv.stale_key())
    fill(kd, {"TRITON_CACHE_DIR/f": b"abc"})
    big = cenv.outside / "big"
    big.mkdir()
    (big / "blob").write_bytes(os.urandom(100_000))
    link = kd.env_dirs()["TRITON_CACHE_DIR"] / "out"
    link.symlink_to(big)
    stats = tree_stats(kd.path)
    assert stats.size_bytes < 10_000 and stats.files == 4  # f, the link, manifest.json, .manifest.lock
    (cenv.root / "envs" / cenv.stale_key("9").name).symlink_to(big)
    code, report = run_json(["list"], capsys, monkeypatch)
    e = _by(report, "key", cenv.stale_key("9").name)
    assert e["is_link"] and e["resolved"] == str(big) and e["size_bytes"] < 10_000


def test_unreadable_directories_are_reported(cenv):
    stuck = cenv.home / ".triton" / "cache" / "locked"
    stuck.mkdir(parents=True)
    (stuck / "secret").write_bytes(b"x" * 10)
    os.chmod(stuck, 0)
    try:
        proc = run_unprivileged(cenv.base, ["list", "--json"])
    finally:
        restore_modes(cenv.base)
    assert proc.returncode == 0, proc.stderr
    triton = _by(json.loads(proc.stdout), "shared", "triton")
    assert triton["unreadable"] == [str(stuck)]


def test_list_text_output_is_readable(cenv, capsys, monkeypatch):
    fill(cenv.keydir(cenv.stale_key()))
    code, out, err = run(["list"], capsys, monkeypatch)
    assert code == 0 and err == ""
    assert f"current environment key: {cenv.current.name} (not created yet)" in out
    assert "stale" in out and "shared" in out and "total:" in out


def test_help_and_bad_facts_file(cenv, capsys, monkeypatch):
    for argv, words in ((["--help"], ("list", "clean", "Exit codes")),
                        (["clean", "--help"], ("--all", "--dry-run", "--yes", "--force", "--json", "--no-shared"))):
        with pytest.raises(SystemExit) as exit_:
            run(argv, capsys, monkeypatch, facts=False)
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert all(w in out for w in words), out
    code, out, err = run(["list", "--facts", str(cenv.base / "missing.json")], capsys, monkeypatch)
    assert code == 2 and "caovan-sm75-cache: error: cannot read facts file" in err and "Traceback" not in err


def test_last_used_falls_back_to_file_times_without_a_manifest(cenv, capsys, monkeypatch):
    kd = cenv.keydir(cenv.stale_key())
    fill(kd)
    kd.manifest_path.unlink()
    when = datetime(2025, 5, 5, tzinfo=timezone.utc).timestamp()
    for p in kd.path.rglob("*"):
        if p.is_file():
            os.utime(p, (when, when))
    e = _by(run_json(["list"], capsys, monkeypatch)[1], "key", kd.key.name)
    assert datetime.fromisoformat(e["last_used"]) - datetime.fromtimestamp(when, timezone.utc) < timedelta(seconds=1)
    assert "no readable manifest" in e["note"]
    assert Path(e["path"]).is_dir()
