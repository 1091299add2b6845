//! A port's connections counted per client address, so one client cannot take every place under
//! the port's cap: its connections past its share are closed as soon as they are accepted.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// Connections open per address, and how many one address may hold.
pub struct Peers {
    per_peer: usize,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Peers {
    pub fn new(per_peer: usize) -> Self {
        Self { per_peer, open: Arc::default() }
    }

    /// A place for one more connection from `address`, held until dropped; `None` when the
    /// address holds its share. An IPv4 address written as IPv6 (`::ffff:a.b.c.d`, what a
    /// dual-stack socket reports) is the same address.
    pub fn enter(&self, address: IpAddr) -> Option<PeerSlot> {
        let address = address.to_canonical();
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let held = open.entry(address).or_default();
        if *held >= self.per_peer {
            return None;
        }
        *held += 1;
        Some(PeerSlot { open: self.open.clone(), address })
    }
}

/// One connection's place among its address's share; given back when dropped. The map holds
/// only addresses with a connection open, so it is as large as the port's cap at most.
pub struct PeerSlot {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
    address: IpAddr,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = open.get_mut(&self.address) {
            *held -= 1;
            if *held == 0 {
                open.remove(&self.address);
            }
        }
    }
}
