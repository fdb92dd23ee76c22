"""fp32 references of the MLA designs (the ground truth of every test and benchmark).

Nothing else in the package re-implements these; see ``attention.py`` for the conventions.
"""

from mla_var3.reference.attention import (
    absorb_query,
    decompress,
    expand_kv,
    flash_attention,
    flash_mla,
    flash_mla_paged,
    gather_paged,
    key_mask,
    mla_var6_plus,
)
from mla_var3.reference.inputs import MLAInputs, design_inputs, make_inputs, make_paged

__all__ = [
    "absorb_query", "decompress", "expand_kv", "flash_attention", "flash_mla", "flash_mla_paged",
    "gather_paged", "key_mask", "mla_var6_plus", "MLAInputs", "design_inputs", "make_inputs", "make_paged",
]
