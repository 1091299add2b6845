//! What a call meets before the pool's budget: what its headers ask for (`request_meta`), whether
//! its key or certificate lets it in and which tenant it is (`auth`), and the pool's door, where
//! calls beyond what the pool can serve or queue wait their turn (`door`). Imports `vocab` and
//! `admission`.

pub mod auth;
pub mod door;
pub mod request_meta;
