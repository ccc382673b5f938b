"""``dhmc.stats.rhat``: nested R-hat and the superchains it groups chains into."""

from __future__ import annotations

import numpy as np

from dhmc.stats import max_nested_rhat, nested_rhat, superchains


def test_nested_rhat_detects_a_stuck_superchain():
    rng = np.random.default_rng(0)
    good = rng.normal(size=(64, 20))
    assert nested_rhat(good, 8) < 1.01
    bad = good.copy()
    bad[:8] += 3.0
    assert nested_rhat(bad, 8) > 1.1


def test_superchains_group_whole_chunks_or_one_chunks_chains():
    assert superchains(64, 4096) == 16 and superchains(16, 1024) == 16 and superchains(12, 1024) == 12
    assert superchains(20, 2000) == 10  # at most 16 groups of whole chunks, an equal number each
    assert superchains(17, 1700) == 17  # none divides them: every chunk its own
    assert superchains(1, 4096) == 16 and superchains(1, 64) == 4 and superchains(1, 8) == 2
    assert superchains(1, 3) == 0


def test_max_nested_rhat_cuts_the_chains_to_whole_superchains():
    rng = np.random.default_rng(1)
    draws = {"a": rng.normal(size=(66, 30)), "b": rng.normal(size=(66, 30, 2))}
    draws["b"][:8, :, 1] += 3.0
    assert max_nested_rhat(draws, 8) == nested_rhat(draws["b"][:64, :, 1], 8) > 1.1
    assert max_nested_rhat(draws, 0) == 1.0
