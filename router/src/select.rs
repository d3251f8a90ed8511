//! Choosing decode and prefill workers by cost (lower is better).
//!
//! **Decode cost** (KV-affine, so multi-turn sessions keep landing where their cache is):
//!
//! ```text
//! decode_blocks_weight × (active_blocks + request_blocks − shared_active_blocks)
//!   + decode_prefill_weight × queued_prefill_tokens / block_size
//!   − overlap_weight × overlap_blocks
//! ```
//!
//! i.e. the worker's potential active KV blocks if it takes the request (its active blocks
//! plus the request's, less the leading ones it already has active for another request of
//! the same conversation), plus its queued prefill work in blocks, minus a credit for each
//! leading prompt block it already caches.
//!
//! **Prefill cost** (a prefill worker's own cache saves it work, its queue delays the request):
//!
//! ```text
//! prefill_queue_weight × queued_prefill_tokens / block_size
//!   − prefill_overlap_weight × overlap_blocks
//!   + prefill_blocks_weight × active_blocks
//! ```
//!
//! **Choice**: with `temperature == 0` a cheapest worker, ties broken uniformly at random by
//! the caller's seeded RNG (deterministic for a seed, and spreads equal workers instead of
//! always loading the first). With `temperature > 0`, worker `i` is sampled with probability
//! ∝ `exp(−(cost_i − min_cost) / temperature)` (softmax over negative costs), which spreads
//! load across near-equal workers at the price of some cache affinity.

use rand::Rng;

use crate::config::SelectionWeights;
use crate::load::WorkerLoad;

/// What decode cost needs to know about one candidate worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeInputs {
    /// The worker's KV block size in tokens (≥ 1).
    pub block_size: u32,
    /// Leading prompt blocks it caches.
    pub overlap_blocks: u32,
    /// Blocks the request occupies (full and partial) in this block size.
    pub request_blocks: u64,
    /// Leading request blocks already active on the worker (another request holds them).
    pub shared_active_blocks: u64,
    /// Its predicted load.
    pub load: WorkerLoad,
}

/// Cost of serving a request's decode on a worker (see the module docs).
pub fn decode_cost(c: &DecodeInputs, w: &SelectionWeights) -> f64 {
    let bs = f64::from(c.block_size.max(1));
    let new_blocks = c.request_blocks.saturating_sub(c.shared_active_blocks);
    w.decode_blocks_weight * (c.load.active_blocks as f64 + new_blocks as f64)
        + w.decode_prefill_weight * c.load.prefill_tokens as f64 / bs
        - w.overlap_weight * f64::from(c.overlap_blocks)
}

/// What prefill cost needs to know about one candidate prefill worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillInputs {
    /// The worker's KV block size in tokens (≥ 1).
    pub block_size: u32,
    /// Leading prompt blocks it caches.
    pub overlap_blocks: u32,
    /// Its predicted load.
    pub load: WorkerLoad,
}

/// Cost of running a request's prefill on a prefill worker (see the module docs).
pub fn prefill_cost(c: &PrefillInputs, w: &SelectionWeights) -> f64 {
    let bs = f64::from(c.block_size.max(1));
    w.prefill_queue_weight * c.load.prefill_tokens as f64 / bs
        - w.prefill_overlap_weight * f64::from(c.overlap_blocks)
        + w.prefill_blocks_weight * c.load.active_blocks as f64
}

/// Index of the chosen candidate given their costs (see the module docs); `None` when
/// `costs` is empty. NaN costs are never chosen unless every cost is NaN.
pub fn pick<R: Rng + ?Sized>(costs: &[f64], temperature: f64, rng: &mut R) -> Option<usize> {
    let min = costs
        .iter()
        .copied()
        .filter(|c| !c.is_nan())
        .fold(f64::INFINITY, f64::min);
    if costs.is_empty() {
        return None;
    }
    if !min.is_finite() {
        // All NaN or infinite: fall back to a uniform choice.
        return Some(rng.random_range(0..costs.len()));
    }
    if temperature > 0.0 && temperature.is_finite() {
        let weights: Vec<f64> = costs
            .iter()
            .map(|&c| {
                if c.is_nan() {
                    0.0
                } else {
                    (-(c - min) / temperature).exp()
                }
            })
            .collect();
        let total: f64 = weights.iter().sum();
        let mut x = rng.random::<f64>() * total;
        for (i, w) in weights.iter().enumerate() {
            if x < *w {
                return Some(i);
            }
            x -= w;
        }
        // Rounding left x just above the last weight: take the last positive one.
        return weights.iter().rposition(|w| *w > 0.0);
    }
    let tolerance = 1e-9 * min.abs().max(1.0);
    let ties: Vec<usize> = costs
        .iter()
        .enumerate()
        .filter(|(_, c)| (**c - min).abs() <= tolerance)
        .map(|(i, _)| i)
        .collect();
    Some(ties[rng.random_range(0..ties.len())])
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    fn load(active_blocks: u64, prefill_tokens: u64) -> WorkerLoad {
        WorkerLoad {
            active_blocks,
            prefill_tokens,
            ..WorkerLoad::default()
        }
    }

    #[test]
    fn decode_cost_credits_overlap_and_charges_load() {
        let w = SelectionWeights::default();
        let cold = DecodeInputs {
            block_size: 64,
            overlap_blocks: 0,
            request_blocks: 10,
            shared_active_blocks: 0,
            load: load(0, 0),
        };
        assert_eq!(decode_cost(&cold, &w), 10.0);
        let warm = DecodeInputs {
            overlap_blocks: 8,
            ..cold
        };
        assert_eq!(decode_cost(&warm, &w), 2.0);
        let busy = DecodeInputs {
            load: load(100, 640),
            ..warm
        };
        assert_eq!(decode_cost(&busy, &w), 100.0 + 10.0 + 10.0 - 8.0);
        let heavier_overlap = SelectionWeights {
            overlap_weight: 2.0,
            ..w
        };
        assert_eq!(decode_cost(&warm, &heavier_overlap), -6.0);
        // The previous turn of the conversation still holds 8 of the blocks active there:
        // they are not new load.
        let same_conversation = DecodeInputs {
            shared_active_blocks: 8,
            ..busy
        };
        assert_eq!(
            decode_cost(&same_conversation, &w),
            100.0 + 2.0 + 10.0 - 8.0
        );
    }

    #[test]
    fn prefill_cost_weighs_queue_against_own_cache() {
        let w = SelectionWeights::default();
        let c = PrefillInputs {
            block_size: 16,
            overlap_blocks: 3,
            load: load(5, 160),
        };
        assert_eq!(prefill_cost(&c, &w), 10.0 - 3.0 + 5.0);
    }

    #[test]
    fn cheapest_wins_and_ties_split_by_seed() {
        let mut rng = SmallRng::seed_from_u64(1);
        assert_eq!(pick(&[], 0.0, &mut rng), None);
        assert_eq!(pick(&[3.0, 1.0, 2.0], 0.0, &mut rng), Some(1));
        let mut seen = [0u32; 3];
        for _ in 0..300 {
            seen[pick(&[1.0, 1.0, 5.0], 0.0, &mut rng).unwrap()] += 1;
        }
        assert_eq!(seen[2], 0);
        assert!(
            seen[0] > 100 && seen[1] > 100,
            "ties split at random: {seen:?}"
        );
        // Same seed, same choices.
        let a: Vec<_> = {
            let mut r = SmallRng::seed_from_u64(9);
            (0..20).map(|_| pick(&[0.0; 4], 0.0, &mut r)).collect()
        };
        let b: Vec<_> = {
            let mut r = SmallRng::seed_from_u64(9);
            (0..20).map(|_| pick(&[0.0; 4], 0.0, &mut r)).collect()
        };
        assert_eq!(a, b);
    }

    #[test]
    fn temperature_samples_cheaper_workers_more_often() {
        let mut rng = SmallRng::seed_from_u64(2);
        let mut seen = [0u32; 2];
        for _ in 0..2000 {
            seen[pick(&[0.0, 1.0], 1.0, &mut rng).unwrap()] += 1;
        }
        // P(0) = 1 / (1 + e^-1) ≈ 0.73.
        let p0 = f64::from(seen[0]) / 2000.0;
        assert!((0.68..0.78).contains(&p0), "p0 = {p0}");
        // Costs far apart: essentially always the cheapest; NaN is never picked.
        for _ in 0..100 {
            assert_eq!(pick(&[f64::NAN, 0.0, 1e6], 1.0, &mut rng), Some(1));
            assert_eq!(pick(&[f64::NAN, 0.0], 0.0, &mut rng), Some(1));
        }
    }

    proptest::proptest! {
        #[test]
        fn zero_temperature_always_returns_a_minimum(
            costs in proptest::collection::vec(-1e6f64..1e6, 1..20), seed in 0u64..1000
        ) {
            let mut rng = SmallRng::seed_from_u64(seed);
            let i = pick(&costs, 0.0, &mut rng).unwrap();
            let min = costs.iter().copied().fold(f64::INFINITY, f64::min);
            proptest::prop_assert_eq!(costs[i], min);
        }

        #[test]
        fn any_temperature_returns_a_valid_index(
            costs in proptest::collection::vec(-1e9f64..1e9, 1..20), t in 0.0f64..1e6, seed in 0u64..1000
        ) {
            let mut rng = SmallRng::seed_from_u64(seed);
            let i = pick(&costs, t, &mut rng).unwrap();
            proptest::prop_assert!(i < costs.len());
        }
    }
}
