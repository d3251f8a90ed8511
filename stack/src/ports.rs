//! Free 127.0.0.1 ports.

use crate::error::StackError;

/// `count` distinct free ports on 127.0.0.1, below the kernel's ephemeral range
/// (`switchyard_support::free_listen_ports`). Envoy binds its listener seconds after the pick
/// (it compiles the filter first), and a port in the ephemeral range could meanwhile become
/// the source port of any outgoing connection on the machine: Envoy then failed with
/// "Address already in use". A process of someone else can still bind one on purpose before
/// our child does (the child then fails and the stack reports which one).
///
/// # Errors
/// None today; kept so callers need not change if picking can fail.
pub fn free_ports(count: usize) -> Result<Vec<u16>, StackError> {
    Ok(switchyard_support::free_listen_ports(count))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_nonzero() {
        let ports = free_ports(8).expect("ports");
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 8);
        assert!(ports.iter().all(|p| *p != 0));
    }
}
