"""The prefix cache's block hash is one the api can compute from token ids alone: stable across
processes (not Python's salted hash), and what the block manager registers is exactly the chain
`prefix_hashes` gives; placement picks the worker holding the longest prefix."""

from __future__ import annotations

import os
import random
import subprocess
import sys

from conveyor.engine.block_manager import BlockManager
from conveyor.engine.params import SamplingParams, StoppingParams
from conveyor.engine.sequence import Sequence
from conveyor.jobqueue.placement import (
    PrefixSummary,
    WorkerPrefixes,
    best_worker,
    decode_summary,
    encode_summary,
    held_blocks,
)
from conveyor.jobqueue.prefix_hash import block_hash, prefix_hashes

BS = 4


def test_the_hash_is_the_same_in_another_process_with_another_hash_seed() -> None:
    tokens = list(range(100, 164))
    code = ("from conveyor.jobqueue.prefix_hash import prefix_hashes; "
            f"print(prefix_hashes({tokens}, 16))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout
    assert out.strip() == str(prefix_hashes(tokens, 16))
    assert len(set(prefix_hashes(tokens, 16))) == 3  # 63 tokens can be hit: 3 full blocks, distinct


def test_the_chain_depends_on_every_earlier_block() -> None:
    a, b = [1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 5, 5, 6, 7, 8, 9]
    assert prefix_hashes(a, BS)[0] != prefix_hashes(b, BS)[0]
    assert prefix_hashes(a, BS)[1] != prefix_hashes(b, BS)[1]  # same second block, other parent
    assert block_hash(None, (5, 6, 7, 8)) != prefix_hashes(a, BS)[1]


def test_the_block_manager_registers_the_chain_the_api_computes() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS)
    prompt = [random.Random(7).randrange(50_000) for _ in range(13)]
    seq = Sequence("r", prompt, SamplingParams(), StoppingParams(max_new_tokens=4))
    assert bm.allocate(seq, len(prompt))
    seq.num_computed_tokens = len(prompt)
    bm.cache_blocks(seq)
    chain = prefix_hashes(prompt, BS)
    assert len(chain) == 3 and set(bm.cached_hashes(100)) == set(chain)
    assert len(bm.cached_hashes(2)) == 2
    bm.free(seq)  # freed blocks stay cached, and stay in the summary
    assert set(bm.cached_hashes(100)) == set(chain)
    again = Sequence("s", prompt, SamplingParams(), StoppingParams(max_new_tokens=4))
    assert len(bm.match_prefix(again)) == 3


def test_placement_picks_the_longest_held_prefix_of_at_least_min_blocks() -> None:
    prompt = list(range(1000, 1000 + 8 * BS + 1))
    chain = prefix_hashes(prompt, BS)
    workers = {
        "short": WorkerPrefixes(PrefixSummary(BS, frozenset(chain[:3]))),
        "long": WorkerPrefixes(PrefixSummary(BS, frozenset(chain[:6]))),
        "other": WorkerPrefixes(PrefixSummary(BS, frozenset(prefix_hashes(list(range(50, 90)), BS)))),
    }
    assert held_blocks(chain, workers["long"].summary) == 6
    assert best_worker(prompt, workers, min_blocks=4) == ("long", 6)
    assert best_worker(prompt, workers, min_blocks=7) is None
    assert best_worker(list(range(5000, 5040)), workers, min_blocks=1) is None
    workers["twin"] = workers["long"]
    picks = {best_worker(prompt, workers, 4, random.Random(seed))[0] for seed in range(20)}  # type: ignore[index]
    assert picks == {"long", "twin"}  # equal holders share the load


def test_placement_weighs_the_prefix_held_against_the_backlog() -> None:
    prompt = list(range(1000, 1000 + 8 * BS + 1))  # 33 tokens, 8 full blocks
    chain = prefix_hashes(prompt, BS)
    long, short = PrefixSummary(BS, frozenset(chain[:6])), PrefixSummary(BS, frozenset(chain[:4]))
    idle = PrefixSummary(BS, frozenset())

    def place(long_backlog: int, short_backlog: int = 0, idle_backlog: int = 0) -> tuple[str, int] | None:
        workers = {"long": WorkerPrefixes(long, long_backlog), "short": WorkerPrefixes(short, short_backlog),
                   "idle": WorkerPrefixes(idle, idle_backlog)}
        return best_worker(prompt, workers, min_blocks=2)

    # long computes 33 - 24 = 9 tokens + its backlog, short 33 - 16 = 17 + its backlog
    assert place(long_backlog=7) == ("long", 6)  # 16 < 17: the longer prefix
    assert place(long_backlog=9) == ("short", 4)  # 18 > 17: short finishes its prefill first
    ties = {place(long_backlog=8) for _ in range(40)}  # 17 = 17: either, at random
    assert ties == {("long", 6), ("short", 4)}
    # each busier than computing the whole prompt on the idle worker (33 + its backlog): shared
    assert place(long_backlog=30, short_backlog=16) == ("short", 4)  # 33 <= 33 + 0
    assert place(long_backlog=30, short_backlog=17) is None  # 34 > 33 + 0
    assert place(long_backlog=30, short_backlog=17, idle_backlog=2) == ("short", 4)  # 34 <= 33 + 2


def test_a_summary_round_trips_and_a_foreign_value_is_skipped() -> None:
    chain = prefix_hashes(list(range(40)), BS)
    assert decode_summary(encode_summary(BS, chain)) == PrefixSummary(BS, frozenset(chain))
    assert decode_summary("not a summary") is None
