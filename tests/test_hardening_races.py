"""Races say what they are (issue 29, class 9): a launch racing `caovan-sm75-cache clean --all` starts
over or names the race (never "set CAOVAN_CACHE_DIR to a writable directory" for a writable one), and
`clean --all` treats torch inductor's per-user temp folder, which every HOME of the user shares, as
outside the home cache folders: a second yes.

Everything lives in temporary directories (helpers/cache_trees.py points HOME and TMPDIR there).
"""

from __future__ import annotations

import shutil
import threading
import time

import pytest
from helpers.cache_trees import cenv, run  # noqa: F401

from caovan_vllm_sm75_turbo3.caches import layout
from caovan_vllm_sm75_turbo3.caches.layout import KeyDir, prepare, read_manifest
from caovan_vllm_sm75_turbo3.errors import CaovanError

FLAG = "--yes-outside-home-cache"


def _keydir(cenv) -> KeyDir:
    return cenv.keydir()


def _racing_clean(monkeypatch, cenv, times: int) -> list[int]:
    """Remove the whole cache root right after prepare() created the key directory, `times` times."""
    done = [0]
    is_empty = layout.is_empty

    def racing(keydir):
        result = is_empty(keydir)
        if done[0] < times:
            done[0] += 1
            shutil.rmtree(cenv.root)
        return result

    monkeypatch.setattr(layout, "is_empty", racing)
    return done


def test_prepare_starts_over_when_a_racing_clean_removes_the_key(cenv, monkeypatch):
    done = _racing_clean(monkeypatch, cenv, times=layout.PREPARE_ATTEMPTS - 1)
    result = prepare(_keydir(cenv))
    assert done[0] == layout.PREPARE_ATTEMPTS - 1
    assert result.created and read_manifest(_keydir(cenv).path)["key"] == cenv.current.name


def test_a_race_that_keeps_on_is_named_as_one(cenv, monkeypatch):
    _racing_clean(monkeypatch, cenv, times=10**6)
    with pytest.raises(CaovanError) as err:
        prepare(_keydir(cenv))
    text = str(err.value)
    assert "kept changing" in text and "caovan-sm75-cache clean" in text
    assert "writable" not in text and "\n" not in text


def test_a_file_where_a_directory_belongs_is_named(cenv):
    cenv.root.parent.mkdir(parents=True, exist_ok=True)
    cenv.root.write_text("not a directory")
    with pytest.raises(CaovanError) as err:
        prepare(_keydir(cenv))
    assert f"{cenv.root} is a file, not a directory" in str(err.value)


def test_launches_racing_a_cleaner_never_blame_a_writable_directory(cenv):
    """Threads preparing keys while another removes the cache root over and over, for a bounded time:
    each prepare either succeeds or names the race."""
    stop = time.monotonic() + 2.0
    problems: list[str] = []
    successes = [0]

    def launcher():
        while time.monotonic() < stop:
            try:
                prepare(_keydir(cenv))
                successes[0] += 1
            except CaovanError as err:
                if "kept changing" not in str(err):
                    problems.append(str(err))

    def cleaner():
        while time.monotonic() < stop:
            shutil.rmtree(cenv.root, ignore_errors=True)

    threads = [threading.Thread(target=launcher) for _ in range(3)] + [threading.Thread(target=cleaner)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert problems == [] and successes[0] > 0


def _inductor(cenv):
    folder = cenv.tmp / "torchinductor_tester"
    (folder / "fx").mkdir(parents=True)
    (folder / "fx" / "graph").write_text("compiled")
    return folder


def test_clean_all_yes_leaves_the_shared_per_user_inductor_folder_for_a_second_yes(cenv, capsys, monkeypatch):
    folder = _inductor(cenv)
    (cenv.home / ".cache" / "vllm" / "g").mkdir(parents=True)
    code, out, err = run(["clean", "--all", "--yes"], capsys, monkeypatch)
    assert code == 1, out + err
    assert (folder / "fx" / "graph").read_text() == "compiled"
    assert f"declined: {folder} -> {folder} lies outside your home cache folders" in out
    assert "every HOME of yours shares" in out and FLAG in out
    assert list((cenv.home / ".cache" / "vllm").iterdir()) == []   # the home's own shared caches went
    code, out, err = run(["clean", "--all", "--yes", FLAG], capsys, monkeypatch)
    assert code == 0, out + err
    assert folder.is_dir() and list(folder.iterdir()) == []


def test_the_inductor_folder_is_listed_with_the_other_shared_defaults(cenv, capsys, monkeypatch):
    folder = _inductor(cenv)
    code, out, err = run(["list", "--json"], capsys, monkeypatch)
    assert code == 0, err
    import json
    shared = [e for e in json.loads(out)["entries"] if e["kind"] == "shared"]
    assert {e["path"] for e in shared} >= {str(folder), str(cenv.home / ".cache" / "vllm")}
    assert next(e for e in shared if e["path"] == str(folder))["cleaned_by"] == "clean --all"
