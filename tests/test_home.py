"""One ptd home for profiles, the text cache and crash logs (``ptd.errors.ptd_home``)."""

from pathlib import Path

from ptd.errors import crash_log, ptd_home
from ptd.runtime.data.corpus import cache_dir
from ptd.specs.hardware import hardware_home


def test_all_three_live_under_ptd_home(monkeypatch, tmp_path):
    monkeypatch.setenv("PTD_HOME", str(tmp_path))
    assert hardware_home() == tmp_path / "hardware"
    assert cache_dir() == tmp_path / "cache"
    log = crash_log(ValueError("boom"))
    assert log is not None and log.parent == tmp_path / "logs"
    assert "ValueError: boom" in log.read_text()


def test_unset_or_empty_ptd_home_is_the_users_dot_ptd(monkeypatch, tmp_path):
    # an empty PTD_HOME once meant the working folder for profiles and crash logs, but the
    # user's ~/.cache/ptd for the text cache
    monkeypatch.setenv("HOME", str(tmp_path))
    for value in (None, ""):
        if value is None:
            monkeypatch.delenv("PTD_HOME", raising=False)
        else:
            monkeypatch.setenv("PTD_HOME", value)
        assert ptd_home() == tmp_path / ".ptd"
        assert hardware_home() == tmp_path / ".ptd" / "hardware"
        assert cache_dir() == tmp_path / ".ptd" / "cache"
        assert not str(hardware_home()).startswith(str(Path.cwd()) + "/hardware")


def test_a_ptd_home_that_is_a_file_is_refused_up_front(ptd_cli, monkeypatch, tmp_path):
    f = tmp_path / "afile"
    f.write_text("not a folder")
    monkeypatch.setenv("PTD_HOME", str(f))
    for argv in (["train", "--steps", "1", "--model", "tiny"], ["calibrate", "--quick"],
                 ["estimate", "--model", "tiny", "--hardware", "cpu"]):
        rc, out, err = ptd_cli(*argv)
        assert rc == 2, (argv, err)
        assert err.count("\n") == 1 and "PTD_HOME" in err and "is a file" in err, err
    assert f.read_text() == "not a folder"  # nothing lost
