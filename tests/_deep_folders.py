"""A chain of folders nested deeper than Python recurses, as a step's program once made one."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DEPTH = sys.getrecursionlimit() + 100


@contextmanager
def deep_folders(root: Path, file_name: str, text: str) -> Iterator[int]:
    """`root/d/d/…/d/file_name` holding `text`, `DEPTH` folders down; removed on leaving.

    Made by descriptor (the path itself grows past what the operating system takes), and
    removed a level at a time: pytest's own clean-up of old temporary folders recurses.
    """
    folder = os.open(root, os.O_RDONLY)
    try:
        for _ in range(DEPTH):
            os.mkdir("d", dir_fd=folder)
            inner = os.open("d", os.O_RDONLY, dir_fd=folder)
            os.close(folder)
            folder = inner
        with open(os.open(file_name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=folder), "w") as file:
            file.write(text)
    finally:
        os.close(folder)
    try:
        yield DEPTH
    finally:
        top = root / "d"
        while (top / "d").exists():  # lift the chain a level at a time
            os.rename(top / "d", root / "lifted")
            for name in os.listdir(top):
                os.unlink(top / name)
            os.rmdir(top)
            os.rename(root / "lifted", top)
        shutil.rmtree(top)
