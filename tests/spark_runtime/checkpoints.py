"""Test helpers that damage a query's checkpoint the way a crash would."""

from __future__ import annotations

import glob
import os


def forget_last_commits(query_checkpoint, count: int = 2) -> None:
    """Delete the newest `count` commit files of a query's checkpoint (with their .crc files),
    as after a crash between writing a batch's outputs and committing it: the next start runs
    those batches again from the offset log."""
    commits = glob.glob(os.path.join(str(query_checkpoint), "commits", "[0-9]*"))
    commits = sorted(commits, key=lambda path: int(os.path.basename(path)))
    assert len(commits) >= count, commits
    for path in commits[-count:]:
        os.remove(path)
        crc = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.crc")
        if os.path.exists(crc):
            os.remove(crc)
