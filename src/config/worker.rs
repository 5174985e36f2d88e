//! The worker role's settings: its id, slots, heartbeat, drain and warm pool.

use std::time::Duration;

use clap::Args;

use super::{ConfigError, ReaperSettings, switch};
use crate::languages::LanguageCatalog;
use crate::worker::WorkerConfig;

/// The worker role.
#[derive(Debug, Clone, Args)]
pub struct WorkerSettings {
    /// This worker's id (in heartbeats, processing lists and container
    /// labels); unique per process. Default: hostname and a random suffix.
    #[arg(long, env = "CODE_RUNNER_WORKER_ID")]
    pub worker_id: Option<String>,

    /// Most sandboxes this worker runs at once.
    #[arg(long, env = "CODE_RUNNER_WORKER_MAX_SANDBOXES", default_value_t = 4)]
    pub worker_max_sandboxes: usize,

    /// How often the heartbeat is refreshed, in milliseconds.
    #[arg(
        long,
        env = "CODE_RUNNER_HEARTBEAT_INTERVAL_MS",
        default_value_t = 5000
    )]
    pub heartbeat_interval_ms: u64,

    /// On SIGTERM: how long running jobs may go on before they are killed, in
    /// milliseconds.
    #[arg(long, env = "CODE_RUNNER_DRAIN_TIMEOUT_MS", default_value_t = 30000)]
    pub drain_timeout_ms: u64,

    /// Address of the worker role's own /metrics and /healthz (the `worker`
    /// command; `serve` uses the API's address).
    #[arg(
        long,
        env = "CODE_RUNNER_WORKER_LISTEN",
        default_value = "127.0.0.1:8081"
    )]
    pub worker_listen: std::net::SocketAddr,

    /// Warm sandboxes to keep ready per language when no capacity schedule
    /// says otherwise, as language=count,… (e.g. `python=4,javascript=2`).
    #[arg(long, env = "CODE_RUNNER_WARM", default_value = "")]
    pub warm: String,

    /// Most warm sandboxes this worker keeps (0: no warm pool). They are
    /// never counted as free slots.
    #[arg(long, env = "CODE_RUNNER_WARM_MAX", default_value_t = 0)]
    pub warm_max: usize,

    /// A warm sandbox older than this is replaced (images change), in
    /// seconds.
    #[arg(long, env = "CODE_RUNNER_WARM_LIFETIME_SECS", default_value_t = 600)]
    pub warm_lifetime_secs: u64,

    /// Whether warm sandboxes of the languages that have one hold their
    /// runtime already started (docs/warm-runtimes.md): `on` or `off` (also
    /// `true`/`false`, `yes`/`no`, `1`/`0`, in any case). A capacity
    /// schedule entry may say otherwise for its window.
    #[arg(long, env = "CODE_RUNNER_WARM_RUNTIMES", default_value = "on")]
    pub warm_runtimes: String,

    /// Whether background work yields to the running jobs while at least
    /// half the slots are busy: `on` or `off` (also `true`/`false`,
    /// `yes`/`no`, `1`/`0`, in any case). On, the warm pool starts one
    /// sandbox at a time, and the containers of jobs that ended by
    /// themselves wait (up to as many as there are slots) to be removed one
    /// at a time.
    #[arg(long, env = "CODE_RUNNER_YIELD_WHILE_BUSY", default_value = "on")]
    pub yield_while_busy: String,

    /// No warm sandbox is started while the machine has less memory
    /// available than this (`MemAvailable`), in MiB; 0: no reserve.
    /// Default: a tenth of the machine's memory.
    #[arg(long, env = "CODE_RUNNER_WARM_MEMORY_RESERVE_MB")]
    pub warm_memory_reserve_mb: Option<u64>,

    /// Most KiB of a job's output files returned inline in its result (all
    /// its files and tests together, before base64); a file past it goes
    /// to the job's key's file store and the result gives its `ref`. 0:
    /// every output file is stored.
    #[arg(
        long,
        env = "CODE_RUNNER_OUTPUTS_INLINE_MAX_KB",
        default_value_t = 1024
    )]
    pub outputs_inline_max_kb: u64,
}

impl WorkerSettings {
    /// The worker's configuration: `id` is what [`Self::validate`] gave,
    /// `reaper` the settings of the reaper beside it (the heartbeat TTL and
    /// the requeues are the reaper's settings), `catalog` the languages
    /// `CODE_RUNNER_WARM` may name.
    pub fn config(
        &self,
        id: String,
        reaper: &ReaperSettings,
        catalog: &LanguageCatalog,
    ) -> Result<WorkerConfig, ConfigError> {
        let warm_floors = self.warm_floors(catalog)?;
        let warm_memory_reserve = self.warm_memory_reserve()?;
        let warm_runtimes = self.warm_runtimes()?;
        let yield_while_busy = self.yield_while_busy()?;
        Ok(WorkerConfig {
            id,
            max_sandboxes: self.worker_max_sandboxes,
            heartbeat_interval: Duration::from_millis(self.heartbeat_interval_ms),
            heartbeat_ttl: Duration::from_millis(reaper.heartbeat_ttl_ms),
            drain_timeout: Duration::from_millis(self.drain_timeout_ms),
            warm_floors,
            warm_max: self.warm_max,
            warm_lifetime: Duration::from_secs(self.warm_lifetime_secs),
            warm_runtimes,
            yield_while_busy,
            refill_hold: crate::worker::REFILL_HOLD,
            warm_memory_reserve,
            max_requeues: reaper.max_requeues,
            outputs: self.outputs()?,
        })
    }

    /// What the worker does with a job's output files
    /// (`CODE_RUNNER_OUTPUTS_INLINE_MAX_KB`, checked); the file store's
    /// limits are the defaults of `CODE_RUNNER_FILE_MAX_MB` and
    /// `CODE_RUNNER_FILE_KEEP_SECS` until the plan gives the API's.
    fn outputs(&self) -> Result<crate::worker::OutputsPolicy, ConfigError> {
        const MAX_KB: u64 = 16 * 1024;
        if self.outputs_inline_max_kb > MAX_KB {
            return Err(ConfigError::new(
                "CODE_RUNNER_OUTPUTS_INLINE_MAX_KB",
                format!(
                    "{} is more than {MAX_KB} (16 MiB inline in one result; larger files belong in the file store)",
                    self.outputs_inline_max_kb
                ),
            ));
        }
        Ok(crate::worker::OutputsPolicy {
            inline_max_bytes: self.outputs_inline_max_kb << 10,
            ..crate::worker::OutputsPolicy::default()
        })
    }

    /// `CODE_RUNNER_WARM_RUNTIMES`, checked.
    fn warm_runtimes(&self) -> Result<bool, ConfigError> {
        switch("CODE_RUNNER_WARM_RUNTIMES", &self.warm_runtimes)
    }

    /// `CODE_RUNNER_YIELD_WHILE_BUSY`, checked.
    fn yield_while_busy(&self) -> Result<bool, ConfigError> {
        switch("CODE_RUNNER_YIELD_WHILE_BUSY", &self.yield_while_busy)
    }

    /// The warm pool's memory reserve in bytes
    /// (`CODE_RUNNER_WARM_MEMORY_RESERVE_MB`, by default a tenth of the
    /// machine's memory).
    fn warm_memory_reserve(&self) -> Result<u64, ConfigError> {
        match self.warm_memory_reserve_mb {
            None => Ok(crate::sandbox::pool::memory::default_reserve()),
            Some(mib) => mib.checked_mul(1024 * 1024).ok_or_else(|| {
                ConfigError::new(
                    "CODE_RUNNER_WARM_MEMORY_RESERVE_MB",
                    format!("{mib} MiB is more than any machine has"),
                )
            }),
        }
    }

    /// The per-language warm floors of `CODE_RUNNER_WARM`, checked against
    /// the catalog and `CODE_RUNNER_WARM_MAX`.
    fn warm_floors(
        &self,
        catalog: &LanguageCatalog,
    ) -> Result<std::collections::BTreeMap<String, usize>, ConfigError> {
        let error = |message: String| ConfigError::new("CODE_RUNNER_WARM", message);
        if self.warm_max > 1024 {
            return Err(ConfigError::new(
                "CODE_RUNNER_WARM_MAX",
                "must be between 0 and 1024",
            ));
        }
        if self.warm_lifetime_secs < 10 {
            return Err(ConfigError::new(
                "CODE_RUNNER_WARM_LIFETIME_SECS",
                "must be at least 10",
            ));
        }
        let mut floors = std::collections::BTreeMap::new();
        for entry in self
            .warm
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            let (name, count) = entry
                .split_once('=')
                .ok_or_else(|| error(format!("{entry:?} is not language=count")))?;
            let language = catalog.find(name.trim()).ok_or_else(|| {
                error(format!(
                    "unknown language {:?}; known: {}",
                    name.trim(),
                    catalog.ids().join(", ")
                ))
            })?;
            let count: usize = count
                .trim()
                .parse()
                .map_err(|_| error(format!("{:?} is not a count", count.trim())))?;
            if floors.insert(language.id.clone(), count).is_some() {
                return Err(error(format!("{} is given twice", language.id)));
            }
        }
        let total: usize = floors.values().sum();
        if total > self.warm_max {
            return Err(error(format!(
                "asks for {total} warm sandboxes but CODE_RUNNER_WARM_MAX is {}",
                self.warm_max
            )));
        }
        Ok(floors)
    }

    /// The worker's id, with the settings checked; `reaper` is the settings
    /// of the reaper beside it (every process with a worker runs a reaper),
    /// whose heartbeat TTL must outlast two heartbeat intervals.
    pub fn validate(&self, reaper: &ReaperSettings) -> Result<String, ConfigError> {
        let heartbeat_ttl_ms = reaper.heartbeat_ttl_ms;
        if self.worker_max_sandboxes == 0 || self.worker_max_sandboxes > 1024 {
            return Err(ConfigError::new(
                "CODE_RUNNER_WORKER_MAX_SANDBOXES",
                "must be between 1 and 1024",
            ));
        }
        if self.heartbeat_interval_ms == 0 {
            return Err(ConfigError::new(
                "CODE_RUNNER_HEARTBEAT_INTERVAL_MS",
                "must be at least 1",
            ));
        }
        if heartbeat_ttl_ms < self.heartbeat_interval_ms * 2 {
            return Err(ConfigError::new(
                "CODE_RUNNER_HEARTBEAT_TTL_MS",
                format!(
                    "{} is less than twice the heartbeat interval ({})",
                    heartbeat_ttl_ms, self.heartbeat_interval_ms
                ),
            ));
        }
        let id = match &self.worker_id {
            Some(id) => id.clone(),
            None => {
                let host = nix::unistd::gethostname()
                    .ok()
                    .and_then(|h| h.into_string().ok())
                    .unwrap_or_else(|| "worker".into());
                let suffix = uuid::Uuid::new_v4().simple().to_string();
                format!("{host}-{}", &suffix[..8])
            }
        };
        if id.is_empty()
            || id.len() > 64
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(ConfigError::new(
                "CODE_RUNNER_WORKER_ID",
                format!("{id:?} must be 1-64 letters, digits, '-', '_' or '.'"),
            ));
        }
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::WorkerSettings;
    use crate::sandbox::pool::memory::default_reserve;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        worker: WorkerSettings,
    }

    fn parse(args: &[&str]) -> WorkerSettings {
        Cli::try_parse_from(std::iter::once("code-runner").chain(args.iter().copied()))
            .unwrap()
            .worker
    }

    #[test]
    fn the_warm_memory_reserve_is_in_mib_and_a_tenth_of_the_machine_by_default() {
        let reserve = |args: &[&str]| parse(args).warm_memory_reserve().unwrap();
        assert_eq!(
            reserve(&["--warm-memory-reserve-mb", "512"]),
            512 * 1024 * 1024
        );
        assert_eq!(reserve(&["--warm-memory-reserve-mb", "0"]), 0);
        assert_eq!(reserve(&[]), default_reserve());
        assert!(default_reserve() > 0);
    }

    #[test]
    fn a_warm_memory_reserve_past_any_machine_names_its_setting() {
        let error = parse(&["--warm-memory-reserve-mb", &u64::MAX.to_string()])
            .warm_memory_reserve()
            .unwrap_err();
        assert_eq!(error.setting, "CODE_RUNNER_WARM_MEMORY_RESERVE_MB");
        assert_eq!(
            error.message,
            format!("{} MiB is more than any machine has", u64::MAX)
        );
        // Not a number: refused by the command line, naming the flag.
        let refused = Cli::try_parse_from(["code-runner", "--warm-memory-reserve-mb", "lots"])
            .err()
            .unwrap()
            .to_string();
        assert!(refused.contains("--warm-memory-reserve-mb"), "{refused}");
    }

    #[test]
    fn the_on_off_settings_are_on_by_default_and_take_every_accepted_form() {
        let defaults = parse(&[]);
        assert!(defaults.warm_runtimes().unwrap());
        assert!(defaults.yield_while_busy().unwrap());
        for (value, on) in [
            ("on", true),
            ("off", false),
            ("true", true),
            ("false", false),
            ("yes", true),
            ("no", false),
            ("1", true),
            ("0", false),
            ("Off", false),
        ] {
            let settings = parse(&["--warm-runtimes", value, "--yield-while-busy", value]);
            assert_eq!(settings.warm_runtimes().unwrap(), on, "{value}");
            assert_eq!(settings.yield_while_busy().unwrap(), on, "{value}");
        }
    }

    #[test]
    fn a_bad_on_off_value_names_its_setting_and_the_accepted_values() {
        let settings = parse(&["--warm-runtimes", "maybe", "--yield-while-busy", "y"]);
        assert_eq!(
            settings.warm_runtimes().unwrap_err().to_string(),
            "invalid configuration: CODE_RUNNER_WARM_RUNTIMES: \"maybe\" is not on or off \
             (also true/false, yes/no, 1/0)"
        );
        assert_eq!(
            settings.yield_while_busy().unwrap_err().to_string(),
            "invalid configuration: CODE_RUNNER_YIELD_WHILE_BUSY: \"y\" is not on or off \
             (also true/false, yes/no, 1/0)"
        );
    }
}
