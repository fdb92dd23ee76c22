"""Test support shared by the test suite and the benchmarks: the tolerance policy and
seeded input generators with NaN-poisoned padding."""

from mla_var3.testing.tolerance import LSE_TOLERANCE, TOLERANCE, assert_close, rel_err
from mla_var3.testing.poison import nan_padded, poisoned

__all__ = ["LSE_TOLERANCE", "TOLERANCE", "assert_close", "rel_err", "nan_padded", "poisoned"]
