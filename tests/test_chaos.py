"""Chaos, the quick slice CI runs (tests/chaos_runner.py; the full run is scripts/chaos.py): DDP
training with one rank killed (SIGKILL) and, in another run, one stopped (SIGSTOP): every survivor
raises a DistBackendError naming it within the timeout + 5 s and leaves a flight-recorder dump
naming the op that failed, and nothing is left in /dev/shm."""

import random

import pytest

import chaos_runner


@pytest.mark.parametrize("kind,world_size,seed", [("kill", 3, 11), ("stop", 2, 12)])
def test_survivors_name_the_lost_rank_in_time(kind, world_size, seed):
    outcome = chaos_runner.one_run(kind, world_size, random.Random(seed))
    assert outcome.problems == [], outcome
    assert len(outcome.detection_s) == world_size - 1
    assert outcome.dumps == world_size - 1
