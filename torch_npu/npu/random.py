"""``torch_npu.npu.random``: the generator ``npu`` ops draw from (defined in ``torch_npu/rng.py``)."""

from ..rng import (get_rng_state, get_rng_state_all, initial_seed, manual_seed, manual_seed_all, seed, seed_all,
                   set_rng_state, set_rng_state_all)

__all__ = ["get_rng_state", "get_rng_state_all", "initial_seed", "manual_seed", "manual_seed_all", "seed",
           "seed_all", "set_rng_state", "set_rng_state_all"]
