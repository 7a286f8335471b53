"""`caovan-sm75-cache clean`: the most dangerous code we ship. Each safety rule of issue 5 has a test.

Everything lives in temporary directories (HOME, TMPDIR and the cache root point there); a
directory `outside` next to them holds files that must survive every clean.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.cache_trees import (Env, cenv, fill, restore_modes, run, run_json,  # noqa: F401
                         run_unprivileged, tree_hash)

from caovan_vllm_sm75_turbo3.caches import clean as clean_mod
from caovan_vllm_sm75_turbo3.caches.clean import Outcome, Target, _Remover, execute, plan_clean, refusal, \
    vllm_processes
from caovan_vllm_sm75_turbo3.caches.inventory import CacheEntry, TreeStats, inventory
from caovan_vllm_sm75_turbo3.caches.layout import hold_in_use


def _outside(cenv: Env) -> tuple[Path, Path]:
    """A file and a directory outside every root, with content."""
    f = cenv.outside / "precious.txt"
    f.write_text("do not delete")
    d = cenv.outside / "dir"
    d.mkdir()
    (d / "inner.bin").write_bytes(os.urandom(64))
    return f, d


def _shared(cenv: Env, name: str = "vllm") -> Path:
    path = {"vllm": cenv.home / ".cache" / "vllm", "triton": cenv.home / ".triton" / "cache"}[name]
    (path / "sub").mkdir(parents=True)
    (path / "sub" / "entry").write_bytes(os.urandom(100))
    return path


def test_clean_removes_stale_keys_only(cenv, capsys, monkeypatch):
    cur, old1, old2 = cenv.keydir(), cenv.keydir(cenv.stale_key("2.9")), cenv.keydir(cenv.stale_key("2.10"))
    for kd in (cur, old1, old2):
        fill(kd)
    (cenv.root / "envs" / "myenv").mkdir()
    (cenv.root / "envs" / "myenv" / "keep").write_text("x")
    shared = _shared(cenv)
    before_cur, before_shared = tree_hash(cur.path), tree_hash(shared)
    code, out, err = run(["clean", "--yes"], capsys, monkeypatch)
    assert code == 0, out + err
    assert not old1.path.exists() and not old2.path.exists()
    assert tree_hash(cur.path) == before_cur and tree_hash(shared) == before_shared
    assert (cenv.root / "envs" / "myenv" / "keep").read_text() == "x"
    assert f"removed {old1.path}" in out and f"removed {old2.path}" in out


def test_symlinks_pointing_outside_are_unlinked_and_the_outside_survives(cenv, capsys, monkeypatch):
    f, d = _outside(cenv)
    before = tree_hash(cenv.outside)
    old = cenv.keydir(cenv.stale_key())
    fill(old)
    caches = old.env_dirs()
    (caches["TRITON_CACHE_DIR"] / "to-file").symlink_to(f)
    (caches["TRITON_CACHE_DIR"] / "to-dir").symlink_to(d)
    (caches["VLLM_CACHE_ROOT"] / "to-parent").symlink_to(cenv.base)
    (caches["CUDA_CACHE_PATH"] / "relative").symlink_to("../../../../../outside/dir")
    (cenv.root / "envs" / cenv.stale_key("7").name).symlink_to(d)  # a whole key that is a link
    shared = _shared(cenv)
    (shared / "sub" / "escape").symlink_to(d)
    code, out, err = run(["clean", "--all", "--yes"], capsys, monkeypatch)
    assert code == 0, out + err
    assert not old.path.exists() and not os.path.lexists(cenv.root / "envs" / cenv.stale_key("7").name)
    assert tree_hash(cenv.outside) == before and f.read_text() == "do not delete"
    assert shared.is_dir() and list(shared.iterdir()) == []  # a shared default is emptied, not removed


def test_a_symlinked_cache_root_is_cleaned_where_it_points_and_the_link_stays(cenv, capsys, monkeypatch):
    real = cenv.base / "disk" / "caovan"
    real.mkdir(parents=True)
    link = cenv.base / "link-root"
    link.symlink_to(real)
    monkeypatch.setenv("CAOVAN_CACHE_DIR", str(link))
    old = cenv.keydir(cenv.stale_key()).__class__(link, cenv.stale_key())
    cur = old.__class__(link, cenv.current)
    fill(old), fill(cur)
    sibling = cenv.base / "disk" / "neighbour.txt"
    sibling.write_text("n")
    code, out, err = run(["clean", "--yes"], capsys, monkeypatch)
    assert code == 0, out + err
    assert link.is_symlink() and (real / "envs" / cur.key.name).is_dir()
    assert not (real / "envs" / old.key.name).exists()
    assert sibling.read_text() == "n"


def test_a_symlinked_shared_default_is_emptied_where_it_points(cenv, capsys, monkeypatch):
    real = cenv.base / "fast" / "triton"
    (real / "k").mkdir(parents=True)
    (real / "k" / "bin").write_bytes(b"1")
    (cenv.home / ".triton").mkdir()
    (cenv.home / ".triton" / "cache").symlink_to(real)
    # the real target lies outside the home cache folders: --yes alone leaves it (issue 17) ...
    code, out, err = run(["clean", "--all", "--yes"], capsys, monkeypatch)
    assert code == 1 and (real / "k" / "bin").read_bytes() == b"1"
    # ... and the second, explicit yes empties it where it points
    code, out, err = run(["clean", "--all", "--yes", "--yes-outside-home-cache"], capsys, monkeypatch)
    assert code == 0, out + err
    assert (cenv.home / ".triton" / "cache").is_symlink() and real.is_dir() and list(real.iterdir()) == []


def test_dot_dot_in_names_is_just_a_name(cenv, capsys, monkeypatch):
    f, d = _outside(cenv)
    before = tree_hash(cenv.outside)
    old = cenv.keydir(cenv.stale_key())
    fill(old)
    t = old.env_dirs()["TRITON_CACHE_DIR"]
    for name in ("...", "..x", "a..b", "..", ".. "):
        if name == "..":
            continue  # the kernel never lets a file be called ".."; the others are legal names
        (t / name).mkdir()
        (t / name / "..f").write_text("x")
    # a cache root spelled with ".." components resolves before anything is decided
    monkeypatch.setenv("CAOVAN_CACHE_DIR", str(cenv.home / "x" / ".." / ".cache" / "caovan-sm75-turbo3"))
    (cenv.home / "x").mkdir()
    code, out, err = run(["clean", "--yes"], capsys, monkeypatch)
    assert code == 0, out + err
    assert not old.path.exists()
    assert tree_hash(cenv.outside) == before and (cenv.home / "x").is_dir()


def test_names_that_are_not_single_components_are_refused_by_the_engine(cenv):
    f, d = _outside(cenv)
    before = tree_hash(cenv.outside)
    envs = cenv.root / "envs"
    envs.mkdir(parents=True)
    entry = CacheEntry("key", "x", envs / "x", True, False, TreeStats())
    for name in ("../../outside", "..", ".", "", "a/b"):
        out = execute([Target(entry, envs, (name,))], dict(os.environ), protect=[], force=False)
        assert out.removed == [] and out.not_removed, name
    assert tree_hash(cenv.outside) == before


def test_the_engine_refuses_a_target_root_outside_the_rules_even_if_asked(cenv):
    """execute() re-checks every root just before deleting, so a bad plan cannot reach $HOME."""
    (cenv.home / "important").write_text("keep")
    entry = CacheEntry("shared", "x", cenv.home, True, False, TreeStats())
    out = execute([Target(entry, cenv.home, None)], dict(os.environ), protect=[], force=True)
    assert out.removed == [] and "home directory" in out.not_removed[0][1]
    assert (cenv.home / "important").read_text() == "keep"


def test_unreadable_directories_are_reported_and_the_rest_removed(cenv):
    old = cenv.keydir(cenv.stale_key())
    fill(old)
    other = cenv.keydir(cenv.stale_key("2.9"))
    fill(other)
    stuck = old.env_dirs()["TRITON_CACHE_DIR"] / "stuck"
    stuck.mkdir()
    (stuck / "kernel").write_bytes(b"k")
    os.chmod(stuck, 0)
    try:
        proc = run_unprivileged(cenv.base, ["clean", "--yes", "--json"])
        os.chmod(stuck, 0o755)
        assert (stuck / "kernel").read_bytes() == b"k"  # what could not be read is left whole
    finally:
        restore_modes(cenv.base)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    reasons = {r["path"]: r["reason"] for r in report["outcome"]["not_removed"]}
    assert reasons == {str(stuck): "permission denied"}
    assert report["outcome"]["removed"] == [str(other.path)]
    assert not other.path.exists() and old.path.is_dir()
    assert not (old.env_dirs()["VLLM_CACHE_ROOT"] / "torch_compile_cache").exists()  # the rest went


def test_partial_failure_text_says_what_was_not_removed(cenv):
    old = cenv.keydir(cenv.stale_key())
    fill(old)
    stuck = old.env_dirs()["CUDA_CACHE_PATH"]
    (stuck / "f").write_text("f")
    os.chmod(stuck, 0o500)  # readable, but its entries cannot be unlinked
    try:
        proc = run_unprivileged(cenv.base, ["clean", "--yes"])
    finally:
        restore_modes(cenv.base)
    assert proc.returncode == 1
    assert f"NOT removed {stuck}/f: permission denied" in proc.stdout
    assert "some entries were NOT removed" in proc.stdout
    assert (stuck / "f").read_text() == "f"


HOLDER = r"""
import json, sys, time
from pathlib import Path
from caovan_vllm_sm75_turbo3.caches import layout
from caovan_vllm_sm75_turbo3.caches.key import key_from_components
kd = layout.KeyDir(Path(sys.argv[1]), key_from_components(json.loads(sys.argv[2])))
layout.hold_in_use(kd)
print("held", flush=True)
time.sleep(60)
"""


def test_a_held_lock_keeps_the_cache_and_names_the_process(cenv, capsys, monkeypatch):
    old = cenv.keydir(cenv.stale_key())
    fill(old)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(cenv.root), json.dumps(old.key.components)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = tree_hash(old.path)
        code, out, err = run(["clean", "--yes"], capsys, monkeypatch)
        assert code == 1
        assert f"process {holder.pid} holds its lock" in out and "--force" in out
        assert tree_hash(old.path) == before
        code, report = run_json(["clean", "--yes"], capsys, monkeypatch)
        assert report["in_use"][0]["path"] == str(old.path) and str(holder.pid) in report["in_use"][0]["reason"]
        code, out, err = run(["clean", "--yes", "--force"], capsys, monkeypatch)
        assert code == 0, out + err
        assert not old.path.exists()
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_a_lock_taken_after_the_plan_still_stops_the_removal(cenv):
    old = cenv.keydir(cenv.stale_key())
    fill(old)
    inv = inventory(cenv.root, cenv.current, dict(os.environ))
    plan = plan_clean(inv, dict(os.environ), everything=False, shared=False, force=False)
    assert [t.entry.path for t in plan.targets] == [old.path]
    fd = hold_in_use(old)  # a server starts between the question and the answer
    try:
        out = execute(plan.targets, dict(os.environ), protect=[], force=False)
    finally:
        os.close(fd)
    assert out.removed == [] and str(os.getpid()) in out.not_removed[0][1]
    assert old.manifest_path.is_file()


def test_a_file_vanishing_mid_clean_is_reported_and_exits_non_zero(cenv, capsys, monkeypatch):
    old = cenv.keydir(cenv.stale_key())
    fill(old, {"TRITON_CACHE_DIR/a/one": b"1", "TRITON_CACHE_DIR/a/two": b"2"})
    real_unlink = os.unlink

    def racing_unlink(path, *, dir_fd=None):
        if path == "one":  # another process removes it just before we do
            real_unlink(path, dir_fd=dir_fd)
        return real_unlink(path, dir_fd=dir_fd)

    monkeypatch.setattr(clean_mod.os, "unlink", racing_unlink)
    code, report = run_json(["clean", "--yes"], capsys, monkeypatch)
    monkeypatch.setattr(clean_mod.os, "unlink", real_unlink)
    assert code == 1
    vanished = str(cenv.root.resolve() / "envs" / old.key.name / "triton" / "a" / "one")
    assert report["outcome"]["vanished"] == [vanished]
    assert report["outcome"]["removed"] == [str(old.path)]  # everything else went, the directory included
    assert report["outcome"]["files_removed"] == 3  # two, manifest.json, .manifest.lock; not "one"
    assert not old.path.exists()


def test_no_terminal_and_no_yes_refuses_and_touches_nothing(cenv, capsys, monkeypatch):
    fill(cenv.keydir(cenv.stale_key()))
    before = tree_hash(cenv.base)
    code, out, err = run(["clean"], capsys, monkeypatch, tty=False)
    assert code == 2 and "stdin is not a terminal" in err and "--yes" in err
    assert tree_hash(cenv.base) == before


def test_a_terminal_is_asked_and_no_means_no(cenv, capsys, monkeypatch):
    old = cenv.keydir(cenv.stale_key())
    fill(old)
    before = tree_hash(cenv.base)
    for answer in ("n\n", "\n", ""):
        code, out, err = run(["clean"], capsys, monkeypatch, tty=True, answers=answer)
        assert code == 1 and "[y/N]" in err and "declined" in out
        assert tree_hash(cenv.base) == before
    code, out, err = run(["clean"], capsys, monkeypatch, tty=True, answers="y\n")
    assert code == 0 and not old.path.exists()


def test_all_asks_separately_for_the_shared_defaults(cenv, capsys, monkeypatch):
    cur, old = cenv.keydir(), cenv.keydir(cenv.stale_key())
    fill(cur), fill(old)
    shared = _shared(cenv)
    before = tree_hash(shared)
    code, out, err = run(["clean", "--all"], capsys, monkeypatch, tty=True, answers="y\nn\n")
    assert err.count("[y/N]") == 2 and "other tools" in err
    assert code == 1 and "declined: nothing of shared removed" in out
    assert not cur.path.exists() and not old.path.exists()
    assert tree_hash(shared) == before
    code, out, err = run(["clean", "--all"], capsys, monkeypatch, tty=True, answers="y\n")
    assert code == 0 and list(shared.iterdir()) == []


def test_all_no_shared_and_user_set_dirs_are_left_alone(cenv, capsys, monkeypatch):
    shared = _shared(cenv)
    mine = cenv.base / "my-triton"
    (mine / "k").mkdir(parents=True)
    (mine / "k" / "bin").write_bytes(b"mine")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(mine))
    before_shared, before_mine = tree_hash(shared), tree_hash(mine)
    fill(cenv.keydir())
    code, out, err = run(["clean", "--all", "--no-shared", "--yes"], capsys, monkeypatch)
    assert code == 0 and not cenv.keydir().path.exists() and tree_hash(shared) == before_shared
    code, report = run_json(["clean", "--all", "--yes"], capsys, monkeypatch)
    assert code == 0 and list(shared.iterdir()) == []
    assert tree_hash(mine) == before_mine
    assert any(s["path"] == str(mine) and "set by you in TRITON_CACHE_DIR" in s["reason"] for s in report["skipped"])


@pytest.mark.parametrize("argv", [["clean"], ["clean", "--all"], ["clean", "--all", "--force"]])
def test_dry_run_leaves_every_byte_in_place(cenv, capsys, monkeypatch, argv):
    _outside(cenv)
    for kd in (cenv.keydir(), cenv.keydir(cenv.stale_key()), cenv.keydir(cenv.stale_key("2.9"))):
        fill(kd)
    (cenv.root / "envs" / cenv.stale_key("3").name).symlink_to(cenv.outside)
    _shared(cenv)
    _shared(cenv, "triton")
    # the locks dry-run must not create: a key without .in-use.lock keeps not having one
    before = tree_hash(cenv.base)
    code, out, err = run(argv + ["--dry-run"], capsys, monkeypatch)
    assert code == 0 and "would remove" in out and "nothing was touched" in out
    assert tree_hash(cenv.base) == before
    code, report = run_json(argv + ["--dry-run"], capsys, monkeypatch)
    assert report["dry_run"] and report["planned"] and report["outcome"]["removed"] == []
    assert tree_hash(cenv.base) == before


@pytest.mark.parametrize("where", ["/", "home", "home-parent", "cache-home"])
def test_refuses_slash_home_and_broad_roots(cenv, capsys, monkeypatch, where):
    root = {"/": Path("/"), "home": cenv.home, "home-parent": cenv.home.parent,
            "cache-home": cenv.home / ".cache"}[where]
    fill(cenv.keydir(cenv.stale_key()))  # something cleanable in the normal root, untouched below
    (cenv.home / "notes.txt").write_text("mine")
    monkeypatch.setenv("CAOVAN_CACHE_DIR", str(root))
    if where != "/":
        key_in_root = cenv.keydir(cenv.stale_key()).__class__(root, cenv.stale_key("2.1"))
        fill(key_in_root)
    before = tree_hash(cenv.base)
    code, out, err = run(["clean", "--all", "--yes"], capsys, monkeypatch)
    assert code == 2 and "refused" in out
    assert tree_hash(cenv.base) == before


def test_refusal_rules(cenv):
    env = dict(os.environ)
    (cenv.home / ".cache").mkdir()
    assert "file-system root" in refusal(Path("/"), env)
    assert "home directory" in refusal(cenv.home, env)
    assert "home directory" in refusal(cenv.home.parent, env)
    assert "shared by everything" in refusal(cenv.home / ".cache", env)
    assert "shared by everything" in refusal(cenv.tmp, env)
    assert "top-level" in refusal(Path("/usr"), env)
    assert "not an absolute path" in refusal(Path("relative/dir"), env)
    (cenv.home / "to-home").symlink_to(cenv.home)
    assert "home directory" in refusal(cenv.home / "to-home", env)
    theirs = cenv.base / "theirs"
    theirs.mkdir()
    if os.geteuid() == 0:
        os.chown(theirs, 65534, 65534)
        assert "belongs to uid 65534" in refusal(theirs, env)
    else:
        assert "belongs to uid 0" in refusal(Path("/var/lib"), env)
    assert "system directory /usr" in refusal(Path("/usr/share"), env)
    ok = cenv.home / ".cache" / "vllm"
    ok.mkdir()
    assert refusal(ok, env) is None


def test_a_shared_default_linked_to_home_is_refused(cenv, capsys, monkeypatch):
    (cenv.home / "notes.txt").write_text("mine")
    (cenv.home / ".cache").mkdir()
    (cenv.home / ".cache" / "vllm").symlink_to(cenv.home)
    before = tree_hash(cenv.base)
    code, out, err = run(["clean", "--all", "--yes"], capsys, monkeypatch)
    assert code == 2 and f"refused {cenv.home / '.cache' / 'vllm'}" in out and "home directory" in out
    assert tree_hash(cenv.base) == before


def test_our_root_inside_a_shared_default_is_not_entered(cenv, capsys, monkeypatch):
    inner = cenv.home / ".cache" / "vllm" / "caovan"
    monkeypatch.setenv("CAOVAN_CACHE_DIR", str(inner))
    cur = cenv.keydir().__class__(inner, cenv.current)
    fill(cur)
    (cenv.home / ".cache" / "vllm" / "torch_compile_cache").mkdir()
    (cenv.home / ".cache" / "vllm" / "torch_compile_cache" / "g").write_text("g")
    fd = hold_in_use(cur)  # the current server is running
    try:
        before = tree_hash(cur.path)
        code, out, err = run(["clean", "--all", "--yes"], capsys, monkeypatch)
        assert tree_hash(cur.path) == before
    finally:
        os.close(fd)
    assert code == 1 and "in use" in out  # the current key was held, so not everything went
    assert not (cenv.home / ".cache" / "vllm" / "torch_compile_cache").exists()
    assert f"kept {inner}: protected" in out


def test_running_vllm_keeps_the_shared_defaults_unless_forced(cenv):
    shared = _shared(cenv)
    inv = inventory(cenv.root, cenv.current, dict(os.environ))
    plan = plan_clean(inv, dict(os.environ), everything=True, shared=True, force=False, vllm_pids=[4242])
    assert not [t for t in plan.targets if t.group == "shared"]
    assert any(e.path == shared and "4242" in r for e, r in plan.busy)
    forced = plan_clean(inv, dict(os.environ), everything=True, shared=True, force=True, vllm_pids=[4242])
    assert [t.entry.path for t in forced.targets if t.group == "shared"] == [shared]


def test_vllm_processes_finds_a_server_by_its_command_line():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                              "vllm.entrypoints.openai.api_server"])
    try:
        deadline = time.monotonic() + 30
        while child.pid not in vllm_processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.pid in vllm_processes()
    finally:
        child.kill()
        child.wait(timeout=30)
    assert child.pid not in vllm_processes()


def test_nothing_to_clean_is_success(cenv, capsys, monkeypatch):
    code, out, err = run(["clean"], capsys, monkeypatch)
    assert code == 0 and "nothing to clean" in out


def test_a_directory_swapped_for_a_symlink_mid_clean_is_not_followed(cenv, capsys, monkeypatch):
    f, d = _outside(cenv)
    before = tree_hash(cenv.outside)
    old = cenv.keydir(cenv.stale_key())
    fill(old)
    swap = old.env_dirs()["TRITON_CACHE_DIR"] / "swap"
    swap.mkdir()
    (swap / "x").write_text("x")
    real_open = os.open

    def racing_open(path, flags, mode=0o777, *, dir_fd=None):
        if path == "swap" and dir_fd is not None:  # an attacker swaps the checked directory for a link
            os.rename(swap, swap.with_name("swapped-away"))
            os.symlink(d, swap)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(clean_mod.os, "open", racing_open)
    code, report = run_json(["clean", "--yes"], capsys, monkeypatch)
    monkeypatch.setattr(clean_mod.os, "open", real_open)
    assert code == 1
    assert [r["reason"] for r in report["outcome"]["not_removed"]] == ["became a symlink or a file meanwhile; not followed"]
    assert tree_hash(cenv.outside) == before


def test_another_file_system_inside_a_cache_is_not_crossed(cenv):
    """A mount point shows up as a directory whose st_dev differs from the root's; simulated here by
    telling the remover the root lives on another device (mounting needs privileges tests lack)."""
    top = cenv.base / "cache"
    (top / "mnt").mkdir(parents=True)
    (top / "mnt" / "data").write_text("on another disk")
    out = Outcome()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        gone = _Remover(os.fstat(fd).st_dev + 1, set(), out).remove(fd, "mnt", str(top / "mnt"))
    finally:
        os.close(fd)
    assert not gone and out.kept == [(str(top / "mnt"), "another file system is mounted here; not crossed")]
    assert (top / "mnt" / "data").read_text() == "on another disk"
