//! What both HTTP/2 sides of the sidecar run on, the gRPC port's client connections and the
//! upstream connection to TEI alike: writes corked into one socket write per wake-up (`corked`),
//! keepalive PINGs (`keepalive`), writing within the peer's window (`send_window`), and the
//! certificates in force on both ports (`tls`). Imports only `vocab`.

pub mod corked;
pub mod keepalive;
pub mod send_window;
pub mod tls;
