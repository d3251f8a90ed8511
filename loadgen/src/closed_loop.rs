//! The one closed-loop mechanism every session workload shares (the agentic generator and
//! session traces): a request with dependencies (`after`) is sent when the last of them has
//! completed, plus its `think_ms`. The HTTP client and the virtual-time tracker both run it
//! from [`PlannedRequest::after`] and [`PlannedRequest::think_ms`]; this module only puts a
//! freshly built list of such requests into the order and labelling a [`super::Workload`]
//! promises, the same way for every source, so that a workload written as a session trace
//! and read back is the same list, request for request.
//!
//! 1. **Planned arrival.** A request without dependencies arrives at its own `arrival_ms`; a
//!    request with dependencies is *planned* at the latest planned arrival among them plus its
//!    think time. Service times are unknown before a run, so this is only an estimate that
//!    orders the requests; the real send time comes from completions.
//! 2. **Order.** Requests are sorted by planned arrival, stably (on ties a dependency, built
//!    first, stays first), and ids and dependencies are rewritten to the new indices;
//!    dependency lists are sorted, their order means nothing.
//! 3. **Labels.** Sessions are numbered by their first request in that order, and within a
//!    session its agents likewise (the main agent, which starts it, is 0).

use std::collections::HashMap;

use super::PlannedRequest;

/// Puts closed-loop requests into workload order (see the module doc).
///
/// `requests[i].id` must be `i`, and every dependency must point to an earlier request (the
/// order they were built or read in); planned arrivals of requests with dependencies are
/// overwritten.
///
/// # Panics
/// If a dependency does not point to an earlier request: the builders guarantee it.
pub fn finish_closed_loop(mut requests: Vec<PlannedRequest>) -> Vec<PlannedRequest> {
    plan_arrivals(&mut requests);
    let mut requests = renumber_by_arrival(requests);
    label_sessions_and_agents(&mut requests);
    requests
}

/// Step 1: planned arrival = latest dependency's planned arrival + think time.
fn plan_arrivals(requests: &mut [PlannedRequest]) {
    for index in 0..requests.len() {
        let r = &requests[index];
        assert_eq!(r.id, index, "ids are indices before ordering");
        if r.after.is_empty() {
            continue;
        }
        let latest = r
            .after
            .iter()
            .map(|&d| {
                assert!(d < index, "request {index} depends on a later one ({d})");
                requests[d].arrival_ms
            })
            .max()
            .unwrap_or(0);
        // Saturating: a span this large is refused after planning (`Workload::check_span`).
        requests[index].arrival_ms = latest.saturating_add(requests[index].think_ms);
    }
}

/// Step 2: stable sort by planned arrival; ids and dependencies rewritten, dependencies
/// sorted.
fn renumber_by_arrival(mut requests: Vec<PlannedRequest>) -> Vec<PlannedRequest> {
    requests.sort_by_key(|r| r.arrival_ms);
    let mut new_id = vec![0; requests.len()];
    for (index, r) in requests.iter().enumerate() {
        new_id[r.id] = index;
    }
    for (index, r) in requests.iter_mut().enumerate() {
        r.id = index;
        for d in &mut r.after {
            *d = new_id[*d];
        }
        r.after.sort_unstable();
    }
    requests
}

/// Step 3: sessions, then agents within each session, numbered by first appearance.
fn label_sessions_and_agents(requests: &mut [PlannedRequest]) {
    let mut sessions: HashMap<u64, u64> = HashMap::new();
    let mut agents: HashMap<(u64, u32), u32> = HashMap::new();
    let mut agents_in_session: HashMap<u64, u32> = HashMap::new();
    for r in requests {
        let next_session = sessions.len() as u64;
        let session = *sessions.entry(r.session).or_insert(next_session);
        let agent = *agents.entry((r.session, r.agent)).or_insert_with(|| {
            let count = agents_in_session.entry(session).or_insert(0);
            *count += 1;
            *count - 1
        });
        r.session = session;
        r.agent = agent;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompts::PromptSpec;

    fn request(id: usize, session: u64, agent: u32, after: Vec<usize>, t: u64) -> PlannedRequest {
        PlannedRequest {
            id,
            arrival_ms: t,
            session,
            turn: 0,
            agent,
            after,
            think_ms: t,
            prompt: PromptSpec::default(),
            osl: 1,
        }
    }

    #[test]
    fn arrivals_follow_the_latest_dependency_and_labels_the_first_appearance() {
        // Session 9 starts at 100; its agent 5 starts after request 0 with 50 ms think time,
        // its agent 4 after request 0 with 10; request 3 joins both with 1 ms.
        let built = vec![
            request(0, 9, 0, vec![], 100),
            request(1, 9, 5, vec![0], 50),
            request(2, 9, 4, vec![0], 10),
            request(3, 9, 0, vec![2, 1], 1),
            request(4, 3, 0, vec![], 120),
        ];
        let done = finish_closed_loop(built);
        let view: Vec<_> = done
            .iter()
            .map(|r| (r.arrival_ms, r.session, r.agent, r.after.clone()))
            .collect();
        assert_eq!(
            view,
            vec![
                (100, 0, 0, vec![]),
                (110, 0, 1, vec![0]),
                (120, 1, 0, vec![]),
                (150, 0, 2, vec![0]),
                (151, 0, 0, vec![1, 3]),
            ]
        );
    }
}
