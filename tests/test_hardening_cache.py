"""Cache hardening (issue 17, class 8 and the cache parts of 1 and 7): the plan names what clean will
really delete, a target outside the home cache folders is asked for again, a partly removed key exits 1,
serve and the cleaner accept the same roots, special files never hang, hostile trees end fast.

Everything lives in temporary directories; `outside` holds what no clean may touch.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers.cache_trees import (EXAMPLE, Env, cenv, fill, make_deep, remove_deep, run, run_json,  # noqa: F401
                         tree_hash)
from helpers.hostile import BOUND_S, FAST, assert_clean, run_main
from hypothesis import given
from hypothesis import strategies as st

from caovan_vllm_sm75_turbo3.caches import clean as clean_mod
from caovan_vllm_sm75_turbo3.caches import inventory as inventory_mod
from caovan_vllm_sm75_turbo3.caches.clean import refusal
from caovan_vllm_sm75_turbo3.caches.key import env_key, key_from_components
from caovan_vllm_sm75_turbo3.caches.layout import (IN_USE_LOCK, MANIFEST, MANIFEST_LOCK, checked_root,
                                                   hold_in_use, prepare, read_manifest)
from caovan_vllm_sm75_turbo3.caches.locations import home_cache_folders
from caovan_vllm_sm75_turbo3.cli import cache as cache_cli
from caovan_vllm_sm75_turbo3.cli import serve
from caovan_vllm_sm75_turbo3.config import load_settings
from caovan_vllm_sm75_turbo3.errors import CaovanError, SettingError
from caovan_vllm_sm75_turbo3.policy.vllm_args import read_vllm_args
from caovan_vllm_sm75_turbo3.runtime.facts import Facts

FACTS = str(EXAMPLE)
FLAG = "--yes-outside-home-cache"


class Hung(BaseException):
    """Raised by hang_guard; not an OSError (TimeoutError is one, and the code under test may catch those)."""


@contextmanager
def hang_guard(seconds: float = 10.0):
    """Fail (instead of hanging the suite) when the body blocks: SIGALRM interrupts a blocking open(),
    and repeats every second in case something swallowed the first one."""
    def boom(signum, frame):
        raise Hung(f"blocked for more than {seconds} s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _outside_tree(cenv: Env) -> Path:
    """A tree outside every home cache folder, reached only through symlinks."""
    real = cenv.outside / "nv-cache"
    (real / "kernels").mkdir(parents=True)
    (real / "kernels" / "k.bin").write_bytes(os.urandom(64))
    (cenv.home / ".nv").mkdir(parents=True)
    (cenv.home / ".nv" / "ComputeCache").symlink_to(real)
    return real


# --- 1. the plan names the real target; outside targets are asked for again -------------------


def test_the_plan_names_the_real_target_of_a_symlinked_shared_default(cenv, capsys, monkeypatch):
    real = _outside_tree(cenv)
    link = cenv.home / ".nv" / "ComputeCache"
    code, out, err = run(["clean", "--all", "--dry-run"], capsys, monkeypatch)
    assert code == 0, out + err
    assert f"empty {link} -> {real}" in out and "outside your home cache folders" in out and FLAG in out
    code, report = run_json(["clean", "--all", "--dry-run"], capsys, monkeypatch)
    entry = next(p for p in report["planned"] if p["path"] == str(link))
    assert entry["real_path"] == str(real) and entry["outside_home_caches"] is True


def test_a_parent_symlink_is_resolved_in_the_plan_too(cenv, capsys, monkeypatch):
    real = cenv.base / "disk" / "triton-home"
    (real / "cache" / "k").mkdir(parents=True)
    (real / "cache" / "k" / "bin").write_bytes(b"1")
    (cenv.home / ".triton").symlink_to(real)
    code, report = run_json(["clean", "--all", "--dry-run"], capsys, monkeypatch)
    entry = next(p for p in report["planned"] if p["path"] == str(cenv.home / ".triton" / "cache"))
    assert entry["real_path"] == str(real / "cache")


def test_yes_alone_does_not_empty_a_target_outside_the_home_cache_folders(cenv, capsys, monkeypatch):
    real = _outside_tree(cenv)
    inside = cenv.home / ".cache" / "vllm"
    (inside / "g").mkdir(parents=True)
    (inside / "g" / "graph").write_text("g")
    before = tree_hash(cenv.outside)
    code, out, err = run(["clean", "--all", "--yes"], capsys, monkeypatch)
    assert code == 1, out + err
    assert tree_hash(cenv.outside) == before
    assert f"declined: {cenv.home / '.nv' / 'ComputeCache'} -> {real}" in out and FLAG in out
    assert list(inside.iterdir()) == []  # what lies inside the home caches went as before
    code, out, err = run(["clean", "--all", "--yes", FLAG], capsys, monkeypatch)
    assert code == 0, out + err
    assert real.is_dir() and list(real.iterdir()) == [] and (cenv.home / ".nv" / "ComputeCache").is_symlink()


def test_a_terminal_is_asked_again_for_outside_targets(cenv, capsys, monkeypatch):
    real = _outside_tree(cenv)
    before = tree_hash(cenv.outside)
    code, out, err = run(["clean", "--all", "--yes"], capsys, monkeypatch, tty=True, answers="n\n")
    assert code == 1 and str(real) in err and "[y/N]" in err
    assert tree_hash(cenv.outside) == before
    code, out, err = run(["clean", "--all", "--yes"], capsys, monkeypatch, tty=True, answers="y\n")
    assert code == 0, out + err
    assert list(real.iterdir()) == []


def test_the_outside_question_has_a_bounded_wait(cenv, monkeypatch):
    r, w = os.pipe()  # a terminal nobody answers: the read end never gets a byte
    try:
        stdin = os.fdopen(r, "r")
        monkeypatch.setattr(cache_cli.sys, "stdin", stdin)
        start = time.monotonic()
        assert cache_cli._confirm("Empty it?", timeout_s=0.3) is False
        assert time.monotonic() - start < 3
    finally:
        stdin.close()
        os.close(w)


def test_home_cache_folders_are_defined_once(cenv):
    env = dict(os.environ)
    folders = home_cache_folders(env, cenv.root)
    for p in (cenv.home / ".cache", cenv.home / ".nv", cenv.home / ".triton", cenv.root):
        assert Path(os.path.realpath(p)) in folders
    assert cenv.home not in folders and Path("/") not in folders


def test_a_symlink_inside_a_cache_never_loses_its_targets_contents(cenv, capsys, monkeypatch):
    precious = cenv.outside / "precious"
    precious.mkdir()
    (precious / "data").write_text("keep")
    old = cenv.keydir(cenv.stale_key())
    fill(old)
    (old.env_dirs()["TRITON_CACHE_DIR"] / "link").symlink_to(precious)
    inside = cenv.home / ".cache" / "vllm"
    inside.mkdir(parents=True)
    (inside / "link").symlink_to(precious)
    (inside / "file-link").symlink_to(precious / "data")
    before = tree_hash(cenv.outside)
    code, out, err = run(["clean", "--all", "--yes", FLAG], capsys, monkeypatch)
    assert code == 0, out + err
    assert tree_hash(cenv.outside) == before and not old.path.exists() and list(inside.iterdir()) == []


# --- 2. a partly removed key exits 1 and says what was left -----------------------------------


@pytest.mark.parametrize("fault", ["unlink-eperm", "rmdir-ebusy", "mount"])
def test_a_partly_removed_key_exits_1_naming_what_was_left(cenv, capsys, monkeypatch, fault):
    old = cenv.keydir(cenv.stale_key())
    fill(old, {"TRITON_CACHE_DIR/stuck/kernel.cubin": b"k", "VLLM_CACHE_ROOT/g/graph.py": b"g"})
    stuck = old.env_dirs()["TRITON_CACHE_DIR"] / "stuck"
    real_unlink, real_rmdir, real_stat = os.unlink, os.rmdir, os.stat

    def unlink(path, *, dir_fd=None):
        if fault == "unlink-eperm" and path == "kernel.cubin":
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return real_unlink(path, dir_fd=dir_fd)

    def rmdir(path, *, dir_fd=None):
        if fault == "rmdir-ebusy" and path == "stuck":
            raise OSError(errno.EBUSY, "Device or resource busy")
        return real_rmdir(path, dir_fd=dir_fd)

    def fake_stat(path, *, dir_fd=None, follow_symlinks=True):
        st = real_stat(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
        if fault == "mount" and path == "stuck" and dir_fd is not None:  # another file system is mounted here
            return os.stat_result((st.st_mode, st.st_ino, st.st_dev + 1, *tuple(st)[3:10]))
        return st

    monkeypatch.setattr(clean_mod.os, "unlink", unlink)
    monkeypatch.setattr(clean_mod.os, "rmdir", rmdir)
    monkeypatch.setattr(clean_mod.os, "stat", fake_stat)
    code, out, err = run(["clean", "--yes"], capsys, monkeypatch)
    assert code == 1, out + err
    shown = Path(os.path.realpath(old.path))
    why = {"unlink-eperm": "operation not permitted", "rmdir-ebusy": "Device or resource busy",
           "mount": "another file system is mounted here"}[fault]
    line = next(x for x in out.splitlines() if x.startswith(f"partly removed {old.path}"))
    assert str(shown / "triton" / "stuck") in line and why in line, out
    assert not (old.env_dirs()["VLLM_CACHE_ROOT"] / "g").exists()  # the rest went
    assert (stuck / "kernel.cubin").exists() or fault == "rmdir-ebusy"
    code, report = run_json(["clean", "--yes"], capsys, monkeypatch)
    assert code == 1 and report["outcome"]["partly_removed"][0]["path"] == str(old.path)


# --- 3. serve and the cleaner agree on the acceptable roots -----------------------------------


def _serve(model: Path, env: dict[str, str], *extra: str):
    return run_main(serve.PROG, serve.main, [str(model), "--dry-run", "--facts", FACTS, *extra], env=env)


@pytest.mark.parametrize("where", ["/", "/usr", "/etc", "/usr/lib", "home", "home-parent", "cache-home", "tmp"])
def test_serve_refuses_what_the_cleaner_refuses(cenv, tmp_path, where):
    root = {"home": cenv.home, "home-parent": cenv.home.parent, "cache-home": cenv.home / ".cache",
            "tmp": cenv.tmp}.get(where, Path(where))
    (cenv.home / ".cache").mkdir(exist_ok=True)
    env = {"HOME": str(cenv.home), "TMPDIR": str(cenv.tmp), "CAOVAN_CACHE_DIR": str(root)}
    assert refusal(root, env)  # the cleaner refuses it ...
    r = _serve(tmp_path, env)  # ... and so does the launch, before anything is written
    assert_clean(r, codes=(2,))
    assert "CAOVAN_CACHE_DIR" in r.err and "accepted" in r.err
    assert not (root / "envs").exists() or where in ("/usr", "/etc", "/usr/lib", "/")


@pytest.mark.parametrize("how", ["flag", "config"])
def test_the_refusal_names_where_the_root_came_from(cenv, tmp_path, how):
    env = {"HOME": str(cenv.home), "TMPDIR": str(cenv.tmp)}
    extra = ["--cache-dir", "/"] if how == "flag" else ["--additional-config", '{"caovan_cache_dir": "/"}']
    r = _serve(tmp_path, env, *extra)
    assert_clean(r, codes=(2,))
    assert ("--cache-dir" if how == "flag" else "caovan_cache_dir") in r.err


def test_an_accepted_root_is_accepted_by_both(cenv, tmp_path):
    env = {"HOME": str(cenv.home), "TMPDIR": str(cenv.tmp)}
    for root in (cenv.base / "disk" / "caovan", cenv.home / ".cache" / "caovan-sm75-turbo3"):
        root.mkdir(parents=True)
        assert refusal(root, env) is None
        assert checked_root(str(root), "env CAOVAN_CACHE_DIR", env) == root
        assert_clean(_serve(tmp_path, {**env, "CAOVAN_CACHE_DIR": str(root)}), codes=(0,))


def test_a_relative_cache_dir_is_refused_as_the_message_says(cenv, tmp_path, monkeypatch):
    # Each vLLM process may start in another directory: the cache root must be absolute (issue 29:
    # a relative one was accepted although the refusal said "absolute").
    monkeypatch.chdir(cenv.base)
    for env, cli in (({"CAOVAN_CACHE_DIR": "rel/c"}, None), ({}, {"cache_dir": "./x/../y"})):
        with pytest.raises(SettingError, match="is not accepted: an absolute path, or empty"):
            load_settings(env, None, cli)
    assert load_settings({"CAOVAN_CACHE_DIR": "~/c"}).cache_dir == str(cenv.home / "c")
    r = run_main(cache_cli.PROG, cache_cli.main, ["clean", "--dry-run", "--json", "--facts", FACTS],
                 env={"HOME": str(cenv.home), "CAOVAN_CACHE_DIR": "rel/c"})
    assert r.code == 2 and "CAOVAN_CACHE_DIR='rel/c' is not accepted" in r.err


def test_tilde_that_cannot_be_expanded_is_refused(cenv):
    with pytest.raises(SettingError) as err:
        load_settings({"CAOVAN_CACHE_DIR": "~no-such-user-caovan/x"})
    assert "CAOVAN_CACHE_DIR" in str(err.value) and "~" in str(err.value)


# --- 4. special files where a manifest, a lock or a key is expected ---------------------------


def _special(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        os.mknod(path, stat.S_IFSOCK | 0o600)
    else:  # a character device like /dev/zero: reading it never ends
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))


KINDS = ["fifo", "socket"] + (["chardev"] if os.geteuid() == 0 else [])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", [MANIFEST, IN_USE_LOCK])
def test_a_special_file_in_a_key_is_reported_and_never_opened(cenv, capsys, monkeypatch, kind, name):
    old = cenv.keydir(cenv.stale_key())
    fill(old)
    (old.path / name).unlink(missing_ok=True)
    _special(old.path / name, kind)
    with hang_guard():
        assert read_manifest(old.path) is None or name != MANIFEST
        code, report = run_json(["list"], capsys, monkeypatch)
        entry = next(e for e in report["entries"] if e["path"] == str(old.path))
        assert code == 0 and name in (entry["note"] or "")
        code, out, err = run(["clean", "--yes"], capsys, monkeypatch)
    assert code == 0, out + err
    assert not old.path.exists()  # the special file is unlinked with the key, never opened


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", [MANIFEST_LOCK, IN_USE_LOCK, MANIFEST])
def test_a_special_lock_file_does_not_hang_the_launch(cenv, kind, name):
    kd = cenv.keydir()
    prepare(kd)
    (kd.path / name).unlink(missing_ok=True)
    _special(kd.path / name, kind)
    with hang_guard(), pytest.raises(CaovanError) as err:
        hold_in_use(kd) if name == IN_USE_LOCK else prepare(kd)
    assert str(kd.path / name) in str(err.value) and "not a regular file" in str(err.value)


def test_a_special_file_named_like_a_key_is_listed_not_cleaned(cenv, capsys, monkeypatch):
    (cenv.root / "envs").mkdir(parents=True)
    fifo = cenv.root / "envs" / cenv.stale_key().name
    os.mkfifo(fifo)
    with hang_guard():
        code, report = run_json(["list"], capsys, monkeypatch)
        assert code == 0
        entry = next(e for e in report["entries"] if e["path"] == str(fifo))
        assert "FIFO" in entry["note"]
        code, out, err = run(["clean", "--all", "--yes"], capsys, monkeypatch)
    assert code == 0 and stat.S_ISFIFO(os.lstat(fifo).st_mode)


# --- 5. hostile trees --------------------------------------------------------------------------


def test_ten_thousand_levels_end_fast_without_recursion_errors(cenv, capsys, monkeypatch):
    old = cenv.keydir(cenv.stale_key())
    fill(old)
    top = old.env_dirs()["TRITON_CACHE_DIR"]
    make_deep(top, 10_000)
    before = tree_hash(cenv.outside)
    try:
        start = time.monotonic()
        code, report = run_json(["list"], capsys, monkeypatch)
        assert code == 0
        code, out, err = run(["clean", "--yes"], capsys, monkeypatch)
        assert code == 1 and "Traceback" not in out + err and "nested deeper than" in out
        assert f"partly removed {old.path}" in out
        assert time.monotonic() - start < 30
    finally:
        remove_deep(top)
    assert tree_hash(cenv.outside) == before


def test_names_that_are_not_utf8_are_printed_escaped(cenv, capsys, monkeypatch):
    old = cenv.keydir(cenv.stale_key())
    fill(old)
    bad = os.fsencode(old.env_dirs()["TRITON_CACHE_DIR"]) + b"/\xff\xfe-dir"
    os.mkdir(bad)
    open(bad + b"/f\xff", "wb").close()
    os.mkdir(os.fsencode(cenv.root / "envs") + b"/not-a-key-\xff")
    code, out, err = run(["list"], capsys, monkeypatch)
    assert code == 0 and "not-a-key-\\xff" in out, out + err
    code, report = run_json(["list"], capsys, monkeypatch)
    assert code == 0
    real_unlink = os.unlink

    def refuse(path, *, dir_fd=None):
        if path == os.fsdecode(b"f\xff"):
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_unlink(path, dir_fd=dir_fd)

    monkeypatch.setattr(clean_mod.os, "unlink", refuse)
    code, out, err = run(["clean", "--yes"], capsys, monkeypatch)
    assert code == 1 and "\\xff\\xfe-dir/f\\xff: permission denied" in out, out + err


def test_a_huge_tree_is_counted_up_to_a_limit_and_says_at_least(cenv, capsys, monkeypatch):
    old = cenv.keydir(cenv.stale_key())
    fill(old)
    many = old.env_dirs()["TRITON_CACHE_DIR"] / "many"
    many.mkdir()
    for i in range(300):
        (many / str(i)).write_bytes(b"x" * 10)
    monkeypatch.setattr(inventory_mod, "WALK_LIMIT", 100)
    code, report = run_json(["list"], capsys, monkeypatch)
    entry = next(e for e in report["entries"] if e["path"] == str(old.path))
    assert code == 0 and entry["complete"] is False and entry["files"] <= 100
    code, out, err = run(["list"], capsys, monkeypatch)
    assert "at least" in out
    code, out, err = run(["clean", "--dry-run"], capsys, monkeypatch)
    assert "at least" in out
    code, out, err = run(["clean", "--yes"], capsys, monkeypatch)
    assert code == 0 and not old.path.exists()  # the limit bounds counting, never deleting


# A generated tree: (path components, kind); names include non-UTF-8 bytes, '..'-like names and
# symlinks that point outside, to the parent, nowhere, or into the outside tree.
_NAME = st.sampled_from([b"a", b"b", b"..x", b"...", b"\xff\xfe", b"k\xe9", b" sp", b"-", b"c" * 200])
_KIND = st.sampled_from(["dir", "file", "link-outside", "link-parent", "link-dangling", "fifo", "link-file"])
_NODES = st.lists(st.tuples(st.lists(_NAME, min_size=1, max_size=4), _KIND), max_size=25)
_WHERE = st.sampled_from(["stale-key", "current-key", "shared-inside", "shared-linked-outside"])


def _grow(top: Path, nodes: list, outside: Path) -> None:
    base = os.fsencode(top)
    for parts, kind in nodes:
        path = base + b"/" + b"/".join(parts)
        parent = os.path.dirname(path)
        try:
            os.makedirs(parent, exist_ok=True)
            if os.path.lexists(path):
                continue
            if kind == "dir":
                os.mkdir(path)
            elif kind == "file":
                with open(path, "wb") as f:
                    f.write(b"x" * len(parts))
            elif kind == "fifo":
                os.mkfifo(path)
            else:
                target = {"link-outside": os.fsencode(outside), "link-parent": b"..",
                          "link-dangling": b"/nonexistent/caovan", "link-file": os.fsencode(outside / "f")}[kind]
                os.symlink(target, path)
        except (FileExistsError, NotADirectoryError, FileNotFoundError):
            continue  # a generated path below a file or through a dangling link: not a tree


@FAST
@given(nodes=_NODES, where=_WHERE, argv=st.sampled_from([
    ["list", "--json"], ["clean", "--dry-run", "--json"], ["clean", "--yes", "--json"],
    ["clean", "--all", "--yes", "--json"], ["clean", "--all", "--dry-run", "--json"]]))
def test_hostile_trees_end_fast_and_nothing_outside_the_plan_goes(tmp_path_factory, nodes, where, argv):
    base = tmp_path_factory.mktemp("t")
    home, outside = base / "home", base / "outside"
    (outside / "d").mkdir(parents=True)
    (outside / "f").write_text("precious")
    (outside / "d" / "g").write_text("precious")
    env = {"HOME": str(home), "TMPDIR": str(base / "tmp"), "USER": "tester", "LOGNAME": "tester"}
    current = env_key(Facts.load(EXAMPLE))
    root = home / ".cache" / "caovan-sm75-turbo3"
    stale = key_from_components(dict(current.components, torch="0"))
    top = {"stale-key": root / "envs" / stale.name, "current-key": root / "envs" / current.name,
           "shared-inside": home / ".cache" / "vllm", "shared-linked-outside": outside / "linked"}[where]
    top.mkdir(parents=True)
    if where == "shared-linked-outside":  # emptied only with --yes-outside-home-cache, never given here
        (home / ".nv").mkdir(parents=True)
        (home / ".nv" / "ComputeCache").symlink_to(top)
    _grow(top, nodes, outside)
    before = tree_hash(outside)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cache_cli, "vllm_processes", lambda: [])
        r = run_main(cache_cli.PROG, cache_cli.main, [*argv, "--facts", FACTS], env=env)
    assert_clean(r)
    assert r.seconds < BOUND_S
    if r.out:  # valid JSON, or nothing on stdout and one line on stderr
        json.loads(r.out)
    assert tree_hash(outside) == before and (outside / "f").read_text() == "precious"
