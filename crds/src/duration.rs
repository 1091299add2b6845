//! Durations as the API spells them (`queueTimeout: 1m30s`). The parser lives in `teifleet-wire`,
//! shared with every binary's duration flags; it accepts Go's syntax, as the CRD's CEL rule does,
//! so anything the API server admits parses here.

pub use teifleet_wire::duration::{InvalidDuration, parse as parse_duration};
