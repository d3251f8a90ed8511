//! Sequence numbers → in order, gap, duplicate, stale, restart.

use switchyard_adapters::vllm::sequence::{SeqStatus, SequenceTracker};

fn observe_all(seqs: &[u64]) -> Vec<SeqStatus> {
    let mut t = SequenceTracker::new();
    seqs.iter().map(|&s| t.observe(s)).collect()
}

#[test]
fn consecutive_from_zero_is_in_order() {
    assert_eq!(observe_all(&[0, 1, 2]), [SeqStatus::InOrder; 3]);
}

#[test]
fn a_jump_reports_the_missing_range() {
    let mut t = SequenceTracker::new();
    assert_eq!(t.observe(0), SeqStatus::InOrder);
    assert_eq!(t.observe(4), SeqStatus::Gap { from: 1, to: 3 });
    assert_eq!(t.observe(5), SeqStatus::InOrder);
    assert_eq!(t.next_expected(), 6);
}

#[test]
fn joining_late_is_a_gap_from_zero() {
    let mut t = SequenceTracker::new();
    assert_eq!(t.next_expected(), 0);
    assert_eq!(t.observe(10), SeqStatus::Gap { from: 0, to: 9 });
}

#[test]
fn repeats_and_old_numbers_are_not_applied() {
    let mut t = SequenceTracker::new();
    for s in 0..=5 {
        t.observe(s);
    }
    assert_eq!(t.observe(5), SeqStatus::Duplicate);
    assert_eq!(t.observe(3), SeqStatus::Stale { last: 5 });
    assert_eq!(t.last(), Some(5));
    assert_eq!(t.observe(6), SeqStatus::InOrder);
}

#[test]
fn back_to_zero_is_a_restart() {
    let mut t = SequenceTracker::new();
    for s in 0..=7 {
        t.observe(s);
    }
    assert_eq!(t.observe(0), SeqStatus::Restarted { last: 7 });
    assert_eq!(t.observe(1), SeqStatus::InOrder);
}

#[test]
fn zero_twice_is_a_duplicate() {
    // A restart right after the first batch looks the same; the tracker does not guess.
    assert_eq!(
        observe_all(&[0, 0]),
        [SeqStatus::InOrder, SeqStatus::Duplicate]
    );
}

#[test]
fn extremes_do_not_overflow() {
    let mut t = SequenceTracker::new();
    assert_eq!(
        t.observe(u64::MAX),
        SeqStatus::Gap {
            from: 0,
            to: u64::MAX - 1
        }
    );
    assert_eq!(t.next_expected(), u64::MAX);
    assert_eq!(t.observe(u64::MAX), SeqStatus::Duplicate);
    t.reset();
    assert_eq!(t.last(), None);
    assert_eq!(t.observe(0), SeqStatus::InOrder);
}
