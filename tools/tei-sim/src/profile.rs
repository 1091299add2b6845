//! A profile: how a real TEI's device behaved when measured (`teifleet-calibrate profile` writes
//! one to `tools/tei-sim/profiles/<name>.json`), so the simulator replays TEI's batch times instead
//! of numbers typed by hand.
//!
//! The simulator reads two keys and ignores the rest of the file, which records how the numbers
//! were obtained (TEI version, machine, load, raw samples, the fit's error):
//!
//! ```text
//! {
//!   "format": 1,
//!   "sim": {
//!     "fixed_latency_us": 2100.0,       // device time of every batch
//!     "per_request_latency_us": 350.0,  // added per request (sequence) in the batch
//!     "per_token_latency_us": 48.0,     // added per token in the batch
//!     "max_batch_requests": 4,          // null: no cap
//!     "max_batch_tokens": 16384,        // null: keep the simulator's
//!     "device": "spin",                 // sleep (a GPU) or spin (TEI on a CPU)
//!     "freeze_next_batch": true         // the prepared batch stops filling once it has a request
//!   }
//! }
//! ```
//!
//! A profile is refused, with the key at fault named, when it is not such JSON, is of another
//! format, has unknown keys in `sim`, or has a time that is negative, not finite or over a minute.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{Device, SimConfig};
use crate::error::SimError;

/// The format this simulator reads; a file of another format is refused rather than half read.
pub const PROFILE_FORMAT: u32 = 1;

/// Larger files are refused unread: a profile is a few kilobytes of samples.
const MAX_PROFILE_BYTES: u64 = 4 << 20;

/// No batch of a real TEI takes a minute; a larger value is a unit mistake.
const MAX_LATENCY_US: f64 = 60e6;

/// What the simulator takes from a profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// [`PROFILE_FORMAT`].
    pub format: u32,
    pub sim: DeviceModel,
}

/// The batch-time model and the batching limits TEI was seen to use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceModel {
    pub fixed_latency_us: f64,
    pub per_request_latency_us: f64,
    pub per_token_latency_us: f64,
    pub max_batch_requests: Option<usize>,
    pub max_batch_tokens: Option<usize>,
    pub device: Device,
    /// The prepared batch takes no requests once it has one, as TEI's (absent: false).
    #[serde(default)]
    pub freeze_next_batch: bool,
}

impl Profile {
    /// Reads and checks a profile file.
    pub fn load(path: &Path) -> Result<Self, SimError> {
        let bad = |why: String| SimError::InvalidConfig(format!("profile {}: {why}", path.display()));
        let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_PROFILE_BYTES + 1), &mut text)
            .map_err(|e| bad(e.to_string()))?;
        if text.len() as u64 > MAX_PROFILE_BYTES {
            return Err(bad(format!("larger than {MAX_PROFILE_BYTES} bytes")));
        }
        Self::parse(&text).map_err(bad)
    }

    /// Parses and checks a profile's text; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        // The format first, so a file of another format says so instead of failing on a key.
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let Some(object) = value.as_object() else {
            return Err("not a profile: expected a JSON object with \"format\" and \"sim\"".to_owned());
        };
        match object.get("format") {
            Some(format) if format.as_u64() == Some(u64::from(PROFILE_FORMAT)) => {}
            Some(other) => return Err(format!("format {other}, but this simulator reads format {PROFILE_FORMAT}")),
            None => return Err(format!("no \"format\" key (expected {PROFILE_FORMAT})")),
        }
        let profile: Self = serde_json::from_str(text).map_err(|e| format!("not a profile: {e}"))?;
        profile.sim.validate()?;
        Ok(profile)
    }
}

impl DeviceModel {
    fn validate(&self) -> Result<(), String> {
        for (key, value) in [
            ("fixed_latency_us", self.fixed_latency_us),
            ("per_request_latency_us", self.per_request_latency_us),
            ("per_token_latency_us", self.per_token_latency_us),
        ] {
            if !(value.is_finite() && (0.0..=MAX_LATENCY_US).contains(&value)) {
                return Err(format!("sim.{key} is {value:?}: expected microseconds from 0 to {MAX_LATENCY_US}"));
            }
        }
        if self.max_batch_requests == Some(0) {
            return Err("sim.max_batch_requests is 0: expected at least 1, or null for no cap".to_owned());
        }
        if self.max_batch_tokens == Some(0) {
            return Err("sim.max_batch_tokens is 0: expected at least 1, or null".to_owned());
        }
        Ok(())
    }

    /// Sets what the profile measured on `config`, leaving the rest (addresses, model id) as is.
    pub fn apply(&self, config: &mut SimConfig) {
        config.fixed_latency = micros(self.fixed_latency_us);
        config.per_request_latency = micros(self.per_request_latency_us);
        config.per_token_latency = micros(self.per_token_latency_us);
        config.max_batch_requests = self.max_batch_requests;
        if let Some(tokens) = self.max_batch_tokens {
            config.max_batch_tokens = tokens;
        }
        config.device = self.device;
        config.freeze_next_batch = self.freeze_next_batch;
    }
}

/// Validated values only: finite, and at most a minute.
fn micros(us: f64) -> Duration {
    Duration::from_nanos((us * 1e3).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{
        "format": 1,
        "name": "minilm-l6-cpu",
        "recorded": {"tei_version": "1.9.3", "nproc": 2},
        "sim": {
            "fixed_latency_us": 2100.5,
            "per_request_latency_us": 350.0,
            "per_token_latency_us": 48.25,
            "max_batch_requests": 4,
            "max_batch_tokens": null,
            "device": "spin",
            "freeze_next_batch": true
        }
    }"#;

    #[test]
    fn a_profile_sets_the_device_model() {
        let profile = Profile::parse(GOOD).unwrap();
        let mut config = SimConfig::default();
        profile.sim.apply(&mut config);
        assert_eq!(config.fixed_latency, Duration::from_nanos(2_100_500));
        assert_eq!(config.per_request_latency, Duration::from_micros(350));
        assert_eq!(config.per_token_latency, Duration::from_nanos(48_250));
        assert_eq!(config.max_batch_requests, Some(4));
        assert_eq!(config.max_batch_tokens, SimConfig::default().max_batch_tokens);
        assert_eq!(config.device, Device::Spin);
        assert!(config.freeze_next_batch);
        assert!(config.validate().is_ok());
    }

    #[test]
    fn bad_profiles_are_refused_with_the_reason() {
        let with = |from: &str, to: &str| GOOD.replace(from, to);
        let cases = [
            ("{\"format\": 1,".to_owned(), "not JSON"),
            ("[{\"format\": 1}]".to_owned(), "not a profile: expected a JSON object"),
            (with("\"format\": 1", "\"format\": \"1\""), "format \"1\", but this simulator reads format 1"),
            ("{}".to_owned(), "no \"format\" key"),
            (with("\"format\": 1", "\"format\": 2"), "format 2, but this simulator reads format 1"),
            (with("2100.5", "-1"), "sim.fixed_latency_us is -1.0"),
            (with("48.25", "1e300"), "sim.per_token_latency_us is 1e300"),
            (with("350.0", "\"fast\""), "not a profile"),
            (with("\"max_batch_requests\": 4", "\"max_batch_requests\": 0"), "sim.max_batch_requests is 0"),
            (with("\"max_batch_tokens\": null", "\"max_batch_tokens\": 0"), "sim.max_batch_tokens is 0"),
            (with("\"spin\"", "\"gpu\""), "unknown variant `gpu`"),
            (with("\"device\"", "\"devise\""), "unknown field `devise`"),
            (with("\"per_token_latency_us\": 48.25,", ""), "missing field `per_token_latency_us`"),
        ];
        for (text, why) in cases {
            let refused = Profile::parse(&text).unwrap_err();
            assert!(refused.contains(why), "{refused:?} should say {why:?}");
        }
    }

    #[test]
    fn load_names_the_file_and_bounds_its_size() {
        let dir = std::env::temp_dir().join(format!("tei-sim-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.json");
        std::fs::write(&good, GOOD).unwrap();
        assert_eq!(Profile::load(&good).unwrap().sim.max_batch_requests, Some(4));

        let huge = dir.join("huge.json");
        std::fs::write(&huge, vec![b' '; (MAX_PROFILE_BYTES + 1) as usize]).unwrap();
        let refused = Profile::load(&huge).unwrap_err().to_string();
        assert!(refused.contains("huge.json") && refused.contains("larger than"), "{refused}");

        let refused = Profile::load(&dir.join("absent.json")).unwrap_err().to_string();
        assert!(refused.contains("absent.json"), "{refused}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
