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
