//! Switchyard's KV index (`switchyard-kv-index`) against Dynamo's single-threaded radix tree
//! (`dynamo_kv_router::radix_tree::RadixTree`, crate `dynamo-kv-router` 1.6.1), in one
//! process, on the same generated workload, interleaved (A, B, A, B, ...), every query's
//! answer checked equal on both sides. See `docs/kv-index-vs-dynamo.md` for what each number
//! includes.
//!
//! Run: `cargo run --release` in this folder (about a minute once built), or `cargo run
//! --release -- --quick` (about 15 s: fewer repetitions, same scale).

use std::collections::BTreeMap;
use std::hint::black_box;

use dynamo_kv_router::protocols::{
    compute_block_hash_for_seq, compute_seq_hash_for_block, BlockHashOptions,
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, LocalBlockHash, RouterEvent,
};
use dynamo_kv_router::radix_tree::RadixTree;
use switchyard_kv_index::{KvIndex, OverlapScores, WorkerSlot};
use switchyard_protocol::hash::{
    chain_hash, local_block_hash, sequence_hashes, BlockSize, HashSeed, LocalBlockHash as SyLocal,
    SequenceHash,
};
use switchyard_protocol::kv::{EngineBlockId, StoredBlock};

const WORKERS: u16 = 128;
/// Tokens per KV block (vLLM's default).
const BLOCK_TOKENS: usize = 16;
/// Distinct system prompts; each worker holds `SYSTEMS_PER_WORKER` of them, so each one is
/// held by `WORKERS * SYSTEMS_PER_WORKER / SYSTEMS` workers.
const SYSTEMS: usize = 16;
const SYSTEMS_PER_WORKER: usize = 4;
const SYSTEM_BLOCKS: usize = 64;
/// A conversation's turns (blocks each), extending its prefix: system prompt + 448 blocks
/// makes a 512-block prompt.
const TURNS: [usize; 3] = [192, 128, 128];
const CONV_BLOCKS: usize = 448;
const CONVS_PER_WORKER: usize = 66;
/// Every `DUP_EVERY`-th conversation is also stored, whole, on a second worker (a migrated
/// conversation), so some private prefixes have two holders.
const DUP_EVERY: usize = 16;
/// Blocks per `Stored` event at most, as an engine batches a prefill.
const EVENT_BLOCKS: usize = 64;
/// Blocks of a query prompt.
const PROMPT_BLOCKS: usize = 512;
/// Prompts in the rotating query pool (different conversations: every query is cold).
const QUERY_POOL: usize = 2048;
/// Token prompts in the route-path pool.
const ROUTE_POOL: usize = 512;
/// Blocks stored and removed per churn round.
const CHURN_BLOCKS: usize = 64;

/// Deterministic pseudo-random numbers (SplitMix64).
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Token ids of block number `n` (every block number has its own content).
fn block_tokens(n: u64, out: &mut Vec<u32>) {
    for j in 0..BLOCK_TOKENS as u64 {
        out.push((mix(n * BLOCK_TOKENS as u64 + j) % 151_000) as u32);
    }
}

fn seed() -> HashSeed {
    HashSeed::default()
}

/// One block: its number (content), local hash and sequence hash.
#[derive(Clone, Copy)]
struct Block {
    no: u64,
    local: u64,
    seq: u64,
}

/// Blocks numbered `first..first + len`, chained after `parent`.
fn chain(first: u64, len: usize, parent: Option<u64>) -> Vec<Block> {
    let mut tokens = Vec::with_capacity(BLOCK_TOKENS);
    let mut prev = parent.map(SequenceHash);
    (first..first + len as u64)
        .map(|no| {
            tokens.clear();
            block_tokens(no, &mut tokens);
            let local = local_block_hash(&tokens, seed());
            let seq = chain_hash(prev, local, seed());
            prev = Some(seq);
            Block {
                no,
                local: local.0,
                seq: seq.0,
            }
        })
        .collect()
}

/// A `Stored` event in neutral form: both sides' events are made from it.
struct StoreEv {
    worker: u16,
    /// Sequence hash of the parent block.
    parent: Option<u64>,
    /// The parent's engine id on this worker (Switchyard's index finds the parent's record
    /// by it; Dynamo's events name blocks by sequence hash, so its parent is `parent`).
    parent_id: Option<u64>,
    /// (block, engine id on this worker)
    blocks: Vec<(Block, u64)>,
}

/// A `Removed` event: engine ids for Switchyard, sequence hashes for Dynamo.
struct RemoveEv {
    worker: u16,
    blocks: Vec<(u64, u64)>, // (engine id, sequence hash)
}

struct Conv {
    worker: u16,
    dup: Option<u16>,
    system: usize,
    blocks: Vec<Block>,
    /// Engine ids on `worker`, per block.
    engine: Vec<u64>,
}

struct Workload {
    systems: Vec<Vec<Block>>,
    convs: Vec<Conv>,
    ingest: Vec<StoreEv>,
    /// Distinct (worker, block) pairs after ingest.
    pairs: usize,
    /// Next engine id per worker.
    next_engine: Vec<u64>,
    /// Next unused block number.
    next_no: u64,
}

fn systems_of(w: u16) -> impl Iterator<Item = usize> {
    let base = (usize::from(w) % (SYSTEMS / SYSTEMS_PER_WORKER)) * SYSTEMS_PER_WORKER;
    base..base + SYSTEMS_PER_WORKER
}

/// Engine id on worker `w` of the last block of system prompt `system`: each worker stores
/// its system prompts first, in `systems_of` order, from engine id 0.
fn system_last_id(w: u16, system: usize) -> Option<u64> {
    let k = systems_of(w).position(|s| s == system)?;
    Some(((k + 1) * SYSTEM_BLOCKS - 1) as u64)
}

fn workload() -> Workload {
    let mut next_no = 0u64;
    let systems: Vec<Vec<Block>> = (0..SYSTEMS)
        .map(|_| {
            let c = chain(next_no, SYSTEM_BLOCKS, None);
            next_no += SYSTEM_BLOCKS as u64;
            c
        })
        .collect();
    let mut next_engine = vec![0u64; usize::from(WORKERS)];
    let mut ingest = Vec::new();
    let mut pairs = 0;
    let take_ids = |w: u16, n: usize, next_engine: &mut Vec<u64>| {
        let e = &mut next_engine[usize::from(w)];
        let ids: Vec<u64> = (*e..*e + n as u64).collect();
        *e += n as u64;
        ids
    };
    for w in 0..WORKERS {
        for s in systems_of(w) {
            let ids = take_ids(w, SYSTEM_BLOCKS, &mut next_engine);
            pairs += SYSTEM_BLOCKS;
            ingest.push(StoreEv {
                worker: w,
                parent: None,
                parent_id: None,
                blocks: systems[s].iter().copied().zip(ids).collect(),
            });
        }
    }
    let mut convs = Vec::new();
    for c in 0..CONVS_PER_WORKER {
        for w in 0..WORKERS {
            let system = systems_of(w).nth(c % SYSTEMS_PER_WORKER).unwrap_or(0);
            let parent = systems[system].last().map(|b| b.seq);
            let blocks = chain(next_no, CONV_BLOCKS, parent);
            next_no += CONV_BLOCKS as u64;
            let dup = (c % DUP_EVERY == 0).then_some((w + 4) % WORKERS);
            convs.push(Conv {
                worker: w,
                dup,
                system,
                blocks,
                engine: Vec::new(),
            });
        }
    }
    // Turns interleaved across conversations: turn t of every conversation, then turn t + 1.
    let mut start = 0;
    for turn in TURNS {
        for conv in &mut convs {
            let part = &conv.blocks[start..start + turn];
            let (mut parent, mut parent_id) = if start == 0 {
                (
                    conv.system_last(&systems),
                    system_last_id(conv.worker, conv.system),
                )
            } else {
                (Some(conv.blocks[start - 1].seq), Some(conv.engine[start - 1]))
            };
            for chunk in part.chunks(EVENT_BLOCKS) {
                let ids = take_ids(conv.worker, chunk.len(), &mut next_engine);
                conv.engine.extend_from_slice(&ids);
                pairs += chunk.len();
                let last_id = ids.last().copied();
                ingest.push(StoreEv {
                    worker: conv.worker,
                    parent,
                    parent_id,
                    blocks: chunk.iter().copied().zip(ids).collect(),
                });
                parent = chunk.last().map(|b| b.seq);
                parent_id = last_id;
            }
        }
        start += turn;
    }
    // Migrated conversations, whole, on their second worker.
    for conv in &convs {
        let Some(d) = conv.dup else { continue };
        let mut parent = conv.system_last(&systems);
        let mut parent_id = system_last_id(d, conv.system);
        for chunk in conv.blocks.chunks(EVENT_BLOCKS) {
            let ids = take_ids(d, chunk.len(), &mut next_engine);
            pairs += chunk.len();
            let last_id = ids.last().copied();
            ingest.push(StoreEv {
                worker: d,
                parent,
                parent_id,
                blocks: chunk.iter().copied().zip(ids).collect(),
            });
            parent = chunk.last().map(|b| b.seq);
            parent_id = last_id;
        }
    }
    Workload {
        systems,
        convs,
        ingest,
        pairs,
        next_engine,
        next_no,
    }
}

impl Conv {
    fn system_last(&self, systems: &[Vec<Block>]) -> Option<u64> {
        systems[self.system].last().map(|b| b.seq)
    }

    /// The conversation's whole prompt: system prompt then its blocks.
    fn prompt<'a>(&'a self, systems: &'a [Vec<Block>]) -> impl Iterator<Item = &'a Block> {
        systems[self.system].iter().chain(&self.blocks)
    }
}

// ---------------------------------------------------------------------------------------
// The two sides.

/// A `Stored` event as the router hands it to the index: worker, parent, the parent's
/// engine id, blocks.
type SyStore = (
    WorkerSlot,
    Option<SequenceHash>,
    Option<EngineBlockId>,
    Vec<StoredBlock>,
);

fn sy_events(w: &Workload) -> Vec<SyStore> {
    w.ingest.iter().map(sy_store).collect()
}

fn sy_store(e: &StoreEv) -> SyStore {
    let blocks = e
        .blocks
        .iter()
        .map(|(b, id)| StoredBlock {
            seq_hash: SequenceHash(b.seq),
            block_id: EngineBlockId(*id),
        })
        .collect();
    (
        WorkerSlot(e.worker),
        e.parent.map(SequenceHash),
        e.parent_id.map(EngineBlockId),
        blocks,
    )
}

fn sy_new(w: &Workload) -> KvIndex {
    // As the router does when workers register: the hash table sized for the cluster's KV
    // capacity, each worker's engine-id table for its own.
    let mut index = KvIndex::new();
    index.reserve_total(w.pairs);
    let per_worker = w.pairs / usize::from(WORKERS);
    for s in 0..WORKERS {
        index.add_worker_with_capacity(WorkerSlot(s), per_worker + per_worker / 8);
    }
    index
}

fn dy_event(id: u64, worker: u16, data: KvCacheEventData) -> RouterEvent {
    RouterEvent::new(
        u64::from(worker),
        KvCacheEvent {
            event_id: id,
            data,
            dp_rank: 0,
        },
    )
}

fn dy_store(id: u64, e: &StoreEv) -> RouterEvent {
    let blocks = e
        .blocks
        .iter()
        .map(|(b, _)| KvCacheStoredBlockData {
            block_hash: ExternalSequenceBlockHash(b.seq),
            tokens_hash: LocalBlockHash(b.local),
            mm_extra_info: None,
        })
        .collect();
    dy_event(
        id,
        e.worker,
        KvCacheEventData::Stored(KvCacheStoreData {
            parent_hash: e.parent.map(ExternalSequenceBlockHash),
            start_position: None,
            blocks,
        }),
    )
}

fn dy_remove(id: u64, e: &RemoveEv) -> RouterEvent {
    dy_event(
        id,
        e.worker,
        KvCacheEventData::Removed(KvCacheRemoveData {
            block_hashes: e
                .blocks
                .iter()
                .map(|&(_, h)| ExternalSequenceBlockHash(h))
                .collect(),
        }),
    )
}

fn dy_apply(tree: &mut RadixTree, ev: RouterEvent) {
    if let Err(e) = tree.apply_event(ev) {
        panic!("Dynamo's radix tree rejected an event: {e}");
    }
}

fn sy_remove(index: &mut KvIndex, e: &RemoveEv) {
    let ids: Vec<EngineBlockId> = e.blocks.iter().map(|&(id, _)| EngineBlockId(id)).collect();
    let c = index.remove(WorkerSlot(e.worker), &ids);
    assert_eq!(c.unknown_removals, 0, "Switchyard: unknown removal");
}

fn sy_answer(index: &KvIndex, seqs: &[SequenceHash]) -> BTreeMap<u64, u32> {
    let mut out = OverlapScores::default();
    index.find_matches(seqs, &mut out);
    out.matches
        .iter()
        .map(|(s, n)| (u64::from(s.0), *n))
        .collect()
}

fn dy_answer(tree: &RadixTree, locals: &[LocalBlockHash]) -> BTreeMap<u64, u32> {
    let scores = tree.find_matches(locals.to_vec(), false);
    scores
        .scores
        .iter()
        .map(|(w, n)| {
            assert_eq!(w.dp_rank, 0);
            (w.worker_id, *n)
        })
        .collect()
}

/// A query prompt on both sides' terms.
struct Query {
    seqs: Vec<SequenceHash>,
    locals: Vec<LocalBlockHash>,
}

impl Query {
    fn of(blocks: &[Block]) -> Self {
        Query {
            seqs: blocks.iter().map(|b| SequenceHash(b.seq)).collect(),
            locals: blocks.iter().map(|b| LocalBlockHash(b.local)).collect(),
        }
    }
}

/// Fails loudly unless both sides give the same answer for every query.
fn check(what: &str, index: &KvIndex, tree: &RadixTree, queries: &[Query]) {
    for (i, q) in queries.iter().enumerate() {
        let a = sy_answer(index, &q.seqs);
        let b = dy_answer(tree, &q.locals);
        if a != b {
            eprintln!("MISMATCH in {what}, query {i}:\n  switchyard {a:?}\n  dynamo     {b:?}");
            std::process::exit(2);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Measuring.

/// CPU time this thread has used, in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`): the machine
/// is shared, and time spent descheduled is not the code's. (`/proc/thread-self/schedstat`
/// would do too, but it only advances at scheduler ticks while the thread runs.)
fn cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Resident memory of this process in bytes (`/proc/self/statm`, second field, pages).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm's resident field");
    pages * 4096
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One row of the result table: medians of both sides' repetitions.
struct Row {
    name: &'static str,
    unit: &'static str,
    sy: Vec<f64>,
    dy: Vec<f64>,
    /// Whether bigger is better (a rate) or smaller (a time, bytes).
    higher_better: bool,
    /// Ratio shown as Switchyard/Dynamo (memory) rather than the speedup.
    ratio_sy_over_dy: bool,
}

impl Row {
    fn new(name: &'static str, unit: &'static str, higher_better: bool) -> Self {
        Row {
            name,
            unit,
            sy: Vec::new(),
            dy: Vec::new(),
            higher_better,
            ratio_sy_over_dy: false,
        }
    }

    /// The ratio of two values as the table shows it (see [`print_table`]).
    fn ratio_of(&self, s: f64, d: f64) -> f64 {
        if self.ratio_sy_over_dy || self.higher_better {
            s / d
        } else {
            d / s
        }
    }

    /// Ratio of the two medians.
    fn ratio(&self) -> f64 {
        self.ratio_of(median(self.sy.clone()), median(self.dy.clone()))
    }

    /// Median of the ratios of each repetition's pair (A then B, measured back to back):
    /// less sensitive to the machine's load changing between repetitions.
    fn paired_ratio(&self) -> f64 {
        let pairs = self.sy.iter().zip(&self.dy);
        median(pairs.map(|(&s, &d)| self.ratio_of(s, d)).collect())
    }
}

fn print_table(rows: &[Row]) {
    println!();
    println!(
        "| measurement | unit | Switchyard | Dynamo RadixTree | ratio | ratio, median of pairs |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    for r in rows {
        let ratio_note = if r.ratio_sy_over_dy { " (Sy/Dy)" } else { "" };
        println!(
            "| {} | {} | {} | {} | {:.2}{} | {:.2} |",
            r.name,
            r.unit,
            fmt(median(r.sy.clone())),
            fmt(median(r.dy.clone())),
            r.ratio(),
            ratio_note,
            r.paired_ratio()
        );
    }
    println!();
    println!(
        "ratio: Dynamo time / Switchyard time (> 1: Switchyard faster), of the medians and the \
         median of each repetition's pair; memory: Switchyard / Dynamo."
    );
}

fn fmt(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else if x >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

struct Plan {
    ingest_reps: usize,
    reps: usize,
    queries: usize,
    churn_rounds: usize,
    removal_tails: usize,
    memory_reps: usize,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--memory-child") {
        memory_child(args.get(i + 1).map(String::as_str).unwrap_or(""));
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let plan = if quick {
        Plan {
            ingest_reps: 3,
            reps: 5,
            queries: 1000,
            churn_rounds: 256,
            removal_tails: 128,
            memory_reps: 1,
        }
    } else {
        Plan {
            ingest_reps: 9,
            reps: 15,
            queries: 2048,
            churn_rounds: 512,
            removal_tails: 200,
            memory_reps: 3,
        }
    };
    run(&plan);
}

fn run(plan: &Plan) {
    // The whole run's wall time, for the log only; every measurement uses the thread's CPU
    // clock (`cpu_ns`).
    #[allow(clippy::disallowed_methods)]
    let wall = std::time::Instant::now();
    let w = workload();
    println!(
        "workload: {} workers, {} (worker, block) pairs, {} Stored events, {} conversations \
         of {} blocks after {}-block system prompts ({} shared by {} workers each), every \
         {}th also on a second worker; block = {} tokens",
        WORKERS,
        w.pairs,
        w.ingest.len(),
        w.convs.len(),
        CONV_BLOCKS,
        SYSTEM_BLOCKS,
        SYSTEMS,
        usize::from(WORKERS) * SYSTEMS_PER_WORKER / SYSTEMS,
        DUP_EVERY,
        BLOCK_TOKENS
    );
    check_hash_schemes(&w);

    let mut rows = Vec::new();

    // ---- Ingest: fresh indexes each repetition, A then B.
    let sy_evs = sy_events(&w);
    let mut ingest = Row::new("ingest, 4 M pairs (Stored events)", "M blocks/s", true);
    let mut sy_index = None;
    let mut dy_tree = None;
    let mut event_id = 0u64;
    for rep in 0..plan.ingest_reps {
        drop(sy_index.take());
        let t = cpu_ns();
        let mut index = sy_new(&w);
        let setup_ms = (cpu_ns() - t) as f64 / 1e6;
        let t = cpu_ns();
        for (slot, parent, parent_id, blocks) in &sy_evs {
            index.store_after(*slot, *parent, *parent_id, blocks);
        }
        let ns = cpu_ns() - t;
        assert_eq!(
            index.stats().pairs as usize,
            w.pairs,
            "Switchyard pair count"
        );
        // Every event named its parent's engine id: the table holds heads only.
        let stats = index.stats();
        assert!(!stats.every_hash, "Switchyard's index fell back to every hash");
        if rep == 0 {
            println!(
                "switchyard's hash table: {} heads for {} distinct blocks",
                stats.table_hashes, stats.distinct_hashes
            );
        }
        ingest.sy.push(w.pairs as f64 / ns as f64 * 1e3);
        sy_index = Some(index);

        drop(dy_tree.take());
        let evs: Vec<RouterEvent> = w
            .ingest
            .iter()
            .map(|e| {
                event_id += 1;
                dy_store(event_id, e)
            })
            .collect();
        let mut tree = RadixTree::new();
        let t = cpu_ns();
        for ev in evs {
            dy_apply(&mut tree, ev);
        }
        let ns = cpu_ns() - t;
        ingest.dy.push(w.pairs as f64 / ns as f64 * 1e3);
        dy_tree = Some(tree);
        println!(
            "ingest rep {rep}: switchyard {:.2}, dynamo {:.2} M blocks/s (switchyard's setup, \
             not counted: reserve_total + add_worker_with_capacity, {setup_ms:.0} ms CPU)",
            ingest.sy[rep], ingest.dy[rep]
        );
    }
    rows.push(ingest);
    let mut index = sy_index.expect("at least one ingest repetition");
    let mut tree = dy_tree.expect("at least one ingest repetition");

    // ---- Queries.
    let order: Vec<usize> = {
        let mut o: Vec<usize> = (0..w.convs.len()).collect();
        for i in (1..o.len()).rev() {
            let j = (mix(i as u64 ^ 0x5eed) % (i as u64 + 1)) as usize;
            o.swap(i, j);
        }
        o
    };
    let mut next_no = w.next_no;
    let pool: Vec<usize> = order.iter().copied().take(QUERY_POOL).collect();
    let full: Vec<Query> = pool
        .iter()
        .map(|&c| {
            let blocks: Vec<Block> = w.convs[c].prompt(&w.systems).copied().collect();
            Query::of(&blocks)
        })
        .collect();
    let half = PROMPT_BLOCKS / 2;
    let prefix: Vec<Query> = pool
        .iter()
        .map(|&c| {
            let mut blocks: Vec<Block> =
                w.convs[c].prompt(&w.systems).take(half).copied().collect();
            let parent = blocks.last().map(|b| b.seq);
            blocks.extend(chain(next_no, PROMPT_BLOCKS - half, parent));
            next_no += (PROMPT_BLOCKS - half) as u64;
            Query::of(&blocks)
        })
        .collect();
    // Every miss prompt has its own unknown first block (so that each query probes a cold
    // place); the blocks after it are a stored conversation's, which neither side reaches.
    let miss: Vec<Query> = pool
        .iter()
        .map(|&c| {
            let mut blocks = chain(next_no, 1, None);
            next_no += 1;
            blocks.extend(w.convs[c].prompt(&w.systems).skip(1).copied());
            Query::of(&blocks)
        })
        .collect();
    check("full hit", &index, &tree, &full);
    check("prefix hit", &index, &tree, &prefix);
    check("miss", &index, &tree, &miss);
    println!(
        "answers agree on {} queries",
        full.len() + prefix.len() + miss.len()
    );

    rows.push(query_row(
        "512-block query, full hit, cold",
        &index,
        &tree,
        &full,
        plan,
    ));
    rows.push(query_row(
        "512-block query, half hit, cold",
        &index,
        &tree,
        &prefix,
        plan,
    ));
    rows.push(query_row(
        "512-block query, miss (first block unknown)",
        &index,
        &tree,
        &miss,
        plan,
    ));

    // ---- Route path: token ids in, overlap scores out.
    let route_tokens: Vec<(Vec<u32>, usize)> = pool
        .iter()
        .take(ROUTE_POOL)
        .enumerate()
        .map(|(i, &c)| {
            let mut tokens = Vec::with_capacity(PROMPT_BLOCKS * BLOCK_TOKENS);
            for b in w.convs[c].prompt(&w.systems) {
                block_tokens(b.no, &mut tokens);
            }
            (tokens, i)
        })
        .collect();
    let bs = BlockSize::try_new(BLOCK_TOKENS as u32).expect("block size");
    {
        // The route path's inputs give the same answers as the precomputed hashes.
        for (tokens, i) in &route_tokens {
            let seqs = sequence_hashes(tokens, bs, seed());
            assert_eq!(seqs, full[*i].seqs, "Switchyard's hashes from tokens");
            let locals =
                compute_block_hash_for_seq(tokens, BLOCK_TOKENS as u32, Default::default());
            assert_eq!(locals, full[*i].locals, "Dynamo's hashes from tokens");
            let (a, b) = (sy_answer(&index, &seqs), dy_answer(&tree, &locals));
            assert_eq!(a, b, "route path answers");
            let chained = compute_seq_hash_for_block(&locals);
            assert!(
                chained.iter().zip(&seqs).all(|(d, s)| *d == s.0) && chained.len() == seqs.len(),
                "Dynamo's tracking hashes"
            );
        }
    }
    let mut route = Row::new(
        "route path: tokens -> hashes -> 512-block full hit",
        "us",
        false,
    );
    let mut hashing = Row::new("  of which hashing 8192 tokens alone", "us", false);
    // Dynamo's router also chains the local hashes into sequence hashes on each request when
    // it tracks active blocks (`router_track_active_blocks`, on by default: its
    // `compute_seq_hashes_for_tracking`), as Switchyard's does for its load tracker. This row
    // times that variant of Dynamo's side against the same Switchyard repetitions.
    let mut route_tracking = Row::new(
        "  route path, Dynamo chaining too (its active-block tracking)",
        "us",
        false,
    );
    let mut out = OverlapScores::default();
    let n = plan.queries.min(route_tokens.len() * 4);
    for rep in 0..plan.reps {
        let set: Vec<&(Vec<u32>, usize)> = (0..n)
            .map(|k| &route_tokens[(rep * 131 + k) % route_tokens.len()])
            .collect();
        let t = cpu_ns();
        for (tokens, _) in &set {
            let seqs = sequence_hashes(tokens, bs, seed());
            index.find_matches(&seqs, &mut out);
            black_box(&out);
        }
        route.sy.push((cpu_ns() - t) as f64 / n as f64 / 1e3);
        let t = cpu_ns();
        for (tokens, _) in &set {
            let locals = compute_block_hash_for_seq(
                tokens,
                BLOCK_TOKENS as u32,
                BlockHashOptions::default(),
            );
            black_box(tree.find_matches(locals, false));
        }
        route.dy.push((cpu_ns() - t) as f64 / n as f64 / 1e3);
        let t = cpu_ns();
        for (tokens, _) in &set {
            let locals = compute_block_hash_for_seq(
                tokens,
                BLOCK_TOKENS as u32,
                BlockHashOptions::default(),
            );
            // Chained first, so that the local hashes move into the query without a copy.
            let chained = compute_seq_hash_for_block(&locals);
            black_box(tree.find_matches(locals, false));
            black_box(chained);
        }
        route_tracking
            .dy
            .push((cpu_ns() - t) as f64 / n as f64 / 1e3);
        route_tracking.sy.push(route.sy[rep]);
        let t = cpu_ns();
        for (tokens, _) in &set {
            black_box(sequence_hashes(tokens, bs, seed()));
        }
        hashing.sy.push((cpu_ns() - t) as f64 / n as f64 / 1e3);
        let t = cpu_ns();
        for (tokens, _) in &set {
            black_box(compute_block_hash_for_seq(
                tokens,
                BLOCK_TOKENS as u32,
                BlockHashOptions::default(),
            ));
        }
        hashing.dy.push((cpu_ns() - t) as f64 / n as f64 / 1e3);
    }
    rows.push(route);
    rows.push(hashing);
    rows.push(route_tracking);

    // ---- Churn: steady state, each round a worker stores a new 64-block conversation start
    // and drops the one it stored WORKERS rounds earlier (tail first, as LRU eviction does).
    let warm = usize::from(WORKERS);
    let total_rounds = warm + plan.churn_rounds * plan.reps;
    let mut next_engine = w.next_engine.clone();
    let mut churn_stores = Vec::with_capacity(total_rounds);
    for r in 0..total_rounds {
        let wk = (r % usize::from(WORKERS)) as u16;
        let system = systems_of(wk).next().unwrap_or(0);
        let parent = w.systems[system].last().map(|b| b.seq);
        let blocks = chain(next_no, CHURN_BLOCKS, parent);
        next_no += CHURN_BLOCKS as u64;
        let e = &mut next_engine[usize::from(wk)];
        let ids = *e..*e + CHURN_BLOCKS as u64;
        *e += CHURN_BLOCKS as u64;
        churn_stores.push(StoreEv {
            worker: wk,
            parent,
            parent_id: system_last_id(wk, system),
            blocks: blocks.into_iter().zip(ids).collect(),
        });
    }
    let churn_remove = |r: usize| -> RemoveEv {
        let s = &churn_stores[r - warm];
        RemoveEv {
            worker: s.worker,
            blocks: s.blocks.iter().rev().map(|(b, id)| (*id, b.seq)).collect(),
        }
    };
    for s in &churn_stores[..warm] {
        let (slot, parent, parent_id, blocks) = sy_store(s);
        index.store_after(slot, parent, parent_id, &blocks);
        event_id += 1;
        dy_apply(&mut tree, dy_store(event_id, s));
    }
    let mut churn = Row::new(
        "churn: store 64 + remove 64 blocks, steady state",
        "M blocks/s",
        true,
    );
    for rep in 0..plan.reps {
        let rounds = warm + rep * plan.churn_rounds..warm + (rep + 1) * plan.churn_rounds;
        let sy_in: Vec<(SyStore, RemoveEv)> = rounds
            .clone()
            .map(|r| (sy_store(&churn_stores[r]), churn_remove(r)))
            .collect();
        let t = cpu_ns();
        for ((slot, parent, parent_id, blocks), rm) in &sy_in {
            index.store_after(*slot, *parent, *parent_id, blocks);
            sy_remove(&mut index, rm);
        }
        let blocks = (plan.churn_rounds * CHURN_BLOCKS * 2) as f64;
        churn.sy.push(blocks / (cpu_ns() - t) as f64 * 1e3);
        let dy_in: Vec<(RouterEvent, RouterEvent)> = rounds
            .map(|r| {
                event_id += 2;
                (
                    dy_store(event_id - 1, &churn_stores[r]),
                    dy_remove(event_id, &churn_remove(r)),
                )
            })
            .collect();
        let t = cpu_ns();
        for (store, rm) in dy_in {
            dy_apply(&mut tree, store);
            dy_apply(&mut tree, rm);
        }
        churn.dy.push(blocks / (cpu_ns() - t) as f64 * 1e3);
    }
    rows.push(churn);
    check("full hit after churn", &index, &tree, &full);

    // ---- Removal: conversations' last 64 blocks, tail first.
    let mut removal = Row::new("removal: 64-block Removed events", "M blocks/s", true);
    let mut tails = order.iter().skip(QUERY_POOL);
    for _ in 0..plan.reps {
        let evs: Vec<RemoveEv> = tails
            .by_ref()
            .take(plan.removal_tails)
            .map(|&c| {
                let conv = &w.convs[c];
                let from = CONV_BLOCKS - 64;
                RemoveEv {
                    worker: conv.worker,
                    blocks: (from..CONV_BLOCKS)
                        .rev()
                        .map(|i| (conv.engine[i], conv.blocks[i].seq))
                        .collect(),
                }
            })
            .collect();
        let blocks = evs.iter().map(|e| e.blocks.len()).sum::<usize>() as f64;
        let sy_ids: Vec<(WorkerSlot, Vec<EngineBlockId>)> = evs
            .iter()
            .map(|e| {
                (
                    WorkerSlot(e.worker),
                    e.blocks.iter().map(|&(id, _)| EngineBlockId(id)).collect(),
                )
            })
            .collect();
        let t = cpu_ns();
        for (slot, ids) in &sy_ids {
            index.remove(*slot, ids);
        }
        removal.sy.push(blocks / (cpu_ns() - t) as f64 * 1e3);
        let dy_in: Vec<RouterEvent> = evs
            .iter()
            .map(|e| {
                event_id += 1;
                dy_remove(event_id, e)
            })
            .collect();
        let t = cpu_ns();
        for ev in dy_in {
            dy_apply(&mut tree, ev);
        }
        removal.dy.push(blocks / (cpu_ns() - t) as f64 * 1e3);
    }
    rows.push(removal);
    check("full hit after removals", &index, &tree, &full);

    // ---- Removing a whole worker (~31 k blocks), a different one each repetition.
    let mut worker_removal = Row::new("remove a worker (~31 k blocks)", "ms", false);
    for rep in 0..plan.reps {
        let wk = ((rep * 37 + 5) % usize::from(WORKERS)) as u16;
        let t = cpu_ns();
        index.remove_worker(WorkerSlot(wk));
        worker_removal.sy.push((cpu_ns() - t) as f64 / 1e6);
        let t = cpu_ns();
        tree.remove_worker(u64::from(wk));
        worker_removal.dy.push((cpu_ns() - t) as f64 / 1e6);
    }
    rows.push(worker_removal);
    check("full hit after worker removals", &index, &tree, &full);
    check("prefix hit after worker removals", &index, &tree, &prefix);
    drop(index);
    drop(tree);

    // ---- Memory: each side built alone in a child process, RSS before and after.
    let mut memory = Row::new(
        "memory per (worker, block) pair (RSS delta)",
        "bytes",
        false,
    );
    memory.ratio_sy_over_dy = true;
    for _ in 0..plan.memory_reps {
        memory.sy.push(memory_of("switchyard"));
        memory.dy.push(memory_of("dynamo"));
    }
    rows.push(memory);

    print_table(&rows);
    println!("(whole run: {:.0} s wall)", wall.elapsed().as_secs_f64());
}

fn query_row(
    name: &'static str,
    index: &KvIndex,
    tree: &RadixTree,
    queries: &[Query],
    plan: &Plan,
) -> Row {
    let mut row = Row::new(name, "us", false);
    let mut out = OverlapScores::default();
    let n = plan.queries;
    for rep in 0..plan.reps {
        let set: Vec<&Query> = (0..n)
            .map(|k| &queries[(rep * 257 + k) % queries.len()])
            .collect();
        let t = cpu_ns();
        for q in &set {
            index.find_matches(&q.seqs, &mut out);
            black_box(&out);
        }
        row.sy.push((cpu_ns() - t) as f64 / n as f64 / 1e3);
        // Dynamo's query takes its hashes by value: the vectors are made before the clock.
        let inputs: Vec<Vec<LocalBlockHash>> = set.iter().map(|q| q.locals.clone()).collect();
        let t = cpu_ns();
        for v in inputs {
            black_box(tree.find_matches(v, false));
        }
        row.dy.push((cpu_ns() - t) as f64 / n as f64 / 1e3);
    }
    row
}

/// Both hash schemes give the same local hashes from the same tokens, and the same chain.
fn check_hash_schemes(w: &Workload) {
    let conv = &w.convs[0];
    let mut tokens = Vec::new();
    for b in conv.prompt(&w.systems) {
        block_tokens(b.no, &mut tokens);
    }
    let dy = compute_block_hash_for_seq(&tokens, BLOCK_TOKENS as u32, Default::default());
    let ours: Vec<u64> = conv.prompt(&w.systems).map(|b| b.local).collect();
    assert_eq!(
        dy.iter().map(|h| h.0).collect::<Vec<_>>(),
        ours,
        "local hashes"
    );
    let dy_seq = compute_seq_hash_for_block(&dy);
    let locals: Vec<SyLocal> = ours.iter().map(|&h| SyLocal(h)).collect();
    let sy_seq = switchyard_protocol::hash::sequence_hashes_from(None, &locals, seed());
    assert_eq!(
        dy_seq,
        sy_seq.iter().map(|h| h.0).collect::<Vec<_>>(),
        "sequence hashes"
    );
}

/// Runs this binary as a child that builds one side alone and prints bytes per pair.
fn memory_of(side: &str) -> f64 {
    let exe = std::env::current_exe().expect("own path");
    let out = std::process::Command::new(exe)
        .args(["--memory-child", side])
        .output()
        .expect("memory child");
    assert!(out.status.success(), "memory child failed: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let v: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("bytes_per_pair "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("memory child output: {text}"));
    println!("memory {side}: {v:.1} B/pair");
    v
}

/// Builds one side from the workload, making each event just before applying it (so the
/// events' own memory is not counted), and prints the RSS growth per pair.
fn memory_child(side: &str) {
    let w = workload();
    let before = rss_bytes();
    match side {
        "switchyard" => {
            let mut index = sy_new(&w);
            for e in &w.ingest {
                let (slot, parent, parent_id, blocks) = sy_store(e);
                index.store_after(slot, parent, parent_id, &blocks);
            }
            let after = rss_bytes();
            assert_eq!(index.stats().pairs as usize, w.pairs);
            println!(
                "bytes_per_pair {}",
                (after - before) as f64 / w.pairs as f64
            );
            black_box(&index);
        }
        "dynamo" => {
            let mut tree = RadixTree::new();
            for (i, e) in w.ingest.iter().enumerate() {
                dy_apply(&mut tree, dy_store(i as u64, e));
            }
            let after = rss_bytes();
            println!(
                "bytes_per_pair {}",
                (after - before) as f64 / w.pairs as f64
            );
            black_box(&tree);
        }
        _ => panic!("--memory-child switchyard|dynamo"),
    }
}
