//! Free 127.0.0.1 ports.

use std::net::{Ipv4Addr, TcpListener};

use crate::error::StackError;

/// Asks the kernel for `count` distinct free ports on 127.0.0.1. All listeners are held until
/// every port is picked, so the same port is never handed out twice; a process of someone else
/// can still take one before our child binds it (the child then fails and the stack reports
/// which one).
///
/// # Errors
/// [`StackError::Io`] if no port can be bound.
pub fn free_ports(count: usize) -> Result<Vec<u16>, StackError> {
    let listeners = (0..count)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(StackError::io("binding 127.0.0.1:0 to find a free port"))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(StackError::io("reading a bound port"))
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
