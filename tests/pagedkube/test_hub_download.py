"""pagedkube/hub_download.py's progress lines off a terminal (the download itself is tested
through real servers against the Hub mirror, tests/server/test_hub_models.py)."""
from __future__ import annotations

import logging
import time

from pagedkube.hub_download import ProgressLog


def test_off_a_terminal_the_bytes_written_since_the_start_are_logged_each_interval(tmp_path, caplog) -> None:
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / "cached-before").write_bytes(b"x" * 10)          # another model's blob: not this download's
    with caplog.at_level(logging.INFO, logger="pagedkube.hub"):
        with ProgressLog("org/m", blobs, 1000, interval=0.01) as progress:
            assert not progress.on_terminal                    # pytest captures stderr
            (blobs / "0123abcd.incomplete").write_bytes(b"y" * 400)
            deadline = time.monotonic() + 30
            while "org/m: downloading, 400 of 1000 bytes (400 B of 1.0 KB)" not in caplog.text:
                assert time.monotonic() < deadline, caplog.text
                time.sleep(0.01)
    assert not progress.thread.is_alive()
