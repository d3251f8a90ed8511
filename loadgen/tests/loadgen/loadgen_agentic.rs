//! Synthetic agentic sessions meet their stated properties.

use std::collections::HashMap;

use switchyard_loadgen::agentic::{generate_agentic, AgenticConfig, AgenticConfigError};
use switchyard_loadgen::reuse::{prefix_reuse, shared_prefix_tokens};

#[test]
fn sessions_are_long_growing_and_almost_all_reused() {
    let config = AgenticConfig::default();
    for seed in [1, 7, 42] {
        let w = generate_agentic(&config, seed).unwrap();
        assert!(w.requests.len() > 500, "seed {seed}: {}", w.requests.len());
        for r in &w.requests {
            assert!(
                (10_000..=250_000).contains(&r.isl()),
                "seed {seed} request {}: ISL {}",
                r.id,
                r.isl()
            );
        }
        let longest = w.requests.iter().map(|r| r.isl()).max().unwrap();
        assert!(longest > 100_000, "seed {seed}: longest prompt {longest}");
        let reuse = prefix_reuse(&w, 64);
        assert!(reuse.share > 0.95, "seed {seed}: reuse {}", reuse.share);
    }
}

#[test]
fn turns_add_a_few_hundred_tokens_to_the_previous_prompt() {
    let config = AgenticConfig::default();
    let w = generate_agentic(&config, 3).unwrap();
    let shared = shared_prefix_tokens(&w);
    let mut previous: HashMap<(u64, u32), usize> = HashMap::new();
    let mut checked = 0;
    for r in &w.requests {
        if let Some(&p) = previous.get(&(r.session, r.agent)) {
            let prev = &w.requests[p];
            // The whole previous prompt is a prefix of this one.
            assert!(shared[r.id] >= prev.isl(), "request {}", r.id);
            assert_eq!(
                r.prompt.segments[..prev.prompt.segments.len()],
                prev.prompt.segments[..]
            );
            let added = r.isl() - prev.isl();
            let min = u64::from(prev.osl + config.new_tokens_per_turn.0);
            assert!(added >= min, "request {}: +{added}", r.id);
            if r.agent > 0 || r.after == vec![p] {
                // No sub-agent reports in between: answer + new input only.
                let max = u64::from(prev.osl + config.new_tokens_per_turn.1);
                assert!(added <= max, "request {}: +{added}", r.id);
                checked += 1;
            }
        }
        previous.insert((r.session, r.agent), r.id);
    }
    assert!(checked > 300, "{checked}");
}

#[test]
fn sub_agents_branch_off_the_shared_system_prompt_and_dependencies_point_back() {
    let w = generate_agentic(&AgenticConfig::default(), 11).unwrap();
    let system = w.requests[0].prompt.segments[0];
    let mut sub_agents = 0;
    for r in &w.requests {
        assert_eq!(r.id, w.requests.iter().position(|x| x.id == r.id).unwrap());
        assert_eq!(
            r.prompt.segments[0], system,
            "everyone starts with the system prompt"
        );
        for &d in &r.after {
            assert!(d < r.id, "request {} waits on later {d}", r.id);
            assert!(w.requests[d].arrival_ms <= r.arrival_ms);
            assert_eq!(w.requests[d].session, r.session);
        }
        if r.agent > 0 && r.turn == 0 {
            sub_agents += 1;
            assert_eq!(r.after.len(), 1);
            assert_eq!(w.requests[r.after[0]].agent, 0, "spawned by the main agent");
        }
        if r.turn == 0 && r.agent == 0 {
            assert!(r.after.is_empty());
        }
    }
    assert!(sub_agents > 5, "{sub_agents}");
}

#[test]
fn same_seed_same_workload_and_bad_configs_are_rejected() {
    let c = AgenticConfig::default();
    assert_eq!(
        generate_agentic(&c, 5).unwrap(),
        generate_agentic(&c, 5).unwrap()
    );
    assert_ne!(
        generate_agentic(&c, 5).unwrap(),
        generate_agentic(&c, 6).unwrap()
    );
    let inverted = AgenticConfig {
        think_ms: (10, 1),
        ..c.clone()
    };
    assert!(matches!(
        generate_agentic(&inverted, 0),
        Err(AgenticConfigError::InvertedRange {
            field: "think_ms",
            ..
        })
    ));
    let rate = AgenticConfig {
        session_rate_per_s: 0.0,
        ..c.clone()
    };
    assert!(matches!(
        generate_agentic(&rate, 0),
        Err(AgenticConfigError::OutOfRange { .. })
    ));
    let tiny = AgenticConfig {
        max_isl: 1_000,
        ..c
    };
    assert!(generate_agentic(&tiny, 0).is_err());
}

/// Configs that would plan nothing, spawn no sub-agent although asked to, or plan more
/// requests than memory holds are refused naming the field, before anything is generated.
#[test]
fn empty_silent_and_unbounded_configs_are_refused_naming_the_field() {
    let field_of = |c: AgenticConfig| match generate_agentic(&c, 0) {
        Err(AgenticConfigError::OutOfRange { field, .. }) => field,
        other => panic!("{c:?}: {other:?}"),
    };
    let d = AgenticConfig::default();
    let cases = [
        (
            AgenticConfig {
                sessions: 0,
                ..d.clone()
            },
            "sessions",
        ),
        (
            AgenticConfig {
                turns: 0,
                ..d.clone()
            },
            "turns",
        ),
        (
            AgenticConfig {
                output_tokens: (0, 10),
                ..d.clone()
            },
            "output_tokens",
        ),
        (
            AgenticConfig {
                initial_context_tokens: (0, 10),
                ..d.clone()
            },
            "initial_context_tokens",
        ),
        (
            AgenticConfig {
                subagent_probability: 1.0,
                subagents_per_spawn: (0, 0),
                ..d.clone()
            },
            "subagents_per_spawn",
        ),
        (
            AgenticConfig {
                subagent_probability: 1.0,
                subagent_turns: (0, 2),
                ..d.clone()
            },
            "subagent_turns",
        ),
        (
            AgenticConfig {
                sessions: 100_000,
                turns: 1_000,
                ..d.clone()
            },
            "sessions",
        ),
        // Arrivals beyond what virtual time resolves (it overflowed, then hung the replay).
        (
            AgenticConfig {
                think_ms: (u64::MAX - 1, u64::MAX),
                ..d.clone()
            },
            "think_ms / session_rate_per_s",
        ),
        (
            AgenticConfig {
                session_rate_per_s: 1e-18,
                ..d.clone()
            },
            "think_ms / session_rate_per_s",
        ),
    ];
    for (config, field) in cases {
        assert_eq!(field_of(config), field);
    }
    // No sub-agents at all is a valid workload.
    let none = AgenticConfig {
        subagent_probability: 0.0,
        subagents_per_spawn: (0, 0),
        subagent_turns: (0, 0),
        sessions: 2,
        turns: 2,
        ..d
    };
    assert!(generate_agentic(&none, 0).is_ok());
}

/// A `max_isl` below some sessions' drawn first prompt cuts their first context to fit:
/// every session asked for runs, and no prompt passes `max_isl`. Such sessions were dropped
/// without a word (4 sessions asked for, 1 planned; or none at all, and the run failed).
#[test]
fn a_low_max_isl_cuts_first_contexts_and_drops_no_session() {
    for max_isl in [14_100, 20_000] {
        let config = AgenticConfig {
            sessions: 10,
            turns: 3,
            max_isl,
            ..AgenticConfig::default()
        };
        let workload = generate_agentic(&config, 7).expect("a workload");
        let sessions: std::collections::BTreeSet<u64> =
            workload.requests.iter().map(|r| r.session).collect();
        assert_eq!(sessions.len(), 10, "max_isl {max_isl}");
        assert!(workload
            .requests
            .iter()
            .all(|r| r.prompt.tokens() <= u64::from(max_isl)));
    }
}
