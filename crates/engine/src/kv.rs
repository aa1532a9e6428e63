//! The paged KV cache: fixed-size blocks, reference counts, and an LRU prefix cache over free blocks.
//!
//! As in vLLM, a freed block that holds a full prompt block keeps its content hash and stays
//! reusable until it is evicted to serve a new allocation, oldest-freed first.

use std::collections::{HashMap, VecDeque};

pub(crate) type BlockId = u32;

#[derive(Debug, Clone, Default)]
struct Block {
    refs: u32,
    hash: Option<u64>,
    /// Bumped each time the block joins the free queue; older queue entries for it are stale.
    generation: u32,
}

/// The block pool of one engine.
#[derive(Debug)]
pub(crate) struct BlockPool {
    blocks: Vec<Block>,
    /// Free blocks in eviction order (front = least recently freed), with lazily dropped stale entries.
    free: VecDeque<(BlockId, u32)>,
    num_free: usize,
    cached: HashMap<u64, BlockId>,
}

impl BlockPool {
    pub(crate) fn new(num_blocks: usize) -> Self {
        let blocks = vec![Block::default(); num_blocks];
        let free = (0..num_blocks as BlockId).map(|id| (id, 0)).collect();
        Self {
            blocks,
            free,
            num_free: num_blocks,
            cached: HashMap::new(),
        }
    }

    pub(crate) fn total(&self) -> usize {
        self.blocks.len()
    }

    pub(crate) fn num_free(&self) -> usize {
        self.num_free
    }

    /// Share of blocks in use, 0–1 (`vllm:kv_cache_usage_perc`): cached but free blocks count as free.
    pub(crate) fn usage(&self) -> f64 {
        if self.blocks.is_empty() {
            return 0.0;
        }
        1.0 - self.num_free as f64 / self.blocks.len() as f64
    }

    /// Takes `n` fresh blocks, evicting cached content; `None` (and nothing taken) if too few are free.
    pub(crate) fn allocate(&mut self, n: usize, out: &mut Vec<BlockId>) -> bool {
        if n > self.num_free {
            return false;
        }
        for _ in 0..n {
            let id = loop {
                // `num_free` counts valid entries, so the queue cannot run dry before we find one.
                let Some((id, generation)) = self.free.pop_front() else {
                    unreachable!("free queue shorter than num_free");
                };
                let block = &self.blocks[id as usize];
                if block.refs == 0 && block.generation == generation {
                    break id;
                }
            };
            let block = &mut self.blocks[id as usize];
            if let Some(hash) = block.hash.take()
                && self.cached.get(&hash) == Some(&id)
            {
                self.cached.remove(&hash);
            }
            block.refs = 1;
            self.num_free -= 1;
            out.push(id);
        }
        true
    }

    /// Releases a sequence's blocks, last block first so that a prompt's tail is evicted before its head.
    pub(crate) fn release(&mut self, blocks: &mut Vec<BlockId>) {
        while let Some(id) = blocks.pop() {
            let block = &mut self.blocks[id as usize];
            debug_assert!(block.refs > 0, "double free of block {id}");
            block.refs -= 1;
            if block.refs == 0 {
                block.generation = block.generation.wrapping_add(1);
                self.free.push_back((id, block.generation));
                self.num_free += 1;
            }
        }
        if self.free.len() > 2 * self.blocks.len() + 16 {
            let blocks = &self.blocks;
            self.free
                .retain(|&(id, g)| blocks[id as usize].refs == 0 && blocks[id as usize].generation == g);
        }
    }

    /// Takes a reference on the longest run of cached blocks matching `hashes` from the start.
    pub(crate) fn acquire_prefix(&mut self, hashes: &[u64], out: &mut Vec<BlockId>) -> usize {
        let mut hits = 0;
        for hash in hashes {
            let Some(&id) = self.cached.get(hash) else { break };
            let block = &mut self.blocks[id as usize];
            if block.refs == 0 {
                self.num_free -= 1;
            }
            block.refs += 1;
            out.push(id);
            hits += 1;
        }
        hits
    }

    /// Marks a computed full block as holding `hash`, so later prompts with that prefix can reuse it.
    pub(crate) fn register(&mut self, id: BlockId, hash: u64) {
        let block = &mut self.blocks[id as usize];
        if block.hash.is_some() {
            return;
        }
        if let std::collections::hash_map::Entry::Vacant(e) = self.cached.entry(hash) {
            e.insert(id);
            block.hash = Some(hash);
        }
    }
}

/// Chained hashes of a prompt's full blocks: block i's hash covers every token up to its end.
pub(crate) fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    let mut parent: u64 = 0xcbf2_9ce4_8422_2325;
    tokens
        .chunks_exact(block_size)
        .map(|chunk| {
            let mut h = parent;
            for t in chunk {
                for b in t.to_le_bytes() {
                    h ^= u64::from(b);
                    h = h.wrapping_mul(0x0100_0000_01b3);
                }
            }
            parent = h;
            h
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_and_release_keep_count() {
        let mut pool = BlockPool::new(4);
        let mut a = Vec::new();
        assert!(pool.allocate(3, &mut a));
        assert_eq!(pool.num_free(), 1);
        let mut b = Vec::new();
        assert!(!pool.allocate(2, &mut b), "must not over-allocate");
        assert!(b.is_empty(), "a failed allocation takes nothing");
        pool.release(&mut a);
        assert_eq!(pool.num_free(), 4);
        assert!(pool.allocate(4, &mut b));
        assert_eq!(pool.usage(), 1.0);
    }

    #[test]
    fn cached_blocks_are_reused_until_evicted() {
        let mut pool = BlockPool::new(3);
        let hashes = block_hashes(&(0..32).collect::<Vec<_>>(), 16);
        let mut a = Vec::new();
        assert!(pool.allocate(2, &mut a));
        pool.register(a[0], hashes[0]);
        pool.register(a[1], hashes[1]);
        pool.release(&mut a);
        let mut b = Vec::new();
        assert_eq!(pool.acquire_prefix(&hashes, &mut b), 2);
        assert_eq!(pool.num_free(), 1);
        pool.release(&mut b);
        // Three fresh allocations evict both cached blocks.
        let mut c = Vec::new();
        assert!(pool.allocate(3, &mut c));
        pool.release(&mut c);
        let mut d = Vec::new();
        assert_eq!(pool.acquire_prefix(&hashes, &mut d), 0);
    }

    #[test]
    fn hashes_depend_on_the_whole_prefix() {
        let a = block_hashes(&[1; 32], 16);
        let mut tokens = vec![1; 32];
        tokens[0] = 2;
        let b = block_hashes(&tokens, 16);
        assert_ne!(a[1], b[1], "same second block after a different first block");
        assert_eq!(block_hashes(&[1; 20], 16).len(), 1, "only full blocks are hashed");
    }

    #[test]
    fn churn_keeps_the_free_queue_bounded() {
        let mut pool = BlockPool::new(2);
        let hashes = block_hashes(&[7; 16], 16);
        let mut a = Vec::new();
        assert!(pool.allocate(1, &mut a));
        pool.register(a[0], hashes[0]);
        pool.release(&mut a);
        for _ in 0..1000 {
            let mut b = Vec::new();
            pool.acquire_prefix(&hashes, &mut b);
            pool.release(&mut b);
        }
        assert!(pool.free.len() <= 2 * 2 + 17);
        assert_eq!(pool.num_free(), 2);
    }
}
