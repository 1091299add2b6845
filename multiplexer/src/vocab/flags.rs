//! Settings declared once, as flags: a settings struct derives `clap::Args`, the binary flattens
//! it into its command line, and the struct's `Default` is what that command line gives when no
//! flag is passed, so a default is written in one place.

use clap::Args;

/// The values `T`'s flags take when none is given.
pub fn defaults<T: Args>() -> T {
    let command = T::augment_args(clap::Command::new("defaults").no_binary_name(true));
    let matches = command.try_get_matches_from(std::iter::empty::<&str>()).expect("every flag has a default");
    T::from_arg_matches(&matches).expect("the defaults parse")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::front::http::HttpSettings;
    use crate::run::server::{ConnectionBounds, InputBounds};

    #[test]
    fn defaults_are_the_flags_defaults() {
        let http: HttpSettings = super::defaults();
        assert_eq!((http.payload_limit, http.max_client_batch_size, http.max_request_inputs), (2_000_000, 32, 2048));
        assert!(http.auto_truncate);
        let bounds: InputBounds = super::defaults();
        assert_eq!(bounds.header_read_timeout, Duration::from_secs(10));
        assert_eq!(bounds.max_connections, 1024);
        let connections: ConnectionBounds = super::defaults();
        assert_eq!(connections.max_connections_per_peer, 256, "a quarter of the port's cap");
        assert_eq!(connections.idle_connection_timeout, Duration::from_secs(30));
    }
}
