"""Block manager: allocation, ref counts, prefix cache (verified hits, LRU eviction), invariants."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from conveyor.engine.block_manager import BlockHash, BlockManager, hash_block
from conveyor.engine.sequence import Sequence

BS = 4


def make_seq(tokens: list[int], rid: str = "r") -> Sequence:
    return Sequence(request_id=rid, prompt_ids=list(tokens))


def prefill(bm: BlockManager, seq: Sequence) -> bool:
    """Admit seq with its prefix hits and compute all its tokens, as scheduler + forward would."""
    if not bm.allocate(seq, seq.num_tokens - BS * len(hits := bm.match_prefix(seq)), hits):
        return False
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_blocks(seq)
    return True


def check_invariants(bm: BlockManager, seqs: list[Sequence]) -> None:
    holders = Counter(b for s in seqs for b in s.block_table)
    free = set(bm._free)
    for block in bm.blocks:
        assert block.ref_count == holders[block.id], block
        assert (block.id in free) == (block.ref_count == 0), block
    assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
    for block_hash, block_id in bm._cached.items():
        assert bm.blocks[block_id].hash == block_hash


def test_allocate_grows_table_and_counts_refs() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS)
    seq = make_seq(list(range(10)))
    assert bm.allocate(seq, 10)
    assert len(seq.block_table) == 3 and len(set(seq.block_table)) == 3
    assert bm.num_used_blocks == 3 and bm.num_free_blocks == 5
    assert all(bm.blocks[b].ref_count == 1 for b in seq.block_table)
    seq.num_computed_tokens = 10
    assert bm.allocate(seq, 2)  # positions 10, 11 fit in block 3
    assert len(seq.block_table) == 3
    assert bm.allocate(seq, 3)
    assert len(seq.block_table) == 4
    bm.free(seq)
    assert seq.block_table == [] and seq.num_computed_tokens == 0
    assert bm.num_free_blocks == 8
    check_invariants(bm, [])


def test_allocation_failure_changes_nothing() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = make_seq(list(range(8)), "a")
    assert prefill(bm, a)
    bm.free(a)  # its 2 blocks stay cached and free
    b = make_seq(list(range(8)) + list(range(100, 112)), "b")  # 5 blocks, 2 of them hits
    hits = bm.match_prefix(b)
    assert len(hits) == 2
    before = ([(x.ref_count, x.hash) for x in bm.blocks], list(bm._free), dict(bm._cached))
    assert not bm.allocate(b, b.num_tokens - 8, hits)
    assert ([(x.ref_count, x.hash) for x in bm.blocks], list(bm._free), dict(bm._cached)) == before
    assert b.block_table == [] and b.num_computed_tokens == 0 and b.num_cached_tokens == 0
    assert bm.num_queried_tokens == 8  # only a's admission
    # 2 revived + 2 new = 4 blocks: fits exactly once the free count accounts for the revived ones.
    c = make_seq(list(range(8)) + list(range(100, 108)), "c")
    assert not bm.allocate(c, c.num_tokens - 8 + 1, bm.match_prefix(c))
    assert bm.allocate(c, c.num_tokens - 8, bm.match_prefix(c))
    assert bm.num_free_blocks == 0
    check_invariants(bm, [c])


def test_prefix_hits_are_shared_across_sequences() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS)
    shared = list(range(12))
    a = make_seq(shared + [50, 51, 52], "a")
    assert prefill(bm, a)
    b = make_seq(shared + [60, 61], "b")
    hits = bm.match_prefix(b)
    assert hits == a.block_table[:3]
    assert bm.allocate(b, b.num_tokens - 12, hits)
    assert b.num_computed_tokens == 12 and b.num_cached_tokens == 12
    assert b.block_table[:3] == a.block_table[:3] and b.block_table[3] != a.block_table[3]
    assert [bm.blocks[x].ref_count for x in a.block_table] == [2, 2, 2, 1]
    assert bm.num_hit_tokens == 12 and bm.num_queried_tokens == 15 + 14
    assert bm.prefix_cache_hit_rate == pytest.approx(12 / 29)
    check_invariants(bm, [a, b])
    bm.free(a)
    assert [bm.blocks[x].ref_count for x in b.block_table[:3]] == [1, 1, 1]
    check_invariants(bm, [b])


def test_full_prompt_hit_still_computes_last_token() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = make_seq(list(range(8)), "a")
    assert prefill(bm, a)
    assert bm.num_cached_blocks == 2
    b = make_seq(list(range(8)), "b")
    hits = bm.match_prefix(b)
    assert hits == a.block_table[:1]  # the second block holds the last token: recomputed
    assert bm.allocate(b, 4, hits)
    assert b.num_computed_tokens == 4 and b.num_uncomputed == 4
    with pytest.raises(ValueError, match="last token"):
        bm.allocate(make_seq(list(range(8)), "c"), 0, a.block_table)


def test_generated_tokens_are_cached_too() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = make_seq([1, 2, 3], "a")
    assert prefill(bm, a)
    assert bm.num_cached_blocks == 0
    a.append_token(4)  # decode: computed 3 of 4, then the forward computes the 4th
    assert bm.allocate(a, 1)
    a.num_computed_tokens += 1
    bm.cache_blocks(a)
    bm.cache_blocks(a)  # idempotent
    assert bm.num_cached_blocks == 1
    b = make_seq([1, 2, 3, 4, 5], "b")
    assert bm.match_prefix(b) == a.block_table[:1]


def test_same_prefix_computed_twice_keeps_one_chain() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS)
    prompt = list(range(9))
    a, b = make_seq(prompt, "a"), make_seq(prompt, "b")
    assert bm.allocate(a, 9) and bm.allocate(b, 9)  # both admitted before either is cached
    for seq in (a, b):
        seq.num_computed_tokens = 9
        bm.cache_blocks(seq)
    assert bm.num_cached_blocks == 2  # b's copies are twins, not registered
    for token in (20, 21, 22):  # b decodes until its third block is full
        b.append_token(token)
        assert bm.allocate(b, 1)
        b.num_computed_tokens += 1
        bm.cache_blocks(b)
    assert bm.num_cached_blocks == 3
    c = make_seq(b.token_ids + [0], "c")
    assert bm.match_prefix(c) == a.block_table[:2] + b.block_table[2:3]


def test_collision_never_aliases_memory() -> None:
    # Every block hashes alike: lookups find the wrong block, and verification must refuse it.
    bm = BlockManager(num_blocks=16, block_size=BS, hash_fn=lambda parent, tokens: BlockHash(7))
    a = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "a")
    assert prefill(bm, a)
    # [5, 6, 7, 8] is cached, but as computed after [1, 2, 3, 4]: its KV is not b's.
    assert bm.match_prefix(make_seq([5, 6, 7, 8, 0], "b")) == []
    assert bm.match_prefix(make_seq([9, 9, 9, 9, 0], "c")) == []
    # Only one block per hash: the hit on a's first block is lost, never mistaken.
    assert bm.match_prefix(make_seq([1, 2, 3, 4, 0], "d")) == []


def test_collision_with_equal_tokens_but_other_prefix_is_refused() -> None:
    # A hash that ignores the parent: [X][T] and [Z][T] collide on their second block with equal
    # tokens, yet the KV of T after X is not the KV of T after Z.
    bm = BlockManager(num_blocks=16, block_size=BS, hash_fn=lambda parent, tokens: BlockHash(hash(tokens)))
    x, z, t = [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]
    a = make_seq(x + t + [0], "a")
    assert prefill(bm, a)
    c = make_seq(z + [0], "c")  # caches [Z] alone
    assert prefill(bm, c)
    d = make_seq(z + t + [0], "d")
    hits = bm.match_prefix(d)
    assert hits == c.block_table[:1], "T's block computed after X must not serve a prefix Z"
    # Once d computes its own T, a later [Z][T] hits d's blocks.
    assert bm.allocate(d, d.num_tokens - 4, hits)
    d.num_computed_tokens = d.num_tokens
    bm.cache_blocks(d)
    e = make_seq(z + t + [5], "e")
    assert bm.match_prefix(e) == d.block_table[:2]


def test_freed_blocks_stay_cached_and_are_evicted_lru_tail_first() -> None:
    bm = BlockManager(num_blocks=6, block_size=BS)
    a_prompt, b_prompt = list(range(12)), list(range(100, 112))

    def hits(prompt: list[int]) -> int:
        return len(bm.match_prefix(make_seq(prompt + [99], "probe")))

    a = make_seq(a_prompt + [99], "a")  # 3 full blocks + 1 partial
    assert prefill(bm, a)
    bm.free(a)
    assert bm.num_free_blocks == 6 and hits(a_prompt) == 3  # freed, still cached
    b = make_seq(b_prompt + [99], "b")  # 4 blocks: the 3 unhashed free ones, then a's tail
    assert prefill(bm, b)
    assert hits(a_prompt) == 2 and hits(b_prompt) == 3
    bm.free(b)
    c = make_seq([7] * 13, "c")
    assert bm.allocate(c, 8)  # b's partial block (unhashed, reused first), then a's middle block
    assert hits(a_prompt) == 1 and hits(b_prompt) == 3
    assert bm.allocate(c, 12)  # then a's head block: a was freed before b
    assert hits(a_prompt) == 0 and hits(b_prompt) == 3
    assert bm.allocate(c, 13)  # then b's tail block, freed first of b's
    assert hits(b_prompt) == 2
    check_invariants(bm, [c])


def test_revived_hit_leaves_the_free_list() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = make_seq(list(range(9)), "a")
    assert prefill(bm, a)
    bm.free(a)
    b = make_seq(list(range(9)), "b")
    hits = bm.match_prefix(b)
    assert bm.allocate(b, 1, hits)
    assert bm.num_free_blocks == 1 and all(h not in bm._free for h in hits)
    check_invariants(bm, [b])


def test_prefix_caching_disabled() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    a = make_seq(list(range(9)), "a")
    assert prefill(bm, a)
    assert bm.num_cached_blocks == 0 and bm.match_prefix(make_seq(list(range(9)), "b")) == []


def test_misuse_raises_value_error() -> None:
    with pytest.raises(ValueError):
        BlockManager(num_blocks=0, block_size=BS)
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = make_seq(list(range(9)), "a")
    with pytest.raises(ValueError):
        bm.allocate(a, -1)
    assert prefill(bm, a)
    b = make_seq(list(range(9)), "b")
    assert bm.allocate(b, 1)
    with pytest.raises(ValueError, match="empty block table"):
        bm.allocate(b, 1, bm.match_prefix(b))
    with pytest.raises(ValueError, match="not in the prefix cache"):
        bm.allocate(make_seq(list(range(9)), "c"), 1, [a.block_table[2]])


def test_reset_prefix_cache() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = make_seq(list(range(9)), "a")
    assert prefill(bm, a)
    assert not bm.reset_prefix_cache()
    bm.free(a)
    assert bm.reset_prefix_cache()
    assert bm.num_cached_blocks == 0 and bm.match_prefix(make_seq(list(range(9)), "b")) == []


_HASHES = {
    "default": hash_block,
    "few_buckets": lambda parent, tokens: BlockHash(hash((parent, tokens)) % 3),
    "ignores_parent": lambda parent, tokens: BlockHash(hash(tokens) % 5),
}


class BlockManagerMachine(RuleBasedStateMachine):
    """Random interleavings of admission, chunked forwards, decodes and frees.

    A model of the KV memory records, per block slot, the exact prefix whose KV the forward wrote
    there; every computed position of every live sequence must read back its own prefix. That is
    what breaks if a block were shared wrongly, reused while referenced, or a hit aliased.
    """

    @initialize(
        num_blocks=st.integers(4, 24),
        hash_name=st.sampled_from(sorted(_HASHES)),
        caching=st.booleans(),
    )
    def setup(self, num_blocks: int, hash_name: str, caching: bool) -> None:
        self.bm = BlockManager(num_blocks, BS, enable_prefix_caching=caching, hash_fn=_HASHES[hash_name])
        self.seqs: list[Sequence] = []
        self.kv: dict[tuple[int, int], tuple[int, ...]] = {}
        self.count = 0

    @rule(
        base=st.sampled_from([(), (1, 2, 3, 4), (1, 2, 3, 4, 5, 6, 7, 8), (5, 6, 7, 8, 1, 2, 3, 4)]),
        tail=st.lists(st.integers(0, 3), min_size=1, max_size=10),
    )
    def add(self, base: tuple[int, ...], tail: list[int]) -> None:
        self.count += 1
        self.seqs.append(make_seq(list(base) + tail, f"s{self.count}"))

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), token=st.integers(0, 3))
    def forward(self, data: st.DataObject, token: int) -> None:
        seq = data.draw(st.sampled_from(self.seqs))
        if seq.num_uncomputed == 0:
            seq.append_token(token)
        hits = self.bm.match_prefix(seq) if not seq.block_table else []
        new = seq.num_uncomputed - BS * len(hits)
        length = data.draw(st.integers(1, new))
        if not self.bm.allocate(seq, length, hits):
            return
        self._check_reads(seq)
        for pos in range(seq.num_computed_tokens, seq.num_computed_tokens + length):
            self.kv[seq.block_table[pos // BS], pos % BS] = tuple(seq.token_ids[: pos + 1])
        seq.num_computed_tokens += length
        self.bm.cache_blocks(seq)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.seqs))
        self.bm.free(seq)
        self.seqs.remove(seq)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        self.bm.free(data.draw(st.sampled_from(self.seqs)))  # stays, to be recomputed

    def _check_reads(self, seq: Sequence) -> None:
        for pos in range(seq.num_computed_tokens):
            assert self.kv.get((seq.block_table[pos // BS], pos % BS)) == tuple(seq.token_ids[: pos + 1])

    @invariant()
    def consistent(self) -> None:
        check_invariants(self.bm, self.seqs)
        for seq in self.seqs:
            assert len(seq.block_table) * BS >= seq.num_computed_tokens
            self._check_reads(seq)

    def teardown(self) -> None:
        for seq in self.seqs:
            self.bm.free(seq)
        check_invariants(self.bm, [])
        assert self.bm.num_free_blocks == self.bm.num_blocks


BlockManagerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_block_manager_machine = BlockManagerMachine.TestCase


def test_blocks_taken_back_from_the_prefix_cache_run_forwards() -> None:
    # A freed sequence's cached blocks are evicted tail first; a prompt that takes them over gets
    # them in ascending order all the same, so that its KV lies forwards in memory.
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = make_seq(list(range(32)), "a")
    assert prefill(bm, a) and a.block_table == list(range(8))
    bm.free(a)
    b = make_seq(list(range(100, 120)), "b")  # 5 blocks: a's last five, evicted in the LRU's order
    assert prefill(bm, b)
    assert b.block_table == [3, 4, 5, 6, 7]
    assert len(bm.match_prefix(make_seq(list(range(32)) + [1], "probe"))) == 3  # a's head still cached
    check_invariants(bm, [b])
