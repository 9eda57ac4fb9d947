"""Temporary files and folders of the package's own writers, named and cleaned as the C++
library's (io::write_file_atomic, include/onnxtrain/io.h): ``<name>.tmp-<pid>-<n>`` beside the
target, and at each write the ones a dead process left for the same target are removed, so
that writers killed mid-write (kill -9, preemption) do not fill the folder."""

from __future__ import annotations

import os
import re
import secrets
import shutil


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temporaries(target: str) -> None:
    """Removes ``<target>.tmp-<pid>-<digits>`` files and folders whose process no longer exists."""
    folder = os.path.dirname(os.path.abspath(target))
    pattern = re.compile(re.escape(os.path.basename(target)) + r"\.tmp-([0-9]+)-[0-9]+")
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        match = pattern.fullmatch(name)
        if not match or int(match.group(1)) <= 0 or _pid_alive(int(match.group(1))):
            continue
        path = os.path.join(folder, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except OSError:
            pass  # gone already, or not ours to remove


def temporary_name(target: str) -> str:
    """A fresh ``<target>.tmp-<pid>-<n>`` path beside `target` (after removing stale ones)."""
    remove_stale_temporaries(target)
    return f"{os.path.abspath(target)}.tmp-{os.getpid()}-{secrets.randbelow(1 << 24)}"


def write_bytes_atomic(target: str, data: bytes) -> None:
    """Replaces `target` by `data` through a temporary file, fsynced and renamed into place;
    on any error the temporary file is removed and `target` is left as it was."""
    scratch = temporary_name(target)
    try:
        with open(scratch, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(scratch, target)
    except BaseException:
        try:
            os.unlink(scratch)
        except OSError:
            pass
        raise
