//! What a call meets before the pool's budget: what its headers ask for (`request_meta`), whether
//! its key or certificate lets it in, which tenant it is and how high a priority that tenant may
//! ask for (`auth`), whether a sibling's claim is backed by the pool's peer key (`peer`), and the
//! pool's door, where calls beyond what the pool can serve or queue wait their turn (`door`).
//! Imports `vocab` and `admission`.

pub mod auth;
pub mod door;
pub mod peer;
pub mod request_meta;
