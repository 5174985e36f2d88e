//! Key names, under the configured prefix: the only place that spells
//! them (the list with what each holds is in the module doc of `store`).

/// Key names under the configured prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
        }
    }
    pub fn queue(&self) -> String {
        format!("{}jobs:queue", self.prefix)
    }
    /// The fair turns' ring of keys with queued jobs: each entry is the
    /// key's ring of users ([`Keys::users`]).
    pub fn tenants(&self) -> String {
        format!("{}jobs:tenants", self.prefix)
    }
    /// Jobs claimed since the store began (every worker's claims): the
    /// claim rate a queued job's wait is estimated from.
    pub fn claims(&self) -> String {
        format!("{}jobs:claims", self.prefix)
    }
    /// Turns each key took in the current round (by its users ring).
    pub fn tenant_turns(&self) -> String {
        format!("{}jobs:tenants:turns", self.prefix)
    }
    /// Each key's weight: turns per round (by its users ring).
    pub fn tenant_weights(&self) -> String {
        format!("{}jobs:tenants:weights", self.prefix)
    }
    /// An API key's ring of users with queued jobs: each entry is the
    /// user's queue ([`Keys::user_queue`]).
    pub fn users(&self, api_key: &str) -> String {
        format!("{}apikey:{api_key}:users", self.prefix)
    }
    /// One user's queued job ids, oldest at the claim end. `user` is ""
    /// for the key's anonymous user; an API key's name has no `:`.
    pub fn user_queue(&self, api_key: &str, user: &str) -> String {
        format!("{}apikey:{api_key}:queue:{user}", self.prefix)
    }
    /// Queued + running jobs per user of an API key.
    pub fn user_active(&self, api_key: &str) -> String {
        format!("{}apikey:{api_key}:user_active", self.prefix)
    }
    /// One user's submission rate (the theoretical arrival time of GCRA).
    pub fn user_rate(&self, api_key: &str, user: &str) -> String {
        format!("{}apikey:{api_key}:rate:{user}", self.prefix)
    }
    /// The API key and user a user queue's name ([`Keys::user_queue`])
    /// stands for.
    pub fn tenant_of_user_queue<'a>(&self, name: &'a str) -> Option<(&'a str, &'a str)> {
        let rest = name.strip_prefix(&self.prefix)?.strip_prefix("apikey:")?;
        let (api_key, rest) = rest.split_once(':')?;
        Some((api_key, rest.strip_prefix("queue:")?))
    }
    pub fn dead(&self) -> String {
        format!("{}jobs:dead", self.prefix)
    }
    pub fn job(&self, id: &str) -> String {
        format!("{}job:{id}", self.prefix)
    }
    pub fn stdin(&self, id: &str) -> String {
        format!("{}job:{id}:stdin", self.prefix)
    }
    pub fn events(&self, id: &str) -> String {
        format!("{}job:{id}:events", self.prefix)
    }
    pub fn processing(&self, worker: &str) -> String {
        format!("{}worker:{worker}:processing", self.prefix)
    }
    pub fn heartbeat(&self, worker: &str) -> String {
        format!("{}worker:{worker}:hb", self.prefix)
    }
    pub fn worker_doorbell(&self, worker: &str) -> String {
        format!("{}worker:{worker}:doorbell", self.prefix)
    }
    pub fn languages(&self, worker: &str) -> String {
        format!("{}worker:{worker}:languages", self.prefix)
    }
    pub fn workers(&self) -> String {
        format!("{}workers", self.prefix)
    }
    pub fn idempotency(&self, api_key: &str, key: &str) -> String {
        format!("{}idem:{api_key}:{key}", self.prefix)
    }
    pub fn active(&self, api_key: &str) -> String {
        format!("{}apikey:{api_key}:active", self.prefix)
    }
    pub fn recent(&self) -> String {
        format!("{}jobs:recent", self.prefix)
    }
    pub fn compat(&self, id: &str) -> String {
        format!("{}compat:{id}", self.prefix)
    }
    /// A Jobe file id of `api_key`'s: the SHA-256 of the file it names.
    pub fn jobe_file(&self, api_key: &str, id: &str) -> String {
        format!("{}compat:jobe-file:{api_key}:{id}", self.prefix)
    }
    pub fn token_secret(&self) -> String {
        format!("{}config:token_secret", self.prefix)
    }
    pub fn capacity(&self) -> String {
        format!("{}capacity:schedule", self.prefix)
    }
    pub fn stored(&self, api_key: &str) -> String {
        format!("{}apikey:{api_key}:stored", self.prefix)
    }
    pub fn expiry(&self, api_key: &str) -> String {
        format!("{}apikey:{api_key}:expiry", self.prefix)
    }
    /// The bytes of `api_key`'s file `digest` (a SHA-256 in hex).
    pub fn file(&self, api_key: &str, digest: &str) -> String {
        format!("{}file:{api_key}:{digest}", self.prefix)
    }
    /// Where the bytes of `api_key`'s file `digest` are, with the S3
    /// backend: the name of its object (see `files::s3`).
    pub fn file_object(&self, api_key: &str, digest: &str) -> String {
        format!("{}fileobj:{api_key}:{digest}", self.prefix)
    }
    /// Every object of the S3 backend, by when it may be deleted.
    pub fn file_objects(&self) -> String {
        format!("{}files:objects", self.prefix)
    }
    /// The run history of an API key: its jobs by `created_ms`.
    pub fn history(&self, api_key: &str) -> String {
        format!("{}apikey:{api_key}:history", self.prefix)
    }
    /// The run history of one user of an API key (key names have no `:`,
    /// so the user, whatever it holds, cannot make another key's name).
    pub fn user_history(&self, api_key: &str, user: &str) -> String {
        format!("{}apikey:{api_key}:history:{user}", self.prefix)
    }
    /// What the run history shows of a job, kept for the history window.
    pub fn summary(&self, id: &str) -> String {
        format!("{}job:{id}:summary", self.prefix)
    }
    pub fn doorbell(&self, instance: &str) -> String {
        format!("{}feeds:{instance}:doorbell", self.prefix)
    }
    /// One UTC day (`YYYY-MM-DD`) of a key's usage ledger.
    pub fn usage(&self, api_key: &str, day: &str) -> String {
        format!("{}usage:{api_key}:{day}", self.prefix)
    }
    /// A key's ledger keys without the day, which `settle_job` appends
    /// (the day a job ends is only known then).
    pub fn usage_prefix(&self, api_key: &str) -> String {
        self.usage(api_key, "")
    }
}
