"""Property-based: random programs of collectives, reduce ops, sizes, dtypes, roots and groups give
the same result under ddplite as under gloo on every rank. Hypothesis draws new programs each run
(set HYPOTHESIS_SEED, or see the failing example it prints, to replay one)."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import groups_p2p
from harness import run_ranks

OPS = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all"]
REDUCE_OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
STEP = st.tuples(st.sampled_from(OPS), st.sampled_from([0, 1, 3, 17, 1000, 70001]),
                 st.sampled_from(["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64",
                                  "bool"]),
                 st.integers(min_value=0, max_value=4), st.booleans(), st.sampled_from(REDUCE_OPS))


@settings(max_examples=16, deadline=None, database=None, suppress_health_check=list(HealthCheck),
          print_blob=True)
@given(world_size=st.integers(min_value=2, max_value=4), program=st.lists(STEP, min_size=1, max_size=8))
def test_random_programs_match_gloo(world_size, program):
    for mismatches in run_ranks(groups_p2p.run_program, world_size, program, timeout_s=120):
        assert mismatches == []
