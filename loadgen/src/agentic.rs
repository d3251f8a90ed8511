//! Synthetic agentic sessions.
//!
//! Coding and tool-using agents send long, growing contexts: every turn resends the whole
//! conversation plus the last answer and a few hundred new tokens (tool results, a user
//! nudge), so almost all of each prompt is a prefix the serving engine has seen. Sub-agents
//! start from the same system prompt (and tool definitions) with their own task, run a few
//! turns, and their results flow back into the main agent's context. Sessions are closed
//! loop: a turn is sent when the previous one (and any sub-agents it spawned) has finished,
//! plus a think time.
//!
//! Everything is drawn from a seeded RNG; the same seed and config give the same workload.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::closed_loop::finish_closed_loop;
use super::prompts::{PromptSpec, Segment};
use super::{PlannedRequest, Workload};

/// Knobs of the agentic workload. Ranges are inclusive `(min, max)`, drawn uniformly unless
/// noted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgenticConfig {
    /// Number of sessions (main agents).
    pub sessions: u32,
    /// Main-agent turns per session (fewer if the context reaches `max_isl`).
    pub turns: u32,
    /// Session starts per second (Poisson arrivals).
    pub session_rate_per_s: f64,
    /// Pause between a turn's completion and the next turn, ms.
    pub think_ms: (u64, u64),
    /// Shared system prompt and tool definitions, tokens (the same for every agent).
    pub system_tokens: u32,
    /// Session-specific context at the first turn (task, files), tokens, log-uniform; cut to
    /// what `max_isl` leaves after the system prompt.
    pub initial_context_tokens: (u32, u32),
    /// New input per turn (tool results, user message), tokens.
    pub new_tokens_per_turn: (u32, u32),
    /// Output per turn, tokens.
    pub output_tokens: (u32, u32),
    /// Chance that a main-agent turn spawns sub-agents.
    pub subagent_probability: f64,
    /// Sub-agents per spawn.
    pub subagents_per_spawn: (u32, u32),
    /// Sub-agent task prompt after the system prompt, tokens.
    pub subagent_task_tokens: (u32, u32),
    /// Turns per sub-agent.
    pub subagent_turns: (u32, u32),
    /// No prompt grows beyond this many tokens; the agent stops instead.
    pub max_isl: u32,
}

impl Default for AgenticConfig {
    fn default() -> Self {
        AgenticConfig {
            sessions: 16,
            turns: 40,
            session_rate_per_s: 0.5,
            think_ms: (200, 2_000),
            system_tokens: 12_000,
            initial_context_tokens: (2_000, 160_000),
            new_tokens_per_turn: (100, 600),
            output_tokens: (50, 400),
            subagent_probability: 0.05,
            subagents_per_spawn: (1, 3),
            subagent_task_tokens: (1_500, 5_000),
            subagent_turns: (3, 8),
            max_isl: 250_000,
        }
    }
}

/// Invalid agentic configuration.
#[derive(Debug, thiserror::Error)]
pub enum AgenticConfigError {
    /// A `(min, max)` range has `min > max`.
    #[error("{field}: min {min} is above max {max}")]
    InvertedRange {
        /// Config field.
        field: &'static str,
        /// Its min.
        min: u64,
        /// Its max.
        max: u64,
    },
    /// A value is out of its domain.
    #[error("{field}: {message}")]
    OutOfRange {
        /// Config field.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
}

impl AgenticConfig {
    /// Checks ranges and domains.
    ///
    /// # Errors
    /// [`AgenticConfigError`] naming the first bad field.
    pub fn validate(&self) -> Result<(), AgenticConfigError> {
        let ranges: [(&'static str, u64, u64); 7] = [
            ("think_ms", self.think_ms.0, self.think_ms.1),
            (
                "initial_context_tokens",
                self.initial_context_tokens.0.into(),
                self.initial_context_tokens.1.into(),
            ),
            (
                "new_tokens_per_turn",
                self.new_tokens_per_turn.0.into(),
                self.new_tokens_per_turn.1.into(),
            ),
            (
                "output_tokens",
                self.output_tokens.0.into(),
                self.output_tokens.1.into(),
            ),
            (
                "subagents_per_spawn",
                self.subagents_per_spawn.0.into(),
                self.subagents_per_spawn.1.into(),
            ),
            (
                "subagent_task_tokens",
                self.subagent_task_tokens.0.into(),
                self.subagent_task_tokens.1.into(),
            ),
            (
                "subagent_turns",
                self.subagent_turns.0.into(),
                self.subagent_turns.1.into(),
            ),
        ];
        for (field, min, max) in ranges {
            if min > max {
                return Err(AgenticConfigError::InvertedRange { field, min, max });
            }
        }
        let out = |field, message: &str| {
            Err(AgenticConfigError::OutOfRange {
                field,
                message: message.to_string(),
            })
        };
        if !(self.session_rate_per_s > 0.0 && self.session_rate_per_s.is_finite()) {
            return out("session_rate_per_s", "must be a positive number");
        }
        if !(0.0..=1.0).contains(&self.subagent_probability) {
            return out("subagent_probability", "must be in [0, 1]");
        }
        if self.sessions == 0 {
            return out(
                "sessions",
                "must be at least 1: a workload without requests measures nothing",
            );
        }
        if self.turns == 0 {
            return out(
                "turns",
                "must be at least 1: a session without turns sends nothing",
            );
        }
        if self.output_tokens.0 == 0 {
            return out("output_tokens", "minimum must be positive");
        }
        if self.initial_context_tokens.0 == 0 {
            return out("initial_context_tokens", "minimum must be positive");
        }
        if self.subagent_probability > 0.0 && self.subagents_per_spawn.1 == 0 {
            return out(
                "subagents_per_spawn",
                "spawns no sub-agent although subagent_probability is above 0 (set it to 0 for none)",
            );
        }
        if self.subagent_probability > 0.0 && self.subagent_turns.0 == 0 {
            return out(
                "subagent_turns",
                "minimum must be positive when sub-agents spawn",
            );
        }
        if self.most_requests() > MAX_PLANNED_REQUESTS {
            return out(
                "sessions",
                &format!(
                    "sessions × turns × (1 + sub-agent turns per turn) can reach {} requests, more \
                     than the {MAX_PLANNED_REQUESTS} a workload holds in memory",
                    self.most_requests()
                ),
            );
        }
        if u64::from(self.system_tokens) + u64::from(self.initial_context_tokens.0)
            > u64::from(self.max_isl)
        {
            return out("max_isl", "smaller than the shortest first prompt");
        }
        Ok(())
    }
}

/// Most requests one generated workload may plan: every planned request is held in memory
/// (with its prompt's segments), and a virtual-time run keeps a record of each.
pub const MAX_PLANNED_REQUESTS: u64 = 2_000_000;

impl AgenticConfig {
    /// The most requests this config can generate: every main-agent turn, and for each the
    /// most sub-agent turns a spawn can bring.
    fn most_requests(&self) -> u64 {
        let per_turn = if self.subagent_probability > 0.0 {
            1 + u64::from(self.subagents_per_spawn.1) * u64::from(self.subagent_turns.1)
        } else {
            1
        };
        u64::from(self.sessions)
            .saturating_mul(u64::from(self.turns))
            .saturating_mul(per_turn)
    }
}

/// Builds one workload; holds the RNG and the id counters.
struct Generator<'a> {
    config: &'a AgenticConfig,
    rng: StdRng,
    /// Last content block id handed out.
    next_block: u64,
    /// Last agent number handed out in the current session (0 = main).
    next_agent: u32,
    requests: Vec<PlannedRequest>,
}

/// Where and how one agent starts.
struct AgentStart {
    session: u64,
    /// 0 for the main agent.
    agent: u32,
    turns: u32,
    /// First prompt.
    prompt: PromptSpec,
    /// Session start for main agents; unused for sub-agents, whose first turn is planned
    /// from the turn that spawned them (`crate::closed_loop`).
    start_ms: u64,
    /// Requests the first turn waits for.
    after: Vec<usize>,
    /// Pause before the first turn.
    think_ms: u64,
    /// Whether this agent may spawn sub-agents (sub-agents do not nest).
    spawns: bool,
}

/// Block id of the shared system prompt.
const SYSTEM_BLOCK: u64 = 0;

impl Generator<'_> {
    fn range32(&mut self, (lo, hi): (u32, u32)) -> u32 {
        self.rng.random_range(lo..=hi)
    }

    fn think(&mut self) -> u64 {
        let (lo, hi) = self.config.think_ms;
        self.rng.random_range(lo..=hi)
    }

    fn segment(&mut self, tokens: u32) -> Segment {
        self.next_block += 1;
        Segment {
            block: self.next_block,
            tokens,
        }
    }

    /// Runs one agent from `start`; returns the id of its last turn, or `None` if even its
    /// first prompt is longer than `max_isl`.
    fn agent(&mut self, start: AgentStart) -> Option<usize> {
        let AgentStart {
            session,
            agent,
            turns,
            mut prompt,
            start_ms,
            mut after,
            mut think_ms,
            spawns,
        } = start;
        let max_isl = u64::from(self.config.max_isl);
        // Turns with dependencies get their planned arrival from `finish_closed_loop`.
        let arrival = start_ms.saturating_add(think_ms);
        let mut last = None;
        for turn in 0..turns {
            if prompt.tokens() > max_isl {
                break;
            }
            let id = self.requests.len();
            let osl = self.range32(self.config.output_tokens);
            self.requests.push(PlannedRequest {
                id,
                arrival_ms: arrival,
                session,
                turn,
                agent,
                after,
                think_ms,
                prompt: prompt.clone(),
                osl,
            });
            last = Some(id);
            // The next prompt: everything so far, the answer, then new input.
            let answer = self.segment(osl);
            prompt.segments.push(answer);
            after = vec![id];
            think_ms = self.think();
            if spawns && self.rng.random_bool(self.config.subagent_probability) {
                let finals = self.spawn_subagents(session, id, &mut prompt);
                if !finals.is_empty() {
                    after = finals;
                }
            }
            let new = self.range32(self.config.new_tokens_per_turn);
            let new = self.segment(new);
            prompt.segments.push(new);
        }
        last
    }

    /// Sub-agents spawned by main-agent request `parent`: each starts from the shared system
    /// prompt and its own task; each one's final answer is appended to the main `prompt`, and
    /// the main agent's next turn waits for all of them. Returns their last requests.
    fn spawn_subagents(
        &mut self,
        session: u64,
        parent: usize,
        prompt: &mut PromptSpec,
    ) -> Vec<usize> {
        let count = self.range32(self.config.subagents_per_spawn);
        let mut finals = Vec::new();
        for _ in 0..count {
            self.next_agent += 1;
            let task = self.range32(self.config.subagent_task_tokens);
            let start = AgentStart {
                session,
                agent: self.next_agent,
                prompt: PromptSpec {
                    segments: vec![self.system_segment(), self.segment(task)],
                },
                turns: self.range32(self.config.subagent_turns),
                start_ms: 0,
                after: vec![parent],
                think_ms: self.think(),
                spawns: false,
            };
            if let Some(done) = self.agent(start) {
                finals.push(done);
                let report = self.requests[done].osl;
                let report = self.segment(report);
                prompt.segments.push(report);
            }
        }
        finals
    }

    fn system_segment(&self) -> Segment {
        Segment {
            block: SYSTEM_BLOCK,
            tokens: self.config.system_tokens,
        }
    }

    fn log_uniform(&mut self, (lo, hi): (u32, u32)) -> u32 {
        let (lo, hi) = (f64::from(lo), f64::from(hi));
        let x: f64 = self.rng.random();
        (lo * (hi / lo).powf(x)).round() as u32
    }
}

/// Generates the agentic workload for `seed`.
///
/// # Errors
/// [`AgenticConfigError`] if the config is invalid.
pub fn generate_agentic(config: &AgenticConfig, seed: u64) -> Result<Workload, AgenticConfigError> {
    config.validate()?;
    let mut g = Generator {
        config,
        rng: StdRng::seed_from_u64(seed),
        next_block: SYSTEM_BLOCK,
        next_agent: 0,
        requests: Vec::new(),
    };
    let mut start_s = 0.0f64;
    for session in 0..u64::from(config.sessions) {
        if session > 0 {
            let u: f64 = g.rng.random();
            start_s += -(1.0 - u).ln() / config.session_rate_per_s;
        }
        // Every session runs: its first context is cut to what `max_isl` leaves after the
        // system prompt (`validate` made sure that is at least the range's minimum). Drawn
        // whole, a session whose first prompt passed `max_isl` was dropped without a word.
        let room = config.max_isl.saturating_sub(config.system_tokens);
        let context = g.log_uniform(config.initial_context_tokens).min(room);
        let prompt = PromptSpec {
            segments: vec![g.system_segment(), g.segment(context)],
        };
        g.next_agent = 0;
        g.agent(AgentStart {
            session,
            agent: 0,
            turns: config.turns,
            prompt,
            start_ms: (start_s * 1000.0).round() as u64,
            after: Vec::new(),
            think_ms: 0,
            spawns: true,
        });
    }
    let workload = Workload {
        name: format!("agentic:seed={seed}"),
        content_seed: seed,
        requests: finish_closed_loop(g.requests),
    };
    workload
        .check_span(crate::ArrivalScale::PLANNED)
        .map_err(|message| AgenticConfigError::OutOfRange {
            field: "think_ms / session_rate_per_s",
            message,
        })?;
    Ok(workload)
}
