"""The bulk job's work folder: one worker per lock, so two jobs never write the same shards, and starting over
never deletes the shards of a job still running."""

import os

import pytest

from hybrid.bulk import ShardStore


def test_two_jobs_never_write_the_same_shards(tmp_path):
    first = ShardStore(tmp_path, {"job": 1}, "0-of-1")
    with pytest.raises(RuntimeError, match=rf"worker 0-of-1 of {tmp_path} is in use by process {os.getpid()}"):
        ShardStore(tmp_path, {"job": 1}, "0-of-1")
    ShardStore(tmp_path, {"job": 1}, "1-of-2")  # another worker of a split job shares the folder
    del first  # its lock goes with it (and with its process, however that ends)
    ShardStore(tmp_path, {"job": 1}, "0-of-1")


def test_starting_over_never_deletes_the_shards_of_a_job_still_running(tmp_path):
    running = ShardStore(tmp_path, {"job": 1}, "1of2")
    (tmp_path / "shard-000000000000-000000000001.txt").write_text("kept\n")
    with pytest.raises(RuntimeError, match=r"worker 1of2 .* is in use"):
        ShardStore(tmp_path, {"job": 2}, "0of2", start_over=True)
    assert (tmp_path / "shard-000000000000-000000000001.txt").read_text() == "kept\n"
    del running
    ShardStore(tmp_path, {"job": 2}, "0of2", start_over=True)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["lock-0of2"]
