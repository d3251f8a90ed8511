//! How much of a workload's prompts an unlimited prefix cache could reuse.
//!
//! This is a property of the workload alone (no eviction, one cache for everything), the
//! number to compare with the trace's own statistics (about 37 % for the Mooncake
//! conversation trace at 512-token blocks) and the agentic generator's > 95 % promise. A token
//! counts only inside a full cache block whose every earlier block is reused too, as in a real
//! KV cache.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use super::prompts::{splitmix64, PromptSpec};
use super::Workload;

/// Reuse of a workload under an unlimited prefix cache.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct ReuseStats {
    /// Prompt content tokens of all requests.
    pub input_tokens: u64,
    /// Tokens in full cache blocks an earlier request already computed.
    pub reusable_tokens: u64,
    /// `reusable_tokens / input_tokens` (0 for an empty workload).
    pub share: f64,
}

/// Longest-common-prefix index over segment lists.
#[derive(Default)]
struct PrefixIndex {
    /// Prefix keys (hash of the segments so far) seen as a whole.
    prefixes: HashSet<u64>,
    /// (prefix key, next block id) -> longest segment of that block seen after that prefix.
    next_tokens: HashMap<(u64, u64), u32>,
}

impl PrefixIndex {
    const ROOT: u64 = 0x5EED;

    fn key(prefix: u64, block: u64, tokens: u32) -> u64 {
        splitmix64(prefix ^ splitmix64(block ^ (u64::from(tokens) << 40)))
    }

    /// Tokens of `prompt` matching some earlier prompt from the start.
    fn longest_match(&self, prompt: &PromptSpec) -> u64 {
        let mut key = Self::ROOT;
        let mut matched = 0u64;
        for s in &prompt.segments {
            let Some(&seen) = self.next_tokens.get(&(key, s.block)) else {
                break;
            };
            matched += u64::from(seen.min(s.tokens));
            let next = Self::key(key, s.block, s.tokens);
            if seen < s.tokens || !self.prefixes.contains(&next) {
                break;
            }
            key = next;
        }
        matched
    }

    fn insert(&mut self, prompt: &PromptSpec) {
        let mut key = Self::ROOT;
        for s in &prompt.segments {
            let longest = self.next_tokens.entry((key, s.block)).or_insert(0);
            *longest = (*longest).max(s.tokens);
            key = Self::key(key, s.block, s.tokens);
            self.prefixes.insert(key);
        }
    }
}

/// Reuse of `workload` in arrival order, counting full blocks of `block_tokens` tokens.
pub fn prefix_reuse(workload: &Workload, block_tokens: u32) -> ReuseStats {
    let block = u64::from(block_tokens.max(1));
    let mut index = PrefixIndex::default();
    let (mut input_tokens, mut reusable_tokens) = (0u64, 0u64);
    for r in &workload.requests {
        let matched = index.longest_match(&r.prompt);
        reusable_tokens += matched / block * block;
        input_tokens += r.prompt.tokens();
        index.insert(&r.prompt);
    }
    ReuseStats {
        input_tokens,
        reusable_tokens,
        share: if input_tokens == 0 {
            0.0
        } else {
            reusable_tokens as f64 / input_tokens as f64
        },
    }
}

/// Per request, the tokens of its prompt that an earlier request of the workload shares
/// (longest common prefix, not rounded to blocks).
pub fn shared_prefix_tokens(workload: &Workload) -> Vec<u64> {
    let mut index = PrefixIndex::default();
    workload
        .requests
        .iter()
        .map(|r| {
            let m = index.longest_match(&r.prompt);
            index.insert(&r.prompt);
            m
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompts::Segment;
    use crate::PlannedRequest;

    fn workload(prompts: &[&[(u64, u32)]]) -> Workload {
        let requests = prompts
            .iter()
            .enumerate()
            .map(|(id, segs)| PlannedRequest {
                id,
                arrival_ms: id as u64,
                session: 0,
                turn: 0,
                agent: 0,
                after: vec![],
                think_ms: 0,
                prompt: PromptSpec {
                    segments: segs
                        .iter()
                        .map(|&(block, tokens)| Segment { block, tokens })
                        .collect(),
                },
                osl: 1,
            })
            .collect();
        Workload {
            name: "t".into(),
            content_seed: 0,
            requests,
        }
    }

    #[test]
    fn counts_only_whole_shared_prefix_blocks() {
        let w = workload(&[
            &[(1, 10), (2, 10)],
            &[(1, 10), (2, 10), (3, 10)], // 20 shared
            &[(1, 10), (4, 10)],          // 10 shared
            &[(5, 10), (2, 10)],          // block 2 without its prefix: nothing
            &[(1, 10), (2, 6), (9, 4)],   // partial block 2: 16 shared
        ]);
        assert_eq!(shared_prefix_tokens(&w), vec![0, 20, 10, 0, 16]);
        let r = prefix_reuse(&w, 4);
        assert_eq!(r.input_tokens, 20 + 30 + 20 + 20 + 20);
        assert_eq!(r.reusable_tokens, 20 + 8 + 16);
    }

    #[test]
    fn a_longer_earlier_block_shares_its_start() {
        let w = workload(&[&[(1, 512)], &[(1, 100), (7, 3)]]);
        assert_eq!(shared_prefix_tokens(&w), vec![0, 100]);
    }
}
