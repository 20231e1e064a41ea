"""What a listening daemon publishes for every sandbox of its sluice home to hide."""

from __future__ import annotations

import os
import subprocess
import sys

from broker.net.runtime import PUBLISHED_DIR, hidden_paths, publish_hidden, published_hidden, unpublish_hidden


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_published_paths_are_hidden_while_their_daemon_runs(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("SLUICE_HOME", str(home))
    assert published_hidden() == ()
    allow = str(tmp_path / "work" / "allow")
    path = publish_hidden([allow, "/srv/key_secret"])
    assert os.path.dirname(path) == str(home / PUBLISHED_DIR)
    assert oct(os.stat(home / PUBLISHED_DIR).st_mode & 0o777) == "0o700"
    assert published_hidden() == (allow, "/srv/key_secret")
    assert allow in hidden_paths() and str(home) in hidden_paths()
    unpublish_hidden(path)
    assert published_hidden() == ()
    unpublish_hidden(path)  # twice is fine


def test_what_a_dead_daemon_left_is_ignored_and_swept_by_the_next(tmp_path, monkeypatch):
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path))
    directory = tmp_path / PUBLISHED_DIR
    directory.mkdir()
    stale = directory / f"daemon-{_dead_pid()}"
    stale.write_text("/gone/allow\n")
    (directory / "notes.txt").write_text("/not/a/daemon\n")
    assert published_hidden() == ()
    path = publish_hidden(["/live/allow", "relative/is/ignored"])
    assert not stale.exists() and (directory / "notes.txt").exists()
    assert published_hidden() == ("/live/allow",)
    unpublish_hidden(path)
