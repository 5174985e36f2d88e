//! Job-scoped attach tokens: what a submit returns so a browser can follow
//! the job (and, with the control token, type into it) without ever holding
//! the API key.
//!
//! A token is `<job id>.<scope>.<expiry>.<signature>`: `scope` is `read`
//! (the job's events, over SSE or WebSocket) or `control` (also stdin and
//! signals over the WebSocket), `expiry` unix seconds, `signature` the
//! unpadded base64url HMAC-SHA256 of `<job id>|<scope>|<expiry>`. The job id
//! travels in clear (the holder knows it anyway) so a genuine token presented
//! for another job is told apart from a forged one (403, not 401). Tokens of
//! the two earlier forms, `<job id>.<expiry>.<signature>` and
//! `<expiry>.<signature>` (signed over `<job id>|<expiry>`), are still
//! accepted, as `control` tokens: that is what they granted.
//!
//! The secret. A configured one (`CODE_RUNNER_TOKEN_SECRET`) must be at
//! least [`MIN_SECRET_BYTES`] bytes. Without one, every API replica derives
//! the same secret from two things: a random salt shared through Redis
//! (created by whichever replica came first) and the configured API keys
//! (see [`ApiKeys::fingerprint`]). The secret itself is stored nowhere, so
//! anyone who can read Redis (the job data) learns only the salt and cannot
//! sign a token; replicas must then be configured with the same API keys,
//! and changing the keys invalidates the tokens already given out.
//!
//! Revocation is the job's: a token is refused once its job is cancelled
//! (see the streams), and a job that expired or was removed is not found.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::auth::ApiKeys;
use crate::store::{Store, StoreError};

type HmacSha256 = Hmac<Sha256>;

/// The shortest configured secret accepted: HMAC-SHA256's own key size.
pub const MIN_SECRET_BYTES: usize = 32;

/// What a token lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// The job's events (SSE, WebSocket), nothing else.
    Read,
    /// The events, and stdin and signals over the WebSocket.
    Control,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Control => "control",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text {
            "read" => Some(Scope::Read),
            "control" => Some(Scope::Control),
            _ => None,
        }
    }
}

/// Why a token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the attach token has expired")]
    Expired,
    #[error("the attach token is not valid")]
    Invalid,
    /// Genuine, but signed for another job.
    #[error("the attach token is for another job")]
    OtherJob,
}

/// Both tokens of a job, as the submit answer carries them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttachTokens {
    pub read: String,
    pub control: String,
}

/// Signs and checks attach tokens.
#[derive(Clone)]
pub struct TokenSigner {
    /// HMAC-SHA256 keyed with the secret, cloned for each token.
    keyed: HmacSha256,
    ttl: Duration,
}

impl std::fmt::Debug for TokenSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSigner")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// 32 random bytes as hex, from the OS generator (through `uuid`'s v4,
/// hashed together: 244 random bits).
fn random_salt() -> String {
    let mut hasher = Sha256::new();
    hasher.update(uuid::Uuid::new_v4().as_bytes());
    hasher.update(uuid::Uuid::new_v4().as_bytes());
    hex::encode(hasher.finalize())
}

fn keyed(secret: &[u8]) -> HmacSha256 {
    match <HmacSha256 as KeyInit>::new_from_slice(secret) {
        Ok(keyed) => keyed,
        // HMAC pads or hashes a key of any length; the error type exists
        // only for MACs with fixed key sizes.
        Err(_) => unreachable!("HMAC accepts keys of any length"),
    }
}

/// The secret of replicas that have no configured one: HMAC-SHA256 keyed
/// with the shared salt over the API keys' fingerprint.
fn derived_secret(salt: &str, keys: &ApiKeys) -> [u8; 32] {
    let mut mac = keyed(salt.as_bytes());
    mac.update(b"code-runner attach tokens|");
    mac.update(&keys.fingerprint());
    mac.finalize().into_bytes().into()
}

impl TokenSigner {
    /// A signer with a known secret.
    pub fn new(secret: &[u8], ttl: Duration) -> Self {
        Self {
            keyed: keyed(secret),
            ttl,
        }
    }

    /// The configured secret (already checked to be long enough by the
    /// configuration), or else the one derived from the salt every replica
    /// shares through Redis and the API keys. An empty configured secret
    /// counts as none.
    pub async fn from_config(
        secret: Option<&str>,
        keys: &ApiKeys,
        store: &Store,
        ttl: Duration,
    ) -> Result<Self, StoreError> {
        match secret.filter(|s| !s.is_empty()) {
            Some(secret) => Ok(Self::new(secret.as_bytes(), ttl)),
            None => {
                // The Redis value is a salt now; it used to be the secret.
                let salt = store.tokens().shared_secret(&random_salt()).await?;
                Ok(Self::new(&derived_secret(&salt, keys), ttl))
            }
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn mac(&self, job_id: &str, scope: Option<Scope>, expiry: u64) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        mac.update(job_id.as_bytes());
        mac.update(b"|");
        if let Some(scope) = scope {
            mac.update(scope.as_str().as_bytes());
            mac.update(b"|");
        }
        mac.update(expiry.to_string().as_bytes());
        mac
    }

    /// A token of `scope` for `job_id`, valid for the configured time.
    pub fn sign(&self, job_id: &str, scope: Scope) -> String {
        self.sign_until(job_id, scope, now_secs().saturating_add(self.ttl.as_secs()))
    }

    /// Both tokens of `job_id`.
    pub fn sign_both(&self, job_id: &str) -> AttachTokens {
        AttachTokens {
            read: self.sign(job_id, Scope::Read),
            control: self.sign(job_id, Scope::Control),
        }
    }

    fn sign_until(&self, job_id: &str, scope: Scope, expiry: u64) -> String {
        let signature = self
            .mac(job_id, Some(scope), expiry)
            .finalize()
            .into_bytes();
        format!(
            "{job_id}.{}.{expiry}.{}",
            scope.as_str(),
            URL_SAFE_NO_PAD.encode(signature)
        )
    }

    /// Checks a token for `job_id` and returns its scope: the signature
    /// first (in constant time), then the job it names, then the expiry, so
    /// only a genuine token is ever called expired or another job's.
    pub fn verify(&self, job_id: &str, token: &str) -> Result<Scope, TokenError> {
        self.verify_at(job_id, token, now_secs())
    }

    fn verify_at(&self, job_id: &str, token: &str, now: u64) -> Result<Scope, TokenError> {
        let parts: Vec<&str> = token.split('.').collect();
        // (job signed for, scope in the signature, expiry, signature)
        let (signed_for, scope, expiry_text, signature) = match parts.as_slice() {
            [job, scope, expiry, signature] => (
                *job,
                Some(Scope::parse(scope).ok_or(TokenError::Invalid)?),
                *expiry,
                *signature,
            ),
            // The earlier forms: `job.expiry.signature`, and
            // `expiry.signature`, which names no job and can only be
            // checked against this one.
            [job, expiry, signature] => (*job, None, *expiry, *signature),
            [expiry, signature] => (job_id, None, *expiry, *signature),
            _ => return Err(TokenError::Invalid),
        };
        if signed_for.is_empty()
            || expiry_text.is_empty()
            || !expiry_text.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(TokenError::Invalid);
        }
        let expiry: u64 = expiry_text.parse().map_err(|_| TokenError::Invalid)?;
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| TokenError::Invalid)?;
        self.mac(signed_for, scope, expiry)
            .verify_slice(&signature)
            .map_err(|_| TokenError::Invalid)?;
        if signed_for != job_id {
            return Err(TokenError::OtherJob);
        }
        if expiry <= now {
            return Err(TokenError::Expired);
        }
        Ok(scope.unwrap_or(Scope::Control))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = "3f1c0b8e-0000-4000-8000-000000000001";
    const OTHER: &str = "3f1c0b8e-0000-4000-8000-000000000002";

    fn signer() -> TokenSigner {
        TokenSigner::new(b"0123456789abcdef0123456789abcdef", Duration::from_secs(60))
    }

    #[test]
    fn a_token_is_valid_for_its_job_and_scope_only() {
        let signer = signer();
        let both = signer.sign_both(JOB);
        assert_eq!(signer.verify(JOB, &both.read), Ok(Scope::Read));
        assert_eq!(signer.verify(JOB, &both.control), Ok(Scope::Control));
        assert_eq!(signer.verify(OTHER, &both.read), Err(TokenError::OtherJob));
        let parts: Vec<&str> = both.read.split('.').collect();
        assert_eq!(parts[..2], [JOB, "read"]);
        let expiry: u64 = parts[2].parse().unwrap();
        assert!(expiry >= now_secs() + 59 && expiry <= now_secs() + 60);
        assert_eq!(parts[3].len(), 43);
        assert!(!parts[3].contains(['+', '/', '=']));
        // A read token relabelled as a control token is a forgery.
        let promoted = both.read.replacen(".read.", ".control.", 1);
        assert_eq!(signer.verify(JOB, &promoted), Err(TokenError::Invalid));
        let unknown = both.read.replacen(".read.", ".admin.", 1);
        assert_eq!(signer.verify(JOB, &unknown), Err(TokenError::Invalid));
    }

    #[test]
    fn expiry_is_checked_after_the_signature() {
        let signer = signer();
        let token = signer.sign_until(JOB, Scope::Control, 1000);
        assert_eq!(signer.verify_at(JOB, &token, 999), Ok(Scope::Control));
        assert_eq!(
            signer.verify_at(JOB, &token, 1000),
            Err(TokenError::Expired)
        );
        // Moving the expiry forward breaks the signature.
        let forged = token.replacen(".1000.", ".9999.", 1);
        assert_eq!(
            signer.verify_at(JOB, &forged, 1000),
            Err(TokenError::Invalid)
        );
        // So does naming another job.
        let forged = token.replacen(JOB, OTHER, 1);
        assert_eq!(
            signer.verify_at(OTHER, &forged, 999),
            Err(TokenError::Invalid)
        );
        // Another job's genuine token is told apart, expired or not.
        assert_eq!(
            signer.verify_at(OTHER, &token, 2000),
            Err(TokenError::OtherJob)
        );
    }

    #[test]
    fn tokens_of_the_earlier_forms_verify_as_control_tokens() {
        let signer = signer();
        let signature = URL_SAFE_NO_PAD.encode(signer.mac(JOB, None, 1000).finalize().into_bytes());
        for token in [
            format!("1000.{signature}"),
            format!("{JOB}.1000.{signature}"),
        ] {
            assert_eq!(signer.verify_at(JOB, &token, 999), Ok(Scope::Control));
            assert_eq!(
                signer.verify_at(JOB, &token, 1000),
                Err(TokenError::Expired)
            );
        }
        assert_eq!(
            signer.verify_at(OTHER, &format!("1000.{signature}"), 999),
            Err(TokenError::Invalid)
        );
        // A scoped signature does not pass for an earlier-form one.
        let read = signer.sign_until(JOB, Scope::Read, 1000);
        let signature = read.rsplit('.').next().unwrap();
        assert_eq!(
            signer.verify_at(JOB, &format!("{JOB}.1000.{signature}"), 999),
            Err(TokenError::Invalid)
        );
    }

    #[test]
    fn another_secret_or_garbage_is_invalid() {
        let token = signer().sign(JOB, Scope::Control);
        let other = TokenSigner::new(
            b"another secret of thirty-two bytes!",
            Duration::from_secs(60),
        );
        assert_eq!(other.verify(JOB, &token), Err(TokenError::Invalid));
        for garbage in [
            "",
            ".",
            "abc",
            "123.",
            ".abc",
            "+1.abc",
            "12x.abc",
            "99999999999999999999999.abc",
            "123.!!!",
            "a.b.c.d",
            "a.b.c.d.e",
            "x..abc",
            ".123.abc",
        ] {
            assert_eq!(
                signer().verify(JOB, garbage),
                Err(TokenError::Invalid),
                "{garbage:?}"
            );
        }
    }

    #[test]
    fn the_derived_secret_needs_both_the_salt_and_the_keys() {
        let keys = ApiKeys::parse("a:0123456789abcdef0123").unwrap();
        let same_keys = ApiKeys::parse("renamed:0123456789abcdef0123:5").unwrap();
        let other_keys = ApiKeys::parse("a:0123456789abcdef0124").unwrap();
        let salt = random_salt();
        assert_eq!(salt.len(), 64);
        assert_ne!(salt, random_salt());
        let secret = derived_secret(&salt, &keys);
        assert_eq!(secret, derived_secret(&salt, &same_keys));
        assert_ne!(secret, derived_secret(&salt, &other_keys));
        assert_ne!(secret, derived_secret(&random_salt(), &keys));
        assert_ne!(&secret[..], salt.as_bytes());
    }
}
