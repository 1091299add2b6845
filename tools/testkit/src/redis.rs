//! Redis on loopback: Debian's `redis-server` (`tests/cluster/prereqs.sh` installs it), the
//! embedding cache's shared store in the multiplexer's tests. No persistence (`--save ''
//! --appendonly no`): a stopped server comes back empty, as a store that lost its data does, and
//! nothing is written but its log. [`Redis::stop`] and [`Redis::restart`] take it down and back on
//! the same port, which the sidecars keep dialling; [`RedisOptions::password`] makes it require a
//! password (`--requirepass`). A few commands can be sent to it ([`Redis::command`]), in RESP
//! written here, so the tests need no Redis client of their own.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;

use crate::net::loopback;
use crate::process::ChildGuard;
use crate::{Error, Result};

/// The environment variable naming a `redis-server` binary; unset, `redis-server` on `PATH`.
pub const REDIS_BIN_ENV: &str = "TEIFLEET_REDIS_BIN";
/// Set to 1 (as `make unit` does), a test that needs `redis-server` fails without one instead of
/// skipping.
pub const REQUIRE_REDIS_ENV: &str = "TEIFLEET_REQUIRE_REDIS";
/// How many times the server is started on a freshly picked port when one was taken before it
/// bound it.
const START_ATTEMPTS: u32 = 3;
/// How long the server gets to answer PING (it starts in milliseconds).
const READY_WITHIN: Duration = Duration::from_secs(20);
/// Longest wait for one command's answer.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest answer [`Redis::command`] reads: the tests ask for counts and short strings.
const MAX_ANSWER: usize = 1 << 20;

/// How the server is started.
#[derive(Clone, Debug, Default)]
pub struct RedisOptions {
    /// Clients must `AUTH` with this password (`--requirepass`); none: no password.
    pub password: Option<String>,
}

/// A running (or [stopped](Redis::stop)) `redis-server`, killed when dropped.
#[derive(Debug)]
pub struct Redis {
    server: Option<ChildGuard>,
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    options: RedisOptions,
}

impl Redis {
    /// The `redis-server` to run: [`REDIS_BIN_ENV`]'s, else the one on `PATH`; `None` if neither.
    pub fn bin() -> Option<PathBuf> {
        if let Some(path) = std::env::var_os(REDIS_BIN_ENV) {
            return Some(PathBuf::from(path)).filter(|path| path.is_file());
        }
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path).map(|dir| dir.join("redis-server")).find(|path| path.is_file())
    }

    /// [`Redis::bin`], or `None` with a line on stderr saying the test is skipped; panics instead
    /// when [`REQUIRE_REDIS_ENV`] is 1 (CI, where prereqs installed it).
    pub fn bin_or_skip(test: &str) -> Option<PathBuf> {
        let bin = Self::bin();
        if bin.is_none() {
            let required = std::env::var(REQUIRE_REDIS_ENV).is_ok_and(|value| value == "1");
            assert!(!required, "{REQUIRE_REDIS_ENV}=1 but no redis-server (tests/cluster/prereqs.sh installs it)");
            eprintln!("{test}: skipped, no redis-server on PATH or in {REDIS_BIN_ENV} (apt-get install redis-server)");
        }
        bin
    }

    /// Starts `bin` with its log (and nothing else) under `dir`, on a free loopback port, and
    /// waits until it answers.
    pub async fn start(bin: &Path, dir: &Path, options: RedisOptions) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|source| Error::File { path: dir.to_owned(), source })?;
        // redis-server cannot bind port 0 and say which it got: the port is picked here, and can
        // be taken before the server binds it (it then exits, "Address already in use"); it
        // starts again on another.
        let mut attempt = 1;
        loop {
            let mut redis = Self {
                server: None,
                bin: bin.to_owned(),
                dir: dir.to_owned(),
                port: crate::net::free_port()?,
                options: options.clone(),
            };
            match redis.spawn().await {
                Err(error) if attempt < START_ATTEMPTS && port_was_taken(&error) => attempt += 1,
                Err(error) => return Err(error),
                Ok(()) => return Ok(redis),
            }
        }
    }

    async fn spawn(&mut self) -> Result<()> {
        let mut command = Command::new(&self.bin);
        command
            .current_dir(&self.dir)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--dir", &self.dir.display().to_string(), "--logfile", ""]);
        if let Some(password) = &self.options.password {
            command.args(["--requirepass", password]);
        }
        let mut server = ChildGuard::spawn_logged("redis-server", command, self.dir.join("redis.log"))?;
        let addr = self.addr();
        let password = self.options.password.clone();
        server
            .wait_ready(READY_WITHIN, || {
                let password = password.clone();
                async move {
                    let answer = exchange(addr, password.as_deref(), &["PING"]).await;
                    answer.is_some_and(|answer| answer == "PONG")
                }
            })
            .await?;
        self.server = Some(server);
        Ok(())
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    /// The URL a client configures: `redis://127.0.0.1:PORT/0` (the password goes separately).
    pub fn url(&self) -> String {
        format!("redis://{}/0", self.addr())
    }

    /// Whether it is running (not [stopped](Redis::stop), and not exited).
    pub fn running(&mut self) -> bool {
        self.server.as_mut().is_some_and(|server| server.exit_status().is_none())
    }

    /// Kills the server (SIGKILL, as a crashed store): its port refuses connections until
    /// [`Redis::restart`], and what it held is gone.
    pub fn stop(&mut self) {
        if let Some(mut server) = self.server.take() {
            server.kill();
        }
    }

    /// Starts it again on the same port, empty; stops it first if it runs. Fails if the port was
    /// taken meanwhile.
    pub async fn restart(&mut self) -> Result<()> {
        self.stop();
        self.spawn().await
    }

    /// What the server logged (its current run's).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// Sends one command (authenticating first when it has a password) and returns its answer as
    /// text: a simple string, an integer, a bulk string (`None` for a nil), an error as `-ERR
    /// ...`, an array's elements joined by newlines. `None` when nothing answers.
    pub async fn command(&self, args: &[&str]) -> Option<String> {
        exchange(self.addr(), self.options.password.as_deref(), args).await
    }

    /// How many keys its database 0 holds (`DBSIZE`).
    pub async fn keys(&self) -> Option<u64> {
        self.command(&["DBSIZE"]).await?.parse().ok()
    }
}

/// Whether `error` is the server exiting because its port was taken.
fn port_was_taken(error: &Error) -> bool {
    match error {
        Error::Exited { log: Some(log), .. } => {
            std::fs::read_to_string(log).is_ok_and(|text| text.to_ascii_lowercase().contains("address already in use"))
        }
        _ => false,
    }
}

/// One connection: `AUTH password` if given, then `args`; the last command's answer.
async fn exchange(addr: SocketAddr, password: Option<&str>, args: &[&str]) -> Option<String> {
    let talk = async {
        let stream = TcpStream::connect(addr).await.ok()?;
        let mut stream = BufReader::new(stream);
        if let Some(password) = password {
            stream.get_mut().write_all(&encode(&["AUTH", password])).await.ok()?;
            let answer = read_reply(&mut stream).await?;
            if answer.starts_with('-') {
                return Some(answer);
            }
        }
        stream.get_mut().write_all(&encode(args)).await.ok()?;
        read_reply(&mut stream).await
    };
    tokio::time::timeout(COMMAND_TIMEOUT, talk).await.ok().flatten()
}

/// A command as RESP: an array of bulk strings.
fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// One RESP reply as text (see [`Redis::command`]).
async fn read_reply(stream: &mut BufReader<TcpStream>) -> Option<String> {
    let line = read_line(stream).await?;
    let (kind, rest) = line.split_at_checked(1)?;
    match kind {
        "+" | ":" => Some(rest.to_owned()),
        "-" => Some(line),
        "$" => {
            let Ok(len) = rest.parse::<usize>() else { return Some(String::new()) };
            if len > MAX_ANSWER {
                return None;
            }
            let mut body = vec![0; len + 2];
            stream.read_exact(&mut body).await.ok()?;
            body.truncate(len);
            Some(String::from_utf8_lossy(&body).into_owned())
        }
        "*" => {
            let count = rest.parse::<usize>().unwrap_or(0).min(MAX_ANSWER);
            let mut items = Vec::with_capacity(count.min(1024));
            for _ in 0..count {
                items.push(Box::pin(read_reply(stream)).await?);
            }
            Some(items.join("\n"))
        }
        _ => None,
    }
}

async fn read_line(stream: &mut BufReader<TcpStream>) -> Option<String> {
    let mut line = String::new();
    let read = (&mut *stream).take(MAX_ANSWER as u64).read_line(&mut line).await.ok()?;
    (read > 0 && line.ends_with("\r\n")).then(|| line.trim_end_matches("\r\n").to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("teifleet-testkit-redis-{name}-{}", std::process::id()))
    }

    #[test]
    fn commands_are_written_as_arrays_of_bulk_strings() {
        assert_eq!(encode(&["SET", "k", ""]), b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n");
    }

    #[tokio::test]
    async fn stores_stops_and_comes_back_empty_on_its_port() {
        let Some(bin) = Redis::bin_or_skip("stores_stops_and_comes_back_empty_on_its_port") else { return };
        let dir = dir("restart");
        let mut redis = Redis::start(&bin, &dir, RedisOptions::default()).await.unwrap();
        assert_eq!(redis.command(&["SET", "k", "v"]).await.as_deref(), Some("OK"));
        assert_eq!(redis.command(&["GET", "k"]).await.as_deref(), Some("v"));
        assert_eq!(redis.keys().await, Some(1));
        let addr = redis.addr();

        redis.stop();
        assert!(!redis.running());
        let refused = TcpStream::connect(addr).await;
        assert!(refused.is_err(), "nothing listens while stopped");
        assert_eq!(redis.command(&["PING"]).await, None);

        redis.restart().await.unwrap();
        assert_eq!(redis.addr(), addr, "the same port");
        assert_eq!(redis.keys().await, Some(0), "no persistence: back empty");
        drop(redis);
        assert!(TcpStream::connect(addr).await.is_err(), "killed on drop");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[tokio::test]
    async fn a_password_is_required_when_set() {
        let Some(bin) = Redis::bin_or_skip("a_password_is_required_when_set") else { return };
        let dir = dir("password");
        let options = RedisOptions { password: Some("s3cret-pass".into()) };
        let redis = Redis::start(&bin, &dir, options).await.unwrap();
        assert_eq!(redis.command(&["PING"]).await.as_deref(), Some("PONG"), "with the password");
        let without = exchange(redis.addr(), None, &["PING"]).await.unwrap();
        assert!(without.starts_with("-NOAUTH"), "{without}");
        let wrong = exchange(redis.addr(), Some("wrong"), &["PING"]).await.unwrap();
        assert!(wrong.starts_with("-WRONGPASS"), "{wrong}");
        drop(redis);
        std::fs::remove_dir_all(&dir).ok();
    }
}
