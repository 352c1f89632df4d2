"""Paged KV-cache bookkeeping: fixed-size blocks, ref counts, per-sequence block tables, prefix cache.

Pure Python: the model runner owns the KV tensors; this module only decides which block ids hold
which positions of which sequence.

Prefix caching: a full, computed block is registered under a chained hash of (parent hash, its
tokens). A freed block keeps its hash and stays findable until it is popped for reuse, least
recently freed first, so the free list doubles as the LRU cache. A hit is verified against the
block's stored tokens and its parent's prefix id (unique per registration, never reused): colliding
hashes can cost a hit but never splice KV computed for another prefix.

Forks (several sequences of one request): `fork` gives a child the parent's blocks, one more ref
each. The first holder to write into a shared block that is not full copies it first
(copy-on-write): `allocate` swaps in a fresh block and queues the (source, destination) copy, which
the engine hands to the model runner before the forward (`take_copies`). A block is free when its
last holder frees it.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NewType

from conveyor.engine.sequence import Sequence
from conveyor.jobqueue.prefix_hash import block_hash

BlockHash = NewType("BlockHash", int)
HashFn = Callable[[BlockHash | None, tuple[int, ...]], BlockHash]


def hash_block(parent: BlockHash | None, token_ids: tuple[int, ...]) -> BlockHash:
    """Chained hash of one full block: conveyor/jobqueue/prefix_hash.py's, stable across processes, so the api
    computes the same chain from token ids to place a job where its prefix is cached. Hits are
    verified, so collisions are harmless."""
    return BlockHash(block_hash(parent, token_ids))


@dataclass(slots=True)
class KVBlock:
    id: int
    ref_count: int = 0
    hash: BlockHash | None = None  # set while registered in the prefix cache
    token_ids: tuple[int, ...] = ()  # the block's tokens, to verify a hit
    prefix_id: int | None = None  # identity of the exact prefix this block's KV encodes
    parent_prefix_id: int | None = None  # the previous block's prefix_id (None: first block)


@dataclass(slots=True)
class _Chain:
    """How far `cache_blocks` got with one sequence: blocks done, and the last one's identity."""

    num_blocks: int = 0
    hash: BlockHash | None = None
    prefix_id: int | None = None


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        hash_fn: HashFn = hash_block,
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be at least 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._hash_fn = hash_fn
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # Free blocks, next to be reused first. A hashed block joins at the back (LRU eviction); an
        # unhashed one at the front, since reusing it loses nothing.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[BlockHash, int] = {}
        self._chains: dict[Sequence, _Chain] = {}
        self._prefix_ids = itertools.count()
        self.num_queried_tokens = 0  # tokens of admitted sequences looked up in the prefix cache
        self.num_hit_tokens = 0  # of which found there
        self._copies: list[tuple[int, int]] = []  # copy-on-write (source, destination) not yet done

    @property
    def num_free_blocks(self) -> int:
        """Blocks not referenced by any sequence, cached (evictable) ones included."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached block ids for seq's leading full blocks, without side effects. Only blocks within
        the first num_tokens - 1 tokens qualify: the last token must be computed for its logits."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        hits: list[int] = []
        parent_hash: BlockHash | None = None
        parent_id: int | None = None
        for i in range((seq.num_tokens - 1) // bs):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            parent_hash = self._hash_fn(parent_hash, tokens)
            block = self._verified(parent_hash, tokens, parent_id)
            if block is None:
                break
            hits.append(block.id)
            parent_id = block.prefix_id
        return hits

    def allocate(self, seq: Sequence, num_new_tokens: int, cached_blocks: Iterable[int] = ()) -> bool:
        """Take refs on `cached_blocks` (a prefix hit; only on an empty block table), then extend the
        table to cover num_computed_tokens + num_new_tokens positions. All or nothing: False means
        the blocks are not there, and nothing changed."""
        cached = list(cached_blocks)
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        admitting = not seq.block_table
        if cached:
            self._check_hit(seq, cached, admitting)
        num_computed = seq.num_computed_tokens + len(cached) * self.block_size
        num_needed = max(
            0, self.blocks_for(num_computed + num_new_tokens) - len(seq.block_table) - len(cached)
        )
        shared = self._shared_write(seq) if num_new_tokens and not admitting else None
        if shared is not None:
            num_needed += 1  # the copy
        # Hit blocks with no other user sit in the free list: reviving them uses it up too.
        num_revived = sum(1 for b in cached if self.blocks[b].ref_count == 0)
        if num_needed > len(self._free) - num_revived:
            return False
        for block_id in cached:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
        if cached:
            last = self.blocks[cached[-1]]
            self._chains[seq] = _Chain(len(cached), last.hash, last.prefix_id)
            seq.num_computed_tokens = num_computed
        if admitting and self.enable_prefix_caching:
            hit = len(cached) * self.block_size
            self.num_queried_tokens += seq.num_tokens
            self.num_hit_tokens += hit
            # Set, not added to: a preempted sequence is admitted again and must not count twice.
            seq.num_cached_tokens = min(hit, seq.num_prompt_tokens)
        if shared is not None:
            num_needed -= 1
            source, copy = seq.block_table[shared], self._pop_free()
            self.blocks[source].ref_count -= 1  # others still hold it: it was shared
            seq.block_table[shared] = copy
            self._copies.append((source, copy))
        # In ascending order: the same blocks the free list gives (eviction order unchanged), but a
        # finished sequence's blocks come back tail first, and a table that runs backwards through
        # memory is read markedly slower by the decode kernel (docs/engine.md, "Ascending order").
        seq.block_table.extend(sorted(self._pop_free() for _ in range(num_needed)))
        return True

    def extend_for_draft(self, seq: Sequence, num_tokens: int) -> int:
        """Extend seq's table, already covering its next token, for up to `num_tokens` draft tokens
        after it (speculative decoding); returns how many it covers. Only unhashed free blocks
        are taken: a draft never evicts the prefix cache, and `truncate` gives them back."""
        bs, table = self.block_size, seq.block_table
        first = seq.num_computed_tokens + 1  # the draft's first position
        if any(self.blocks[b].ref_count > 1 for b in table[first // bs :]):
            return 0  # a fork's shared block: copy-on-write is the next token's, not a draft's
        room = len(table) * bs - first
        fresh = 0
        for block_id in self._free:  # unhashed blocks sit at the front
            if room + fresh * bs >= num_tokens or self.blocks[block_id].hash is not None:
                break
            fresh += 1
        table.extend(self._pop_free() for _ in range(fresh))
        return max(0, min(num_tokens, room + fresh * bs))

    def truncate(self, seq: Sequence) -> None:
        """Give back the blocks past seq's computed tokens (a rejected draft's): its table is then
        what it would be had the draft never been proposed."""
        keep = self.blocks_for(seq.num_computed_tokens)
        for block_id in reversed(seq.block_table[keep:]):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
                self._free.move_to_end(block_id, last=block.hash is not None)
        del seq.block_table[keep:]

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """`child` continues from `parent`'s computed tokens: it shares every block of the parent's
        (one more ref each) and its place in the prefix cache's chain."""
        if child.block_table:
            raise ValueError(f"{child.request_id}: a fork starts with an empty block table")
        for block_id in parent.block_table:
            self.blocks[block_id].ref_count += 1
        child.block_table = list(parent.block_table)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens
        chain = self._chains.get(parent)
        if chain is not None:
            self._chains[child] = _Chain(chain.num_blocks, chain.hash, chain.prefix_id)

    def take_copies(self) -> list[tuple[int, int]]:
        """The block copies (source, destination) allocations queued since the last call: the model
        runner must make them before the forward writes into the destinations."""
        copies, self._copies = self._copies, []
        return copies

    def _shared_write(self, seq: Sequence) -> int | None:
        """Index in seq's table of the block its next token is written into, if other sequences
        hold it too (a fork's partial last block); None when it is seq's own or not allocated yet."""
        index = seq.num_computed_tokens // self.block_size
        if index < len(seq.block_table) and self.blocks[seq.block_table[index]].ref_count > 1:
            return index
        return None

    def cache_blocks(self, seq: Sequence) -> None:
        """Register seq's blocks that became full and computed since the last call (prompt and
        generated tokens alike), so that later requests can hit them. Idempotent."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        chain = self._chains.setdefault(seq, _Chain())
        num_full = min(seq.num_computed_tokens, seq.num_tokens, len(seq.block_table) * bs) // bs
        for i in range(chain.num_blocks, num_full):
            block = self.blocks[seq.block_table[i]]
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            block_hash = self._hash_fn(chain.hash, tokens)
            twin = self._verified(block_hash, tokens, chain.prefix_id)
            if twin is not None:
                # Another sequence computed the same prefix first: continue the chain through its
                # block, so our children stay findable; ours stays unhashed and is reused first.
                block = twin
            else:
                # New, or a hash collision: the newest block wins the hash slot.
                block.hash = block_hash
                block.token_ids = tokens
                block.parent_prefix_id = chain.prefix_id
                block.prefix_id = next(self._prefix_ids)
                self._cached[block_hash] = block.id
            chain.hash, chain.prefix_id = block_hash, block.prefix_id
        chain.num_blocks = max(chain.num_blocks, num_full)

    def free(self, seq: Sequence) -> None:
        """Drop seq's refs (tail first, so its tail is evicted first) and reset its progress."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
                if block.hash is None:
                    self._free.move_to_end(block_id, last=False)
        seq.block_table.clear()
        seq.num_computed_tokens = 0
        self._chains.pop(seq, None)

    def cached_hashes(self, limit: int) -> list[int]:
        """Up to `limit` hashes of the prefix cache's blocks, the likeliest to be hit first: those
        sequences hold now, then free ones, most recently freed first (the last to be evicted)."""
        out: list[int] = [h for h, block_id in self._cached.items() if self.blocks[block_id].ref_count > 0]
        del out[limit:]
        for block_id in reversed(self._free):  # hashed free blocks sit at the back, unhashed at the front
            if len(out) >= limit:
                break
            block = self.blocks[block_id]
            if block.hash is None:
                break
            if self._cached.get(block.hash) == block_id:
                out.append(block.hash)
        return out

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block and the hit statistics. Only when no block is in use (False
        otherwise): a running sequence's chain would point at forgotten blocks."""
        if self.num_used_blocks:
            return False
        for block in self.blocks:
            _unhash(block)
        self._cached.clear()
        self.num_queried_tokens = self.num_hit_tokens = 0
        return True

    def _verified(
        self, block_hash: BlockHash, tokens: tuple[int, ...], parent_id: int | None
    ) -> KVBlock | None:
        block_id = self._cached.get(block_hash)
        if block_id is None:
            return None
        block = self.blocks[block_id]
        if block.token_ids != tokens or block.parent_prefix_id != parent_id:
            return None
        return block

    def _check_hit(self, seq: Sequence, cached: list[int], admitting: bool) -> None:
        if not admitting or seq.num_computed_tokens:
            raise ValueError(f"{seq.request_id}: cached blocks can only start an empty block table")
        if len(cached) * self.block_size >= seq.num_tokens:
            raise ValueError(f"{seq.request_id}: a prefix hit must leave the last token to compute")
        if len(set(cached)) != len(cached):
            raise ValueError(f"{seq.request_id}: cached blocks repeat a block id")
        for block_id in cached:
            if not 0 <= block_id < self.num_blocks or self.blocks[block_id].hash is None:
                raise ValueError(f"{seq.request_id}: block {block_id} is not in the prefix cache")

    def _pop_free(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:  # evicted only now: it stayed findable while free
            if self._cached.get(block.hash) == block_id:
                del self._cached[block.hash]
            _unhash(block)
        block.ref_count = 1
        return block_id


def _unhash(block: KVBlock) -> None:
    block.hash = None
    block.token_ids = ()
    block.prefix_id = block.parent_prefix_id = None
