"""Temporary names beside a final file: a legal name for any legal final name, naming the
writer's PID, so that the leftovers of dead writers can be found."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from waiting import wait_for

from ipycloud.runtime.durable import (
    is_temporary,
    stale_temporaries,
    stale_temporary,
    temp_name_for,
    write_bytes_atomically,
)

NAME_MAX = 255  # bytes, on ext4, xfs, btrfs, tmpfs and overlayfs alike


def names_up_to_name_max() -> list[str]:
    """Final names of every length in bytes up to NAME_MAX, from characters of 1 to 4 bytes
    in UTF-8, some starting one byte off so that a cut can fall inside a character."""
    names = []
    for character in ("a", "é", "€", "😀"):
        for lead in ("", "a"):
            width = len(character.encode())
            for count in range(1, (NAME_MAX - len(lead)) // width + 1):
                names.append(lead + character * count)
    return names


@pytest.mark.parametrize("character", ["a", "é", "€", "😀"])
def test_a_temporary_name_fits_for_every_final_name_and_names_this_process(
        character: str) -> None:
    for final in [name for name in names_up_to_name_max() if name.endswith(character)]:
        temp = temp_name_for(final)
        raw = os.fsencode(temp)
        assert len(raw) <= max(len(final.encode()), 143), (final, temp)
        assert temp.startswith(f".tmp-{os.getpid()}-"), temp
        assert is_temporary(temp) and stale_temporary(temp)  # this process's, between writes
        kept = temp.split("-", 3)[3]
        assert kept and final.startswith(kept), (final, temp)
        raw.decode("utf-8")  # never a character cut in two


def test_a_short_final_name_is_kept_whole() -> None:
    temp = temp_name_for(Path("/somewhere/step-000012.pt"))
    assert temp.parent == Path("/somewhere")
    assert temp.name.startswith(f".tmp-{os.getpid()}-")
    assert temp.name.split("-", 3)[3] == "step-000012.pt"


@pytest.mark.parametrize("final", ["x" * 240, "é" * 127, "a" + "😀" * 63],
                         ids=["240 ASCII", "254 bytes of é", "253 bytes, 4-byte characters"])
def test_a_file_whose_name_is_near_name_max_is_written_atomically(
        tmp_path: Path, final: str) -> None:
    target = tmp_path / final
    write_bytes_atomically(target, b"state")
    assert target.read_bytes() == b"state"
    assert [path.name for path in tmp_path.iterdir()] == [final]


def test_a_long_temporary_name_of_a_dead_writer_is_stale_and_of_a_live_one_is_not(
        tmp_path: Path) -> None:
    code = ("import sys\nfrom ipycloud.runtime.durable import temp_name_for\n"
            "print(temp_name_for('z' * 255), flush=True)\nsys.stdin.read()\n")
    writer = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdin is not None
    temp = writer.stdout.readline().strip()
    try:
        assert temp.startswith(f".tmp-{writer.pid}-") and len(temp) <= NAME_MAX
        assert is_temporary(temp) and not stale_temporary(temp)
    finally:
        writer.stdin.close()
        writer.wait(timeout=60)
    assert stale_temporary(temp)


def test_the_temporary_file_of_a_writer_that_ended_unreaped_is_stale(tmp_path: Path) -> None:
    """A writer that died and that no parent has reaped yet (an orphan waiting for an init
    that reaps late, or never) still has its PID, as a zombie."""
    writer = os.fork()
    if writer == 0:
        os._exit(0)
    try:
        wait_for(lambda: psutil.Process(writer).status() == psutil.STATUS_ZOMBIE,
                 what="the writer a zombie")
        name = f".tmp-{writer}-0123abcd-step-000000001.pt"
        (tmp_path / name).write_bytes(b"partial")
        assert stale_temporary(name)
        assert [path.name for path in stale_temporaries(tmp_path)] == [name]
    finally:
        os.waitpid(writer, 0)


def test_a_temporary_file_older_than_the_process_that_has_its_pid_now_is_stale(
        tmp_path: Path) -> None:
    """Its writer died and, PIDs wrapping around, another process took its PID over."""
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    assert other.stdin is not None
    try:
        name = f".tmp-{other.pid}-0123abcd-step-000000001.pt"
        leftover = tmp_path / name
        leftover.write_bytes(b"partial")
        an_hour_ago = time.time() - 3600
        os.utime(leftover, (an_hour_ago, an_hour_ago))
        assert [path.name for path in stale_temporaries(tmp_path)] == [name]
        os.utime(leftover)  # changed now, while that process runs: it may be writing it
        assert list(stale_temporaries(tmp_path)) == []
    finally:
        other.stdin.close()
        other.wait(timeout=60)
